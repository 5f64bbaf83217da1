"""What `llmsim run` loads before it simulates: only the modules a plain run uses, and
numpy's BLAS with one thread (its threads spin at import and llmsim multiplies no large
matrices). Checked in a child process started as the command line starts one."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from sim.costmodel.mixed_decode import median

ROOT = Path(__file__).resolve().parent.parent
QUICK = ROOT / "scenarios" / "quickstart.yaml"

# never needed by `llmsim run` without --plots, --trace-out, --interval or workers
HEAVY = ("pandas", "matplotlib", "scipy", "pyarrow", "ray", "torch", "tqdm", "statistics",
         "sim.planning", "sim.calibrate", "sim.fit", "sim.engine.plots", "sim.report.perfetto",
         "sim.cli.planning", "sim.cli.calibrate")


def _run_as_command(tmp_path: Path, env: dict[str, str]) -> dict:
    """`llmsim run` (main() of the process's own argv, as the console script calls it) of a
    small quickstart; what it left in sys.modules, os.environ and /proc/self/task."""
    code = (
        "import json, os, sys\n"
        f"sys.argv = ['llmsim', 'run', {str(QUICK)!r}, '--out', {str(tmp_path / 'r')!r}, "
        "'--set', 'workload.num_requests=20', '--no-progress']\n"
        "from sim.cli.main import main\n"
        "rc = main()\n"
        "tasks = os.listdir('/proc/self/task') if os.path.isdir('/proc/self/task') else None\n"
        "print(json.dumps({'rc': rc, 'modules': sorted(sys.modules), 'threads': tasks and len(tasks),"
        " 'blas': os.environ.get('OPENBLAS_NUM_THREADS')}))\n")
    base = {k: v for k, v in os.environ.items()
            if k not in ("OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS", "OMP_NUM_THREADS")}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                       env={**base, "PYTHONPATH": str(ROOT), **env}, timeout=300)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.splitlines()[-1])


def test_a_plain_run_imports_no_plotting_planning_calibration_or_parallel_library(tmp_path):
    got = _run_as_command(tmp_path, {})
    assert got["rc"] == 0
    loaded = set(got["modules"])
    assert [m for m in HEAVY if m in loaded] == []
    assert {"numpy", "simpy", "sim.engine.runner"} <= loaded  # it did simulate
    assert json.loads((tmp_path / "r" / "summary.json").read_text())["requests"]["total"] == 20


def test_the_command_starts_numpy_with_one_blas_thread_unless_the_user_chose(tmp_path):
    got = _run_as_command(tmp_path / "a", {})
    assert got["blas"] == "1"
    if got["threads"] is not None:  # Linux: OpenBLAS would start one thread per core
        assert got["threads"] == 1
    mine = _run_as_command(tmp_path / "b", {"OMP_NUM_THREADS": "2"})
    assert mine["blas"] is None  # the user's OMP_NUM_THREADS stands: nothing set over it
    if mine["threads"] is not None and (os.cpu_count() or 1) > 1:
        assert mine["threads"] == 2


def test_main_called_in_a_process_leaves_blas_threads_alone(tmp_path, monkeypatch):
    """Only the command line's own main() sets the variable: a library caller's stays."""
    from sim.cli.main import main

    monkeypatch.delenv("OPENBLAS_NUM_THREADS", raising=False)
    assert main(["run", str(QUICK), "--out", str(tmp_path / "r"), "--set",
                 "workload.num_requests=5", "--no-progress"]) == 0
    assert "OPENBLAS_NUM_THREADS" not in os.environ


@given(st.lists(st.floats(0, 1), min_size=1, max_size=40))
def test_the_mixed_decode_median_is_statistics_median(values):
    assert median(values) == statistics.median(values)


def test_commands_that_time_kernels_leave_blas_threads_alone():
    code = ("import os, sys; sys.argv = ['llmsim', 'calibrate', '--help']\n"
            "from sim.cli.main import main\n"
            "try:\n    main()\nexcept SystemExit:\n    pass\n"
            "print(os.environ.get('OPENBLAS_NUM_THREADS'))\n")
    env = {k: v for k, v in os.environ.items()
           if k not in ("OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS", "OMP_NUM_THREADS")}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                       env={**env, "PYTHONPATH": str(ROOT)}, timeout=120)
    assert r.stdout.splitlines()[-1] == "None", r.stderr
