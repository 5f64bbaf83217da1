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
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pandas as pd

from sim.config.scenario import Scenario, scenario_from_dict
from sim.planning.units import fleet_cluster, unit_of
from sim.policies.router import RouterSpec

if TYPE_CHECKING:
    from sim.planning.planspec import PlanSpec

RANDOM_ROUTER = RouterSpec(policy="random")


@dataclass
class FleetResult:
    replicas: int
    requests: pd.DataFrame  # every request; `replica` is 0..replicas-1, `replica_name` the engine's
    summary: dict  # the cluster run's summary (pooled over replicas)
    replica_steps: list[pd.DataFrame]  # each replica's iterations


def simulate_fleet(scenario: Scenario, replicas: int, seed: int,
                   router: RouterSpec = RANDOM_ROUTER) -> FleetResult:
    """Simulate `replicas` copies of the scenario's deployment behind `router`."""
    from sim.engine.runner import run

    if replicas < 1:
        raise ValueError("a fleet needs at least one replica")
    data = scenario_dict(scenario)
    data["seed"] = seed
    data["cluster"] = fleet_cluster(scenario, replicas, router)
    out = run(scenario_from_dict(data, file=scenario.file or None, base_dir=scenario.base_dir or None))
    names = [r.name for r in out.result.replicas]
    index = {n: i for i, n in enumerate(names)}
    req = out.requests.rename(columns={"replica": "replica_name"})
    req.insert(0, "replica", req.replica_name.map(index).astype(int))
    steps = [out.steps[out.steps.replica == n].drop(columns="replica").reset_index(drop=True) for n in names]
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
    each fleet behind the plan's router. Each count's p99s are the worst seed's, its
    output tokens per request the mean over seeds."""
    from sim.config.scenario import load_scenario
    from sim.planning.capacity import violations
    from sim.planning.planspec import plan_scenario
    from sim.planning.traffic import probe_overrides

    scen = plan_scenario(spec)
    base = {"slo": spec.slo.as_scenario_slo(), **cand}
    base_sc = load_scenario(scen, base)
    seeds = [base_sc.seed + 100 + i for i in range(spec.search.seeds)]
    unit = unit_of(base_sc)  # n units of it: requests per replica as in the probes
    checks: dict[int, dict] = {}

    def check(n: int) -> bool:
        if n < 1:
            return False
        if n not in checks:
            sc = load_scenario(scen, {**base, **probe_overrides(
                base_sc, spec.arrival, spec.target_rate, spec.search.requests * n * unit.replicas)})
            runs = [simulate_fleet(sc, n, seed, spec.router).summary for seed in seeds]
            broke = [v for s in runs for v in violations(s, spec.slo)]
            checks[n] = {"replicas": n, "passed": not broke, "broke": "; ".join(dict.fromkeys(broke)),
                         **{f"{k}_p99_s": max(s[f"{k}_s"]["p99"] or math.inf for s in runs)
                            for k in ("ttft", "tpot", "e2e")},
                         "goodput": min((s["goodput"] or {}).get("fraction_met", 1.0) for s in runs),
                         "output_tokens_per_request": sum(
                             s["output_token_throughput"] / max(s["request_throughput"], 1e-12)
                             for s in runs) / len(runs)}
        return checks[n]["passed"]

    n = row["replicas"]
    if check(n):  # bisect down to the smallest passing count (0 replicas always fail)
        lo, hi = 0, n
        guess = math.ceil(spec.target_rate / row["fail_rate"]) if row.get("fail_rate") else 1
        for mid in (guess, guess - 1):  # the likely answer and its neighbour first
            if lo < mid < hi:
                lo, hi = (lo, mid) if check(mid) else (mid, hi)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if check(mid) else (mid, hi)
        n = hi
    else:  # up, never past search.max_replicas (where no count holds, `holds` is False)
        while n < spec.search.max_replicas and not check(n + 1):
            n += 1
        n = min(n + 1, spec.search.max_replicas)
    ok = check(n)
    fewer = check(n - 1) if n > 1 else False
    return {"candidate": row["candidate"], "replicas": n, "estimated_replicas": row["replicas"],
            "holds": ok, "one_fewer_breaks": not fewer, "seeds": seeds,
            "router": dataclasses.asdict(spec.router), "router_label": router_label(spec.router),
            "checks": [checks[k] for k in sorted(checks)]}
