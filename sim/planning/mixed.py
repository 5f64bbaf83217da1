"""`llmsim plan` for a mixed fleet: the cheapest mix of GPU types for a length mix, behind
the length-aware router, against the best single type.

```yaml
name: mixed_chat_docs
scenario: ../scenarios/mixed_fleet.yaml   # model, runtime, settings, the workload (lengths, arrivals)
target_rate: 8
slo: {ttft_p99_s: 2.0, tpot_p99_s: 0.06}
search: {seeds: 2}                        # SearchSpec: steady rule, margin, redundancy, ...
arrival: auto                             # the workload's own process; or poisson
mixed:
  gpus: [a100-80gb, h100-sxm, h200-sxm]   # the GPU types each pool may use
  thresholds: [1024, 2048, 3072]          # the length cuts searched (tokens)
  classes: 2                              # most pools (length classes) in a mix: 2 to 4
  length_by: prompt                       # or total (prompt + output; the oracle case)
  within: least_outstanding               # each pool's own router
```

The scenario's own `cluster:` (if any) is replaced: the plan builds the fleets itself.

1. **The length mix** (`sim/planning/mixed_stream.py`): the scenario's workload drawn
   once with its seed (at least `search.requests` x 20 requests); each length class's
   share and its requests written apart — on the Poisson path their lengths, on any
   other arrival process (trace, gamma, time-varying) the class's own sub-stream of
   arrivals, replayed at each probed rate (that module says how).
2. **Per-pool capacity** (`sim/planning/capacity.py`, `sim/planning/steady.py`): for each
   GPU type, the highest rate one replica sustains within the SLOs in steady state on
   each class's sub-workload, and on the whole workload (the single-type option).
3. **Sizing**: a pool serving share f of the target needs ceil(target x f x (1 + margin)
   / its sustained rate) replicas (+1 with `search.redundancy: n+1`, per pool); a single
   type ceil(target x (1 + margin) / rate) (+1). Every split of 2 to `classes` classes
   (a strictly increasing choice of thresholds) with every GPU type on each class, and
   every single type, is an option; its $/hour is the sum of its pools'. The search costs
   G x (S + 1) capacity searches (G GPU types, S classes: 2 per threshold with 2
   classes, every (Ti, Tj] with more) and sum over k of C(thresholds, k - 1) x G^k
   options, priced by arithmetic. The single types are options too, so the cheapest
   option never costs more than the best single type.
4. **90 % intervals** (`sim/planning/uncertainty.py`, as the rate plans): each pool's
   sustained rate lies in its `rate_interval`, [rate x (1 - b), fail rate x (1 + b)]
   (the bisection's bracket widened by b, the step model's `interval_band` over the
   lookups at the sustained rate), so its replicas (`replicas_needed`) and dollars have a
   90 % interval; a checked fleet's p99s have their `latency_interval` over its seeds
   ([seed low / (1 + b), seed high / (1 - b)]), and its replicas per pool theirs from the
   pool's capacity moving by b (`sim/planning/mixed_check.py`).
5. **The check** (`sim/planning/mixed_check.py`): the cheapest mix and the best single
   type simulated as whole fleets (the length router with the pool's own router within)
   on the same traffic at the target plus the margin for `search.fleet_traffic_s` (600 s)
   on fresh seeds, measured over the steady window; the replica count moves until the
   fleet holds with as few as it can. The recommendation is the cheaper of the two.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import os
import tempfile
from pathlib import Path
from typing import Any

import pandas as pd

from sim.io.specload import SpecError
from sim.planning.capacity import max_rate
from sim.planning.mixed_stream import length_mix, stream_overrides
from sim.planning.mixedspec import (  # noqa: F401  (the plan's spec, re-exported)
    POOL_NAMES,
    MixedPlanSpec,
    MixedSpec,
    _base,
    describe,
    is_mixed_plan,
    load_mixed_plan,
    span_label,
    spans,
)
from sim.planning.planspec import SearchSpec, load_prices, plan_scenario
from sim.planning.uncertainty import (
    fleet_pool,
    fmt_range,
    interval_band,
    interval_columns,
    measured_share,
    rate_interval,
    replicas_needed,
    seed_group,
    seed_pools,
    stands_on,
)

# ---- per-pool capacity -----------------------------------------------------------------

def pool_capacity(spec: MixedPlanSpec, gpu: str, path: Path, kind: str) -> dict:
    """One replica of `gpu` on the (sub-)workload in `path`: its sustained rate, the
    lowest failing rate, and the half-width b of the step model's 90 % error interval over
    the lookups at the sustained rate (`interval_band`)."""
    from sim.config.scenario import load_scenario
    from sim.planning.estimate import _runner
    from sim.planning.mixed_stream import steady_for

    scen = plan_scenario(spec)
    base = {**_base(spec), "gpu": gpu, **stream_overrides(path, kind)}
    try:
        sc = load_scenario(scen, base)
    except SpecError as e:
        return {"gpu": gpu, "rate": 0.0, "note": f"refused by the scenario: {e.path}: {e.message}"}
    s = spec.search
    choice = "trace" if kind == "replay" else "poisson"
    run_at = _runner(scen, base, sc, steady_for(s.rule(), sc, kind), spec.slo.bounds(), choice)
    cap = max_rate(run_at, spec.slo, [sc.seed + i for i in range(s.seeds)], s.need, s.rate_start,
                   s.rate_min, s.rate_max, s.rel_tol, s.max_probes)
    prov = cap.at_rate.summaries[0].get("lookup_provenance") if cap.at_rate else None
    # the probes as seed groups for the pooled seed term (`uncertainty.seed_pool`)
    groups = [seed_group(f"{gpu} {path.stem} probe {p.rate:.4g}/s", p.summaries,
                         p.passed and p.seeds_passed == p.seeds_run, p.rate / cap.rate)
              for p in cap.probes] if cap.rate > 0 else []
    return {"gpu": gpu, "rate": cap.rate, "fail_rate": cap.fail_rate, "probes": len(cap.probes),
            "broke": "; ".join(cap.at_fail.broke) if cap.at_fail else "", "note": "",
            "interval90_model": interval_band(prov), "measured_share": measured_share(prov),
            "stands_on": stands_on(prov), "seed_groups": groups}


def _jobs(spec: MixedPlanSpec, mix: dict) -> list[tuple]:
    keys = [k for k in mix["files"] if k != "all"]
    return [(g, k) for g in spec.mixed.gpus for k in ["all", *keys]]


def capacities(spec: MixedPlanSpec, mix: dict, workers: int) -> dict:
    """(gpu, 'all' | (lo, hi)) -> pool_capacity row, in worker processes."""
    jobs = _jobs(spec, mix)
    kind = mix["process"]
    if workers <= 1:
        return {(g, k): pool_capacity(spec, g, mix["files"][k], kind) for g, k in jobs}
    from sim.planning.lifetime import worker_pool

    with worker_pool(workers) as pool:
        futs = {(g, k): pool.submit(pool_capacity, spec, g, mix["files"][k], kind) for g, k in jobs}
        return {k: f.result() for k, f in futs.items()}


# ---- sizing ----------------------------------------------------------------------------

def replicas_for(rate: float, share: float, capacity: float, search: SearchSpec) -> int | None:
    """Replicas of one pool: ceil(rate x share x (1 + margin) / capacity) (+1 for n+1,
    never under min_replicas); None when one replica sustains nothing."""
    if capacity <= 0:
        return None
    n = math.ceil(search.sizing_rate(rate) * share / capacity - 1e-9)
    return max(search.min_replicas, n + (1 if search.redundancy == "n+1" else 0))


def options(target: float, shares: dict[tuple, float], caps: dict, gpu_usd_h: dict[str, float],
            search: SearchSpec, classes: int = 2, rate_intervals: dict | None = None) -> list[dict]:
    """Every single type and every split into 2 to `classes` length classes (a strictly
    increasing choice of the thresholds that `shares`' classes (lo, hi] are cut at) with
    every GPU type on each class, sized and priced, cheapest first (ties: fewer pools,
    then fewer replicas). `caps`: (gpu, 'all' | (lo, hi)) -> sustained rate of one
    replica; `rate_intervals`: the same keys -> the rate's 90 % interval (low, high), for
    the replicas' and dollars' 90 % intervals."""
    out = []
    gpus = sorted({g for g, _ in caps})
    rr = rate_intervals or {}
    extra = 1 if search.redundancy == "n+1" else 0

    def pool(name: str, g: str, key, share: float) -> dict:
        p = {"name": name, "gpu": g, "replicas": replicas_for(target, share, caps[(g, key)], search),
             "share": share, "sustained_rate": caps[(g, key)]}
        if (g, key) in rr:
            p["replicas_interval90"] = (replicas_needed(search.sizing_rate(target) * share, rr[(g, key)], extra,
                                                        search.min_replicas)
                                        if rr[(g, key)][0] > 0 else None)
        return p

    splits = [()] + [c for k in range(2, classes + 1)
                     for c in itertools.combinations(sorted({t for lo, hi in shares for t in (lo, hi)
                                                             if t not in (0, None)}), k - 1)]
    for cuts in splits:
        keys = ["all"] if not cuts else spans(cuts)
        if any((gpus[0], k) not in caps for k in keys):
            continue  # a class is empty at this split
        names = ("all",) if not cuts else POOL_NAMES[len(keys)]
        for assign in ([(g,) for g in gpus] if not cuts else itertools.product(gpus, repeat=len(keys))):
            pools = [pool(n, g, k, 1.0 if k == "all" else shares[k])
                     for n, g, k in zip(names, assign, keys, strict=True)]
            if any(p["replicas"] is None for p in pools):
                continue
            o = {"kind": "mix" if cuts else "single", "threshold": cuts[0] if len(cuts) == 1 else None,
                 "thresholds": list(cuts), "pools": pools,
                 "usd_per_hour": sum(p["replicas"] * gpu_usd_h[p["gpu"]] for p in pools)}
            if all(p.get("replicas_interval90") for p in pools):
                o["usd_per_hour_interval90"] = tuple(sum(p["replicas_interval90"][i] * gpu_usd_h[p["gpu"]]
                                                         for p in pools) for i in (0, 1))
            out.append(o)
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
            unit = unit_of(load_scenario(plan_scenario(spec), {**_base(spec), "gpu": g}))
        except SpecError as e:
            raise SpecError(spec.file, f"mixed.gpus[{i}]", f"'{g}' refused by the scenario: {e.message}") from None
        if unit.unpriced(prices) is not None:
            raise SpecError(spec.file, f"mixed.gpus[{i}]", f"no price for GPU '{g}' in the prices file")
        out[g] = unit.usd_per_hour(prices)
    return out


# ---- the plan --------------------------------------------------------------------------

def rate_intervals(caps: dict) -> dict:
    """(gpu, class) -> the sustained rate's 90 % interval, `rate_interval` of the bisection's
    bracket [rate, fail rate] and the capacity's `interval90_model` (sim/planning/uncertainty.py)."""
    return {k: rate_interval(v["rate"], v.get("fail_rate") or v["rate"], v.get("interval90_model", 0.0))
            for k, v in caps.items()}


def run_mixed_plan(spec: MixedPlanSpec, prices_path: str | None = None, workers: int | None = None) -> dict:
    from sim.planning.mixed_check import check_option, pooled_p99s, tried_groups

    prices = load_prices(prices_path or (str(Path(spec.file).resolve().parent / spec.prices)
                                         if spec.prices else None))
    usd = gpu_prices(spec, prices)
    workers = workers or max(1, min(os.cpu_count() or 1, 8))
    with tempfile.TemporaryDirectory(prefix="llmsim-mixed-") as tmp:
        mix = length_mix(spec, Path(tmp))
        caps = capacities(spec, mix, workers)
        groups = [g for v in caps.values() for g in v.pop("seed_groups", [])]  # not in plan.json
        rates = {k: v["rate"] for k, v in caps.items()}
        opts = options(spec.target_rate, mix["shares"], rates, usd, spec.search, spec.mixed.classes,
                       rate_intervals(caps))
        singles = [o for o in opts if o["kind"] == "single"]
        mixes = [o for o in opts if o["kind"] == "mix"]
        result: dict[str, Any] = {
            "name": spec.name, "kind": "mixed", "target_rate": spec.target_rate,
            "slo": dataclasses.asdict(spec.slo), "length_by": spec.mixed.length_by,
            "within": spec.mixed.within, "classes": spec.mixed.classes, "arrival": mix["arrival"],
            "mix": {"requests": mix["requests"], "seed": mix["seed"],
                    "class_share": {span_label(*k): v for k, v in mix["shares"].items()},
                    "interarrival_cv": {k if k == "all" else span_label(*k): v
                                        for k, v in mix["interarrival_cv"].items()},
                    "mean_output_tokens": mix["mean_output_tokens"]},
            "capacity": [{"gpu": g, "workload": k if k == "all" else span_label(*k), **v,
                          "sustained_rate_interval90": rate_intervals({0: v})[0]} for (g, k), v in caps.items()],
            "search_cost": {"capacity_searches": len(caps), "options": len(opts)},
            "options": opts, "best_single": singles[0] if singles else None,
            "best_mix": mixes[0] if mixes else None}
        checks = {}
        for key in ("best_mix", "best_single"):
            if result[key] is not None:
                checks[key] = check_option(spec, result[key], usd, mix)
    pools = seed_pools([*groups, *(g for c in checks.values() for g in tried_groups(c))])
    for c in checks.values():  # the checked fleets' p99s on the fleets' pooled seed term
        c.update(pooled_p99s(c, fleet_pool(pools)))
    result["checks"], result["seed_pool"] = checks, pools
    held = [c for c in checks.values() if c["holds"]]
    rec = min(held, key=lambda c: (c["usd_per_hour"], len(c["pools"]))) if held else None
    if rec is not None:
        per_usd = 1e6 / (spec.target_rate * mix["mean_output_tokens"] * 3600)
        rec = {**rec, "usd_per_m_output_tokens": rec["usd_per_hour"] * per_usd,
               "usd_per_m_output_tokens_interval90": tuple(u * per_usd for u in rec["usd_per_hour_interval90"]),
               "kind": "mix" if len(rec["pools"]) > 1 else "single"}
    result["recommended"] = rec
    return result


def write_mixed_plan(result: dict, out_dir: str | Path) -> Path:
    """plan.json (everything) and options.csv (every option sized; each 90 % interval as its
    `_low`/`_high` columns) in an output folder."""
    import json

    from sim.io.outdir import write_output

    def write(folder: Path) -> None:
        (folder / "plan.json").write_text(json.dumps(result, indent=2, default=str) + "\n")
        pd.DataFrame([interval_columns(
            {"option": o["label"], "kind": o["kind"], "threshold": o["threshold"],
             "thresholds": " ".join(map(str, o["thresholds"])), "usd_per_hour": o["usd_per_hour"],
             "usd_per_hour_interval90": o.get("usd_per_hour_interval90"),
             **{f"{p['name']}_{k}": p.get(k) for p in o["pools"]
                for k in ("gpu", "replicas", "replicas_interval90", "share", "sustained_rate")}})
            for o in result["options"]]).to_csv(folder / "options.csv", index=False)

    return write_output(out_dir, "plan", write, {"name": result["name"]})


def mixed_lines(result: dict) -> list[str]:
    """The plan's answer in lines (the CLI prints them)."""
    m = result["mix"]
    cv = m["interarrival_cv"].get("all")
    lines = [f"arrivals: {result['arrival']['label']}"
             + (f"; inter-arrival CV {cv:.3g}" if cv is not None else ""),
             f"length mix ({m['requests']:,} requests drawn, seed {m['seed']}), by {result['length_by']} "
             "tokens: " + ", ".join(f"{float(s):.0%} {k}" for k, s in m["class_share"].items()),
             "one replica's sustained rate (req/s, steady probes on the sub-workload it receives; "
             "90 % interval: seed bracket + the step model's 90 % error):"]
    by_gpu: dict[str, list[str]] = {}
    for c in result["capacity"]:
        by_gpu.setdefault(c["gpu"], []).append(
            f"{c['workload']} {c['rate']:.2f} ({fmt_range(c.get('sustained_rate_interval90'), '{:.2f}')})")
    lines += [f"  {g}: " + ", ".join(v) for g, v in by_gpu.items()]
    cost = result.get("search_cost")
    if cost:
        lines.append(f"searched: {cost['options']} options (up to {result.get('classes', 2)} length classes) "
                     f"from {cost['capacity_searches']} capacity searches")
    for key, name in (("best_single", "best single type"), ("best_mix", "best mix")):
        o = result[key]
        if o is not None:
            lines.append(f"{name} (estimate): {o['label']}, ${o['usd_per_hour']:.2f}/hour"
                         + (f" (90 % interval ${fmt_range(o['usd_per_hour_interval90'], '{:.2f}')})"
                            if o.get("usd_per_hour_interval90") else ""))
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
        lines.append(f"  90 % intervals: ${fmt_range(rec['usd_per_hour_interval90'], '{:.2f}')}/hour, "
                     f"TTFT99 {fmt_range(rec['ttft_p99_interval90_s'], '{:.3f}')} s, "
                     f"TPOT99 {fmt_range(rec['tpot_p99_interval90_s'], '{:.3f}')} s (seed spread + the step "
                     f"model's 90 % error ±{rec['interval90_model']:.0%}; lookups {rec['stands_on_lookups']})")
        if rec.get("seed_term"):
            lines.append(f"  the seed term stands on {rec['seed_term']}")
        single = result["checks"].get("best_single")
        if single and single["holds"] and rec["kind"] == "mix":
            lines.append(f"  saves {1 - rec['usd_per_hour'] / single['usd_per_hour']:.0%} against the best "
                         f"single type checked ({single['fleet']}, ${single['usd_per_hour']:.2f}/hour)")
    return lines
