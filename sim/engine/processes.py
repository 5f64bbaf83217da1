"""The SimPy engine: arrivals, a router, replicas, and (disaggregated) KV links.

`arrivals(env, ...)` releases requests at their arrival times and hands each to the
fleet's router; `replica(env, ...)` loops: ask the policy for a plan, start it
(`sim/engine/replica.py`: admit, preempt, swap, allocate KV), hold the clock for the step's
latency, then finish it (first tokens, finished requests, freed KV). With prefill and
decode pools, `kv_link(env, ...)` moves each finished prefill's KV to a decode replica
once that replica has room (bytes / bandwidth + latency; `sim/engine/handoff.py`); `reporter(env, ...)` refreshes
what the router knows of each replica every `router.staleness_s`. Closed loop
(`sim/workload/clients.py`): `client(env, ...)` is one user, sending its next request
when its previous one ended (the replica process reports each request's end to
`ClosedLoop.ended`). A runtime's per-request latency (`RequestLatencySpec`) delays a
request on its way into a replica's queue and out to its client. Policies and routers
never see `env`; SimPy stays in this module.
"""

from __future__ import annotations

import os

import numpy as np
import simpy

from sim.config.cluster import Link
from sim.engine.autoscale import SCRAPE_WATCH, Attainment, Lifecycle
from sim.engine.clock import Clock, run_clock
from sim.engine.closedloop import ClosedLoop, streamed
from sim.engine.decoderun import decode_run
from sim.engine.feed import Feed, fed_replica, feedable
from sim.engine.fleet import Fleet, Node
from sim.engine.handoff import (
    hand_over,
    join_arrived,
    reserve_transfer,
    take_over,
)
from sim.engine.recorder import pooled_gaps
from sim.engine.replica import Replica, ReplicaResult, RunResult
from sim.engine.results import Event
from sim.policies.autoscale import FleetMetrics
from sim.policies.batch import Seq
from sim.policies.plan import StepKind
from sim.policies.prefix import regroup
from sim.workload.requests import Workload

IDLE, DECODE = StepKind.IDLE, StepKind.DECODE


def arrivals(env: simpy.Environment, fleet: Fleet, seqs: list[Seq]):
    """Release each request at its arrival time to the router."""
    t = 0.0
    for s in seqs:
        if s.arrival > t:
            yield env.timeout(s.arrival - t)
            t = s.arrival
        fleet.dispatch(s)


def client(env: simpy.Environment, loop: ClosedLoop, seqs: list[Seq], user: int):
    """One user: take its next session and send the session's requests one after
    another, each once the previous response ended and the user has thought."""
    window = loop.plan.window_s
    while (session := loop.next_session(user)) is not None:
        for i in session:
            s = seqs[i]
            if not loop.warm[i]:
                if loop.gate is not None and not loop.gate.processed:
                    yield loop.gate
                if loop.start is None:
                    loop.begin(env.now)
                elif window is not None and env.now - loop.start >= window:
                    return
            s.arrival = env.now
            loop.sent.append(i)
            ended = loop.ends[i] = env.event()
            loop.fleet.dispatch(s)
            yield ended
            pause = loop.after(s)
            if pause > 0:
                yield env.timeout(pause)


def reporter(env: simpy.Environment, fleet: Fleet, every_s: float, until: list[bool]):
    """Replicas report their load every `every_s` seconds while requests remain."""
    while not until[0]:
        fleet.report()
        yield env.timeout(every_s)


