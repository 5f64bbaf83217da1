"""A fleet of identical replicas behind one router, at one request rate.

`simulate_fleet(scenario, replicas, seed, router)` runs the scenario as a cluster
(`sim/cluster.py`) of `replicas` copies of its deployment behind `router` (a
`RouterSpec`: policy, staleness_s, affinity_slack, as a scenario's `cluster.router`;
default the random router), and returns the fleet's requests (with a replica index),
its pooled summary (the same keys as a run summary: `ttft_s.p99`, `goodput`, ...; its
`stands_on` names the router) and each replica's iterations. A `cluster:` section the
scenario may have is replaced: the plan sizes one kind of replica. (Before the cluster
engine landed this was N independent single-replica runs on random 1/N thinnings of
one workload — the same thing for a random router.)
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import pandas as pd

from .cluster import RouterSpec
from .scenario import Scenario, scenario_from_dict

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
    from .runner import run

    if replicas < 1:
        raise ValueError("a fleet needs at least one replica")
    data = scenario_dict(scenario)
    data["seed"] = seed
    data["cluster"] = {"router": dataclasses.asdict(router), "groups": [{"name": "r", "count": replicas}]}
    out = run(scenario_from_dict(data, file=scenario.file or None, base_dir=scenario.base_dir or None))
    names = [r.name for r in out.result.replicas]
    index = {n: i for i, n in enumerate(names)}
    req = out.requests.rename(columns={"replica": "replica_name"})
    req.insert(0, "replica", req.replica_name.map(index).astype(int))
    steps = [out.steps[out.steps.replica == n].drop(columns="replica").reset_index(drop=True) for n in names]
    summary = {**out.summary, "stands_on": f"the cluster engine, {router_label(router)} (sim/fleet.py)"}
    return FleetResult(replicas, req, summary, steps)


def router_label(router: RouterSpec) -> str:
    """The router in words, with the settings its policy reads: 'random router',
    'least_kv router (reports 0.1 s stale)', 'affinity router (slack 8)'."""
    from .router import ROUTERS

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
