"""Limits known before a run and I/O errors as one line (issue 18, item 5): a run whose
memory floor is over what is available is refused before its workload is drawn; a full
disk (here: a file-size limit, EFBIG, the same path as ENOSPC) while a run, a sweep or a
report writes is one line, and a sweep keeps its finished rows."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sim.cli.main import main
from sim.config.scenario import load_scenario
from sim.engine.hostmem import (
    BASE_B,
    ENV,
    PER_ITERATION_B,
    PER_REQUEST_B,
    available_bytes,
    check_host_memory,
    estimate_bytes,
)
from sim.engine.recorder import MEMORY_ROWS
from sim.io.specload import SpecError

ROOT = Path(__file__).resolve().parent.parent
QUICK = str(ROOT / "scenarios" / "quickstart.yaml")


def test_the_estimate_is_base_plus_requests_plus_the_fewest_iterations():
    # 1,000 requests, 256,000 output tokens, 256 sequences a step: at least 1,000 steps
    assert estimate_bytes(1000, 256_000, 256) == BASE_B + 1000 * PER_REQUEST_B + 1000 * PER_ITERATION_B
    assert estimate_bytes(1000, 256_001, 256) == estimate_bytes(1000, 256_000, 256) + PER_ITERATION_B


@pytest.mark.parametrize("n", [10**7, 10**8])
def test_a_run_too_large_for_memory_is_one_line_before_anything_is_drawn(tmp_path, monkeypatch, capsys, n):
    monkeypatch.setenv(ENV, "8")
    t0 = time.monotonic()
    assert main(["run", QUICK, "--set", f"workload.num_requests={n}", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "workload.num_requests" in err
    assert f"{n:,} requests need at least" in err and "8.0 GiB is available" in err and ENV in err
    assert time.monotonic() - t0 < 20  # refused, not generated (10^8 requests take minutes)
    assert not (tmp_path / "o").exists()


def test_the_iterations_count_once_the_workload_is_known(monkeypatch):
    monkeypatch.setenv(ENV, "0.25")
    sc = load_scenario(QUICK)
    check_host_memory(sc, 10, 1000)  # small: fine
    with pytest.raises(SpecError, match="10 requests and 100,000,000,000 output tokens need at least"):
        check_host_memory(sc, 10, 10**11)  # 2^22 steps held x 90 B is over 0.25 GiB


def test_steps_past_those_a_run_holds_in_memory_cost_no_memory():
    """A run's step log goes to disk past MEMORY_ROWS rows (sim/engine/recorder.py)."""
    floor = BASE_B + 10 * PER_REQUEST_B + MEMORY_ROWS * PER_ITERATION_B
    assert estimate_bytes(10, 256 * (MEMORY_ROWS + 1), 256) == floor
    assert estimate_bytes(10, 10**11, 256) == floor


def test_the_limit_can_be_switched_off_or_set_and_defaults_to_memavailable(monkeypatch):
    sc = load_scenario(QUICK, {"workload.num_requests": 10**8})
    monkeypatch.setenv(ENV, "off")
    check_host_memory(sc)  # no check
    monkeypatch.setenv(ENV, "lots")
    with pytest.raises(SpecError, match=f"{ENV}: 'lots' is not a number of GiB"):
        check_host_memory(sc)
    monkeypatch.delenv(ENV)
    if Path("/proc/meminfo").exists():
        line = next(ln for ln in Path("/proc/meminfo").read_text().splitlines() if ln.startswith("MemAvailable:"))
        assert abs(available_bytes() - int(line.split()[1]) * 1024) < 2**30  # read just now, moves a little


