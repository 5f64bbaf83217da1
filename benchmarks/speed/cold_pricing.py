"""What a first run spends pricing step shapes: the distinct shapes the Azure conversation
hour prices (its step-time memo after one run with the cache off) and the CPU time to price
them afresh, per shape.

    python benchmarks/speed/cold_pricing.py [--scenario FILE] [--repeat 3]

Runs `simulate()` once cold (LLMSIM_STEP_CACHE=off), then, `--repeat` times, prices every
key of its replica's memo again on a fresh latency model whose GPU profile's lookups are
cold too (decode steps, dense token counts, prefill attention, LM-head rows; keys in the
run's order), then once more warm (every lookup a memo hit): pricing = cold - warm, in
CPU seconds (`time.process_time()`), medians. sim/costmodel/stepcache.py keeps these
shapes between runs; this is what a run without that cache pays.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # this checkout's sim, not an installed one
SCENARIO = ROOT / "scenarios" / "azure_conv_reference.yaml"


def price(lat, keys: list[tuple]) -> float:
    """CPU seconds to look up every memo key on `lat`."""
    t0 = time.process_time()
    for kind, *a in keys:
        if kind == "decode":
            n, ctx_q, max_q = a
            lat.decode(n, ctx_q * n, max_q)  # sums that quantise back to the key
        elif kind == "dense":
            lat.dense_ms(*a)
        elif kind == "lm":
            lat.lm_head_ms(*a)
        elif kind == "pa":
            lat.prefill_attn_ms(*a)
    return time.process_time() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scenario", type=Path, default=SCENARIO)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    os.environ["LLMSIM_STEP_CACHE"] = "off"
    from sim.config.scenario import load_scenario
    from sim.costmodel.latency import StepLatency
    from sim.engine.build import build_fleet
    from sim.engine.processes import simulate
    from sim.engine.runner import prepare

    sc = load_scenario(a.scenario)
    configs, wl, rng = prepare(sc)
    fleet = build_fleet(sc, configs, rng)
    simulate(wl, fleet.replicas, fleet.router)
    lat = configs[0].latency
    if type(lat) is not StepLatency:
        sys.exit(f"{a.scenario.name}: not a one-stage replica")
    keys = [k for k in lat._memo if k[0] in ("decode", "dense", "lm", "pa")]
    cold, warm = [], []
    for _ in range(a.repeat):
        lat.p._memo.clear()  # the profile's lookups cold too, as in a new process
        getattr(lat.p, "bound", {}).clear()  # (and its bound lookups: sim/costmodel/bound.py)
        fresh = prepare(sc)[0][0].latency
        cold.append(price(fresh, keys))
        warm.append(price(fresh, keys))
    c, w = statistics.median(cold), statistics.median(warm)
    kinds = Counter(k[0] for k in keys)
    print(f"{a.scenario.name}: {len(keys):,} shapes priced by a first run "
          f"({', '.join(f'{n:,} {k}' for k, n in kinds.most_common())}); "
          f"CPU {c * 1e3:.0f} ms cold, {w * 1e3:.0f} ms warm (median of {a.repeat}): "
          f"{(c - w) * 1e6 / max(1, len(keys)):.1f} µs per shape")


if __name__ == "__main__":
    main()
