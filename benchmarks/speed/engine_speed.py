"""Speed of the simulator's hot loop on the Azure 2023 conversation trace.

    python benchmarks/speed/engine_speed.py [--repeat 3] [--duration-s S]

Simulates the 19,366-request, one-hour trace on one replica (the reference
stack's scheduler settings) under both runtimes and prints wall time, simulated
requests per wall second and iterations per wall second (median of repeats;
only `simulate()` is timed: no YAML, trace parsing or output writing). It also
prints the process CPU time, steadier than wall time on a shared machine. `--duration-s`
keeps only the trace's first S seconds (the test suite runs `--repeat 1 --duration-s 20`).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # this checkout's sim, not an installed one

from sim.config.scenario import load_scenario  # noqa: E402
from sim.engine.build import build_fleet  # noqa: E402
from sim.engine.processes import simulate  # noqa: E402
from sim.engine.runner import prepare  # noqa: E402

SCENARIO = ROOT / "scenarios" / "azure_conv_reference.yaml"


def time_once(runtime: str, duration_s: float | None) -> tuple[float, float, int, int]:
    overrides = {"runtime": runtime}
    if duration_s is not None:
        overrides["workload.duration_s"] = duration_s
    sc = load_scenario(SCENARIO, overrides)
    configs, wl, rng = prepare(sc)
    fleet = build_fleet(sc, configs, rng)
    t0, c0 = time.perf_counter(), time.process_time()
    res = simulate(wl, fleet.replicas, fleet.router)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    return wall, cpu, len(res.seqs), len(res.steps.t_end)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--duration-s", type=float, help="only the trace's first S seconds")
    a = ap.parse_args()
    print(f"{'runtime':24} {'requests':>9} {'iterations':>10} {'wall s':>7} {'cpu s':>6} "
          f"{'req/s':>9} {'iter/s':>9}")
    for runtime in ("h200-eager-reference", "h200-eager-live", "cuda-graph"):
        runs = [time_once(runtime, a.duration_s) for _ in range(a.repeat)]
        wall = statistics.median(r[0] for r in runs)
        cpu = statistics.median(r[1] for r in runs)
        _, _, n, it = runs[0]
        print(f"{runtime:24} {n:9d} {it:10d} {wall:7.2f} {cpu:6.2f} {n / wall:9.0f} "
              f"{it / wall:9.0f}")


if __name__ == "__main__":
    main()
