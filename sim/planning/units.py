"""The unit a plan sizes: one replica, or a scenario's whole `cluster:` as written.

A scenario without a `cluster:` is one replica; its unit is that replica (tensor x
pipeline GPUs of the scenario's GPU). A scenario with one is planned as the deployment
it describes: the unit is every group of the cluster (`count` replicas of tensor x
pipeline GPUs each, on the group's own GPU, in its role: both, prefill or decode),
probed as itself (the cluster engine, its router, its prefill -> decode KV link) and
priced as the sum of its pools:

    $/hour of a unit = sum over groups of count x tensor x pipeline x price(group's GPU)

A **fleet of N units** is the same cluster with every group's `count` multiplied by N,
behind the fleet's router (`fleet_cluster`); a unit of 2 prefill + 2 decode H200s
becomes 2N + 2N. The fleet of N plain replicas is the N = 1 group cluster `r` it always
was, so plans of single-replica scenarios are unchanged.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from sim.config.scenario import Scenario, group_scenario
from sim.policies.router import RouterSpec


@dataclass(frozen=True)
class Pool:
    """One group of a unit: `count` replicas of `gpus_per_replica` GPUs of type `gpu`."""

    name: str
    role: str  # both | prefill | decode
    count: int
    gpu: str
    tensor: int
    gpus_per_replica: int

    @property
    def gpus(self) -> int:
        return self.count * self.gpus_per_replica

    def usd_per_hour(self, prices: dict[str, float]) -> float:
        return self.gpus * prices[self.gpu]


@dataclass(frozen=True)
class Unit:
    pools: tuple[Pool, ...]
    clustered: bool  # the scenario has a `cluster:` (else: one plain replica)

    @property
    def gpus(self) -> int:
        return sum(p.gpus for p in self.pools)

    @property
    def replicas(self) -> int:
        return sum(p.count for p in self.pools)

    @property
    def deployment(self) -> str:
        """'disaggregated' when prefill and decode run on separate pools, else 'aggregated'."""
        return "disaggregated" if any(p.role != "both" for p in self.pools) else "aggregated"

    @property
    def tensor(self) -> int | None:
        """The tensor degree when every pool shares one, else None."""
        degrees = {p.tensor for p in self.pools}
        return degrees.pop() if len(degrees) == 1 else None

    def unpriced(self, prices: dict[str, float]) -> str | None:
        """The first GPU of the unit without a price, or None."""
        return next((p.gpu for p in self.pools if p.gpu not in prices), None)

    def usd_per_hour(self, prices: dict[str, float]) -> float:
        return sum(p.usd_per_hour(prices) for p in self.pools)

    def describe(self) -> str:
        """'1 x h100-sxm tp2', '1 x h200-sxm tp8 pp2' or '2 x h200-sxm prefill + 2 x h200-sxm decode (4 GPUs)'."""
        parts = [f"{p.count} x {p.gpu}" + (f" tp{p.tensor}" if p.tensor > 1 else "")
                 + (f" pp{p.gpus_per_replica // p.tensor}" if p.gpus_per_replica > p.tensor else "")
                 + (f" {p.role}" if p.role != "both" else "") for p in self.pools]
        return " + ".join(parts) + (f" ({self.gpus} GPUs)" if self.clustered else "")

    def as_dict(self, prices: dict[str, float] | None = None) -> dict:
        """The unit in plan.json: its pools, GPUs, deployment and (with prices) $/hour."""
        pools = [{**dataclasses.asdict(p), "gpus": p.gpus,
                  **({"usd_per_hour": p.usd_per_hour(prices)} if prices else {})} for p in self.pools]
        out = {"describe": self.describe(), "deployment": self.deployment, "gpus": self.gpus,
               "replicas": self.replicas, "pools": pools}
        if prices:
            out["usd_per_hour"] = self.usd_per_hour(prices)
        return out


def unit_of(sc: Scenario) -> Unit:
    """The unit a scenario describes (each group resolved as the engine resolves it)."""
    if sc.cluster is None:
        return Unit((Pool("r", "both", 1, sc.gpu, sc.parallel.tensor, sc.parallel.gpus),), False)
    pools = []
    for gi, group in enumerate(sc.cluster.groups):
        g = group_scenario(sc, group, f"cluster.groups[{gi}]")
        pools.append(Pool(group.name or f"g{gi}", group.role, group.count, g.gpu, g.parallel.tensor,
                          g.parallel.gpus))
    return Unit(tuple(pools), True)


def fleet_cluster(sc: Scenario, units: int, router: RouterSpec) -> dict:
    """The `cluster:` mapping of a fleet of `units` copies of the scenario's unit behind
    `router`: every group's count multiplied (its role, GPU and settings kept, and the
    prefill -> decode link), or `units` plain replicas for a scenario without a cluster."""
    if units < 1:
        raise ValueError("a fleet needs at least one unit")
    if sc.cluster is None:
        return {"router": dataclasses.asdict(router), "groups": [{"name": "r", "count": units}]}
    groups = [{k: v for k, v in dataclasses.asdict(g).items() if v is not None} | {"count": g.count * units}
              for g in sc.cluster.groups]
    return {"router": dataclasses.asdict(router), "groups": groups,
            "kv_transfer": dataclasses.asdict(sc.cluster.kv_transfer)}


def unit_noun(d: dict) -> str:
    """'unit' for a plan row, check or recommendation whose unit is several replicas (a
    cluster scenario), else 'replica'."""
    return "unit" if (d.get("unit_replicas") or 1) > 1 else "replica"
