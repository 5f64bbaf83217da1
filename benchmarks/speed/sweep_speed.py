"""A 200-configuration sweep on each executor: identical rows, and the speed-up over
the sequential sweep.

    python benchmarks/speed/sweep_speed.py [--workers 2] [--no-ray] [--configs N] [--requests N]

`--configs N` runs only the grid's first N configurations and `--requests` sets the
requests per configuration (default 100); the test suite runs `--configs 4 --requests 20
--no-ray`.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # this checkout's sim, not an installed one

from sim.planning.sweep import configurations, run_sweep  # noqa: E402

SCENARIO = ROOT / "scenarios" / "quickstart.yaml"
GRID = [("workload.arrival.rate", [0.5 * (i + 1) for i in range(20)]),
        ("scheduler.policy", ["continuous", "chunked"]),
        ("kv.block_size", [8, 16, 32, 64, 128])]

if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--no-ray", action="store_true")
    ap.add_argument("--configs", type=int, help="only the grid's first N configurations")
    ap.add_argument("--requests", type=int, default=100, help="requests per configuration")
    a = ap.parse_args()
    configs = configurations(GRID, [])[:a.configs]
    base = {"workload.num_requests": a.requests}
    execs = ["sequential", "process"] + ([] if a.no_ray or not importlib.util.find_spec("ray") else ["ray"])
    times, tables = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        for ex in execs:
            t0 = time.perf_counter()
            run_sweep(SCENARIO, configs, Path(tmp) / ex, base=base, executor=ex, workers=a.workers)
            times[ex] = time.perf_counter() - t0
            tables[ex] = (Path(tmp) / ex / "results.csv").read_bytes()
    same = all(t == tables["sequential"] for t in tables.values())
    load = os.getloadavg()[0]
    print(f"{len(configs)} configurations, {a.workers} workers, {os.cpu_count()} CPUs, load average "
          f"{load:.1f} (other processes share the cores); rows identical across executors: {same}")
    for ex in execs:
        print(f"  {ex:10s} {times[ex]:6.1f} s  speed-up {times['sequential'] / times[ex]:.2f}x")
