"""Speed and memory of a large fleet: 64 Llama-3-8B replicas on H200s serving 64x the
Azure conversation trace's rate for one hour (~1.24 M requests, the trace's lengths
wrapping around, Poisson arrivals at 64 x 5.38 req/s).

    python benchmarks/fleet_speed.py [--replicas 64] [--router round_robin] [--write DIR]

Prints the wall and CPU time of simulate() and of building the tables and summary, the
peak resident memory (ru_maxrss), iterations/s and simulated requests/s. With --write,
also the time to write requests.csv / steps.csv / summary.json.
"""

from __future__ import annotations

import argparse
import resource
import time
from pathlib import Path

from sim.build import build_fleet
from sim.engine import simulate
from sim.runner import prepare, run
from sim.scenario import scenario_from_dict

ROOT = Path(__file__).resolve().parent.parent
CONV_RATE = 19366 / 3600  # the Azure conversation trace's mean rate, requests/s


def scenario(replicas: int, router: str, hours: float):
    return scenario_from_dict({
        "name": f"fleet{replicas}",
        "seed": 1,
        "model": "llama-3-8b",
        "gpu": "h200-sxm",
        "runtime": "cuda-graph",
        "cluster": {"router": {"policy": router}, "groups": [{"name": "h200", "count": replicas}]},
        "workload": {
            "trace": {"path": str(ROOT / "data/traces/azure_2023_conv.csv"), "format": "azure"},
            "arrival": {"kind": "poisson", "rate": CONV_RATE * replicas},
            "duration_s": 3600 * hours,
        },
    }, base_dir=ROOT)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--replicas", type=int, default=64)
    ap.add_argument("--router", default="round_robin")
    ap.add_argument("--hours", type=float, default=1.0)
    ap.add_argument("--write", help="also write the run's tables into this (new) folder")
    a = ap.parse_args()
    sc = scenario(a.replicas, a.router, a.hours)
    t0, c0 = time.perf_counter(), time.process_time()
    configs, wl, rng = prepare(sc)
    fleet = build_fleet(sc, configs, rng)
    t1, c1 = time.perf_counter(), time.process_time()
    res = simulate(wl, fleet.replicas, fleet.router)
    t2, c2 = time.perf_counter(), time.process_time()
    iters = sum(len(r.steps.t_end) for r in res.replicas)
    print(f"{a.replicas} replicas, router {a.router}: {len(res.seqs):,} requests, "
          f"{iters:,} iterations")
    print(f"  workload + build: {t1 - t0:6.1f} s wall {c1 - c0:6.1f} s cpu")
    print(f"  simulate():       {t2 - t1:6.1f} s wall {c2 - c1:6.1f} s cpu  "
          f"({iters / (c2 - c1):,.0f} iterations/s, {len(res.seqs) / (c2 - c1):,.0f} requests/s of cpu)")
    del res
    t3, c3 = time.perf_counter(), time.process_time()
    out = run(sc)  # the whole run again, with tables and summary (what `llmsim run` does)
    t4, c4 = time.perf_counter(), time.process_time()
    print(f"  sim.run() end to end: {t4 - t3:6.1f} s wall {c4 - c3:6.1f} s cpu")
    if a.write:
        t5 = time.perf_counter()
        out.write(a.write, plots=False)
        print(f"  writing tables: {time.perf_counter() - t5:6.1f} s")
    print(f"  peak RSS: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.2f} GiB")


if __name__ == "__main__":
    main()
