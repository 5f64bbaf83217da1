"""A replica's port to the fleet: what the router knows of it (`load`, refreshed by the
engine's reports) and the state of its side of a disaggregated KV hand-off (the verbs
are in `sim/engine/handoff.py`).
"""

from __future__ import annotations

from collections.abc import Callable

from sim.policies.batch import Seq
from sim.policies.router import ReplicaLoad


class Port:
    """One replica's side of the fleet."""

    __slots__ = ("load", "handoff", "arrived", "outside_tokens", "prefix_view")

    def __init__(self) -> None:
        self.load = ReplicaLoad()  # what a router knows of it (outstanding kept current)
        # disaggregated prefill: called with (seq, t) when a prefill's first token is out
        # and its KV must move to a decode replica (the seq keeps its blocks here until then)
        self.handoff: Callable[[Seq, float], None] | None = None
        self.arrived: list[tuple[Seq, float]] = []  # disaggregated decode: KV arrived mid-step
        self.outside_tokens = 0  # disaggregated: KV held for requests outside the batch
        self.prefix_view: tuple | None = None  # prefix hashes in whole KV blocks (prefix_views)
