"""One replica's state changes: applying a policy's plan and a step's results.

The engine (`sim/engine/processes.py`) owns the clock; this module owns what a step does to
requests and KV blocks: admission (with prefix-cache reuse), preemption by
recompute or swap, prefill / decode / mixed (chunked) / speculative steps, first
tokens, finishes, and the per-step log. A disaggregated replica's side of a KV hand-off
(the state below, the verbs in `sim/engine/handoff.py`) starts at `first_token`.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable
from dataclasses import dataclass

from sim.costmodel.latency import StepLatency
from sim.engine.results import Event, ReplicaResult, RunResult, StepLog, move_events
from sim.policies.batch import FINISHED, REJECTED, SWAPPED, TRANSFERRING, WAITING, Seq
from sim.policies.kv import ContiguousKV
from sim.policies.router import ReplicaLoad
from sim.policies.scheduler import (
    DECODE,
    IDLE,
    ReplicaState,
    StaticPolicy,
    StepPlan,
    drop_from_head,
)
from sim.policies.speculative import SpecBatch

__all__ = ["Replica", "ReplicaResult", "RunResult", "Step", "StepLog"]


@dataclass(slots=True)
class Step:
    """A step under way: what `Replica.start` began and `Replica.finish` completes."""

    plan: StepPlan
    seconds: float
    seqs: int = 0       # sequences computed
    tokens: int = 0     # tokens computed (or, for speculative rounds, emitted)
    code: int = 0       # log kind: 0 prefill, 1 decode, 2 verify, 3 mixed


class Replica:
    """One model replica: its state, its policy and its step latency model."""

    def __init__(self, state: ReplicaState, policy, latency: StepLatency, kv_bytes_per_token: float,
                 pcie_bytes_per_s: float):
        self.st, self.policy, self.lat = state, policy, latency
        # the unjittered step model (its kernel_s), and the GPU kernel seconds of the steps run
        self.kernels, self.kernel_busy_s = getattr(latency, "base", latency), 0.0
        self.static = isinstance(policy, StaticPolicy)
        self.contiguous = isinstance(state.kv, ContiguousKV)
        self.block_bytes = kv_bytes_per_token * state.kv.block_size
        self.pcie = pcie_bytes_per_s
        self.log = StepLog()
        self.gaps = array("d")     # inter-token gaps, weighted (see RunningBatch.advance)
        self.weights = array("q")
        self.static_rows: list[Seq] = []
        self.done = 0  # requests this replica finished or rejected
        self.step = Step(IDLE, 0.0)  # the step under way (start fills it, finish completes it)
        self.load = ReplicaLoad()  # what a router knows of it (outstanding kept current here)
        self.transfer_bytes = 0.0  # KV bytes received from prefill replicas
        self.policy_watermark = getattr(policy, "watermark", 0)
        self.swap_bytes = 0.0
        self.spec = isinstance(state.batch, SpecBatch)
        self.name, self.index = "r0", 0
        self.config = None       # the ReplicaConfig it was built from (sim/engine/build.py)
        self.speculator = None
        # disaggregated prefill: called with (seq, t) when a prefill's first token is out
        # and its KV must move to a decode replica (the seq keeps its blocks here until then)
        self.handoff: Callable[[Seq, float], None] | None = None
        self.arrived: list[tuple[Seq, float]] = []  # disaggregated decode: KV arrived mid-step
        self.prefix_view: tuple | None = None  # prefix hashes in whole KV blocks (engine.prefix_views)
        self.outside_tokens = 0  # disaggregated: KV held for requests outside the batch
        self.events: list[Event] = []  # preemptions, swaps and KV transfers, with their times
        # (new, cached) prefill shapes this server has run (a live runtime stalls on new ones)
        self.prefill_shapes: set[tuple[int, int]] = set()

    # ---- KV ------------------------------------------------------------------------
    def alloc(self, blocks: int) -> None:
        self.st.kv.allocate(blocks)
        if self.st.prefix is not None:
            self.st.prefix.evict_to_fit()

    def free(self, s: Seq, held: int) -> None:
        """`s` lets go of `held` logical blocks; blocks another request shares stay."""
        prefix = self.st.prefix
        self.st.kv.free(held - prefix.release(s) if prefix is not None else held)

    def held(self, s: Seq) -> int:
        if self.contiguous:
            return s.reserved
        if s in self.st.batch.members:
            return self.st.batch.held_blocks(s)
        return self.st.kv.blocks_for(s.prefilled)

    # ---- plan application -------------------------------------------------------------
    def reject(self, plan: StepPlan) -> None:
        """Drop the plan's rejected requests. Policies reject while scanning their queue
        from the head, so each one lies among the first few entries: O(rejected + admitted)."""
        st = self.st
        gone = [r.seq for r in plan.reject]
        from_swap = [s for s in gone if s.state == SWAPPED]
        if from_swap:
            drop_from_head(st.swapped, set(from_swap))
            st.swap_free_blocks += sum(s.reserved for s in from_swap)
        if len(from_swap) < len(gone):
            drop_from_head(st.waiting, {s for s in gone if s.state != SWAPPED})
        for r in plan.reject:
            s = r.seq
            s.state = REJECTED
            s.reject_reason = r.reason
            self.done += 1
            self.load.outstanding -= 1

    def admit(self, plan: StepPlan, now: float, chunked: bool = False) -> None:
        """Take the plan's new requests off the queue and give them KV for their whole
        prefill, or (`chunked`) for their cached prefix plus their first chunk's tokens,
        reusing cached prefix blocks. Every request references its cached prefix before any
        block is taken, so no admission evicts a block a later one in the plan counts on
        (its new tokens are then the plan's, within the step's token budget)."""
        st, kv, prefix = self.st, self.st.kv, self.st.prefix
        per_row = StaticPolicy.per_request_reservation(st, plan.prefill) if self.static else 0
        need = 0
        for a in plan.admit:
            s, h = a.seq, a.cached_blocks
            st.waiting.popleft()
            first = s.sched_t < 0
            if first:
                s.sched_t = now
            if self.contiguous:
                s.reserved = per_row or st.admission_need(s)
                need += s.reserved
                s.prefilled = 0
                continue
            if prefix is not None and s.prefix:
                upto = h * prefix.hash_tokens + a.chunk_tokens if chunked else None
                need += prefix.admission_blocks(s, h, upto)
                s.prefilled = prefix.acquire(s, h, first)
                if first:
                    s.cached_tokens = s.prefilled
            else:
                if prefix is not None and first:
                    prefix.miss(s)
                s.prefilled = 0
                need += kv.blocks_for(a.chunk_tokens if chunked else s.tokens_to_prefill)
        self.alloc(need)
        if self.static:
            self.static_rows = list(plan.prefill)

    def first_token(self, s: Seq, t_end: float) -> None:
        """`s` finished its (re)prefill at `t_end`: one token out, then decode or finish."""
        s.generated += 1
        if s.first_token_t < 0:
            s.first_token_t = t_end
        else:  # resumed after a recompute preemption: one long gap
            self.gaps.append(t_end - s.last_token_t)
            self.weights.append(1)
        if self.st.prefix is not None:
            self.st.prefix.insert(s, s.prompt)
        if s.generated >= s.output:
            s.finish_t = t_end
            self.release(s)
        elif self.handoff is not None:
            s.state = TRANSFERRING
            self.outside_tokens += s.prompt
            self.handoff(s, t_end)
        else:
            self.st.batch.join(s, t_end)

    def release(self, s: Seq) -> None:
        """A finished request gives back its KV (static contiguous rows wait for the batch)."""
        s.state = FINISHED
        self.done += 1
        self.load.outstanding -= 1
        if self.contiguous:
            if not self.static:
                self.st.kv.free(s.reserved)
            return
        self.release_kv(s)

    def release_kv(self, s: Seq) -> None:
        """`s` leaves with all its KV blocks (finished, or handed to a decode replica): the
        prefix cache keeps its computed tokens, and the blocks only it holds are freed."""
        tokens = s.prompt + s.generated - 1
        if self.st.prefix is not None:
            self.st.prefix.insert(s, tokens)
        self.free(s, self.st.kv.blocks_for(tokens))

    def preempt(self, plan: StepPlan) -> None:
        """Recompute preemption: victims lose their KV and go back to the queue's front."""
        st, batch = self.st, self.st.batch
        for v in plan.preempt:
            held = self.held(v)
            if v in batch.members:
                batch.leave(v)
            else:
                st.prefilling.remove(v)
            self.free(v, held)
            v.prefilled = 0
            v.state = WAITING
            v.preemptions += 1
        st.waiting.extendleft(reversed(plan.preempt))

    def swap(self, plan: StepPlan) -> float:
        """Swap victims out and swapped requests back in; returns the seconds spent."""
        st, batch, kv = self.st, self.st.batch, self.st.kv
        moved = 0
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
            self.alloc(s.reserved)
            st.swap_free_blocks += s.reserved
            moved += s.reserved
            batch.join(s, s.last_token_t)
        if not moved:
            return 0.0
        nbytes = moved * self.block_bytes
        self.swap_bytes += nbytes
        return nbytes / self.pcie

    # ---- steps ------------------------------------------------------------------------
    def decode_step(self, plan: StepPlan) -> tuple[float, int]:
        """Start a decode step (after any preemption or swapping); returns (seconds, rows)."""
        batch = self.st.batch
        move_s = 0.0
        if plan is not DECODE:
            if plan.preempt:
                self.preempt(plan)
            if plan.swap_out or plan.swap_in:
                move_s = self.swap(plan)
        need = batch.new_blocks_needed(plan.lookahead)
        if need:
            self.alloc(need)
        n = batch.n_compute
        if self.spec:  # victims gone, the round keeps the lookahead its blocks were planned at
            return batch.seconds(plan.lookahead) + move_s, n
        return self.lat.decode(n, batch.sum_ctx(), batch.max_ctx()) + move_s, n

    def finish_round(self, n: int) -> tuple[int, int]:
        """After a speculative round: free rolled-back draft slots; (kind code, tokens)."""
        batch = self.st.batch
        if batch.rolled_back:
            self.st.kv.free(batch.rolled_back)
            batch.rolled_back = 0
        la = batch._la
        return (2 if la > 1 else 1), n * la

    def prefill_step(self, plan: StepPlan, now: float) -> tuple[float, int, int]:
        """Start an all-prefill step; returns (seconds, sequences, tokens)."""
        loads = self._loads()
        self.admit(plan, now)
        chunks = [(s.tokens_to_prefill - s.prefilled, s.prefilled) for s in plan.prefill]
        dur = self.lat.prefill(chunks, self.prefill_shapes) + self._load_seconds(loads)
        return dur, len(chunks), sum(q for q, _ in chunks)

    def _loads(self) -> int:
        return self.st.prefix.loaded if self.st.prefix is not None else 0

    def _load_seconds(self, before: int) -> float:
        """PCIe time of the prefix blocks this step copied back from host memory."""
        prefix = self.st.prefix
        if prefix is None or prefix.loaded == before:
            return 0.0
        nbytes = (prefix.loaded - before) * prefix.units * self.block_bytes
        self.swap_bytes += nbytes
        return nbytes / self.pcie

    def finish_prefill_step(self, plan: StepPlan, t_end: float) -> None:
        for s in plan.prefill:
            s.prefilled = s.tokens_to_prefill
            self.first_token(s, t_end)

    def mixed_step(self, plan: StepPlan, now: float) -> tuple[float, int, int, int]:
        """Start a chunked step (decodes + prefill chunks); returns (seconds, kind,
        sequences, tokens)."""
        st, batch, kv = self.st, self.st.batch, self.st.kv
        if plan.preempt:
            self.preempt(plan)
        loads = self._loads()
        if plan.admit:
            self.admit(plan, now, chunked=True)
            st.prefilling.extend(plan.prefill)
        new = {a.seq for a in plan.admit}
        chunks = []
        for c in plan.chunks:
            s, q = c.seq, c.tokens
            if s not in new:
                self.alloc(kv.blocks_for(s.prefilled + q) - kv.blocks_for(s.prefilled))
            chunks.append((q, s.prefilled))
        need = batch.new_blocks_needed()
        if need:
            self.alloc(need)
        n = batch.n_compute
        dur = (self.lat.mixed(n, batch.sum_ctx(), batch.max_ctx(), chunks, self.prefill_shapes)
               + self._load_seconds(loads))
        kind = (1 if n else 0) if not chunks else (3 if n else 0)
        return dur, kind, n + len(chunks), n + sum(q for q, _ in chunks)

    def finish_mixed_step(self, plan: StepPlan, t_end: float) -> list[Seq]:
        """Decodes advance and chunks complete; returns the requests that finished."""
        st = self.st
        done = []
        if st.batch.n_compute:
            done = st.batch.advance(t_end, self.gaps, self.weights)
            for s in done:
                self.release(s)
        for c in plan.chunks:
            s = c.seq
            s.prefilled += c.tokens
            if s.prefilled >= s.tokens_to_prefill:
                st.prefilling.remove(s)
                self.first_token(s, t_end)
                if s.state == FINISHED:
                    done.append(s)
        return done

    def check_conserved(self) -> None:
        """At the end of a run every KV block and every swap block is free again."""
        kv, prefix = self.st.kv, self.st.prefix
        if kv.free_blocks != kv.num_blocks or (prefix is not None and prefix.refs):
            raise RuntimeError(f"KV leak: {kv.num_blocks - kv.free_blocks} of {kv.num_blocks} "
                               f"blocks still taken after every request ended")
        if self.st.swapped:
            raise RuntimeError(f"{len(self.st.swapped)} requests left in host memory")

    def end_static_batch(self) -> None:
        """The batch's longest request finished: every row gives its slot back."""
        if self.contiguous:
            for s in self.static_rows:
                self.st.kv.free(s.reserved)
        self.static_rows = []
        self.st.batch.clear_padding()

    def record(self, t0: float, t1: float, kind: int, seqs: int, tokens: int) -> None:
        held = self.st.batch.kv_tokens() + self.outside_tokens
        if self.st.prefix is not None:  # a shared block holds its tokens once
            held -= self.st.prefix.extra_refs * self.st.prefix.hash_tokens
        self.log.add(t0, t1, kind, seqs, tokens, self.st.kv.used_blocks, held)

    # ---- one plan, start to finish (the engine and the reference engine both use these) --
    def start(self, plan: StepPlan, now: float) -> Step | None:
        """Apply `plan` at `now`: rejections, preemption, swaps, admissions and KV for the
        step; returns the step to compute (the replica's one step under way, reused from
        step to step), or None when the plan computes nothing."""
        if plan.reject:
            self.reject(plan)
        if plan.preempt or plan.swap_out or plan.swap_in:
            self.events.extend(move_events(plan, now))
        kind = plan.kind
        step = self.step
        if kind == "decode":
            step.seconds, n = self.decode_step(plan)
            step.seqs = step.tokens = n
            step.code = 1
        elif kind == "prefill":
            step.seconds, step.seqs, step.tokens = self.prefill_step(plan, now)
            step.code = 0
        elif kind == "mixed":
            step.seconds, step.code, step.seqs, step.tokens = self.mixed_step(plan, now)
        else:
            if kind == "preempt":
                self.preempt(plan)
                self.swap(plan)
            return None
        self.kernel_busy_s += (self.speculator.kernel_s if self.spec and kind == "decode"
                               else self.kernels.kernel_s)
        step.plan = plan
        return step

    def finish(self, step: Step, t0: float, t_end: float) -> list[Seq]:
        """The step begun at `t0` ended at `t_end`: tokens out, finished requests free
        their KV, the step is logged. Returns the requests that finished in it."""
        kind = step.plan.kind
        if kind == "decode":
            done = self.st.batch.advance(t_end, self.gaps, self.weights)
            for s in done:
                self.release(s)
            code, tokens = self.finish_round(step.seqs) if self.spec else (1, step.seqs)
            self.record(t0, t_end, code, step.seqs, tokens)
        elif kind == "prefill":
            self.finish_prefill_step(step.plan, t_end)
            done = [s for s in step.plan.prefill if s.state == FINISHED]
            self.record(t0, t_end, 0, step.seqs, step.tokens)
        else:
            done = self.finish_mixed_step(step.plan, t_end)
            self.record(t0, t_end, step.code, step.seqs, step.tokens)
        if self.static:
            self.end_of_step()
        return done

    def end_of_step(self) -> None:
        """Static batching: once the batch's last row finished (at its prefill, too), every
        slot is given back."""
        if self.static and len(self.st.batch) == 0 and (self.st.batch.n_compute
                                                        or self.static_rows):
            self.end_static_batch()
