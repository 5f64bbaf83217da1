"""`llmsim plan` for a mixed fleet: the cheapest mix of GPU types for a length mix, behind
the length-aware router, against the best single type.

```yaml
name: mixed_chat_docs
scenario: ../scenarios/mixed_fleet.yaml   # model, runtime, settings, the workload's lengths
target_rate: 8
slo: {ttft_p99_s: 2.0, tpot_p99_s: 0.06}
search: {seeds: 2}                        # SearchSpec: steady rule, margin, redundancy, ...
mixed:
  gpus: [a100-80gb, h100-sxm, h200-sxm]   # the GPU types each pool may use
  thresholds: [1024, 2048, 3072]          # the length split searched (tokens)
  length_by: prompt                       # or total (prompt + output; the oracle case)
  within: least_outstanding               # each pool's own router
```

The scenario's own `cluster:` (if any) is replaced: the plan builds the fleets itself.

1. **The length mix** (`length_mix`): `search.requests` x 20 requests drawn from the
   scenario's workload with its seed; for each threshold T the share of requests of
   length <= T (the short pool's), and each side's requests written as a lengths CSV.
2. **Per-pool capacity** (`sim/planning/capacity.py`, `sim/planning/steady.py`): for each
   GPU type, the highest Poisson rate one replica sustains within the SLOs in steady state
   on each side's sub-workload (a length-independent split of Poisson arrivals is Poisson
   at the side's share of the rate), and on the whole workload (the single-type option).
3. **Sizing**: a pool serving share f of the target needs ceil(target x f x (1 + margin)
   / its sustained rate) replicas (+1 with `search.redundancy: n+1`, per pool); a single
   type ceil(target x (1 + margin) / rate) (+1). Every (T, short GPU, long GPU) mix and
   every single type is an option; its $/hour is the sum of its pools'. The single types
   are options too, so the cheapest option never costs more than the best single type.
4. **The check**: the cheapest mix and the best single type are simulated as whole
   fleets (the cluster engine, the length router with the pool's own router within) at
   the target plus the margin for `search.fleet_traffic_s` (600 s) of traffic on fresh
   seeds, measured over the steady window. A fleet that breaks the SLOs gets one more
   replica in each pool whose own requests break them (the single type: one more), up to
   `mixed.check_rounds` times; a fleet that holds gives up one replica at a time, dearest
   pool first, while it still holds (not with `n+1`: its spare is kept), so the count
   moves either way as in the rate plans' check; the fleet's cost is that of the last
   count that held. The recommendation is the cheaper of the two checked fleets.
"""

from __future__ import annotations

import dataclasses
import math
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from sim.io.specload import SpecError
from sim.planning.capacity import max_rate
from sim.planning.mixedspec import (  # noqa: F401  (the plan's spec, re-exported)
    MixedPlanSpec,
    MixedSpec,
    _base,
    _scenario_path,
    describe,
    is_mixed_plan,
    load_mixed_plan,
)
from sim.planning.planspec import SearchSpec, load_prices

# ---- the length mix ------------------------------------------------------------------

def length_mix(spec: MixedPlanSpec, folder: Path) -> dict:
    """The drawn workload's share at or under each threshold, and per threshold the two
    sides' lengths CSVs in `folder` (the whole mix too, as `all`)."""
    from sim.config.scenario import load_scenario
    from sim.workload.requests import generate

    sc = load_scenario(_scenario_path(spec), _base(spec))
    n = spec.search.requests * 20
    wl = generate(dataclasses.replace(sc.workload, num_requests=n, duration_s=None),
                  np.random.default_rng(sc.seed), file=sc.file or None, path="workload",
                  base_dir=sc.base_dir or None)
    prompt, output = np.asarray(wl.prompt_tokens), np.asarray(wl.output_tokens)
    length = prompt + output if spec.mixed.length_by == "total" else prompt
    frame = pd.DataFrame({"num_prefill_tokens": prompt, "num_decode_tokens": output})
    files = {"all": folder / "all.csv"}
    frame.to_csv(files["all"], index=False)
    shares = {}
    for t in spec.mixed.thresholds:
        short = length <= t
        shares[t] = float(short.mean())
        if 0 < short.sum() < len(short):
            for side, rows in (("short", short), ("long", ~short)):
                files[(t, side)] = folder / f"{side}_{t}.csv"
                frame[rows].to_csv(files[(t, side)], index=False)
    return {"requests": n, "seed": sc.seed, "short_share": shares, "files": files,
            "mean_output_tokens": float(output.mean())}


