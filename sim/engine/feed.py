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

import numpy as np

from sim.engine.decoderun import decode_run
from sim.policies.plan import StepKind

if TYPE_CHECKING:
    from sim.engine.clock import Clock
    from sim.engine.fleet import Fleet, Node
    from sim.engine.replica import Replica
    from sim.policies.batch import Seq
    from sim.policies.plan import Admission, StepPlan

_IDLE, _PREFILL, _MIXED = StepKind.IDLE, StepKind.PREFILL, StepKind.MIXED
_INF = float("inf")


class Feed:
    """The requests of one replica in arrival order, grouped by the instant (engine clock)
    at which the arrivals process dispatches them."""

    __slots__ = ("seqs", "starts", "times", "k", "next", "load", "waiting")

    def __init__(self, fleet: Fleet, seqs: list[Seq], clock: np.ndarray, group: np.ndarray):
        """`clock[i]`, `group[i]`: the engine's clock when `seqs[i]` is dispatched and the
        index of its instant (-1: at the start, before the arrivals process first waits).
        Each request is given its replica and that replica's view of its prefix here, as
        `Fleet.dispatch` gives them to a lone front replica (nothing reads them before)."""
        self.seqs = seqs
        group = np.asarray(group)
        starts = np.flatnonzero(np.diff(group, prepend=group[:1] - 1)) if len(group) else group
        self.starts: list[int] = [*starts.tolist(), len(seqs)]  # each instant's first request
        self.times: list[float] = np.asarray(clock)[starts].tolist()
        self.k = 0  # the next instant to deliver
        self.next = self.times[0] if self.times else _INF  # its clock time
        (node,) = fleet.front
        rep = node.rep
        self.load, self.waiting = rep.port.load, rep.st.waiting
        view = rep.port.prefix_view
        for s in seqs if rep.index or view is not None else ():
            s.replica = rep.index
            if view is not None:
                s.prefix = view[s.rid]

    @classmethod
    def of(cls, fleet: Fleet, seqs: list[Seq], arrival: np.ndarray) -> Feed:
        """Every request of `seqs` (`arrival`: their arrival times), at the instants the
        arrivals process (sim/engine/processes.py `arrivals`) dispatches them."""
        return cls(fleet, seqs, *instants(arrival))

    def deliver(self, t: float) -> None:
        """Dispatch the instants a replica boundary at `t` sees: the next one if at or
        before `t` (scheduled before the boundary's event), later ones only before `t`.
        Each request as `Fleet.dispatch` sends it to a lone front replica (no router, no
        request latency): counted outstanding and queued."""
        if self.next > t:
            return
        times, starts = self.times, self.starts
        k = self.k + 1
        last = len(times)
        while k < last and times[k] < t:
            k += 1
        lo, hi = starts[self.k], starts[k]
        self.load.outstanding += hi - lo
        self.waiting.extend(self.seqs[lo:hi])
        self.k, self.next = k, times[k] if k < last else _INF


