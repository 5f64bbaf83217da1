"""Arrivals a lone replica takes at its own step boundaries, without a SimPy event each.

Where a replica is the only process of a run (one front replica, open loop, no runtime
request latency, no router report, no autoscaler, no disaggregated pool, no pipeline;
`feedable`), the arrivals process (sim/engine/processes.py `arrivals`) and the replica's
step ends are the only events, and each arrival does nothing but put its requests in the
replica's queue (`Fleet.dispatch`). `fed_replica` then runs the replica's loop as
`processes.replica` does, leaping, but hands each arrival's requests to the queue itself
(`Feed.deliver`) at the step boundary where the replica would first have seen them:
instead of two events per arrival (the arrival's timeout, the end of the step that saw it)
none; the replica yields only to sleep until the next arrival when it has nothing to do,
and once at its end (the engine's clock ends where it ended).

Which arrivals a boundary at `t` sees, exactly as in SimPy (events at one instant fire in
the order they were scheduled): every arrival instant before `t`, and one at `t` itself
only if it was already scheduled when the replica scheduled the step's end, i.e. the first
not yet delivered (the arrivals process schedules an instant only once the one before it
fired). A replica woken from sleep by an arrival sees that arrival and those at earlier
instants: the same rule. Instants are the engine's clock at each arrival: the running
float sum of the gaps the arrivals process waits (`instants`, sim/engine/split.py).
The same rows, draws and state in the same order: `tests/test_leap.py` (stepping, one
event per step, against leaping) and `tests/test_feed.py`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sim.engine.decoderun import decode_run
from sim.policies.plan import StepKind

if TYPE_CHECKING:
    from sim.engine.clock import Clock
    from sim.engine.processes import Fleet, Node
    from sim.policies.batch import Seq

_IDLE = StepKind.IDLE
_INF = float("inf")


class Feed:
    """The requests of one replica in arrival order, grouped by the instant (engine clock)
    at which the arrivals process dispatches them."""

    __slots__ = ("fleet", "seqs", "starts", "times", "k", "next")

    def __init__(self, fleet: Fleet, seqs: list[Seq], clock: list[float], group: list[int]):
        """`clock[i]`, `group[i]`: the engine's clock when `seqs[i]` is dispatched and the
        index of its instant (-1: at the start, before the arrivals process first waits)."""
        self.fleet, self.seqs = fleet, seqs
        self.starts: list[int] = []  # where each instant's requests begin in `seqs`
        self.times: list[float] = []
        last = None
        for i, (t, g) in enumerate(zip(clock, group, strict=True)):
            if g != last:
                last = g
                self.starts.append(i)
                self.times.append(t)
        self.starts.append(len(seqs))
        self.k = 0  # the next instant to deliver
        self.next = self.times[0] if self.times else _INF  # its clock time

    @classmethod
    def of(cls, fleet: Fleet, seqs: list[Seq]) -> Feed:
        """Every request of `seqs` (sorted by arrival), at the instants `arrivals` gives."""
        clock, group = [], []
        t, now, g = 0.0, 0.0, -1
        for s in seqs:  # as processes.arrivals: SimPy adds each gap it waits to its clock
            if s.arrival > t:
                now += s.arrival - t
                t = s.arrival
                g += 1
            clock.append(now)
            group.append(g)
        return cls(fleet, seqs, clock, group)

    def deliver(self, t: float) -> None:
        """Dispatch the instants a replica boundary at `t` sees: the next one if at or
        before `t` (scheduled before the boundary's event), later ones only before `t`."""
        if self.next > t:
            return
        times, starts, seqs, dispatch = self.times, self.starts, self.seqs, self.fleet.dispatch
        k = self.k
        while True:
            for i in range(starts[k], starts[k + 1]):
                dispatch(seqs[i])
            k += 1
            nxt = times[k] if k < len(times) else _INF
            if nxt >= t:
                break
        self.k, self.next = k, nxt


def feedable(fleet: Fleet, node: Node, leap: bool) -> bool:
    """Whether `node`'s replica may take its arrivals from a `Feed`: leaping, the fleet's
    one replica, nothing told of its ends, no request latency, no pipeline process and no
    static batch (whose deadline wake-ups `fed_replica` does not replay)."""
    rep = node.rep
    return (leap and len(fleet.nodes) == 1 and fleet.front == [node] and fleet.ready is None
            and node.ended is None
            and rep.port.handoff is None and node.request_s is None
            and getattr(rep, "process", None) is None and not rep.holds_batch)


def fed_replica(env: Clock, node: Node, feed: Feed, progress=None):
    """`processes.replica` (leaping, quiet, nothing else running), taking its arrivals from
    `feed` at its step boundaries; the same state changes, rows and draws in the same order."""
    rep = node.rep
    st, log, policy = rep.st, rep.rec.log, rep.policy
    steady = getattr(policy, "steady", None) if (
        rep.speculator is None and not rep.own_record) else None
    now = env.now
    feed.deliver(now)  # the requests dispatched at the start (before the replica started)
    while True:
        plan = policy.schedule(st, now)
        if steady is not None and (repeats := steady(st, plan)) and (
                now + rep.step.seconds < feed.next):
            rows = len(log.t_end)
            now, step = decode_run(rep, plan, now, feed.next, repeats, True)
            if progress is not None and len(log.t_end) // 2000 != rows // 2000:
                progress(now)
            if step is None:
                continue
        else:
            step = rep.start(plan, now)
        if step is not None:
            t_end = now + step.seconds
            if t_end >= feed.next:  # the boundary another process's event came before
                feed.deliver(t_end)
            rep.finish(step, now, t_end)
            now = t_end
        else:
            if plan.kind is _IDLE:
                if plan.wake_at is not None:
                    raise RuntimeError("a fed replica's policy asked to wake at a deadline")
                if feed.next == _INF:  # nothing more will arrive: the clock ends here
                    if now != env.now:
                        yield env.timeout_at(now)
                    node.wake = env.event()
                    yield node.wake  # never triggered: the run is over
                now = feed.next
                yield env.timeout_at(now)  # asleep until the next arrival
                feed.deliver(now)
            rep.end_of_step()
        if progress is not None and len(log.t_end) % 2000 == 0:
            progress(now)