def _lengths_overrides(path: Path) -> dict:
    return {"workload.lengths": {"path": str(path)}, "workload.prompt": None,
            "workload.output": None, "workload.trace": None}


# ---- per-pool capacity -----------------------------------------------------------------

def pool_capacity(spec: MixedPlanSpec, gpu: str, lengths: Path) -> dict:
    """One replica of `gpu` on the sub-workload in `lengths`: its sustained Poisson rate."""
    from sim.config.scenario import load_scenario
    from sim.planning.plan import _runner
    from sim.planning.traffic import steady_rule

    scen = _scenario_path(spec)
    base = {**_base(spec), "gpu": gpu, **_lengths_overrides(lengths)}
    try:
        sc = load_scenario(scen, base)
    except SpecError as e:
        return {"gpu": gpu, "rate": 0.0, "note": f"refused by the scenario: {e.path}: {e.message}"}
    s = spec.search
    rule = steady_rule(s.rule(), sc, "poisson")
    run_at = _runner(scen, base, sc, rule, spec.slo.bounds(), "poisson")
    cap = max_rate(run_at, spec.slo, [sc.seed + i for i in range(s.seeds)], s.need, s.rate_start,
                   s.rate_min, s.rate_max, s.rel_tol, s.max_probes)
    return {"gpu": gpu, "rate": cap.rate, "fail_rate": cap.fail_rate, "probes": len(cap.probes),
            "broke": "; ".join(cap.at_fail.broke) if cap.at_fail else "", "note": ""}


def _jobs(spec: MixedPlanSpec, mix: dict) -> list[tuple]:
    keys = [k for k in mix["files"] if k != "all"]
    return [(g, k) for g in spec.mixed.gpus for k in ["all", *keys]]


def capacities(spec: MixedPlanSpec, mix: dict, workers: int) -> dict:
    """(gpu, 'all' | (threshold, side)) -> pool_capacity row, in worker processes."""
    jobs = _jobs(spec, mix)
    if workers <= 1:
        return {(g, k): pool_capacity(spec, g, mix["files"][k]) for g, k in jobs}
    import concurrent.futures as cf
    import multiprocessing as mp

    from sim.planning.lifetime import die_with_parent
    from sim.planning.sweep import _START_METHOD

    with cf.ProcessPoolExecutor(workers, mp_context=mp.get_context(_START_METHOD),
                                initializer=die_with_parent, initargs=(os.getpid(),)) as pool:
        futs = {(g, k): pool.submit(pool_capacity, spec, g, mix["files"][k]) for g, k in jobs}
        return {k: f.result() for k, f in futs.items()}


# ---- sizing ----------------------------------------------------------------------------

def replicas_for(rate: float, share: float, capacity: float, search: SearchSpec) -> int | None:
    """Replicas of one pool: ceil(rate x share x (1 + margin) / capacity) (+1 for n+1,
    never under min_replicas); None when one replica sustains nothing."""
    if capacity <= 0:
        return None
    n = math.ceil(search.sizing_rate(rate) * share / capacity - 1e-9)
    return max(search.min_replicas, n + (1 if search.redundancy == "n+1" else 0))


