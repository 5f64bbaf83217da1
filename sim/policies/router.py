"""Routers: which replica serves a new request. Plain classes; they never touch the clock.

A router sees what a real one could see: its own count of requests it dispatched that
have not finished (exact — responses stream back through it), and each replica's queue
length and KV-cache use as last reported (`ReplicaLoad`, refreshed by the engine every
`router.staleness_s` seconds, or kept current when that is 0).

`length` (a mixed fleet, `LengthAware`): pools of replicas (cluster groups, e.g. one GPU
type for short chats, another for long documents) chosen by the request's length against
stated thresholds — its prompt tokens (`length_by: prompt`, what any router reads off the
request), or prompt plus output tokens (`length_by: total`: the request's expected total
length, as a client's `max_tokens` states it; the simulator uses the request's actual
output length, so this is the oracle case) — then, within the pool, the pool's own router
(`within`, any other policy).
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
                    "affinity", "length"] = "round_robin"
    # replicas report queue length and KV use every staleness_s seconds (0: always current)
    staleness_s: float = field(default=0.0, metadata={"ge": 0, "le": 3600})
    affinity_slack: int = field(default=8, metadata={"ge": 0})
    # length: a request of length L goes to pool i, the first with L <= thresholds[i]
    # (past the last threshold: the last pool); pools are the cluster groups named in
    # `length_groups` (default: the front groups in order), one more than the thresholds
    length_thresholds: tuple[int, ...] = ()
    length_groups: tuple[str, ...] = ()
    length_by: Literal["prompt", "total"] = "prompt"
    within: Literal["round_robin", "random", "least_outstanding", "least_kv", "power_of_two",
                    "affinity"] = "least_outstanding"  # each pool's own router

    def check(self):
        t = self.length_thresholds
        if self.policy != "length":
            if t or self.length_groups:
                return "length_thresholds" if t else "length_groups", \
                    f"only read by policy 'length' (policy is '{self.policy}')"
            return None
        if not t:
            return "length_thresholds", "policy 'length' needs at least one threshold (allowed: e.g. [2048])"
        if any(x < 1 for x in t) or list(t) != sorted(set(t)):
            return "length_thresholds", f"{list(t)} (allowed: whole tokens >= 1, strictly increasing)"
        if self.length_groups and len(self.length_groups) != len(t) + 1:
            return "length_groups", (f"{len(self.length_groups)} groups for {len(t)} threshold(s) "
                                     f"(allowed: {len(t) + 1}, one more than the thresholds)")
        return None


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

    def choices(self, n: int, replicas: int) -> np.ndarray:
        """The next `n` choices among `replicas`, as n calls of `choose` make them."""
        out = (self.next % replicas + np.arange(n, dtype=np.int64)) % replicas
        if n:
            self.next = int(out[-1]) + 1
        return out


class RandomRouter:
    uses_reports = False

    def __init__(self, spec: RouterSpec, rng: np.random.Generator):
        self.rng = rng

    def choose(self, key: int | None, loads: list[ReplicaLoad]) -> int:
        return int(self.rng.integers(len(loads)))

    def choices(self, n: int, replicas: int) -> np.ndarray:
        """The next `n` choices among `replicas`, as n calls of `choose` draw them (numpy's
        bounded integers draw an array element by element, as one at a time)."""
        return self.rng.integers(replicas, size=n).astype(np.int64, copy=False)


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


class LengthAware:
    """Mixed fleets: the request's length picks a pool by the thresholds (exactly the
    requests longer than threshold i go past pool i), the pool's own router picks the
    replica within it. `bind` tells it which group each front replica belongs to."""

    uses_reports = False  # the pools' routers may; see `bind`
    reads_length = True

    def __init__(self, spec: RouterSpec, rng: np.random.Generator):
        self.spec = spec
        self.thresholds = spec.length_thresholds
        self.total = spec.length_by == "total"
        self.inner = [ROUTERS[spec.within](spec, rng) for _ in range(len(spec.length_thresholds) + 1)]
        self.uses_reports = ROUTERS[spec.within].uses_reports
        self.members: list[list[int]] = []

    def bind(self, groups: list[str]) -> None:
        """The group of each front replica, in order; pools are `length_groups` (default:
        the distinct groups in order of first appearance)."""
        names = self.spec.length_groups or tuple(dict.fromkeys(groups))
        if len(names) != len(self.inner):
            raise ValueError(f"{len(names)} pools for {len(self.thresholds)} threshold(s)")
        self.members = [[i for i, g in enumerate(groups) if g == name] for name in names]
        if not all(self.members):
            raise ValueError(f"a pool of {list(names)} has no replica")

    def pool(self, prompt: int, output: int) -> int:
        """The pool of a request: the first i with its length <= thresholds[i], else the last."""
        n = prompt + output if self.total else prompt
        for i, t in enumerate(self.thresholds):
            if n <= t:
                return i
        return len(self.thresholds)

    def choose_request(self, key: int | None, loads: list[ReplicaLoad], prompt: int, output: int) -> int:
        p = self.pool(prompt, output)
        ids = self.members[p]
        return ids[self.inner[p].choose(key, [loads[i] for i in ids])]

    def choose(self, key: int | None, loads: list[ReplicaLoad]) -> int:
        raise TypeError("the length router chooses by request (choose_request)")


ROUTERS = {
    "round_robin": RoundRobin,
    "random": RandomRouter,
    "least_outstanding": LeastOutstanding,
    "least_kv": LeastKV,
    "power_of_two": PowerOfTwo,
    "affinity": Affinity,
    "length": LengthAware,
}


def pool_router(spec: RouterSpec) -> RouterSpec:
    """The router within one pool: a length router's `within` policy, else `spec` itself
    (a disaggregated cluster's decode router is one)."""
    if spec.policy != "length":
        return spec
    return RouterSpec(policy=spec.within, staleness_s=spec.staleness_s, affinity_slack=spec.affinity_slack)


def make_router(spec: RouterSpec, rng: np.random.Generator, groups: list[str] | None = None):
    """The router of `spec`; `groups`: each front replica's group (the length router's pools)."""
    r = ROUTERS[spec.policy](spec, rng)
    if getattr(r, "reads_length", False):
        r.bind(groups or [])
    return r
