"""Speed of `llmsim run` end to end on the Azure 2023 conversation hour (19,366 requests,
~110 k iterations under the reference stack), and of its phases.

    python benchmarks/speed/run_speed.py [--repeat 3] [--scenario FILE] [--plots] [--format csv]
                                   [--checkout DIR [--extra ARGS]] [--cache cold|warm|both]
                                   [--pyc]

End to end: `python -m sim run SCENARIO --out TMP --no-progress` in a child process,
timed by wall clock and by the child's CPU time (user + system, from getrusage: steadier
than wall time on a shared machine); median of the repeats. `--cache`: with the step-time
cache off (cold: every step shape priced afresh, as a first run), warm (a private cache
folder filled by one untimed run first: a rerun of the same configuration), or both
(sim/costmodel/stepcache.py; LLMSIM_STEP_CACHE). `--pyc`: the children may cache their
bytecode (in a private temp folder, PYTHONPYCACHEPREFIX, filled by the untimed first
run), as an installed llmsim has it; without it they run as the environment says (where
PYTHONDONTWRITEBYTECODE is set, every module is compiled at every start). Phases: the same
run in this process, each phase timed by `time.process_time()`: importing the CLI's
modules (in a child, numpy's BLAS started as the command starts it), loading the scenario and its workload, reading the step-time cache,
simulate() (cold, and warm from the cache), building the tables and the summary, writing
the tables and summary.json (and the plots, with --plots). Prints the peak resident memory
of the end-to-end child (ru_maxrss). With --checkout, only the end to end time of another
checkout's `python -m sim run` (an older commit, say: before and after), with --extra
passed to it (e.g. --extra=--no-plots).
"""

from __future__ import annotations

import argparse
import os
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


def child(args: list[str], cwd: Path = ROOT, env: dict | None = None) -> tuple[float, float, float]:
    """(wall s, CPU s, peak RSS MiB) of one child process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run([sys.executable, *args], cwd=cwd, check=True, stdout=subprocess.DEVNULL,
                   env={**os.environ, **(env or {})})
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, after.ru_maxrss / 1024


def end_to_end(scenario: Path, extra: list[str], repeat: int, checkout: Path = ROOT,
               cache: str = "cold", pyc: bool = False) -> None:
    """`cache` "cold": LLMSIM_STEP_CACHE=off; "warm": a private cache folder, filled by one
    untimed run first. `pyc`: bytecode cached in a private folder (filled by that run)."""
    folder = Path(tempfile.mkdtemp(prefix="llmsim-speed-cache-"))
    env = {"LLMSIM_STEP_CACHE": "off" if cache == "cold" else str(folder / "c")}
    if pyc:
        env |= {"PYTHONPYCACHEPREFIX": str(folder / "pyc"), "PYTHONDONTWRITEBYTECODE": ""}

    def once() -> tuple[float, float, float]:
        out = Path(tempfile.mkdtemp(prefix="llmsim-speed-")) / "run"
        try:
            return child(["-m", "sim", "run", str(scenario), "--out", str(out),
                          "--no-progress", *extra], cwd=checkout, env=env)
        finally:
            shutil.rmtree(out.parent)
    try:
        if cache == "warm" or pyc:
            once()
        runs = [once() for _ in range(repeat)]
    finally:
        shutil.rmtree(folder)
    wall = statistics.median(r[0] for r in runs)
    cpu = statistics.median(r[1] for r in runs)
    where = "" if checkout == ROOT else f" [{checkout}]"
    print(f"llmsim run {scenario.name} {' '.join(extra)}{where} (step-time cache {cache}"
          f"{', bytecode cached' if pyc else ''}): "
          f"{wall:.2f} s wall, {cpu:.2f} s CPU (median of {repeat}: "
          f"{', '.join(f'{r[1]:.2f}' for r in runs)}); peak RSS {max(r[2] for r in runs):.0f} MiB")


def phases(scenario: Path, plots: bool, fmt: str) -> None:
    _, imports, _ = child(["-c", "import sim.cli.main as m; getattr(m, 'one_blas_thread', lambda: 0)(); "
                                 "import sim.engine.runner, sim.config.scenario, sim.io.outputs"])
    _, bare, _ = child(["-c", "pass"])
    from sim.config.scenario import load_scenario
    from sim.costmodel.stepcache import warm
    from sim.engine.build import build_fleet
    from sim.engine.metrics import itl_table, request_table, step_tables, summarize
    from sim.engine.processes import simulate
    from sim.engine.runner import RunOutput, prepare, run

    cache = Path(tempfile.mkdtemp(prefix="llmsim-speed-cache-"))
    c0 = time.process_time()
    sc = load_scenario(scenario)
    configs, wl, rng = prepare(sc)
    fleet = build_fleet(sc, configs, rng)
    c1 = time.process_time()
    filled = warm(cache, [c.latency for c in configs])  # an empty folder: nothing read
    res = simulate(wl, fleet.replicas, fleet.router)
    s0 = time.process_time()
    filled.save()
    s1 = time.process_time()
    configs_w, wl_w, rng_w = prepare(sc)
    fleet_w = build_fleet(sc, configs_w, rng_w)
    w0 = time.process_time()
    warm(cache, [c.latency for c in configs_w])
    w1 = time.process_time()
    simulate(wl_w, fleet_w.replicas, fleet_w.router)
    w2 = time.process_time()
    shutil.rmtree(cache)
    c2 = time.process_time()  # the tables, from here
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
    cold = s0 - c1
    print(f"phases (CPU s): python start {bare:.2f}, imports {imports - bare:.2f}, "
          f"scenario + workload {c1 - c0:.2f}, simulate {cold:.2f} cold "
          f"({len(res.seqs):,} requests, {iters:,} iterations, "
          f"{iters / max(cold, 1e-9):,.0f} iterations/s) + writing the step-time cache "
          f"{s1 - s0:.2f} / reading it {w1 - w0:.2f} + simulate {w2 - w1:.2f} warm, "
          f"tables + summary "
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
    ap.add_argument("--cache", choices=("cold", "warm", "both"), default="both",
                    help="the step-time cache off, warm, or each in turn (end to end)")
    ap.add_argument("--pyc", action="store_true",
                    help="let the children cache their bytecode (in a private temp folder)")
    a = ap.parse_args()
    caches = ("cold", "warm") if a.cache == "both" else (a.cache,)
    if a.checkout:
        for cache in caches:
            end_to_end(a.scenario.resolve(), a.extra.split(), a.repeat, a.checkout.resolve(),
                       cache, a.pyc)
        return
    extra = (["--plots"] if a.plots else []) + ["--format", a.format]
    for cache in caches:
        end_to_end(a.scenario.resolve(), extra, a.repeat, cache=cache, pyc=a.pyc)
    phases(a.scenario.resolve(), a.plots, a.format)


if __name__ == "__main__":
    main()
