"""The fleet check of a mixed-fleet plan (`sim/planning/mixed.py`): an option's pools
simulated as one fleet behind the length router, the replica count moved until it holds.

`check_option` runs the option's fleet at the target plus the margin for
`search.fleet_traffic_s` on fresh seeds, measured over the steady rule's window, the
whole fleet's SLOs deciding and each pool's own requests telling which pool to grow.
The traffic is the plan's workload (`sim/planning/mixed_stream.py`): Poisson over the
drawn lengths, or the workload's own stream replayed (seed i: its own window), so every
option checked sees the same requests at the same times on a seed.

Ranges of the fleet that holds: its p99s over the seeds, widened by the step model's
band over the fleet's lookups, and their 90 % prediction intervals
(`sim/planning/uncertainty.py`); per pool, replicas (n - spare) / (1 +- band) rounded up
(+ the spare): a step model off by e moves every replica's capacity by e.
"""

from __future__ import annotations

import math

from sim.planning.capacity import SLO, violations
from sim.planning.mixed_stream import steady_for, stream_overrides, traffic
from sim.planning.mixedspec import POOL_NAMES, MixedPlanSpec, _base, _scenario_path, describe
from sim.planning.steady import window, windowed_summary
from sim.planning.uncertainty import model_band, prediction_interval, stands_on


def fleet_cluster(spec: MixedPlanSpec, option: dict) -> dict:
    """The `cluster:` of an option: its pools as groups behind the length router (a single
    type: one group behind the pools' own router)."""
    groups = [{"name": p["name"], "count": p["replicas"], "gpu": p["gpu"]} for p in option["pools"]]
    m = spec.mixed
    if option["kind"] == "single":
        return {"router": {"policy": m.within}, "groups": groups}
    cuts = option.get("thresholds") or [option["threshold"]]
    return {"router": {"policy": "length", "length_thresholds": list(cuts),
                       "length_groups": list(POOL_NAMES[len(cuts) + 1]), "length_by": m.length_by,
                       "within": m.within},
            "groups": groups}


def run_option(spec: MixedPlanSpec, option: dict, seed: int, mix: dict | None = None) -> tuple[dict, dict]:
    """One seed of an option's fleet at the target plus the margin for
    `search.fleet_traffic_s` on the plan's workload (`mix`, from `length_mix`; None: the
    scenario's lengths at Poisson arrivals): (the whole fleet's windowed summary, each pool's)."""
    from sim.config.scenario import load_scenario
    from sim.engine.runner import run

    s = spec.search
    rate = s.sizing_rate(spec.target_rate)
    n = max(s.requests, math.ceil(rate * s.fleet_traffic_s))
    scen = _scenario_path(spec)
    kind = mix["process"] if mix else "poisson"
    stream = stream_overrides(mix["files"]["all"], kind) if mix and kind == "replay" else {}
    sc0 = load_scenario(scen, {**_base(spec), **stream})
    over = {**_base(spec), **stream, **traffic(sc0, kind, rate, n, window=seed - sc0.seed),
            "cluster": fleet_cluster(spec, option), "seed": seed}
    out = run(load_scenario(scen, over))
    rule, bounds = steady_for(s.rule(), sc0, kind), spec.slo.bounds()
    req = out.requests
    whole = windowed_summary(out.summary, window(req, rule, bounds), n, rate)
    pools = {}
    for p in option["pools"]:
        mine = req[req.replica.str.rsplit("-", n=1).str[0] == p["name"]]
        if len(mine) >= 8:
            w = window(mine, rule, bounds)
            pools[p["name"]] = {"broke": _pool_broke(w, spec.slo), "requests": int(len(mine)),
                                **{f"{k}_p99_s": w["stats"][f"{k}_s"]["p99"] for k in ("ttft", "tpot", "e2e")}}
    return whole, pools


def _pool_broke(w: dict, slo: SLO) -> list[str]:
    out = []
    for key, bound, name in (("ttft_s", slo.ttft_p99_s, "TTFT"), ("tpot_s", slo.tpot_p99_s, "TPOT"),
                             ("e2e_s", slo.e2e_p99_s, "E2E")):
        v = w["stats"][key]["p99"]
        if bound is not None and (v is None or v > bound):
            out.append(f"p99 {name} {v if v is None else round(v, 4)} > {bound:g} s")
    if slo.min_throughput_ratio is not None and w["ratio"] < slo.min_throughput_ratio:
        out.append(f"steady throughput {w['ratio']:.0%} of offered")
    return out


