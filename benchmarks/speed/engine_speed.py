"""Speed of the simulator's hot loop on the Azure 2023 conversation trace.

    python benchmarks/speed/engine_speed.py [--repeat 3]

Simulates the 19,366-request, one-hour trace on one replica (the reference
stack's scheduler settings) under both runtimes and prints wall time, simulated
requests per wall second and iterations per wall second (median of repeats;
only `simulate()` is timed: no YAML, trace parsing or output writing). It also
prints the process CPU time, steadier than wall time on a shared machine.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from sim.config.scenario import load_scenario
from sim.engine.build import build_fleet
from sim.engine.processes import simulate
from sim.engine.runner import prepare

ROOT = Path(__file__).resolve().parents[2]
SCENARIO = ROOT / "scenarios" / "azure_conv_reference.yaml"


def time_once(runtime: str) -> tuple[float, float, int, int]:
    sc = load_scenario(SCENARIO, {"runtime": runtime})
    configs, wl, rng = prepare(sc)
    fleet = build_fleet(sc, configs, rng)
    t0, c0 = time.perf_counter(), time.process_time()
    res = simulate(wl, fleet.replicas, fleet.router)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    return wall, cpu, len(res.seqs), len(res.steps.t_end)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    print(f"{'runtime':24} {'requests':>9} {'iterations':>10} {'wall s':>7} {'cpu s':>6} "
          f"{'req/s':>9} {'iter/s':>9}")
    for runtime in ("h200-eager-reference", "h200-eager-live", "cuda-graph"):
        runs = [time_once(runtime) for _ in range(a.repeat)]
        wall = statistics.median(r[0] for r in runs)
        cpu = statistics.median(r[1] for r in runs)
        _, _, n, it = runs[0]
        print(f"{runtime:24} {n:9d} {it:10d} {wall:7.2f} {cpu:6.2f} {n / wall:9.0f} "
              f"{it / wall:9.0f}")


if __name__ == "__main__":
    main()