def test_the_estimate_is_a_floor_of_what_a_run_really_takes(tmp_path):
    """Measured: the peak memory of a real run is above its estimate (no run that fits is
    refused)."""
    code = ("import resource, sys\n"
            "from sim.engine.runner import run\n"
            "out = run(sys.argv[1], {'workload.num_requests': 3000})\n"
            "out.write(sys.argv[2], plots=False)\n"
            "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, int(out.requests.output_tokens.sum()))")
    r = subprocess.run([sys.executable, "-c", code, QUICK, str(tmp_path / "o")], capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300)
    assert r.returncode == 0, r.stderr
    peak, tokens = map(int, r.stdout.split())
    if sys.platform == "darwin":
        peak //= 1024  # ru_maxrss is bytes there, KiB on Linux
    assert estimate_bytes(3000, tokens, 256) < peak


# --- a full disk --------------------------------------------------------------------------

def _llmsim_with_file_limit(args: list[str], cwd: Path, limit: int) -> subprocess.CompletedProcess:
    """`llmsim ARGS` where no file may grow past `limit` bytes (writes then fail, EFBIG)."""
    code = ("import resource, signal, sys\n"
            "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
            f"resource.setrlimit(resource.RLIMIT_FSIZE, ({limit}, {limit}))\n"
            "from sim.cli.main import main\n"
            "sys.exit(main(sys.argv[1:]))\n")
    return subprocess.run([sys.executable, "-c", code, *args], cwd=cwd, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300)


def _one_line(r: subprocess.CompletedProcess, code: int) -> str:
    assert r.returncode == code, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("llmsim: error: "), r.stderr
    return lines[0]


pytestmark_fsize = pytest.mark.skipif(not hasattr(resource, "RLIMIT_FSIZE"), reason="no RLIMIT_FSIZE")


@pytestmark_fsize
def test_a_full_disk_while_a_run_writes_is_one_line_and_keeps_the_earlier_results(tmp_path):
    assert main(["run", QUICK, "--set", "workload.num_requests=10", "--out", str(tmp_path / "o")]) == 0
    before = (tmp_path / "o" / "summary.json").read_bytes()
    r = _llmsim_with_file_limit(["run", QUICK, "--set", "workload.num_requests=300", "--out", "o"],
                                tmp_path, 20_000)
    assert "could not write" in _one_line(r, 2)
    assert (tmp_path / "o" / "summary.json").read_bytes() == before
    assert not list(tmp_path.glob(".llmsim-*"))


@pytestmark_fsize
def test_a_full_disk_while_a_sweep_appends_keeps_its_finished_rows_for_a_rerun(tmp_path):
    args = ["sweep", QUICK, "--grid", "seed=1,2,3,4,5,6", "--set", "workload.num_requests=10",
            "--executor", "sequential", "--out", "sw"]
    r = _llmsim_with_file_limit(args, tmp_path, 9_000)
    line = _one_line(r, 2)
    assert "rows.jsonl" in line and "finished row(s) kept" in line
    rows = (tmp_path / "sw" / "rows.jsonl").read_text().splitlines()
    kept = [json.loads(x) for x in rows[:-1]]  # the last line may be torn
    assert 1 <= len(kept) < 6
    again = subprocess.run([sys.executable, "-m", "sim", *args], cwd=tmp_path, capture_output=True, text=True,
                           env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300)
    assert again.returncode == 0, again.stderr
    final = [json.loads(x) for x in (tmp_path / "sw" / "rows.jsonl").read_text().splitlines() if x.startswith("{")
             and x.endswith("}")]
    assert len({r["key"] for r in final}) == 6 and all(r in final for r in kept)  # none lost, kept reused
    assert len((tmp_path / "sw" / "results.csv").read_text().splitlines()) == 7


@pytestmark_fsize
def test_a_full_disk_while_a_report_writes_is_one_line(tmp_path):
    assert main(["run", QUICK, "--set", "workload.num_requests=10", "--plots", "--out", str(tmp_path / "o")]) == 0
    r = _llmsim_with_file_limit(["report", "o"], tmp_path, 8_000)
    assert "could not write" in _one_line(r, 2)
    assert not (tmp_path / "o" / "report.html").exists()
    assert not [p for p in tmp_path.glob("o/.llmsim-*") if p.name != ".llmsim-output.json"]
