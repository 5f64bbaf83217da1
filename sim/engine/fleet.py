"""The engine's handle on a fleet: a `Node` per replica (its SimPy wake-ups, what waits
for its room) and the `Fleet` that routes arrivals to them and hands KV over between a
disaggregated fleet's pools (sim/engine/processes.py runs them)."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

import simpy

from sim.engine.handoff import reject_at_handoff
from sim.engine.replica import Replica
from sim.policies.batch import Seq

if TYPE_CHECKING:
    from sim.config.cluster import Link
    from sim.engine.autoscale import Lifecycle


class Node:
    """The engine's handle on one replica: its SimPy wake-up and what waits for its room."""

    __slots__ = ("rep", "wake", "room", "transfers", "link_wake", "ended", "request_s")

    def __init__(self, rep: Replica):
        self.rep = rep
        self.wake: simpy.Event | None = None   # the replica process sleeps on this when idle
        self.room: simpy.Event | None = None   # a KV link waits on this for free blocks
        self.transfers: deque[tuple[Seq, Node]] = deque()  # decode side: KV moves queued
        self.link_wake: simpy.Event | None = None
        # closed loop: told of the requests that ended (finished or rejected) here
        self.ended: Callable[[list[Seq]], None] | None = None
        # the runtime's per-request latency (RequestLatencySpec.seconds()), None when zero
        cfg = rep.config
        self.request_s = cfg.runtime.request.seconds() if cfg and cfg.runtime.request else None

    def poke(self) -> None:
        if self.wake is not None and not self.wake.triggered:
            self.wake.succeed()

    def stepped(self) -> None:
        """After a step or preemption: wake a KV link waiting for room here."""
        if self.room is not None and not self.room.triggered:
            self.room.succeed()


class Fleet:
    """The replicas, the router's view of them, and the KV hand-off between pools."""

    def __init__(self, env: simpy.Environment, replicas: list[Replica], router, *,
                 decode_router=None, link: Link | None = None, staleness_s: float = 0.0):
        self.env = env
        self.nodes = [Node(r) for r in replicas]
        self.front = [n for n in self.nodes if n.rep.config is None or n.rep.config.role != "decode"]
        self.back = [n for n in self.nodes if n.rep.config is not None and n.rep.config.role == "decode"]
        self.router, self.decode_router, self.link = router, decode_router, link
        self.loads = [n.rep.port.load for n in self.front]
        self.back_loads = [n.rep.port.load for n in self.back]
        self.fresh_reports = staleness_s == 0  # reports refreshed at every choice
        self.by_length = getattr(router, "reads_length", False)  # a mixed fleet's length router
        # autoscaling (sim/engine/autoscale.py): the front indices the router may choose
        self.ready: list[int] | None = None
        self.lifecycle: Lifecycle | None = None
        for n in self.front:
            if self.back:
                n.rep.port.handoff = self._handoff_from(n)

    def scaled(self, lifecycle: Lifecycle) -> Fleet:
        """Route only to `lifecycle`'s ready replicas from now on."""
        self.lifecycle, self.ready = lifecycle, lifecycle.ready_ids()
        return self

    # ---- routing ----------------------------------------------------------------------
    def dispatch(self, s: Seq) -> None:
        """A request arrives: the router picks a front replica (it sees `self.loads`)."""
        if self.ready is not None:  # autoscaled: the router sees only ready replicas
            ready = [self.front[k] for k in self.ready]
            if self.fresh_reports and self.router.uses_reports:
                self.report(ready)
            i = self.ready[self.router.choose(s.prefix[0] if s.prefix else None,
                                              [n.rep.port.load for n in ready])]
            self.lifecycle.routed[i] += 1
        elif len(self.front) == 1:
            i = 0
        else:
            if self.fresh_reports and self.router.uses_reports:
                self.report(self.front)
            i = (self.router.choose_request(s.prefix[0] if s.prefix else None, self.loads, s.prompt, s.output)
                 if self.by_length else self.router.choose(s.prefix[0] if s.prefix else None, self.loads))
        node = self.front[i]
        rep = node.rep
        rep.port.load.outstanding += 1
        s.replica = rep.index
        if rep.port.prefix_view is not None:
            s.prefix = rep.port.prefix_view[s.rid]
        if node.request_s is not None:  # the API server's receive and tokenisation first
            receive, per_token = node.request_s[:2]
            self.env.timeout(receive + per_token * s.prompt).callbacks.append(
                lambda _: self._enqueue(node, s))
            return
        self._enqueue(node, s)

    @staticmethod
    def _enqueue(node: Node, s: Seq) -> None:
        node.rep.st.waiting.append(s)
        node.poke()

    def report(self, nodes: list[Node] | None = None) -> None:
        """Replicas report their queue and KV use (the part of the router's view that can
        be stale; outstanding counts are the router's own and always current)."""
        for n in self.nodes if nodes is None else nodes:
            rep = n.rep
            load = rep.port.load
            load.waiting = len(rep.st.waiting)
            load.kv_used = rep.st.kv.used_blocks / rep.st.kv.num_blocks

    # ---- disaggregated hand-off ----------------------------------------------------------
    def _handoff_from(self, src: Node):
        def handoff(s: Seq, t: float) -> None:
            need = src.rep.st.kv.blocks_for(s.prompt + s.generated - 1)
            fits = [i for i, n in enumerate(self.back)
                    if need <= n.rep.st.kv.num_blocks - n.rep.policy.watermark]
            if not fits:
                reject_at_handoff(src.rep, s, f"its prompt's KV ({need} blocks) is larger "
                                              "than any decode replica's cache")
                if src.ended is not None:
                    src.ended([s])
                return
            if self.fresh_reports and self.decode_router.uses_reports:
                self.report(self.back)
            loads = [self.back_loads[i] for i in fits]
            dst = self.back[fits[self.decode_router.choose(None, loads)]]
            dst.rep.port.load.outstanding += 1
            dst.transfers.append((s, src))
            if dst.link_wake is not None and not dst.link_wake.triggered:
                dst.link_wake.succeed()
        return handoff
