"""Speed and memory of a large fleet: 64 Llama-3-8B replicas on H200s serving 64x the
Azure conversation trace's rate for one hour (~1.24 M requests, the trace's lengths
wrapping around, Poisson arrivals at 64 x 5.38 req/s).

    python benchmarks/speed/fleet_speed.py [--replicas 64] [--router round_robin] [--write DIR]
        [--hours H] [--rate R | --day] [--diurnal PEAK_TO_TROUGH]
        [--workers N|auto [--executor ray]] [--no-split] [--step-log summary]

The day (issue 19): `--day` is a 128-replica fleet at 25 M requests a day (289 req/s,
Poisson, the same lengths); `--hours 0.1` simulates a slice of it and extrapolates to
24 h by requests (`--diurnal 3`: the rate follows a day's cosine, 3x peak to trough,
from its trough at 0 h; for a whole day, not a slice).

Runs the scenario once, as `llmsim run` does, and prints the engine's wall time
(iterations/s, simulated requests/s), the whole run's wall and CPU time and the peak
resident memory: this process's (ru_maxrss) and, with --workers, each worker's CPU and
the largest worker's memory (as the workers measured them; with the process pool also
as the kernel counted them, RUSAGE_CHILDREN), the load average, and a day's figures
extrapolated linearly by requests.
A round-robin or random fleet is simulated replica by replica, each replica alone with
its own requests (sim/engine/split.py: the same results); --no-split simulates it whole,
in one engine, as before. --workers N spreads the replicas over N processes
(sim/engine/parallel.py). With --write, also the time to write requests.csv,
steps.csv and summary.json. `--step-log summary` keeps each replica's step sums instead of
its rows (sim/engine/steptally.py: no steps.csv; a whole day's rows would not fit on disk).
The test suite runs `--replicas 2 --hours 0.005 --write DIR`.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # this checkout's sim, not an installed one

from sim.config.scenario import scenario_from_dict  # noqa: E402
from sim.engine.runner import run  # noqa: E402

CONV_RATE = 19366 / 3600  # the Azure conversation trace's mean rate, requests/s
DAY_REPLICAS, DAY_RATE = 128, 25e6 / 86400  # issue 19's fleet-day: ~25 M requests


def scenario(replicas: int, router: str, hours: float, rate: float | None = None,
             diurnal: float | None = None, step_log: str = "rows"):
    rate = CONV_RATE * replicas if rate is None else rate
    arrival = ({"kind": "poisson", "rate": rate} if diurnal is None else
               {"kind": "diurnal", "rate": rate, "peak_to_trough": diurnal, "period_s": 86400.0})
    return scenario_from_dict({
        "name": f"fleet{replicas}",
        "seed": 1,
        "model": "llama-3-8b",
        "gpu": "h200-sxm",
        "runtime": "cuda-graph",
        "step_log": step_log,
        "cluster": {"router": {"policy": router}, "groups": [{"name": "h200", "count": replicas}]},
        "workload": {
            "trace": {"path": str(ROOT / "data/traces/azure_2023_conv.csv"), "format": "azure"},
            "arrival": arrival,
            "duration_s": 3600 * hours,
        },
    }, base_dir=ROOT)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--replicas", type=int, default=None, help="default 64 (--day: 128)")
    ap.add_argument("--rate", type=float, default=None,
                    help="the fleet's requests/s (default replicas x 5.38, the trace's; --day: 289)")
    ap.add_argument("--day", action="store_true", help="issue 19's fleet-day: 128 replicas, 25 M "
                    "requests a day (use --hours for a slice)")
    ap.add_argument("--diurnal", type=float, default=None, metavar="PEAK_TO_TROUGH",
                    help="arrivals follow a 24 h cosine of this peak-to-trough ratio")
    ap.add_argument("--router", default="round_robin")
    ap.add_argument("--hours", type=float, default=1.0)
    ap.add_argument("--write", help="also write the run's tables into this (new) folder")
    ap.add_argument("--workers", default="1", help="N, or auto (as `llmsim run`'s default)")
    ap.add_argument("--executor", default="process", choices=("process", "ray"))
    ap.add_argument("--step-log", choices=("rows", "summary"), default="rows",
                    help="what each replica keeps of its steps (summary: their sums only)")
    ap.add_argument("--no-split", action="store_true",
                    help="the whole fleet in one engine (not replica by replica)")
    a = ap.parse_args()
    if a.day:
        a.replicas = a.replicas or DAY_REPLICAS
        a.rate = a.rate or DAY_RATE
    a.replicas = a.replicas or 64
    sc = scenario(a.replicas, a.router, a.hours, a.rate, a.diurnal, a.step_log)
    t0, c0 = time.perf_counter(), time.process_time()
    workers = a.workers if a.workers == "auto" else int(a.workers)
    out = run(sc, workers=workers, executor=a.executor,  # what `llmsim run` does
              split=not a.no_split)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    iters = sum(r.steps.rows() for r in out.result.replicas)
    sim_s = out.summary["simulate_wall_s"]
    print(f"{a.replicas} replicas, router {a.router}: {len(out.result.seqs):,} requests, "
          f"{iters:,} iterations")
    print(f"  simulate():           {sim_s:6.1f} s wall ({iters / sim_s:,.0f} iterations/s, "
          f"{len(out.result.seqs) / sim_s:,.0f} simulated requests/s)")
    print(f"  sim.run() end to end: {wall:6.2f} s wall {cpu:6.2f} s cpu")
    print(f"  engine:               {out.engine}")
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    use = out.worker_usage
    if use:
        print(f"  workers:              {len(use)} x ({', '.join(f'{u.cpu_s:.2f}' for u in use)}) s"
              f" cpu, largest {max(u.peak_rss_gib for u in use):.2f} GiB; all processes "
              f"{cpu + sum(u.cpu_s for u in use):6.1f} s cpu")
    if kids.ru_maxrss:  # process pool: its workers, as the kernel counted them
        print(f"  child processes:      {kids.ru_utime + kids.ru_stime:6.2f} s cpu, largest "
              f"{kids.ru_maxrss / 2**20:.2f} GiB; with this process "
              f"{cpu + kids.ru_utime + kids.ru_stime:6.2f} s cpu")
    print(f"  peak RSS after run:   {rss:.2f} GiB (this process)")
    load = os.getloadavg()
    print(f"  load average:         {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} "
          f"({os.cpu_count()} cores)")
    if a.hours < 24 and a.diurnal is None:
        day = (a.rate or CONV_RATE * a.replicas) * 86400
        k = day / max(len(out.result.seqs), 1)
        all_cpu = cpu + (sum(u.cpu_s for u in use) if use else kids.ru_utime + kids.ru_stime)
        print(f"  all processes:        {iters / all_cpu:,.0f} iterations and "
              f"{len(out.result.seqs) / all_cpu:,.0f} requests per CPU second")
        print(f"  a day ({day / 1e6:.1f} M requests, x{k:.0f}): {wall * k / 60:6.1f} min wall, "
              f"{all_cpu * k / 60:6.1f} min cpu (all processes), {iters * k / 1e6:,.0f} M "
              f"iterations")
    if a.write:
        t5 = time.perf_counter()
        out.write(a.write, plots=False)
        print(f"  writing tables: {time.perf_counter() - t5:6.1f} s wall")
        print(f"  peak RSS:       {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.2f} GiB")


if __name__ == "__main__":
    main()
