"""The SimPy engine: an arrival process feeding a replica process.

`arrivals(env, ...)` releases requests at their arrival times; `replica(env, ...)`
loops: ask the policy for a plan, apply it (admit, preempt, swap, allocate KV),
hold the clock for the step's latency, then apply the step's results (first
tokens, finished requests, freed KV). Policies never see `env`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import simpy

from .batch import FINISHED, REJECTED, SWAPPED, WAITING, RunningBatch, Seq
from .kv import ContiguousKV, PagedKV
from .latency import StepLatency
from .scheduler import ReplicaState, StaticPolicy, StepPlan
from .workload import Workload

KIND_CODES = {"prefill": 0, "decode": 1}


@dataclass
class StepLog:
    """Column lists, one entry per iteration (cheap appends on the hot path)."""

    t_start: list[float] = field(default_factory=list)
    t_end: list[float] = field(default_factory=list)
    kind: list[int] = field(default_factory=list)
    num_seqs: list[int] = field(default_factory=list)
    num_tokens: list[int] = field(default_factory=list)
    kv_blocks_used: list[int] = field(default_factory=list)
    kv_tokens: list[int] = field(default_factory=list)


@dataclass
class RunResult:
    seqs: list[Seq]
    steps: StepLog
    itl_gaps: list[float]
    itl_weights: list[int]
    kv: PagedKV
    end_time: float
    swap_bytes: float = 0.0


class Replica:
    """One model replica: its state, its policy and its step latency model."""

    def __init__(self, state: ReplicaState, policy, latency: StepLatency, kv_bytes_per_token: float,
                 pcie_bytes_per_s: float):
        self.st = state
        self.policy = policy
        self.lat = latency
        self.static = isinstance(policy, StaticPolicy)
        self.contiguous = isinstance(state.kv, ContiguousKV)
        self.block_bytes = kv_bytes_per_token * state.kv.block_size
        self.pcie = pcie_bytes_per_s
        self.log = StepLog()
        self.gaps: list[float] = []
        self.weights: list[int] = []
        self.static_rows: list[Seq] = []
        self.wake: simpy.Event | None = None
        self.pending = 0  # requests not yet finished or rejected
        self.swap_bytes = 0.0
        self.arrivals_done = False

    # ---- plan application -----------------------------------------------------
    def _reject(self, plan: StepPlan) -> None:
        gone = set(plan.reject)
        self.st.waiting = type(self.st.waiting)(s for s in self.st.waiting if s not in gone)
        for s, why in zip(plan.reject, plan.reasons, strict=True):
            s.state = REJECTED
            s.reject_reason = why
            self.pending -= 1

    def _start_prefill(self, plan: StepPlan, now: float) -> list[tuple[int, int]]:
        st, kv = self.st, self.st.kv
        chunks = []
        per_row = StaticPolicy.per_request_reservation(st, plan.prefill) if self.static else 0
        for s in plan.prefill:
            st.waiting.popleft()
            n = s.tokens_to_prefill
            if self.contiguous:
                s.reserved = per_row or st.admission_need(s)
                kv.allocate(s.reserved)
            else:
                kv.allocate(kv.blocks_for(n))
            if s.sched_t < 0:
                s.sched_t = now
            chunks.append((n, 0))
        if self.static:
            self.static_rows = list(plan.prefill)
        return chunks

    def _finish_prefill(self, plan: StepPlan, t_end: float) -> None:
        for s in plan.prefill:
            s.generated += 1
            if s.first_token_t < 0:
                s.first_token_t = t_end
            else:  # resumed after a recompute preemption: one long gap
                self.gaps.append(t_end - s.last_token_t)
                self.weights.append(1)
            if s.generated >= s.output:
                s.finish_t = t_end
                self._release(s, prefilled=True)
            else:
                self.st.batch.join(s, t_end)

    def _release(self, s: Seq, prefilled: bool = False) -> None:
        """A finished request gives back its KV (static contiguous rows wait for the batch)."""
        s.state = FINISHED
        self.pending -= 1
        kv = self.st.kv
        if self.contiguous:
            if not self.static:
                kv.free(s.reserved)
        else:
            kv.free(kv.blocks_for(s.prompt + s.generated - 1))

    def _apply_decode_plan(self, plan: StepPlan) -> float:
        """Preempt / swap before a decode step; returns the seconds spent moving KV."""
        st, batch, kv = self.st, self.st.batch, self.st.kv
        moved = 0
        for v in plan.preempt:
            held = v.reserved if self.contiguous else batch.held_blocks(v)
            batch.leave(v)
            kv.free(held)
            v.state = WAITING
            v.preemptions += 1
        st.waiting.extendleft(reversed(plan.preempt))
        for v in plan.swap_out:
            held = batch.held_blocks(v)
            batch.leave(v)
            kv.free(held)
            st.swap_free_blocks -= held
            v.reserved = held
            v.state = SWAPPED
            v.preemptions += 1
            st.swapped.append(v)
            moved += held
        for s in plan.swap_in:
            st.swapped.popleft()
            kv.allocate(s.reserved)
            st.swap_free_blocks += s.reserved
            moved += s.reserved
            batch.join(s, s.last_token_t)
        if not moved:
            return 0.0
        nbytes = moved * self.block_bytes
        self.swap_bytes += nbytes
        return nbytes / self.pcie

    def _end_static_batch(self) -> None:
        """The batch's longest request finished: every row gives its slot back."""
        if self.contiguous:
            for s in self.static_rows:
                self.st.kv.free(s.reserved)
        self.static_rows = []
        self.st.batch.clear_padding()

    def _record(self, t0: float, t1: float, kind: int, seqs: int, tokens: int) -> None:
        log, b = self.log, self.st.batch
        log.t_start.append(t0)
        log.t_end.append(t1)
        log.kind.append(kind)
        log.num_seqs.append(seqs)
        log.num_tokens.append(tokens)
        log.kv_blocks_used.append(self.st.kv.used_blocks)
        log.kv_tokens.append(b.kv_tokens())


