"""Speed of the simulator under overload with rejections.

    python benchmarks/speed/overload.py [--requests 200000] [--repeat 1]

Llama-3-8B on one H200, continuous batching, 10,000 requests/s (far above what one
replica serves, so the waiting queue grows to most of the run), prompts uniform in
100..10,000 tokens: the 18 % above the 8,192-token context window are rejected as
the scheduler reaches them. Before issue 7 every rejection rebuilt the waiting
queue, so the run took time quadratic in the queue length. Prints wall and CPU
seconds of `simulate()` alone, the requests, rejections and iterations per wall second.
The test suite runs `--requests 2000`.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # this checkout's sim, not an installed one

from sim.config.scenario import scenario_from_dict  # noqa: E402
from sim.engine.build import build_fleet  # noqa: E402
from sim.engine.processes import simulate  # noqa: E402
from sim.engine.runner import prepare  # noqa: E402
from sim.policies.batch import REJECTED  # noqa: E402


def scenario(requests: int):
    return scenario_from_dict({
        "name": "overload", "seed": 1, "model": "llama-3-8b", "gpu": "h200-sxm",
        "scheduler": {"policy": "continuous", "max_num_seqs": 256, "max_num_batched_tokens": 8192},
        "workload": {
            "num_requests": requests,
            "arrival": {"kind": "poisson", "rate": 10_000},
            "prompt": {"kind": "uniform", "low": 100, "high": 10_000},
            "output": {"kind": "fixed", "value": 50},
        },
    })


def time_once(requests: int) -> tuple[float, float, int, int, int]:
    sc = scenario(requests)
    configs, wl, rng = prepare(sc)
    fleet = build_fleet(sc, configs, rng)
    t0, c0 = time.perf_counter(), time.process_time()
    res = simulate(wl, fleet.replicas, fleet.router)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    rejected = sum(s.state == REJECTED for s in res.seqs)
    return wall, cpu, len(res.seqs), rejected, len(res.steps.t_end)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=200_000)
    ap.add_argument("--repeat", type=int, default=1)
    a = ap.parse_args()
    runs = [time_once(a.requests) for _ in range(a.repeat)]
    wall = statistics.median(r[0] for r in runs)
    cpu = statistics.median(r[1] for r in runs)
    _, _, n, rej, it = runs[0]
    print(f"{'requests':>9} {'rejected':>9} {'iterations':>10} {'wall s':>7} {'cpu s':>7} "
          f"{'req/s':>9} {'iter/s':>9}")
    print(f"{n:9d} {rej:9d} {it:10d} {wall:7.2f} {cpu:7.2f} {n / wall:9.0f} {it / wall:9.0f}")


if __name__ == "__main__":
    main()