def options(target: float, shares: dict[int, float], caps: dict, gpu_usd_h: dict[str, float],
            search: SearchSpec) -> list[dict]:
    """Every single type and every (threshold, short GPU, long GPU) mix, sized and priced,
    cheapest first (ties: fewer pools, then fewer replicas). `caps`: (gpu, 'all' |
    (threshold, side)) -> sustained rate of one replica."""
    out = []
    gpus = sorted({g for g, _ in caps})
    for g in gpus:
        n = replicas_for(target, 1.0, caps[(g, "all")], search)
        if n is not None:
            out.append({"kind": "single", "threshold": None, "pools": [
                {"name": "all", "gpu": g, "replicas": n, "share": 1.0, "sustained_rate": caps[(g, "all")]}],
                "usd_per_hour": n * gpu_usd_h[g]})
    for t, share in shares.items():
        if (gpus[0], (t, "short")) not in caps:
            continue  # one side is empty at this threshold
        for gs in gpus:
            for gl in gpus:
                ns = replicas_for(target, share, caps[(gs, (t, "short"))], search)
                nl = replicas_for(target, 1 - share, caps[(gl, (t, "long"))], search)
                if ns is None or nl is None:
                    continue
                out.append({"kind": "mix", "threshold": t, "pools": [
                    {"name": "short", "gpu": gs, "replicas": ns, "share": share,
                     "sustained_rate": caps[(gs, (t, "short"))]},
                    {"name": "long", "gpu": gl, "replicas": nl, "share": 1 - share,
                     "sustained_rate": caps[(gl, (t, "long"))]}],
                    "usd_per_hour": ns * gpu_usd_h[gs] + nl * gpu_usd_h[gl]})
    for o in out:
        o["label"] = describe(o)
    return sorted(out, key=lambda o: (o["usd_per_hour"], len(o["pools"]),
                                      sum(p["replicas"] for p in o["pools"])))


def gpu_prices(spec: MixedPlanSpec, prices: dict[str, float]) -> dict[str, float]:
    """$/hour of one replica of each GPU type (its tensor x pipeline GPUs); a type the
    scenario refuses or without a price is an error naming it."""
    from sim.config.scenario import load_scenario
    from sim.planning.units import unit_of

    out = {}
    for i, g in enumerate(spec.mixed.gpus):
        try:
            unit = unit_of(load_scenario(_scenario_path(spec), {**_base(spec), "gpu": g}))
        except SpecError as e:
            raise SpecError(spec.file, f"mixed.gpus[{i}]", f"'{g}' refused by the scenario: {e.message}") from None
        if unit.unpriced(prices) is not None:
            raise SpecError(spec.file, f"mixed.gpus[{i}]", f"no price for GPU '{g}' in the prices file")
        out[g] = unit.usd_per_hour(prices)
    return out


# ---- the plan --------------------------------------------------------------------------

def run_mixed_plan(spec: MixedPlanSpec, prices_path: str | None = None, workers: int | None = None) -> dict:
    prices = load_prices(prices_path or (str(Path(spec.file).resolve().parent / spec.prices)
                                         if spec.prices else None))
    usd = gpu_prices(spec, prices)
    workers = workers or max(1, min(os.cpu_count() or 1, 8))
    with tempfile.TemporaryDirectory(prefix="llmsim-mixed-") as tmp:
        mix = length_mix(spec, Path(tmp))
        caps = capacities(spec, mix, workers)
    rates = {k: v["rate"] for k, v in caps.items()}
    opts = options(spec.target_rate, {t: s for t, s in mix["short_share"].items()
                                      if (spec.mixed.gpus[0], (t, "short")) in caps}, rates, usd, spec.search)
    singles = [o for o in opts if o["kind"] == "single"]
    mixes = [o for o in opts if o["kind"] == "mix"]
    result: dict[str, Any] = {
        "name": spec.name, "target_rate": spec.target_rate, "slo": dataclasses.asdict(spec.slo),
        "length_by": spec.mixed.length_by, "within": spec.mixed.within,
        "mix": {"requests": mix["requests"], "seed": mix["seed"],
                "short_share": {str(t): s for t, s in mix["short_share"].items()},
                "mean_output_tokens": mix["mean_output_tokens"]},
        "capacity": [{"gpu": g, "workload": "all" if k == "all" else f"{k[1]} (threshold {k[0]})", **v}
                     for (g, k), v in caps.items()],
        "options": opts, "best_single": singles[0] if singles else None,
        "best_mix": mixes[0] if mixes else None}
    from sim.planning.mixed_check import check_option

    checks = {}
    for key in ("best_mix", "best_single"):
        if result[key] is not None:
            checks[key] = check_option(spec, result[key], usd)
    result["checks"] = checks
    held = [c for c in checks.values() if c["holds"]]
    rec = min(held, key=lambda c: (c["usd_per_hour"], len(c["pools"]))) if held else None
    if rec is not None:
        out_tok = mix["mean_output_tokens"]
        rec = {**rec, "usd_per_m_output_tokens": rec["usd_per_hour"] / (spec.target_rate * out_tok * 3600) * 1e6,
               "kind": "mix" if len(rec["pools"]) > 1 else "single"}
    result["recommended"] = rec
    return result


