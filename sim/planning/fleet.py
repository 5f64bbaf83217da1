"""A fleet of identical replicas behind one router, at one request rate.

`simulate_fleet(scenario, replicas, seed, router)` runs the scenario as a cluster
(`sim/config/cluster.py`) of `replicas` copies of its deployment behind `router` (a
`RouterSpec`: policy, staleness_s, affinity_slack, as a scenario's `cluster.router`;
default the random router), and returns the fleet's requests (with a replica index),
its pooled summary (the same keys as a run summary: `ttft_s.p99`, `goodput`, ...; its
`stands_on` names the router) and each replica's iterations. A scenario with a
`cluster:` is a unit of its own (`sim/planning/units.py`): `replicas` such units are its
groups' counts multiplied, every group keeping its role, GPU and settings, behind
`router`; `replicas` then counts units. (Before the cluster engine landed this was N
independent single-replica runs on random 1/N thinnings of one workload — the same
thing for a random router.)

`validate_fleet(plan, row, candidate)` is a plan's fleet check: the smallest replica
count of one candidate whose fleet meets the plan's SLOs at its target rate.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pandas as pd

from sim.config.scenario import Scenario, scenario_from_dict
from sim.planning.units import fleet_cluster
from sim.policies.router import RouterSpec

if TYPE_CHECKING:
    from sim.planning.planspec import PlanSpec

RANDOM_ROUTER = RouterSpec(policy="random")


@dataclass
class FleetResult:
    replicas: int
    requests: pd.DataFrame  # every request; `replica` is 0..replicas-1, `replica_name` the engine's
    summary: dict  # the cluster run's summary (pooled over replicas)
    replica_steps: list[pd.DataFrame]  # each replica's iterations (none kept: empty)


def simulate_fleet(scenario: Scenario, replicas: int, seed: int,
                   router: RouterSpec = RANDOM_ROUTER, watch=None) -> FleetResult:
    """Simulate `replicas` copies of the scenario's deployment behind `router`. `watch`
    (sim/planning/fleetstop.py `FleetStop`): the run stops once its failure is certain,
    as the engine's watcher (a fleet simulated whole) or between replicas (one simulated
    replica by replica: sim/engine/screensplit.py); `watch.stopped` then says why, and a
    fleet stopped between replicas has the summary of the requests it simulated."""
    from sim.engine.runner import run

    if replicas < 1:
        raise ValueError("a fleet needs at least one replica")
    data = scenario_dict(scenario)
    data["seed"] = seed
    data["cluster"] = fleet_cluster(scenario, replicas, router)
    sc = scenario_from_dict(data, file=scenario.file or None, base_dir=scenario.base_dir or None)
    if watch is not None:
        from sim.engine.screensplit import Screened, may_screen, run_screened

        out = run_screened(sc, watch) if may_screen(sc) else None
        if out is None:  # a fleet simulated whole: the engine's watcher
            out = run(sc, watch=watch)
        if isinstance(out, Screened):
            from sim.planning.fleetstop import partial_summary

            watch.stopped["replicas"] = out.replicas
            summary = {**partial_summary(out.requests, replicas),
                       "stands_on": f"the cluster engine, {router_label(router)} (sim/planning/fleet.py), "
                                    f"stopped after {out.replicas_run} of {out.replicas} replicas"}
            return FleetResult(replicas, out.requests, summary, [])
    else:
        out = run(sc)
    names = [r.name for r in out.result.replicas]
    index = {n: i for i, n in enumerate(names)}
    req = out.requests.rename(columns={"replica": "replica_name"})
    req.insert(0, "replica", req.replica_name.map(index).astype(int))
    steps = [out.steps[out.steps.replica == n].drop(columns="replica").reset_index(drop=True)
             for n in names] if out.step_tables is not None else []  # none: step_log summary
    summary = {**out.summary, "stands_on": f"the cluster engine, {router_label(router)} (sim/planning/fleet.py)"}
    return FleetResult(replicas, req, summary, steps)


def router_label(router: RouterSpec) -> str:
    """The router in words, with the settings its policy reads: 'random router',
    'least_kv router (reports 0.1 s stale)', 'affinity router (slack 8)'."""
    from sim.policies.router import ROUTERS

    notes = []
    if ROUTERS[router.policy].uses_reports and router.staleness_s > 0:
        notes.append(f"reports {router.staleness_s:g} s stale")
    if router.policy == "affinity":
        notes.append(f"slack {router.affinity_slack}")
    if router.policy == "length":  # a mixed fleet: pools by length, each with its own router
        notes.append(f"thresholds {', '.join(map(str, router.length_thresholds))} {router.length_by} tokens, "
                     f"{router.within} within a pool")
    return f"{router.policy} router" + (f" ({', '.join(notes)})" if notes else "")


def scenario_dict(sc: Scenario) -> dict:
    """A scenario as the plain mapping its YAML would give (loader-set fields left out)."""
    data = dataclasses.asdict(sc)
    for name in ("file", "base_dir"):
        data.pop(name, None)
    return data


def validate_fleet(spec: PlanSpec, row: dict, cand: dict) -> dict:
    """Move the replica count until N meets the SLOs (all seeds) and N - 1 does not
    (assumes more replicas never hurt: down by bisection from the estimate, else up),
    each fleet behind the plan's router, at the target rate plus `search.margin` (10 % by
    default) for `search.fleet_traffic_s`
    of traffic (10 minutes by default) on fresh seeds (none a probe used), measured over
    the steady rule's window (warm-up and cool-down left out). Each count's p99s are the
    worst seed's, its output tokens per request the mean over seeds. A cluster scenario's
    fleet is N units of it (`sim/planning/units.py`). With
    `search.redundancy: n+1` the fleet is that N plus one (the SLOs hold with one
    replica down); never under `search.min_replicas`. With `search.stop_early` a count's
    runs stop once a seed certainly fails (sim/planning/fleetstop.py: the same verdicts);
    the count settled on is run again whole if its runs were stopped, so the figures the
    plan reports of it are whole runs'."""
    s = spec.search
    seeds = fresh_seeds(spec, cand)
    rate = s.sizing_rate(spec.target_rate)
    checks: dict[int, dict] = {}
    stopped: set[int] = set()  # counts whose runs a seed's certain failure stopped

    def check(n: int, stop: bool = s.stop_early) -> bool:
        if n < 1:
            return False
        if n not in checks:
            runs = run_seeds(spec, cand, n, rate, seeds, s.fleet_traffic_s, stop)
            checks[n] = _check_row(n, runs, spec)
            if any(r.get("stopped") for r in runs):
                stopped.add(n)
        return checks[n]["passed"]

    extra = 1 if s.redundancy == "n+1" else 0
    n = max(1, row["replicas"] - extra)  # the count that must hold with one down (n+1)
    if check(n):  # bisect down to the smallest passing count (0 replicas always fail)
        lo, hi = 0, n
        guess = math.ceil(rate / row["fail_rate"]) if row.get("fail_rate") else 1
        for mid in (guess, guess - 1):  # the likely answer and its neighbour first
            if lo < mid < hi:
                lo, hi = (lo, mid) if check(mid) else (mid, hi)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if check(mid) else (mid, hi)
        n = hi
    else:  # up, never past search.max_replicas (where no count holds, `holds` is False)
        while n < s.max_replicas and not check(n + 1):
            n += 1
        n = min(n + 1, s.max_replicas)
    ok = check(n)
    fewer = check(n - 1) if n > 1 else False
    serving = max(s.min_replicas, min(n + extra, s.max_replicas))
    if serving != n:
        ok = ok and check(serving)
    if serving in stopped:  # failed (holds false), but its figures are the plan's: whole runs
        del checks[serving]
        check(serving, stop=False)
    return {"candidate": row["candidate"], "replicas": serving, "needed": n, "estimated_replicas": row["replicas"],
            "holds": ok, "one_fewer_breaks": not fewer, "redundancy": s.redundancy,
            "holds_one_down": bool(extra) and serving - 1 >= n and checks[n]["passed"],
            "seeds": seeds, "traffic_s": s.fleet_traffic_s, "rate": rate, "margin": s.margin,
            "router": dataclasses.asdict(spec.router), "router_label": router_label(spec.router),
            "checks": [checks[k] for k in sorted(checks)]}


