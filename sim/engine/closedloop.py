"""Closed-loop bookkeeping (`sim/workload/clients.py`): what the users share, and times as
a client sees them. The users themselves are SimPy processes (`client()` in
`sim/engine/processes.py`); this module holds their state and never touches the clock.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from sim.policies.batch import Seq
from sim.workload.clients import ClientPlan


class ClosedLoop:
    """The users' shared state: the queues of sessions, each sent request's end event, the
    warm-up gate and the measured window (`sim/workload/clients.py`)."""

    def __init__(self, env, plan: ClientPlan, fleet):
        self.env, self.plan, self.fleet = env, plan, fleet
        warm = [x for x in plan.sessions if plan.warmup[x[0]]]
        rest = [x for x in plan.sessions if not plan.warmup[x[0]]]
        self.warm_queue = deque(warm)  # warm-up sessions: whoever is free takes the next
        # measured sessions: one shared queue, or user k's own (sessions k, k + C, ...)
        c = plan.concurrency
        self.queues = ([deque(rest[k::c]) for k in range(c)] if plan.per_user
                       else [deque(rest)] * c)
        self.warm = plan.warmup.tolist()
        self.ends: dict = {}  # rid -> the SimPy event its client waits on
        self.sent: list[int] = []
        self.warm_left = sum(self.warm)
        self.gate = env.event() if plan.drain_warmup and self.warm_left else None
        self.start: float | None = None  # the first measured send
        self.gap_marks: list[int] | None = None  # each replica's ITL gaps before the gate opened
        self.kernel_marks: list[float] | None = None  # GPU kernel seconds before the window

    def next_session(self, user: int) -> tuple[int, ...] | None:
        """The session user `user` sends next (warm-up first), None when it has none left."""
        q = self.warm_queue if self.warm_queue else self.queues[user]
        return q.popleft() if q else None

    def begin(self, now: float) -> None:
        """The first measured request goes out: the measured window starts."""
        self.start = now
        self.kernel_marks = [n.rep.rec.kernel_busy_s for n in self.fleet.nodes]

    def ended(self, seqs: list[Seq]) -> None:
        for s in seqs:
            ev = self.ends.pop(s.rid, None)
            if ev is None:
                continue
            ev.succeed()
            if self.warm[s.rid]:
                self.warm_left -= 1
                if self.warm_left == 0 and self.gate is not None:
                    self.gap_marks = [len(n.rep.rec.gaps) for n in self.fleet.nodes]
                    self.gate.succeed()

    def after(self, s: Seq) -> float:
        """Seconds from the engine's end of `s` to its client's next send: the last chunk's
        streaming and the response's close (the runtime's), then the user's think time."""
        req = self.fleet.nodes[s.replica].request_s
        return (req[2] + req[3] if req is not None else 0.0) + float(self.plan.think_s[s.rid])


def streamed(seqs: list[Seq], nodes: list) -> None:
    """Times as the client sees them: each token `chunk` seconds after the engine produced
    it, the response closed `finish` seconds after the last (the serving replica's
    runtime; nothing when every runtime's per-request latency is zero)."""
    if all(n.request_s is None or not (n.request_s[2] or n.request_s[3]) for n in nodes):
        return
    for s in seqs:
        req = nodes[s.replica].request_s
        if req is None:
            continue
        if s.first_token_t >= 0:
            s.first_token_t += req[2]
        if s.finish_t >= 0:
            s.finish_t += req[2] + req[3]



def client_summary(plan: ClientPlan, req: dict) -> dict:
    """The closed loop's part of the run summary: users, and requests sent by kind."""
    warm = np.asarray(req["warmup"], dtype=bool)
    sent = np.asarray(req["id"], dtype=np.int64)
    return {"concurrency": plan.concurrency, "warmup_requests": int(warm.sum()),
            "measured_requests": int((~warm).sum()),
            "not_sent": int(len(plan.warmup) - len(sent)),
            "drain_warmup": plan.drain_warmup,
            "think_s_mean": float(plan.think_s[sent].mean()) if len(sent) else 0.0}
