"""Speed of `llmsim plan` over a day: the day plan (sim/planning/dayplan.py) of
Llama-3-8B replicas serving a diurnal day (illustrative cosine, peak/trough 4, mean
`--rate` requests/s, Azure conversation lengths) on each GPU of `--gpus`, with the
default policy grid of `day:` (HPA on utilisation 0.5 / 0.7 and on queue 4 / 8, the
SLO-attainment policy at 0.99, the bound's schedule x1 / x1.25, and static peak: nine
whole days simulated per GPU type), SLOs p99 TTFT <= 2 s and TPOT <= 100 ms, attainment
target 99 %.

    python benchmarks/speed/day_plan_speed.py [--hours 24] [--rate 10] [--gpus l40s,a100-80gb]
    python benchmarks/speed/day_plan_speed.py --plan plans/day_8b.yaml [--no-screen]

`--hours` is the day's length and its cycle's period (a compressed day: the same cosine in
fewer hours); `--plan` times a plan file instead. Fleets are screened (`day.screen`,
sim/planning/dayscreen.py) unless `--no-screen` (every fleet's whole day, as before the
screen). Prints the load average, the wall and CPU time of the whole plan (this process
and its workers), the fleets simulated whole and screened, and the recommendation.
The test suite runs `--hours 0.02 --rate 2 --gpus l40s --policies schedule`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # this checkout's sim, not an installed one

from sim.planning.dayplan import day_lines, run_day_plan  # noqa: E402
from sim.planning.planspec import load_plan  # noqa: E402


def files(folder: Path, hours: float, rate: float, gpus: list[str], policies: str | None,
          screen: bool = True) -> Path:
    scen = {
        "name": "day_plan_speed", "seed": 1, "model": "llama-3-8b", "gpu": gpus[0], "runtime": "vllm",
        "slo": {"ttft_s": 2.0, "tpot_s": 0.1},
        "cluster": {"groups": [{"name": "pool", "count": 1}],
                    "autoscale": {"policy": "queue", "target": 8, "max_replicas": 8, "scrape_s": 15,
                                  "stabilization_s": 300}},
        "workload": {"trace": {"path": str(ROOT / "data/traces/azure_2023_conv.csv"), "format": "azure"},
                     "arrival": {"kind": "diurnal", "rate": rate, "peak_to_trough": 4,
                                 "period_s": 3600 * hours},
                     "duration_s": 3600 * hours},
    }
    (folder / "scenario.json").write_text(json.dumps(scen))
    day: dict = {"attainment": 0.99, "window_s": max(60.0, 3600 * hours / 24), "seeds": 1, "screen": screen}
    if policies:
        day["policies"] = {"schedule": [1.0]} if policies == "schedule" else json.loads(policies)
    plan = {"name": "day_plan_speed", "scenario": "scenario.json",
            "slo": {"ttft_p99_s": 2.0, "tpot_p99_s": 0.1}, "search": {"seeds": 1},
            "router": {"policy": "least_outstanding"}, "candidates": {"gpu": gpus}, "day": day}
    (folder / "plan.yaml").write_text(json.dumps(plan))
    return folder / "plan.yaml"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hours", type=float, default=24.0, help="the day's length and period")
    ap.add_argument("--rate", type=float, default=10.0, help="the day's mean requests/s")
    ap.add_argument("--gpus", default="l40s,a100-80gb")
    ap.add_argument("--policies", default=None, help="'schedule', or a JSON policy -> thresholds map")
    ap.add_argument("--workers", type=int, default=None)
    ap.add_argument("--plan", type=Path, default=None, help="time this plan file instead")
    ap.add_argument("--no-screen", action="store_true", help="simulate every fleet's whole day")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        if a.plan is not None:
            spec = load_plan(a.plan)
            spec = dataclasses.replace(spec, day=dataclasses.replace(spec.day, screen=not a.no_screen))
            object.__setattr__(spec, "file", str(a.plan))
            what = f"{a.plan}"
        else:
            spec = load_plan(files(Path(tmp), a.hours, a.rate, a.gpus.split(","), a.policies,
                                   not a.no_screen))
            what = f"{a.hours:g} h day at mean {a.rate:g} req/s, GPUs {a.gpus}"
        load = os.getloadavg()[0]
        t0, c0 = time.perf_counter(), time.process_time()
        result = run_day_plan(spec, workers=a.workers)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    ok = [f for f in result["fleets"] if f["status"] == "ok"]
    screened = sum(f["status"] == "screened" for f in result["fleets"])
    requests = sum(f["requests"] * len(f["seeds"]) for f in ok)
    print(f"day plan ({'screened' if spec.day.screen else 'every whole day'}): {what}: {len(ok)} fleets "
          f"simulated whole ({requests:,} requests), {screened} screened, probes for "
          f"{len(result['candidates'])} candidates")
    print(f"  wall {wall:6.1f} s, CPU {cpu + kids.ru_utime + kids.ru_stime:6.1f} s (this process and its "
          f"workers); load average {load:.1f} -> {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    print("\n".join(day_lines(result)))


if __name__ == "__main__":
    main()
