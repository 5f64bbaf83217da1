"""Speed of the simulator's hot loop on the Azure 2023 conversation trace.

    python benchmarks/speed/engine_speed.py [--repeat 3] [--duration-s S] [--no-leap]

Simulates the 19,366-request, one-hour trace on one replica (the reference
stack's scheduler settings) under both runtimes and prints wall time, simulated
requests per wall second and iterations per wall second (median of repeats;
only `simulate()` is timed: no YAML, trace parsing or output writing). It also
prints the process CPU time, steadier than wall time on a shared machine, iterations per
CPU second, and the peak of Python's own allocations during one more, untimed
`simulate()` (tracemalloc: the simulation's memory, not the interpreter's). `--duration-s`
keeps only the trace's first S seconds (the test suite runs `--repeat 1 --duration-s 20`).
`--no-leap` steps one SimPy event per iteration (as LLMSIM_LEAP=0; the same results).
`--warm` times the loop alone: every timed `simulate()` runs on replicas built from the
configurations (and so the step-time models, with their memos) of one untimed run before
it, so no step time is priced cold (cold lookups are the step-time tables' cost, not the
loop's). Each row ends with the simulation's SimPy events (`events`; leaping: one per
arrival and per step another process could see, not one per iteration).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import tracemalloc
from pathlib import Path
from unittest.mock import patch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # this checkout's sim, not an installed one

from sim.config.scenario import load_scenario  # noqa: E402
from sim.engine import processes  # noqa: E402
from sim.engine.build import build_fleet  # noqa: E402
from sim.engine.processes import Clock, simulate  # noqa: E402
from sim.engine.runner import prepare  # noqa: E402

SCENARIO = ROOT / "scenarios" / "azure_conv_reference.yaml"


class Counted(Clock):
    """The engine's clock, counting the events it processes."""

    events = 0

    def step(self) -> None:
        Counted.events += 1
        super().step()


def time_once(runtime: str, duration_s: float | None, leap: bool, traced: bool = False,
              warm: bool = False) -> tuple[float, float, int, int, int]:
    """(wall s, CPU s, requests, iterations, SimPy events) of one simulate(); with `traced`,
    the wall slot holds the peak MiB of Python allocations instead (tracemalloc, slow);
    with `warm`, on step-time models an untimed run warmed first."""
    overrides = {"runtime": runtime}
    if duration_s is not None:
        overrides["workload.duration_s"] = duration_s
    sc = load_scenario(SCENARIO, overrides)
    configs, wl, rng = prepare(sc)
    if warm:  # the same configurations (step-time models) for the timed run
        fleet = build_fleet(sc, configs, rng)
        simulate(wl, fleet.replicas, fleet.router, leap=leap)
    fleet = build_fleet(sc, configs, rng)
    if traced:
        tracemalloc.start()
    Counted.events = 0
    t0, c0 = time.perf_counter(), time.process_time()
    with patch.object(processes, "Clock", Counted):
        res = simulate(wl, fleet.replicas, fleet.router, leap=leap)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    if traced:
        wall = tracemalloc.get_traced_memory()[1] / 2**20
        tracemalloc.stop()
    return wall, cpu, len(res.seqs), len(res.steps.t_end), Counted.events


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--duration-s", type=float, help="only the trace's first S seconds")
    ap.add_argument("--no-leap", action="store_true", help="one SimPy event per iteration")
    ap.add_argument("--warm", action="store_true",
                    help="time the loop alone: step-time models warmed by an untimed run")
    a = ap.parse_args()
    print(f"{'runtime':24} {'requests':>9} {'iterations':>10} {'wall s':>7} {'cpu s':>6} "
          f"{'req/s':>9} {'iter/s':>9} {'iter/cpu-s':>10} {'peak MiB':>8} {'events':>8}")
    for runtime in ("h200-eager-reference", "h200-eager-live", "cuda-graph"):
        runs = [time_once(runtime, a.duration_s, not a.no_leap, warm=a.warm)
                for _ in range(a.repeat)]
        wall = statistics.median(r[0] for r in runs)
        cpu = statistics.median(r[1] for r in runs)
        _, _, n, it, events = runs[0]
        peak = time_once(runtime, a.duration_s, not a.no_leap, traced=True, warm=a.warm)[0]
        print(f"{runtime:24} {n:9d} {it:10d} {wall:7.2f} {cpu:6.2f} {n / wall:9.0f} "
              f"{it / wall:9.0f} {it / cpu:10.0f} {peak:8.1f} {events:8d}")


if __name__ == "__main__":
    main()
