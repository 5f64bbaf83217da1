"""Wall time of `llmsim plan` on the README's example (plans/chat_8b.yaml:
3 GPU types x 3 TP degrees x 2 policies), with 2 worker processes: steady-state probes
(sim/planning/steady.py), 10-minute fleet checks and the headroom search.

    python benchmarks/speed/plan_speed.py [--plan FILE] [--workers 2]

`--plan` times another plan file instead (the test suite times a one-candidate plan).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # this checkout's sim, not an installed one

from sim.planning.plan import run_plan  # noqa: E402
from sim.planning.planspec import load_plan  # noqa: E402

if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--plan", type=Path, default=ROOT / "plans" / "chat_8b.yaml")
    ap.add_argument("--workers", type=int, default=2)
    a = ap.parse_args()
    spec = load_plan(a.plan)
    t0, c0 = time.perf_counter(), time.process_time()
    result = run_plan(spec, workers=a.workers)
    wall = time.perf_counter() - t0
    cpu = time.process_time() - c0 + sum(os.times()[2:4])  # this process + its workers
    rows = result["candidates"]
    runs = sum(r.get("runs", 0) for r in rows)
    rec = result["recommended"]
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    traffic = sum(r.get("probe_traffic_s", 0) for r in rows)
    checks = result.get("fleet_checks") or []
    counts = sum(len(c["checks"]) for c in checks)
    print(f"{len(rows)} candidates ({sum(r['status'] == 'skipped' for r in rows)} skipped), "
          f"{runs} steady probes ({traffic / 3600:.1f} h of simulated traffic) + {len(checks)} fleet "
          f"check(s) ({counts} replica counts x {len(checks[0]['seeds']) if checks else 0} seeds x "
          f"{checks[0]['traffic_s'] if checks else 0:g} s) + headroom; wall {wall:.1f} s, CPU {cpu:.1f} s")
    if rec:
        head = rec.get("headroom") or {}
        print(f"recommended {rec['candidate']} x {rec['replicas']}, fleet check {result['fleet_check']['holds']}, "
              f"headroom +{head.get('over_target', 0):.0%}")
