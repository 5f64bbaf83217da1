"""Speed of a simulated day with autoscaling: up to 8 Llama-3-8B replicas on L40S serving a
diurnal day (illustrative cosine, peak/trough 4, mean 10 requests/s: ~0.86 M requests,
the Azure conversation trace's lengths wrapping around) under an HPA-like scaler on
outstanding requests per replica (target 8, scraped every 15 s, 300 s stabilisation;
provisioning: 60 s node start plus the weights over local NVMe).

    python benchmarks/speed/autoscale_day_speed.py [--hours 24] [--rate 10] [--replicas 8]

Prints the engine's wall time, the whole run's wall and CPU time, the peak ready count,
GPU-hours and SLO attainment. `--hours` shortens the day (the period stays 24 h, so a
short run covers the night trough only; `--period-hours` scales the cycle with it).
The test suite runs `--hours 0.01 --period-hours 0.01 --rate 2`.
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # this checkout's sim, not an installed one

from sim.config.scenario import scenario_from_dict  # noqa: E402
from sim.engine.runner import run  # noqa: E402


def scenario(replicas: int, rate: float, hours: float, period_h: float):
    return scenario_from_dict({
        "name": f"autoscale_day{replicas}",
        "seed": 1,
        "model": "llama-3-8b",
        "gpu": "l40s",
        "runtime": "vllm",
        "slo": {"ttft_s": 2.0, "tpot_s": 0.1},
        "cluster": {
            "router": {"policy": "least_outstanding"},
            "groups": [{"name": "l40s", "count": 1}],
            "autoscale": {"policy": "queue", "target": 8, "min_replicas": 1,
                          "max_replicas": replicas, "scrape_s": 15, "stabilization_s": 300,
                          "window_s": 3600 * min(hours, 1.0)},
        },
        "workload": {
            "trace": {"path": str(ROOT / "data/traces/azure_2023_conv.csv"), "format": "azure"},
            "arrival": {"kind": "diurnal", "rate": rate, "peak_to_trough": 4,
                        "period_s": 3600 * period_h},
            "duration_s": 3600 * hours,
        },
    }, base_dir=ROOT)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--replicas", type=int, default=8, help="max_replicas")
    ap.add_argument("--rate", type=float, default=10.0, help="the day's mean requests/s")
    ap.add_argument("--hours", type=float, default=24.0)
    ap.add_argument("--period-hours", type=float, default=24.0)
    a = ap.parse_args()
    sc = scenario(a.replicas, a.rate, a.hours, a.period_hours)
    t0, c0 = time.perf_counter(), time.process_time()
    out = run(sc)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    iters = sum(r.steps.rows() for r in out.result.replicas)
    sim_s = out.summary["simulate_wall_s"]
    s = out.summary["autoscale"]
    print(f"{a.hours:g} h at mean {a.rate:g} req/s, up to {a.replicas} replicas: "
          f"{len(out.result.seqs):,} requests, {iters:,} iterations")
    print(f"  simulate():           {sim_s:6.1f} s wall ({iters / sim_s:,.0f} iterations/s, "
          f"{len(out.result.seqs) / sim_s:,.0f} simulated requests/s)")
    print(f"  sim.run() end to end: {wall:6.1f} s wall {cpu:6.1f} s cpu")
    print(f"  peak ready {s['peak_ready']}, {s['gpu_hours']:.1f} GPU-hours, "
          f"{len(s['timeline'])} replica stints, SLO attainment {s['slo_attainment']:.3f}")
    print(f"  peak RSS after run:   {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.2f} GiB")


if __name__ == "__main__":
    main()
