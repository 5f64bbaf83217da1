"""Speed of `llmsim run` end to end on the Azure 2023 conversation hour (19,366 requests,
~110 k iterations under the reference stack), and of its phases.

    python benchmarks/speed/run_speed.py [--repeat 3] [--scenario FILE] [--plots] [--format csv]
                                   [--checkout DIR [--extra ARGS]]

End to end: `python -m sim run SCENARIO --out TMP --no-progress` in a child process,
timed by wall clock and by the child's CPU time (user + system, from getrusage: steadier
than wall time on a shared machine); median of the repeats. Phases: the same run in this
process, each phase timed by `time.process_time()`: importing the CLI's modules (in a
child), loading the scenario and its workload, simulate(), building the tables and the
summary, writing the tables and summary.json (and the plots, with --plots). Prints the
peak resident memory of the end-to-end child (ru_maxrss). With --checkout, only the end
to end time of another checkout's `python -m sim run` (an older commit, say: before and
after), with --extra passed to it (e.g. --extra=--no-plots).
"""

from __future__ import annotations

import argparse
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # this checkout's sim, not an installed one
SCENARIO = ROOT / "scenarios" / "azure_conv_reference.yaml"


def child(args: list[str], cwd: Path = ROOT) -> tuple[float, float, float]:
    """(wall s, CPU s, peak RSS MiB) of one child process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run([sys.executable, *args], cwd=cwd, check=True, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, after.ru_maxrss / 1024


def end_to_end(scenario: Path, extra: list[str], repeat: int, checkout: Path = ROOT) -> None:
    runs = []
    for _ in range(repeat):
        out = Path(tempfile.mkdtemp(prefix="llmsim-speed-")) / "run"
        runs.append(child(["-m", "sim", "run", str(scenario), "--out", str(out),
                           "--no-progress", *extra], cwd=checkout))
        shutil.rmtree(out.parent)
    wall = statistics.median(r[0] for r in runs)
    cpu = statistics.median(r[1] for r in runs)
    where = "" if checkout == ROOT else f" [{checkout}]"
    print(f"llmsim run {scenario.name} {' '.join(extra)}{where}: {wall:.2f} s wall, "
          f"{cpu:.2f} s CPU (median of {repeat}); peak RSS {max(r[2] for r in runs):.0f} MiB")


def phases(scenario: Path, plots: bool, fmt: str) -> None:
    _, imports, _ = child(["-c", "import sim.cli.main, sim.engine.runner, sim.config.scenario, sim.io.outputs"])
    _, bare, _ = child(["-c", "pass"])
    from sim.config.scenario import load_scenario
    from sim.engine.build import build_fleet
    from sim.engine.metrics import itl_table, request_table, step_tables, summarize
    from sim.engine.processes import simulate
    from sim.engine.runner import RunOutput, prepare, run

    c0 = time.process_time()
    sc = load_scenario(scenario)
    configs, wl, rng = prepare(sc)
    fleet = build_fleet(sc, configs, rng)
    c1 = time.process_time()
    res = simulate(wl, fleet.replicas, fleet.router)
    c2 = time.process_time()
    req, steps = request_table(res), step_tables(res)
    summary = summarize(req, steps, res, sc.slo)
    c3 = time.process_time()
    out = RunOutput(sc, req, steps, summary, res, itl_table(res))
    folder = Path(tempfile.mkdtemp(prefix="llmsim-speed-"))
    out.write_files(folder, plots=False, fmt=fmt)
    c4 = time.process_time()
    if plots:
        out = run(sc)  # the full summary, as plots read it
        c5 = time.process_time()
        from sim.engine.plots import plot_run

        plot_run(out, folder)
        plot_s = time.process_time() - c5
    shutil.rmtree(folder)
    iters = sum(r.steps.rows() for r in res.replicas)
    print(f"phases (CPU s): python start {bare:.2f}, imports {imports - bare:.2f}, "
          f"scenario + workload {c1 - c0:.2f}, simulate {c2 - c1:.2f} "
          f"({len(res.seqs):,} requests, {iters:,} iterations, "
          f"{iters / max(c2 - c1, 1e-9):,.0f} iterations/s), tables + summary "
          f"{c3 - c2:.2f}, writing {fmt} + summary.json {c4 - c3:.2f}"
          + (f", plots {plot_s:.2f}" if plots else ""))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--scenario", type=Path, default=SCENARIO)
    ap.add_argument("--plots", action="store_true", help="also time writing the plots")
    ap.add_argument("--format", choices=("csv", "parquet"), default="csv")
    ap.add_argument("--checkout", type=Path, help="time this checkout's llmsim run instead")
    ap.add_argument("--extra", default="", help="arguments for --checkout's llmsim run")
    a = ap.parse_args()
    if a.checkout:
        end_to_end(a.scenario.resolve(), a.extra.split(), a.repeat, a.checkout.resolve())
        return
    extra = (["--plots"] if a.plots else []) + ["--format", a.format]
    end_to_end(a.scenario.resolve(), extra, a.repeat)
    phases(a.scenario.resolve(), a.plots, a.format)


if __name__ == "__main__":
    main()