def arrivals(env: simpy.Environment, workload: Workload, rep: Replica, seqs: list[Seq]):
    """Release each request at its arrival time into the replica's queue."""
    t = 0.0
    for s in seqs:
        if s.arrival > t:
            yield env.timeout(s.arrival - t)
            t = s.arrival
        rep.st.waiting.append(s)
        if rep.wake is not None and not rep.wake.triggered:
            rep.wake.succeed()
    rep.arrivals_done = True
    if rep.wake is not None and not rep.wake.triggered:
        rep.wake.succeed()


def replica(env: simpy.Environment, rep: Replica, progress=None):
    """Run iterations until every request has finished or been rejected."""
    st, lat, log = rep.st, rep.lat, rep.log
    batch = st.batch
    policy = rep.policy
    while rep.pending > 0:
        now = env.now
        plan = policy.schedule(st, now)
        if plan.reject:
            rep._reject(plan)
        kind = plan.kind
        if kind == "decode":
            if plan.preempt or plan.swap_out or plan.swap_in:
                move_s = rep._apply_decode_plan(plan)
            else:
                move_s = 0.0
            need = batch.new_blocks_needed()
            if need:
                st.kv.allocate(need)
            n = batch.n_compute
            dur = lat.decode(n, batch.sum_ctx(), batch.max_ctx()) + move_s
            yield env.timeout(dur)
            t_end = now + dur
            for s in batch.advance(t_end, rep.gaps, rep.weights):
                rep._release(s)
            rep._record(now, t_end, 1, n, n)
            if rep.static and len(batch) == 0:
                rep._end_static_batch()
        elif kind == "prefill":
            chunks = rep._start_prefill(plan, now)
            dur = lat.prefill(chunks)
            yield env.timeout(dur)
            t_end = now + dur
            rep._finish_prefill(plan, t_end)
            rep._record(now, t_end, 0, len(chunks), sum(q for q, _ in chunks))
            if rep.static and len(batch) == 0:
                rep._end_static_batch()
        elif kind == "preempt":
            rep._apply_decode_plan(plan)
        elif kind == "idle":
            if rep.arrivals_done and not st.waiting and not st.swapped and len(batch) == 0:
                break
            rep.wake = env.event()
            if plan.wake_at is not None:
                yield rep.wake | env.timeout(max(0.0, plan.wake_at - now))
            else:
                yield rep.wake
            rep.wake = None
        if progress is not None and len(log.t_end) % 2000 == 0:
            progress(env.now)


def simulate(workload: Workload, kv: PagedKV, policy, latency: StepLatency, *,
             max_model_len: int, kv_bytes_per_token: float, pcie_bytes_per_s: float,
             swap_blocks: int = 0, reserve_max_model_len: bool = True,
             progress=None) -> RunResult:
    """Replay `workload` through one replica; every request ends finished or rejected."""
    paged = not isinstance(kv, ContiguousKV)
    batch = RunningBatch(kv.block_size, paged, keep_finished=isinstance(policy, StaticPolicy))
    st = ReplicaState(kv=kv, batch=batch, max_model_len=max_model_len, swap_free_blocks=swap_blocks,
                      reserve_max_model_len=reserve_max_model_len)
    rep = Replica(st, policy, latency, kv_bytes_per_token, pcie_bytes_per_s)
    arr = np.asarray(workload.arrival_s, dtype=float).tolist()
    seqs = [
        Seq(i, a, p, o, m)
        for i, (a, p, o, m) in enumerate(zip(
            arr,
            np.asarray(workload.prompt_tokens).tolist(),
            np.asarray(workload.output_tokens).tolist(),
            np.asarray(workload.max_tokens).tolist(),
            strict=True,
        ))
    ]
    rep.pending = len(seqs)
    env = simpy.Environment()
    env.process(arrivals(env, workload, rep, seqs))
    env.process(replica(env, rep, progress))
    env.run()
    if rep.pending:
        raise RuntimeError(f"simulation ended with {rep.pending} requests unaccounted for")
    return RunResult(seqs, rep.log, rep.gaps, rep.weights, kv, env.now, rep.swap_bytes)
