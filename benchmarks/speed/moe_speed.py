"""Speed of simulating a Mixture-of-Experts scenario against the dense scenario of the same
request count (issue 20: within 1.5x).

    python benchmarks/speed/moe_speed.py [--requests 2000] [--repeat 3]

Pairs, each the same scenario file, traffic and request count, only the model (and the
layout it needs) changed:

* qwen3_30b_a3b_vs_8b: Qwen3-30B-A3B (128 experts, top-8) against Llama-3.1-8B, one H200;
* deepseek_r1_h200: DeepSeek-R1 at EP 8 with DP attention (8 ranks, 256 experts, latent
  attention) against Llama-3.1-70B at TP 8, fp8 on 8 x H200.

Each run is `sim.run` in this process, timed by `time.process_time()` (CPU seconds: steadier
than wall time on a shared machine), the median of the repeats after one warm-up run of
each (imports and table loads out of the way). Prints CPU seconds, iterations and
microseconds per iteration for both, and the MoE / dense ratio of CPU seconds.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # this checkout's sim, not an installed one

PAIRS = {  # scenario -> the overrides that make its dense twin
    "qwen3_30b_a3b_vs_8b": {"model": "llama-3.1-8b"},
    "deepseek_r1_h200": {"model": "llama-3.1-70b", "parallel.data": 1, "parallel.expert": 1,
                         "parallel.tensor": 8},
}


def timed(scenario: str, overrides: dict, repeat: int) -> tuple[float, int]:
    """(median CPU s, iterations) of `sim.run` of a shipped scenario with overrides."""
    from sim import run

    cpu, iterations = [], 0
    for _ in range(repeat):
        t0 = time.process_time()
        out = run(ROOT / "scenarios" / f"{scenario}.yaml", overrides)
        cpu.append(time.process_time() - t0)
        iterations = out.summary["iterations"]["total"]
    return statistics.median(cpu), iterations


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=2000, help="requests per run (both)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--only", help="one pair's scenario name")
    a = ap.parse_args(argv)
    print(f"{'scenario':<22} {'model':<16} {'CPU s':>7} {'iterations':>10} {'us/iter':>8}")
    worst = 0.0
    for scenario, dense in PAIRS.items():
        if a.only and scenario != a.only:
            continue
        n = {"workload.num_requests": a.requests}
        timed(scenario, n, 1)  # warm-up: imports, tables, memos of the process
        timed(scenario, {**n, **dense}, 1)
        rows = []
        for label, over in (("moe", n), ("dense", {**n, **dense})):
            cpu, it = timed(scenario, over, a.repeat)
            rows.append((label, cpu, it))
            model = over.get("model", "(as shipped)")
            print(f"{scenario:<22} {model:<16} {cpu:7.2f} {it:10d} {cpu / max(it, 1) * 1e6:8.0f}")
        ratio = rows[0][1] / rows[1][1]
        worst = max(worst, ratio)
        print(f"{scenario:<22} MoE / dense CPU time: {ratio:.2f}x")
    print(f"worst MoE / dense: {worst:.2f}x (target: within 1.5x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