def autoscaler(env: simpy.Environment, fleet: Fleet, policy, seqs: list[Seq], finished: list[bool]):
    """Every scrape: retire drained replicas, ask the policy for a replica count, then
    start replicas (ready after the provisioning delay) or cancel starting ones and drain
    ready ones (sim/engine/autoscale.py). Ends once every request is accounted for."""
    lc = fleet.lifecycle
    reps = [n.rep for n in fleet.front]
    slots = reps[0].config.scenario.scheduler.max_num_seqs if reps[0].config else 1
    per = slots if lc.spec.policy in ("utilization", "slo") else 1
    total = len(seqs)
    seen = Attainment(seqs, *lc.slo, lc.spec.attainment_window_s) if lc.spec.policy == "slo" else None

    def ready_at(i: int):
        life = lc.current[i]

        def up(_) -> None:
            if lc.became_ready(i, env.now, life):
                fleet.ready = sorted([*fleet.ready, i])
        return up

    watch = SCRAPE_WATCH.get()  # a planner's screen (reads only; may stop the run)
    while sum(r.done for r in reps) < total:
        now = env.now
        if watch is not None:
            watch(now, lc, seqs)
        retire(fleet, now)
        ready = fleet.ready
        metric = sum(reps[i].port.load.outstanding for i in ready) / len(ready) / per
        current = lc.count("ready", "starting")
        att = seen.at(now) if seen is not None else None
        target = policy.plan(now, FleetMetrics(current, len(ready), metric, att))
        while current < target and (i := lc.start(now)) is not None:
            env.timeout(lc.delay_s).callbacks.append(ready_at(i))
            current += 1
        while current > target:
            if not lc.cancel_newest_starting(now):
                if len(fleet.ready) <= 1:
                    break
                i = min(fleet.ready, key=lambda k: (reps[k].port.load.outstanding, -k))
                fleet.ready = [k for k in fleet.ready if k != i]
                lc.drain(i, now)
            current -= 1
        if env.peek() == float("inf"):  # nothing else will happen: requests are stuck
            break  # (simulate's own check names them)
        yield env.timeout(lc.spec.scrape_s)
    else:
        last = max((e for r in reps if (e := r.rec.log.last_end()) is not None), default=env.now)
        while lc.cancel_newest_starting(last):  # no request left for them: the run's end
            pass
        retire(fleet, env.now, check=total)
    finished[0] = True


def retire(fleet: Fleet, now: float, check: int | None = None) -> None:
    """Draining replicas whose last request has ended are gone (at that request's end);
    at the run's end (`check`: the request count) every request must be accounted for."""
    lc = fleet.lifecycle
    for i, state in enumerate(lc.state):
        rep = fleet.front[i].rep
        if state == "draining" and rep.port.load.outstanding == 0:
            last = rep.rec.log.last_end()
            lc.gone(i, max(lc.current[i].draining, last if last is not None else 0.0))
    if check is not None:
        lc.check_accounted([n.rep.done for n in fleet.front], check)


def kv_link(env: simpy.Environment, fleet: Fleet, dst: Node):
    """Move finished prefills' KV into `dst`, first come first served, one at a time,
    each once `dst` has the blocks for it (back-pressure: the prefill replica keeps the
    blocks, and so admits less, while it waits)."""
    rep = dst.rep
    kv = rep.st.kv
    # each GPU of the decode replica receives its own heads' share over its own link
    bytes_per_token = rep.config.kv_bytes_per_token
    max_seqs = rep.policy.max_seqs
    while True:
        if not dst.transfers:
            dst.link_wake = env.event()
            yield dst.link_wake
            dst.link_wake = None
            continue
        s, src = dst.transfers[0]
        need = kv.blocks_for(s.prompt + s.generated - 1)
        if not kv.can_allocate(need, rep.policy.watermark) or rep.places_taken() >= max_seqs:
            dst.room = env.event()
            yield dst.room
            dst.room = None
            continue
        dst.transfers.popleft()
        nbytes = reserve_transfer(rep, s) * bytes_per_token
        seconds = fleet.link.seconds(nbytes)
        rep.rec.events.append(Event(env.now, s.rid, "kv_transfer", seconds, src.rep.name))
        yield env.timeout(seconds)
        rep.rec.transfer_bytes += nbytes
        hand_over(src.rep, s)
        src.poke()
        s.prefill_replica, s.replica = src.rep.index, rep.index
        take_over(rep, s, env.now)
        dst.poke()


def leaping() -> bool:
    """Whether replicas leap over steps no one else can see (`replica`): on unless the
    environment variable LLMSIM_LEAP is "0" (tests and benchmarks compare both ways)."""
    return os.environ.get("LLMSIM_LEAP", "1") != "0"