def instants(arrival: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(clock, group) of each request: the SimPy clock when the arrivals process
    (sim/engine/processes.py `arrivals`) dispatches it, and the index of the instant it
    yielded for (-1: dispatched at the start, before any yield). The process keeps
    `t`, the latest arrival time seen, and yields `timeout(a - t)` for a later one: the
    clock is the running float sum of those gaps (numpy's cumsum adds in order)."""
    a = np.asarray(arrival, dtype=float)
    if len(a) == 0:
        return np.zeros(0), np.zeros(0, dtype=np.int64)
    t = np.maximum.accumulate(np.concatenate(([0.0], a)))[:-1]  # `t` before each request
    yields = a > t
    clock_at_yield = np.cumsum(np.where(yields, a - t, 0.0)[yields])
    group = np.cumsum(yields) - 1
    clock = np.where(group >= 0, clock_at_yield[np.maximum(group, 0)] if len(clock_at_yield)
                     else 0.0, 0.0)
    return clock, group


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
    """`processes.replica` (leaping, quiet), taking its arrivals from `feed` at its step
    boundaries; the same state changes, rows and draws in the same order. A plain prefill
    plan (`plain_prefills`) is started and finished in one call; the step a lone arrival
    usually gets, its whole prefill beside the decodes (`ChunkedPolicy.whole_arrival`),
    without its plan being built (`_one_arrival`). Another process's event
    on the clock (a probe's watcher, sim/engine/watch.py) ends a run of decode steps, and
    the replica yields at its first step boundary at or after it, so that process sees the
    replica's state as of that boundary, not later."""
    rep = node.rep
    st, log, policy = rep.st, rep.rec.log, rep.policy
    steady = getattr(policy, "steady", None) if (
        rep.speculator is None and not rep.own_record) else None
    plain = plain_prefills(rep)
    # the step an arrival to a decoding replica usually gets, its plan not built
    whole = getattr(policy, "whole_arrival", None) if plain else None
    waiting, queue = st.waiting, env.queue
    now = env.now
    feed.deliver(now)  # the requests dispatched at the start (before the replica started)
    while True:
        if whole is not None and waiting and (s := whole(st)) is not None:
            now, step = _one_arrival(rep, s, now, feed), None
        else:
            plan = policy.schedule(st, now)
            kind = plan.kind
            if plain and (kind is _MIXED and plan.chunks or kind is _PREFILL) and not (
                    plan.reject or plan.preempt or plan.swap_out or plan.swap_in):
                now, step = (mixed_through if kind is _MIXED else prefill_through)(
                    rep, plan, now, feed), None
            elif steady is not None and (repeats := steady(st, plan)) and (
                    now + rep.step.seconds < feed.next):
                rows = log.rows() if progress is not None else 0
                bound = min(feed.next, queue[0][0] if queue else _INF)  # env.peek()
                now, step = decode_run(rep, plan, now, bound, repeats, True)
                if progress is not None and log.rows() // 2000 != rows // 2000:
                    progress(now)
                if step is None:
                    continue
            else:
                step = rep.start(plan, now)
                if step is None:
                    if plan.kind is _IDLE:
                        if plan.wake_at is not None:
                            raise RuntimeError(
                                "a fed replica's policy asked to wake at a deadline")
                        if feed.next == _INF:  # nothing more will arrive: the clock ends here
                            if now != env.now:
                                yield env.timeout_at(now)
                            node.wake = env.event()
                            yield node.wake  # never triggered: the run is over
                        now = feed.next
                        yield env.timeout_at(now)  # asleep until the next arrival
                        feed.deliver(now)
                    rep.end_of_step()
        if step is not None:
            t_end = now + step.seconds
            if t_end >= feed.next:  # the boundary another process's event came before
                feed.deliver(t_end)
            rep.finish(step, now, t_end)
            now = t_end
        if progress is not None and log.rows() % 2000 == 0:
            progress(now)
        if queue and queue[0][0] <= now and now > env.now:  # another's event is due (peek)
            yield env.timeout_at(now)  # it sees this boundary


def plain_prefills(rep: Replica) -> bool:
    """Whether `prefill_through` may run this replica's prefill plans: paged KV without a
    prefix cache, no static batch, no speculation, its own log rows, no hand-off."""
    return (rep.kv.paged and rep.kv.prefix is None and not rep.holds_batch
            and rep.speculator is None and not rep.own_record and rep.port.handoff is None)


def prefill_through(rep: Replica, plan: StepPlan, now: float, feed: Feed) -> float:
    """`Replica.start` then `Replica.finish` of a plain prefill plan begun at `now` (its
    requests admitted and priced, their first tokens, the step's row), with the arrivals
    its end sees delivered in between (they touch only the queue); returns its end. The
    same state changes, row and draws as those (`tests/test_leap.py`)."""
    st, rec = rep.st, rep.rec
    kv, waiting, batch = st.kv, st.waiting, st.batch
    seqs, chunks = [], []
    tokens = need = 0
    for a in plan.admit:  # Replica.admit (KVAccount.admit without a prefix cache)
        s = a.seq
        waiting.popleft()
        if s.sched_t < 0:
            s.sched_t = now
        s.prefilled = 0
        q = s.prompt + s.generated
        need += kv.blocks_for(q)
        seqs.append(s)
        chunks.append((q, 0))
        tokens += q
    rep.kv.take(need)
    secs = rep.lat.prefill(chunks, rep.prefill_shapes)  # (+ 0.0 s loaded from host memory)
    rec.kernel_busy_s += rep.kernels.kernel_s
    step = rep.step
    step.seconds, step.seqs, step.tokens, step.kind, step.plan = (secs, len(chunks), tokens,
                                                                  _PREFILL, plan)
    t_end = now + secs
    if t_end >= feed.next:
        feed.deliver(t_end)
    for s in seqs:  # Replica.finish_prefill_step
        s.prefilled = s.prompt + s.generated
        _first_token(rep, s, t_end)
    # Replica.record (no prefix cache: no token counted twice)
    rec.log.add(now, t_end, _PREFILL, len(chunks), tokens, kv.used_blocks,
                batch.kv_tokens() + rep.port.outside_tokens)
    return t_end


def mixed_through(rep: Replica, plan: StepPlan, now: float, feed: Feed) -> float:
    """`Replica.start` then `Replica.finish` of a plain chunked-prefill plan (decodes and
    prefill chunks, nothing rejected or preempted) begun at `now`: its requests admitted
    with their first chunk's KV, the chunks' KV and the decodes' new blocks taken, the step
    priced, the decodes advanced, completed prefills' first tokens, the step's row; the
    arrivals its end sees delivered in between (they touch only the queue). Returns its
    end. The same state changes, row and draws as those (`tests/test_feed.py`)."""
    st, rec = rep.st, rep.rec
    kv, batch, prefilling = st.kv, st.batch, st.prefilling
    admit = plan.admit
    if not prefilling and len(admit) == 1 and len(plan.chunks) == 1:
        s = admit[0].seq
        if plan.chunks[0].tokens == s.prompt + s.generated:  # its whole prefill at once
            return _one_arrival(rep, s, now, feed)
    # with no prefill under way, every chunk is an admission's first, its blocks taken at
    # admission (the common case: an arrival's whole prompt in one chunk)
    fresh = not prefilling
    new = {a.seq for a in admit} if not fresh else None
    if admit:
        _admit_chunked(rep, admit, now)
    chunks = []
    tokens = 0
    if fresh:
        for c in plan.chunks:
            q = c.tokens
            chunks.append((q, c.seq.prefilled))
            tokens += q
    else:
        take, blocks_for = rep.kv.take, kv.blocks_for
        for c in plan.chunks:  # Replica.mixed_step
            s, q = c.seq, c.tokens
            done = s.prefilled
            if s not in new:  # (an admitted request took its first chunk's blocks above)
                take(blocks_for(done + q) - blocks_for(done))
            chunks.append((q, done))
            tokens += q
    need = batch.new_blocks_needed()
    if need > kv.free_blocks:  # (KVAccount.take without a prefix cache: a planned take)
        rep.kv.take(need)  # raises
    kv.free_blocks -= need
    n = batch.n_compute
    secs = rep.lat.mixed(n, batch.s0 + n * batch.D, batch.max_ctx(), chunks,  # sum_ctx()
                         rep.prefill_shapes)
    rec.kernel_busy_s += rep.kernels.kernel_s  # (+ 0.0 s loaded from host memory)
    step = rep.step
    kind = _MIXED if n else _PREFILL
    step.seconds, step.seqs, step.tokens, step.kind, step.plan = (
        secs, n + len(chunks), n + tokens, kind, plan)
    t_end = now + secs
    if t_end >= feed.next:
        feed.deliver(t_end)
    if n:  # Replica.finish_mixed_step
        for s in batch.advance(t_end, rec.gaps, rec.weights):
            rep.release(s)
    for c in plan.chunks:
        s = c.seq
        s.prefilled += c.tokens
        if s.prefilled >= s.prompt + s.generated:
            prefilling.remove(s)
            _first_token(rep, s, t_end)
    # Replica.record (no prefix cache: no token counted twice)
    rec.log.add(now, t_end, kind, n + len(chunks), n + tokens, kv.num_blocks - kv.free_blocks,
                batch.kv_tokens() + rep.port.outside_tokens)
    return t_end


def _one_arrival(rep: Replica, s: Seq, now: float, feed: Feed) -> float:
    """`mixed_through` of the plan an arrival to a replica with no prefill under way
    usually gets: the running batch's decodes and `s` admitted, its whole prefill in one
    chunk (`ChunkedPolicy.whole_arrival` finds it without the plan being built). Flattened
    (the arrival's own work: `_admit_chunked`, the chunk, `_first_token` in one function
    over plain fields); `s` is not put among the prefills under way and taken out again at
    the step's end, as nothing in between looks there; the replica's `step` keeps its
    plan (nothing reads a finished step's). The same state changes, row and draws
    (`tests/test_feed.py`)."""
    st, rec = rep.st, rep.rec
    kv, batch = st.kv, st.batch
    q = s.prompt + s.generated
    st.waiting.popleft()  # Replica.admit
    if s.sched_t < 0:
        s.sched_t = now
    first, grow = kv.blocks_for(q), batch.new_blocks_needed()
    # its first chunk's blocks (KVAccount.admit) and the decodes' new ones (KVAccount.take
    # without a prefix cache: a planned take)
    if first + grow > kv.free_blocks:
        rep.kv.take(first + grow)  # raises
    kv.free_blocks -= first + grow
    n = batch.n_compute
    secs = rep.lat.mixed_one(n, batch.s0 + n * batch.D, batch.max_ctx(), q, rep.prefill_shapes)
    rec.kernel_busy_s += rep.kernels.kernel_s  # (+ 0.0 s loaded from host memory)
    step = rep.step
    kind = _MIXED if n else _PREFILL
    step.seconds, step.seqs, step.tokens, step.kind = secs, n + 1, n + q, kind
    t_end = now + secs
    if t_end >= feed.next:
        feed.deliver(t_end)
    if n:  # Replica.finish_mixed_step
        for d in batch.advance(t_end, rec.gaps, rec.weights):
            rep.release(d)
    s.prefilled = q
    _first_token(rep, s, t_end)
    rec.log.add(now, t_end, kind, n + 1, n + q, kv.num_blocks - kv.free_blocks,
                batch.kv_tokens() + rep.port.outside_tokens)
    return t_end


def _first_token(rep: Replica, s: Seq, t_end: float) -> None:
    """`Replica.first_token` without a prefix cache: `s`'s prefill ended at `t_end` with
    its first token (or, resumed after a recompute preemption, its next one after one long
    gap); it finishes there or joins the decoding batch."""
    s.generated += 1
    if s.first_token_t < 0:
        s.first_token_t = t_end
    else:
        rep.rec.resumed(t_end, s.last_token_t)
    if s.generated >= s.output:
        s.finish_t = t_end
        rep.release(s)
    else:
        rep.st.batch.join(s, t_end)


def _admit_chunked(rep: Replica, admit: list[Admission], now: float) -> None:
    """`Replica.admit` of a chunked plan's admissions without a prefix cache (each takes
    its first chunk's blocks: KVAccount.admit), and their entry among the prefills under
    way (`Replica.mixed_step`)."""
    st, kv = rep.st, rep.st.kv
    waiting, prefilling = st.waiting, st.prefilling
    need = 0
    for a in admit:
        s = a.seq
        waiting.popleft()
        if s.sched_t < 0:
            s.sched_t = now
        s.prefilled = 0
        need += kv.blocks_for(a.chunk_tokens)
        prefilling.append(s)
    if need > kv.free_blocks:  # (KVAccount.take without a prefix cache: a planned take)
        rep.kv.take(need)  # raises
    kv.free_blocks -= need
