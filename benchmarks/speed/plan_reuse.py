"""Planning that reuses work, before and after: a plan run with every seed of every probe
and every fleet's whole day (`search.lazy_seeds: false`, `day.screen: false`: the search
as it was), then as shipped (lazy seeds: sim/planning/capacity.py `max_rate`; probes and
fleet runs stopped once they certainly fail, `search.stop_early`: sim/planning/probestop.py,
sim/planning/fleetstop.py; screened day fleets: sim/planning/dayscreen.py), with the wall
and CPU time of each (this process and its workers), the steady-state runs, the fleet
counts checked and stopped, and whether the two recommend the same fleet.

    python benchmarks/speed/plan_reuse.py [--plan plans/chat_8b.yaml] [--workers 2] [--only after]

A rate plan prints each candidate whose sustained rate moved (none should: the lazy
search gives the exhaustive answer while a seed that passes at a rate passes below it);
a day plan, the fleets screened. The test suite runs a one-candidate plan.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import resource
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # this checkout's sim, not an installed one

from sim.planning.planspec import load_plan  # noqa: E402


def variant(spec, reuse: bool):
    out = dataclasses.replace(spec, search=dataclasses.replace(spec.search, lazy_seeds=reuse,
                                                                   stop_early=reuse))
    if spec.day is not None:
        out = dataclasses.replace(out, day=dataclasses.replace(spec.day, screen=reuse))
    object.__setattr__(out, "file", spec.file)
    return out


def timed(spec, workers: int) -> tuple[dict, float, float]:
    from sim.planning.dayplan import run_day_plan
    from sim.planning.plan import run_plan

    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0, c0 = time.perf_counter(), time.process_time()
    result = (run_day_plan if spec.day is not None else run_plan)(spec, workers=workers)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = time.process_time() - c0 + (after.ru_utime - kids.ru_utime) + (after.ru_stime - kids.ru_stime)
    return result, time.perf_counter() - t0, cpu


def pick(result: dict) -> str:
    rec = result.get("recommended")
    if rec is None:
        return "none"
    if "fleet" in rec:
        return f"{rec['candidate']} {rec['fleet']} ${rec['usd']:.4f}"
    return f"{rec['candidate']} x {rec['replicas']} ${rec['usd_per_hour']:.2f}/h"


def work(result: dict) -> str:
    if result.get("kind") == "day":
        caps = [c["capacity"] for c in result["candidates"]]
        fleets = result["fleets"]
        return (f"{sum(c.get('runs', 0) for c in caps)} probe runs; {len(fleets)} fleets: "
                f"{sum(f['status'] == 'ok' for f in fleets)} whole days, "
                f"{sum(f['status'] == 'screened' for f in fleets)} screened")
    rows = result["candidates"]
    counts = [c for f in result.get("fleet_checks") or [] for c in f["checks"]]
    tried = ((result.get("recommended") or {}).get("headroom") or {}).get("tried", [])
    return (f"{sum(r.get('runs', 0) for r in rows)} probe runs, "
            f"{sum(r.get('probe_traffic_s', 0) for r in rows) / 3600:.1f} h of probe traffic; "
            f"{len(counts)} fleet counts checked, {sum('stopped' in c['broke'] for c in counts)} stopped; "
            f"{len(tried)} headroom probes")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--plan", type=Path, default=ROOT / "plans" / "chat_8b.yaml")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--only", choices=("before", "after"), default=None)
    a = ap.parse_args()
    spec = load_plan(a.plan)
    print(f"{a.plan}: load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs, {a.workers} workers")
    results = {}
    for name, reuse in (("before", False), ("after", True)):
        if a.only not in (None, name):
            continue
        result, wall, cpu = timed(variant(spec, reuse), a.workers)
        results[name] = result
        print(f"  {name:6} ({'reuse' if reuse else 'exhaustive'}): wall {wall:7.1f} s, CPU {cpu:7.1f} s; "
              f"{work(result)}; recommends {pick(result)}")
    print(f"  load average {os.getloadavg()[0]:.1f} at the end")
    if len(results) == 2:
        b, f = results["before"], results["after"]
        print(f"  same recommendation: {pick(b) == pick(f)}")
        if b.get("kind") != "day":
            moved = [(x["candidate"], x.get("sustained_rate"), y.get("sustained_rate"))
                     for x, y in zip(b["candidates"], f["candidates"], strict=True)
                     if x.get("sustained_rate") != y.get("sustained_rate")]
            print(f"  sustained rates moved: {moved or 'none'}")


if __name__ == "__main__":
    main()