def replica(env: Clock, node: Node, progress=None, leap: bool = True):
    """Run iterations for as long as there is work; sleep when there is none.

    Leaping: a step that ends before the next event anyone else scheduled (`env.peek()`),
    and whose end wakes no one (no closed-loop client told of an end, no disaggregated
    hand-off, no KV link waiting for room here), is finished at once, on the replica's own
    clock `now`, without a SimPy event: nothing else runs in between in either case, so
    every state change, row and random draw comes in the same order at the same times as
    stepping. The replica's clock rejoins the engine's (`Clock.timeout_at`) at the next step that
    another process could see: its end wakes someone, or it ends at or after the next
    scheduled event, which then sees the state it would have seen stepping (events at the
    same instant fire in the order they were scheduled, and a leap's one timeout is
    scheduled after every event already waiting, as the last step's own would have been).
    Where the policy says its plain decode plan holds (`BatchPolicy.steady`), the steps
    before the next event run in one loop, without asking the policy at each
    (`sim/engine/decoderun.py`: the same rows, draws and state, in the same order).
    """
    rep = node.rep
    st, log, policy, port = rep.st, rep.rec.log, rep.policy, rep.port
    batch = st.batch
    # the end of any step wakes no one here: open loop, no hand-off to a decode pool
    quiet = node.ended is None and port.handoff is None
    # runs of plain decode steps in one loop (sim/engine/decoderun.py), where the policy
    # says how long its plan holds and the step is the plain one (no speculation, own log)
    steady = getattr(policy, "steady", None) if (
        leap and rep.speculator is None and not rep.own_record) else None
    now = env.now
    while True:
        if port.arrived:
            join_arrived(rep)
        plan = policy.schedule(st, now)
        if plan.reject and node.ended is not None:
            if now != env.now:
                yield env.timeout_at(now)
            node.ended([r.seq for r in plan.reject])
        # plain decoding, and a step as long as the last one would end before the next event
        # (else a run would stop at once, as in a busy fleet): the steps before it at once
        if steady is not None and node.room is None and (repeats := steady(st, plan)) and (
                now + rep.step.seconds < (bound := env.peek())):
            rows = log.rows() if progress is not None else 0
            now, step = decode_run(rep, plan, now, bound, repeats, quiet)
            if progress is not None and log.rows() // 2000 != rows // 2000:
                progress(now)
            if step is None:
                continue
        else:
            step = rep.start(plan, now)
        if step is not None:
            t_end = now + step.seconds
            if not (leap and t_end < env.peek() and node.room is None and (
                    quiet or (plan.kind is DECODE and rep.speculator is None
                              and (not batch.finish_heap
                                   or batch.finish_heap[0][0] > batch.D + 1)))):
                yield env.timeout(step.seconds) if now == env.now else env.timeout_at(t_end)
            done = rep.finish(step, now, t_end)
            now = t_end
            if node.ended is not None and done:
                node.ended(done)
        else:
            if now != env.now:
                yield env.timeout_at(now)
            if plan.kind is IDLE:
                node.wake = env.event()
                if plan.wake_at is not None:
                    yield node.wake | env.timeout(max(0.0, plan.wake_at - now))
                else:
                    yield node.wake  # a new request, a KV hand-off, or nothing ever again
                node.wake = None
                now = env.now
            rep.end_of_step()
        if node.room is not None:
            node.stepped()
        if progress is not None and log.rows() % 2000 == 0:
            progress(now)


def make_seqs(workload: Workload, max_model_len: int, rows=None) -> list[Seq]:
    """The workload's requests (`rows`: only those, an index array); as in vLLM, generation
    stops at the context window (a longer prompt is rejected by the policy)."""
    def col(c) -> np.ndarray:
        c = np.asarray(c)
        return c if rows is None else c[rows]

    ids = range(len(workload)) if rows is None else np.asarray(rows).tolist()
    prompt = col(workload.prompt_tokens)
    output = np.maximum(np.minimum(col(workload.output_tokens), max_model_len - prompt), 1)
    seqs = list(map(Seq, ids, col(np.asarray(workload.arrival_s, dtype=float)).tolist(),
                    prompt.tolist(), output.tolist(), col(workload.max_tokens).tolist()))
    if workload.prefix_hashes is not None:
        for s in seqs:
            s.prefix = workload.prefix_hashes[s.rid]
    return seqs


def prefix_views(workload: Workload, replicas: list[Replica]) -> None:
    """Give each prefix-caching replica whose KV block does not divide the workload's
    prefix-hash block the hashes regrouped into whole KV blocks (`sim/prefix.regroup`);
    a request dispatched there carries that replica's view of its prefix."""
    if workload.prefix_hashes is None:
        return
    views: dict[int, tuple] = {}
    for r in replicas:
        cache = r.st.prefix
        if cache is None or cache.hash_tokens == workload.block_tokens:
            continue
        if cache.hash_tokens not in views:
            views[cache.hash_tokens] = regroup(workload.prefix_hashes, workload.block_tokens,
                                               r.st.kv.block_size)[0]
        r.port.prefix_view = views[cache.hash_tokens]