def write_mixed_plan(result: dict, out_dir: str | Path) -> Path:
    """plan.json (everything) and options.csv (every option sized) in an output folder."""
    import json

    from sim.io.outdir import write_output

    def write(folder: Path) -> None:
        (folder / "plan.json").write_text(json.dumps(result, indent=2, default=str) + "\n")
        pd.DataFrame([{"option": o["label"], "kind": o["kind"], "threshold": o["threshold"],
                       "usd_per_hour": o["usd_per_hour"],
                       **{f"{p['name']}_{k}": p[k] for p in o["pools"] for k in ("gpu", "replicas",
                                                                                 "share", "sustained_rate")}}
                      for o in result["options"]]).to_csv(folder / "options.csv", index=False)

    return write_output(out_dir, "plan", write, {"name": result["name"]})


def mixed_lines(result: dict) -> list[str]:
    """The plan's answer in lines (the CLI prints them)."""
    lines = [f"length mix ({result['mix']['requests']:,} requests drawn, seed {result['mix']['seed']}), "
             f"by {result['length_by']} tokens: "
             + ", ".join(f"{float(s):.0%} <= {t}" for t, s in result["mix"]["short_share"].items()),
             "one replica's sustained rate (req/s, steady probes on the sub-workload it receives):"]
    by_gpu: dict[str, list[str]] = {}
    for c in result["capacity"]:
        by_gpu.setdefault(c["gpu"], []).append(f"{c['workload']} {c['rate']:.2f}")
    lines += [f"  {g}: " + ", ".join(v) for g, v in by_gpu.items()]
    for key, name in (("best_single", "best single type"), ("best_mix", "best mix")):
        o = result[key]
        if o is not None:
            lines.append(f"{name} (estimate): {o['label']}, ${o['usd_per_hour']:.2f}/hour")
    for key, c in result["checks"].items():
        lines.append(f"fleet check of the {key.replace('_', ' ')}: {c['fleet']} at {c['rate']:g} req/s for "
                     f"{c['traffic_s']:g} s, seeds {c['seeds']}: SLOs {'hold' if c['holds'] else 'DO NOT hold'}, "
                     f"${c['usd_per_hour']:.2f}/hour, TTFT99 {c['ttft_p99_s']:.3f} s, TPOT99 {c['tpot_p99_s']:.3f} s"
                     + (f" ({len(c['tries'])} fleets run, from the estimate {c['option']})"
                        if len(c["tries"]) > 1 else ""))
    rec = result["recommended"]
    if rec is None:
        lines.append("recommended: none: no checked fleet meets the SLOs")
    else:
        lines.append(f"recommended: {rec['fleet']} ({rec['kind']}), ${rec['usd_per_hour']:.2f}/hour, "
                     f"${rec['usd_per_m_output_tokens']:.3f}/M output tokens (its fleet check)")
        single = result["checks"].get("best_single")
        if single and single["holds"] and rec["kind"] == "mix":
            lines.append(f"  saves {1 - rec['usd_per_hour'] / single['usd_per_hour']:.0%} against the best "
                         f"single type checked ({single['fleet']}, ${single['usd_per_hour']:.2f}/hour)")
    return lines
