"""Routers: which replica serves a new request. Plain classes; they never touch the clock.

A router sees what a real one could see: its own count of requests it dispatched that
have not finished (exact — responses stream back through it), and each replica's queue
length and KV-cache use as last reported (`ReplicaLoad`, refreshed by the engine every
`router.staleness_s` seconds, or kept current when that is 0).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from operator import attrgetter
from typing import Literal

import numpy as np


@dataclass(frozen=True)
class RouterSpec:
    # round_robin, random: blind; least_outstanding: fewest requests dispatched and not
    # finished (the router's own count, always current); least_kv: lowest reported KV use;
    # power_of_two: the less outstanding of two drawn at random; affinity: requests with
    # the same leading prefix block (a conversation, a shared system prompt) stay on one
    # replica while it is not more than `affinity_slack` requests busier than the least
    # outstanding one, where prefix caching can reuse their KV
    policy: Literal["round_robin", "random", "least_outstanding", "least_kv", "power_of_two",
                    "affinity"] = "round_robin"
    # replicas report queue length and KV use every staleness_s seconds (0: always current)
    staleness_s: float = field(default=0.0, metadata={"ge": 0, "le": 3600})
    affinity_slack: int = field(default=8, metadata={"ge": 0})


@dataclass
class ReplicaLoad:
    """One replica as the router knows it."""

    outstanding: int = 0      # dispatched by this router and not finished (always current)
    waiting: int = 0          # queued, not yet admitted (as last reported)
    kv_used: float = 0.0      # fraction of KV blocks in use (as last reported)


_OUTSTANDING = attrgetter("outstanding")


class RoundRobin:
    uses_reports = False  # looks only at what it knows itself

    def __init__(self, spec: RouterSpec, rng: np.random.Generator):
        self.next = 0

    def choose(self, key: int | None, loads: list[ReplicaLoad]) -> int:
        i = self.next % len(loads)
        self.next = i + 1
        return i


class RandomRouter:
    uses_reports = False

    def __init__(self, spec: RouterSpec, rng: np.random.Generator):
        self.rng = rng

    def choose(self, key: int | None, loads: list[ReplicaLoad]) -> int:
        return int(self.rng.integers(len(loads)))


def least_outstanding(loads: list[ReplicaLoad]) -> int:
    """Fewest outstanding requests; ties go to the lowest index."""
    return loads.index(min(loads, key=_OUTSTANDING))


class LeastOutstanding:
    uses_reports = False

    def __init__(self, spec: RouterSpec, rng: np.random.Generator):
        pass

    def choose(self, key: int | None, loads: list[ReplicaLoad]) -> int:
        return least_outstanding(loads)


class LeastKV:
    uses_reports = True  # KV use and queue length come from the replicas' reports

    def __init__(self, spec: RouterSpec, rng: np.random.Generator):
        pass

    def choose(self, key: int | None, loads: list[ReplicaLoad]) -> int:
        return min(range(len(loads)), key=lambda i: (loads[i].kv_used, loads[i].waiting,
                                                     loads[i].outstanding, i))


class PowerOfTwo:
    """Two replicas drawn at random; the one with fewer outstanding requests wins."""

    uses_reports = False

    def __init__(self, spec: RouterSpec, rng: np.random.Generator):
        self.rng = rng

    def choose(self, key: int | None, loads: list[ReplicaLoad]) -> int:
        n = len(loads)
        if n == 1:
            return 0
        a = int(self.rng.integers(n))
        b = int(self.rng.integers(n - 1))
        b += b >= a  # a second, different replica
        return a if loads[a].outstanding <= loads[b].outstanding else b


class Affinity:
    """Requests sharing a leading prefix block stay together (where their KV is cached);
    a new key, or one whose replica is more than `affinity_slack` requests busier than the
    least outstanding replica, goes to the least outstanding one and stays there."""

    uses_reports = False

    def __init__(self, spec: RouterSpec, rng: np.random.Generator):
        self.slack = spec.affinity_slack
        self.home: dict[int, int] = {}

    def choose(self, key: int | None, loads: list[ReplicaLoad]) -> int:
        best = least_outstanding(loads)
        if key is None:
            return best
        i = self.home.get(key)
        if i is None or loads[i].outstanding > loads[best].outstanding + self.slack:
            self.home[key] = i = best
        return i


ROUTERS = {
    "round_robin": RoundRobin,
    "random": RandomRouter,
    "least_outstanding": LeastOutstanding,
    "least_kv": LeastKV,
    "power_of_two": PowerOfTwo,
    "affinity": Affinity,
}


def make_router(spec: RouterSpec, rng: np.random.Generator):
    return ROUTERS[spec.policy](spec, rng)
