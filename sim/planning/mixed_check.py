"""The fleet check of a mixed-fleet plan (`sim/planning/mixed.py`): an option's pools
simulated as one fleet behind the length router, the replica count moved until it holds.

`check_option` runs the option's fleet at the target plus the margin for
`search.fleet_traffic_s` on fresh seeds, measured over the steady rule's window, the
whole fleet's SLOs deciding and each pool's own requests telling which pool to grow.
The traffic is the plan's workload (`sim/planning/mixed_stream.py`): Poisson over the
drawn lengths, or the workload's own stream replayed (seed i: its own window), so every
option checked sees the same requests at the same times on a seed.

90 % intervals of the fleet that holds (`sim/planning/uncertainty.py`, b the step model's
`interval_band` over the fleet's lookups): its p99s' `latency_interval` over the seeds,
[seed low / (1 + b), seed high / (1 - b)], the seed term pooled over the plan's fleets
that held (`pooled_p99s`, `tried_groups`, `seed_pools`); per pool, the replicas needed
when each replica's capacity moves within its `rate_interval` [1 - b, 1 + b] of what the
check found (`replicas_needed` of the pool's serving replicas: (n - spare) / (1 +- b)
rounded up, + the spare), and $/hour from those.
"""

from __future__ import annotations

import math

from sim.planning.capacity import SLO, violations
from sim.planning.mixed_stream import steady_for, stream_overrides, traffic
from sim.planning.mixedspec import POOL_NAMES, MixedPlanSpec, _base, describe
from sim.planning.planspec import plan_scenario
from sim.planning.steady import window, windowed_summary
from sim.planning.uncertainty import (
    fleet_group,
    interval_band,
    latency_interval,
    measured_share,
    p99_intervals,
    pool_words,
    rate_interval,
    replicas_needed,
    stands_on,
)


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
    scen = plan_scenario(spec)
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
    last = _last(tries)
    opt["pools"] = last["pools_at"]
    return {"option": option["label"], "fleet": last["fleet"], "pools": opt["pools"], "holds": last["holds"],
            **fleet_intervals(spec, last, gpu_usd_h),
            "usd_per_hour": last["usd_per_hour"], "ttft_p99_s": last["ttft_p99_s"],
            "tpot_p99_s": last["tpot_p99_s"], "e2e_p99_s": last["e2e_p99_s"], "seeds": seeds,
            "rate": spec.search.sizing_rate(spec.target_rate), "traffic_s": spec.search.fleet_traffic_s,
            "fleets_run": len(tries), "tries": tries}


def fleet_intervals(spec: MixedPlanSpec, tried: dict, gpu_usd_h: dict[str, float]) -> dict:
    """90 % intervals of a checked fleet (module docstring): replicas per pool and $/hour;
    p99s over its seeds. b is the step model's `interval_band` over the fleet's lookups."""
    prov = tried.get("lookup_provenance")
    b = interval_band(prov)
    extra = 1 if spec.search.redundancy == "n+1" else 0
    # each pool's load in units of one replica's capacity as checked: its serving replicas
    reps = {p["name"]: replicas_needed(max(p["replicas"] - extra, 1), rate_interval(1.0, 1.0, b), extra,
                                       spec.search.min_replicas)
            for p in tried["pools_at"]}
    out = {"interval90_model": b, "measured_share": measured_share(prov), "stands_on_lookups": stands_on(prov),
           "replicas_interval90": reps,
           "usd_per_hour_interval90": tuple(sum(reps[p["name"]][i] * gpu_usd_h[p["gpu"]]
                                                for p in tried["pools_at"]) for i in (0, 1))}
    for k in ("ttft", "tpot", "e2e"):
        out[f"{k}_p99_interval90_s"] = latency_interval(tried.get(f"{k}_p99_seeds_s") or [], b)
    return out


def _last(tries: list[dict]) -> dict:
    """The fleet a check reports: the last that held, else the last tried."""
    return [t for t in tries if t["holds"]][-1] if any(t["holds"] for t in tries) else tries[-1]


def tried_groups(check: dict) -> list[dict]:
    """A check's seed groups for the fleets' pooled seed term (`uncertainty.seed_pools`):
    one per fleet tried (passed: it held on every seed)."""
    return [fleet_group(f"fleet {t['fleet']}", t["holds"], {k: t.get(f"{k}_p99_seeds_s") for k in ("ttft", "tpot", "e2e")})
            for t in check["tries"]]


def pooled_p99s(check: dict, pool: dict[str, dict]) -> dict:
    """A check's p99 intervals again, on the pooled seed term `pool`, and what it stands on."""
    last = _last(check["tries"])
    return {**p99_intervals({k: last.get(f"{k}_p99_seeds_s") or [] for k in ("ttft", "tpot", "e2e")},
                            check["interval90_model"], pool),
            "seed_term": pool_words(pool)}


def _usd(option: dict, gpu_usd_h: dict[str, float]) -> float:
    return sum(p["replicas"] * gpu_usd_h[p["gpu"]] for p in option["pools"])


def _seed(spec: MixedPlanSpec) -> int:
    from sim.config.scenario import load_scenario

    return load_scenario(plan_scenario(spec), _base(spec)).seed