def fresh_seeds(spec: PlanSpec, cand: dict) -> list[int]:
    """The fleet check's seeds: past every seed a probe of this plan used."""
    from sim.config.scenario import load_scenario
    from sim.planning.planspec import plan_scenario

    base = load_scenario(plan_scenario(spec), {"slo": spec.slo.as_scenario_slo(), **cand}).seed
    first = base + max(1000, spec.search.seeds)
    return [first + i for i in range(spec.search.seeds)]


def run_fleet(spec: PlanSpec, cand: dict, n: int, rate: float, seed: int, traffic_s: float | None,
              stop: bool = False) -> dict:
    """One fleet of `n` replicas at `rate` for `traffic_s` of traffic, measured over the
    steady rule's window; `traffic_s` None: the steady rule decides the length (doubling).
    `stop`: each run stops once the seed's failure is certain (sim/planning/fleetstop.py;
    the verdict is the whole run's, a stopped run's figures its simulated requests')."""
    from sim.config.scenario import load_scenario
    from sim.planning.fleetstop import fleet_stopper
    from sim.planning.planspec import plan_scenario
    from sim.planning.steady import steady_run, window, windowed_summary
    from sim.planning.traffic import probe_overrides, steady_rule

    scen = plan_scenario(spec)
    base = {"slo": spec.slo.as_scenario_slo(), **cand}
    base_sc = load_scenario(scen, base)
    rule, bounds = steady_rule(spec.search.rule(), base_sc, spec.arrival), spec.slo.bounds()

    def run_n(k: int, watch=None):  # a trace replay takes the seed's own window of the trace
        sc = load_scenario(scen, {**base, **probe_overrides(base_sc, spec.arrival, rate, k, window=seed)})
        f = simulate_fleet(sc, n, seed, spec.router, watch)
        return f.requests, f.summary

    stopper = fleet_stopper(rule, bounds, spec.slo.goodput_min) if stop else None
    if traffic_s is None:
        return steady_run(run_n, rate, rule, bounds, stopper)
    k = max(rule.min_requests, math.ceil(rate * traffic_s))
    watch = stopper(k, True) if stopper is not None else None  # one run: its last
    req, summary = run_n(k, watch)
    w = window(req, rule, bounds)
    if watch is not None and watch.stopped is not None:
        return watch.mark(windowed_summary(summary, {**w, "verdict": watch.stopped["verdict"]}, k, rate), req)
    return windowed_summary(summary, w, k, rate)