def check_accounted(replicas: list[Replica], requests: int) -> None:
    """Every request ended finished or rejected, every block and slot given back."""
    done = sum(r.done for r in replicas)
    if done != requests:
        raise RuntimeError(f"simulation ended with {requests - done} requests unaccounted for")
    for r in replicas:
        r.check_conserved()
        r.rec.check_limits(r.name, r.policy.max_seqs, r.policy.step_tokens)


def start_replicas(env: Clock, fleet: Fleet, progress, leap: bool, feed: Feed | None = None
                   ) -> None:
    """A process per replica (a pipelined replica brings its own, sim/engine/pipeline.py;
    a lone replica fed its arrivals, sim/engine/feed.py)."""
    for i, node in enumerate(fleet.nodes):
        process = getattr(node.rep, "process", None)
        if feed is not None:
            env.process(fed_replica(env, node, feed, progress))
        elif process is not None:
            env.process(process(env, node, progress if i == 0 else None))
        else:
            env.process(replica(env, node, progress if i == 0 else None, leap))


def simulate(workload: Workload, replicas: list[Replica], router=None, *, decode_router=None,
             link: Link | None = None, staleness_s: float = 0.0, progress=None,
             lifecycle: Lifecycle | None = None, scaler=None,
             leap: bool | None = None, watcher=None) -> RunResult:
    """Replay `workload` through the replicas; every request ends finished or rejected.
    With `lifecycle` and `scaler` (a sim/policies/autoscale.py policy) replicas come and go.
    `leap` (default: `leaping()`, the LLMSIM_LEAP environment variable): replicas finish
    steps no one else can see without a SimPy event each (`replica`); the same results.
    `watcher`: stop once it says so (sim/engine/watch.py); requests then left unfinished
    keep their state (waiting, running, ...) and are not checked for."""
    max_len = min(r.st.max_model_len for r in replicas)
    seqs = make_seqs(workload, max_len)
    prefix_views(workload, replicas)
    env = Clock()
    fleet = Fleet(env, replicas, router, decode_router=decode_router, link=link,
                  staleness_s=staleness_s)
    finished = [False]
    if staleness_s > 0 and len(fleet.front) > 1 and fleet.router.uses_reports:
        # reports first: a report and an arrival at the same instant see the state before it
        env.process(reporter(env, fleet, staleness_s, finished))

        def watch():  # stop the reporter once every request is accounted for
            while sum(r.done for r in replicas) < len(seqs):
                yield env.timeout(max(staleness_s, 1.0))
            finished[0] = True
        env.process(watch())
    if lifecycle is not None:
        env.process(autoscaler(env, fleet.scaled(lifecycle), scaler, seqs, finished))
    loop = None
    if workload.clients is not None:
        loop = ClosedLoop(env, workload.clients, fleet)
        for node in fleet.nodes:
            node.ended = loop.ended
        for user in range(workload.clients.concurrency):
            env.process(client(env, loop, seqs, user))
    leap = leaping() if leap is None else leap
    feed = None
    if loop is None and lifecycle is None and feedable(fleet, fleet.nodes[0], leap):
        feed = Feed.of(fleet, seqs, workload.arrival_s)  # taken at its step ends
    elif loop is None:
        env.process(arrivals(env, fleet, seqs))
    start_replicas(env, fleet, progress, leap, feed)
    for node in fleet.back:
        env.process(kv_link(env, fleet, node))
    stopped = run_clock(env, seqs, watcher)
    warmup, marks = None, [0] * len(replicas)
    if loop is not None:  # requests never sent (the window closed) leave no row
        sent = sorted(loop.sent)
        seqs, warmup = [seqs[i] for i in sent], workload.clients.warmup[sent]
        marks = loop.gap_marks or marks
        for r, k in zip(replicas, loop.kernel_marks or [0.0] * len(replicas), strict=True):
            r.rec.kernel_busy_s -= k  # the measured window's (the step under way at its start in)
    if stopped is None:
        check_accounted(replicas, len(seqs))
    streamed(seqs, fleet.nodes)
    gaps, weights = pooled_gaps([r.rec for r in replicas], marks)
    results = [ReplicaResult.of(r) for r in replicas]
    end = env.now if not finished[0] else max(
        (e for r in results if (e := r.steps.last_end()) is not None), default=0.0)
    return RunResult(seqs, results, gaps, weights, end, warmup)