def check_option(spec: MixedPlanSpec, option: dict, gpu_usd_h: dict[str, float], mix: dict | None = None) -> dict:
    """Simulate the option's fleet (every fresh seed). While it breaks the SLOs, add
    replicas to each pool whose own requests break them (to every pool when none alone
    does): 1, then 2, 4, ... (at most `mixed.check_rounds` fleets up). Once it holds (and
    without `n+1` spares), each pool in turn, dearest GPU first, is bisected between the
    most replicas known to break (min_replicas - 1 at first) and its count, for the fewest
    with which the fleet still holds (at most `mixed.check_rounds` fleets per pool): a
    per-replica estimate can be far over what a fleet needs (a bursty stream: one replica
    takes each burst alone, a fleet shares it). The fleet reported is the last that held."""
    sc_seed = _seed(spec)
    seeds = [sc_seed + max(1000, spec.search.seeds) + i for i in range(spec.search.seeds)]
    opt = {**option, "pools": [dict(p) for p in option["pools"]]}
    tries: list[dict] = []

    def attempt() -> tuple[bool, dict[str, bool]]:
        runs = [run_option(spec, opt, seed, mix) for seed in seeds]
        broke = list(dict.fromkeys(v for whole, _ in runs for v in violations(whole, spec.slo)))
        pool_broke = {p["name"]: any(pools.get(p["name"], {}).get("broke") for _, pools in runs)
                      for p in opt["pools"]}
        tries.append({"fleet": describe(opt), "holds": not broke, "broke": "; ".join(broke),
                      "usd_per_hour": _usd(opt, gpu_usd_h), "pools_at": [dict(p) for p in opt["pools"]],
                      **{f"{k}_p99_s": max((w[f"{k}_s"]["p99"] or math.inf) for w, _ in runs)
                         for k in ("ttft", "tpot", "e2e")},
                      **{f"{k}_p99_seeds_s": [w[f"{k}_s"]["p99"] for w, _ in runs] for k in ("ttft", "tpot", "e2e")},
                      "lookup_provenance": runs[0][0].get("lookup_provenance"),
                      "pools": {name: [pools.get(name) for _, pools in runs] for name in pool_broke}})
        return not broke, pool_broke

    held, pool_broke = attempt()
    s = spec.search
    failed = {p["name"]: s.min_replicas - 1 for p in opt["pools"]}  # the most replicas known to break
    step = 1
    for _ in range(spec.mixed.check_rounds):
        if held:
            break
        for p in [p for p in opt["pools"] if pool_broke[p["name"]]] or opt["pools"]:
            failed[p["name"]] = max(failed[p["name"]], p["replicas"])
            p["replicas"] += step
        step *= 2  # 1, 2, 4, ... more: an estimate far under what the stream needs is reached
        held, pool_broke = attempt()
    if held and s.redundancy == "none":
        for p in sorted(opt["pools"], key=lambda p: -gpu_usd_h[p["gpu"]]):
            lo, hi, left = failed[p["name"]], p["replicas"], spec.mixed.check_rounds
            while hi - lo > 1 and left > 0:  # bisection: the fewest of this pool that still holds
                left -= 1
                p["replicas"] = (lo + hi) // 2
                if attempt()[0]:
                    hi = p["replicas"]
                else:
                    lo = p["replicas"]
            p["replicas"] = hi
    last = [t for t in tries if t["holds"]][-1] if any(t["holds"] for t in tries) else tries[-1]
    opt["pools"] = last["pools_at"]
    return {"option": option["label"], "fleet": last["fleet"], "pools": opt["pools"], "holds": last["holds"],
            **fleet_ranges(spec, last, gpu_usd_h),
            "usd_per_hour": last["usd_per_hour"], "ttft_p99_s": last["ttft_p99_s"],
            "tpot_p99_s": last["tpot_p99_s"], "e2e_p99_s": last["e2e_p99_s"], "seeds": seeds,
            "rate": spec.search.sizing_rate(spec.target_rate), "traffic_s": spec.search.fleet_traffic_s,
            "fleets_run": len(tries), "tries": tries}


def fleet_ranges(spec: MixedPlanSpec, tried: dict, gpu_usd_h: dict[str, float]) -> dict:
    """Ranges of a checked fleet (module docstring): replicas per pool and $/hour from the
    step model's band over its lookups; p99s over its seeds widened by that band, and
    their 90 % prediction intervals."""
    prov = tried.get("lookup_provenance")
    band = model_band(prov)
    extra = 1 if spec.search.redundancy == "n+1" else 0
    ranges = {}
    for p in tried["pools_at"]:
        serving = max(p["replicas"] - extra, 1)
        ranges[p["name"]] = tuple(max(spec.search.min_replicas, math.ceil(serving / f - 1e-9) + extra)
                                  for f in (1 + band, max(1 - band, 1e-9)))
    out = {"model_band": band, "stands_on_lookups": stands_on(prov), "replicas_range": ranges,
           "usd_per_hour_range": tuple(sum(ranges[p["name"]][i] * gpu_usd_h[p["gpu"]] for p in tried["pools_at"])
                                       for i in (0, 1))}
    for k in ("ttft", "tpot", "e2e"):
        vals = [v for v in tried.get(f"{k}_p99_seeds_s", []) if v is not None]
        out[f"{k}_p99_range_s"] = (min(vals) * (1 - band), max(vals) * (1 + band)) if vals else None
        out[f"{k}_p99_interval90_s"] = prediction_interval(vals[0], prov, vals) if vals else None
    return out


def _usd(option: dict, gpu_usd_h: dict[str, float]) -> float:
    return sum(p["replicas"] * gpu_usd_h[p["gpu"]] for p in option["pools"])


def _seed(spec: MixedPlanSpec) -> int:
    from sim.config.scenario import load_scenario

    return load_scenario(_scenario_path(spec), _base(spec)).seed