def _one_seed(spec: PlanSpec, cand: dict, n: int, rate: float, traffic_s: float | None, stop: bool,
              seed: int) -> dict:
    return run_fleet(spec, cand, n, rate, seed, traffic_s, stop)


def run_seeds(spec: PlanSpec, cand: dict, n: int, rate: float, seeds: list[int],
              traffic_s: float | None, stop: bool = False) -> list[dict]:
    """`run_fleet` for each seed, the seeds in parallel worker processes (one per CPU)."""
    import os

    workers = min(len(seeds), os.cpu_count() or 1)
    one = functools.partial(_one_seed, spec, cand, n, rate, traffic_s, stop)
    if workers <= 1:
        return [one(seed) for seed in seeds]
    from sim.planning.lifetime import worker_pool

    with worker_pool(workers) as pool:
        return list(pool.map(one, seeds))


def _check_row(n: int, runs: list[dict], spec: PlanSpec) -> dict:
    from sim.planning.capacity import violations

    broke = [v for r in runs for v in violations(r, spec.slo)]
    return {"replicas": n, "passed": not broke, "broke": "; ".join(dict.fromkeys(broke)),
            **{f"{k}_p99_s": max(r[f"{k}_s"]["p99"] or math.inf for r in runs) for k in ("ttft", "tpot", "e2e")},
            **{f"{k}_p99_seeds_s": [r[f"{k}_s"]["p99"] for r in runs] for k in ("ttft", "tpot", "e2e")},
            "goodput": min((r["goodput"] or {}).get("fraction_met", 1.0) for r in runs),
            "steady_ratio": min(r["steady"]["ratio"] for r in runs),
            "output_tokens_per_request": sum(
                r["output_token_throughput"] / max(r["request_throughput"], 1e-12) for r in runs) / len(runs),
            "lookup_provenance": runs[0].get("lookup_provenance")}


def headroom(spec: PlanSpec, cand: dict, n: int, hint: float | None = None) -> dict:
    """The highest rate `n` replicas serve within the SLOs (every seed), as a multiple of the
    target: bisection in log rate between the target plus the margin (passed by the fleet
    check) and a
    failing rate, each rate a steady-rule probe of the fleet (`search.headroom_probes`
    runs at most; `hint`: the per-replica estimate of the multiple). With
    `search.stop_early` a failing probe's runs stop once its failure is certain: the same
    verdicts, its p99s (in `tried`, never pooled) the requests finished by then."""
    from sim.planning.capacity import violations

    seeds, target = fresh_seeds(spec, cand), spec.target_rate
    lo, hi, tried = 1 + spec.search.margin, None, []  # the fleet check passed there
    f = max(hint or 1.25, lo * 1.05)
    for _ in range(spec.search.headroom_probes):
        runs = run_seeds(spec, cand, n, target * f, seeds, None, spec.search.stop_early)
        ok = not any(violations(r, spec.slo) for r in runs)
        tried.append({"factor": f, "rate": target * f, "passed": ok,  # each seed's p99s: seed_pool
                      **{f"{k}_p99_seeds_s": [r[f"{k}_s"]["p99"] for r in runs] for k in ("ttft", "tpot", "e2e")}})
        if ok:
            lo = f
        else:
            hi = f
        if hi is not None and hi / lo <= 1.05:
            break
        f = math.sqrt(lo * hi) if hi is not None else f * 1.25
    return {"factor": lo, "rate": target * lo, "over_target": lo - 1, "fail_factor": hi, "tried": tried,
            "stands_on": f"{n} replicas behind a {router_label(spec.router)}, seeds {seeds}, the steady rule"}
