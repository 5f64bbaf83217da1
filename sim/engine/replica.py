"""One replica's state changes: applying a policy's plan and a step's results.

The engine (`sim/engine/processes.py`) owns the clock; this module owns what a step does to
requests: admission, preemption by recompute or swap, prefill / decode / mixed (chunked) /
speculative steps, first tokens and finishes. Its parts sit beside it: KV blocks and
prefix references in `sim/engine/kvaccount.py`, the step log, gaps, events and counters in
`sim/engine/recorder.py`, load reports and the disaggregated hand-off in
`sim/engine/port.py` and `sim/engine/handoff.py` (which takes over at `first_token`).
"""

from __future__ import annotations

from dataclasses import dataclass

from sim.costmodel.latency import StepLatency
from sim.engine.kvaccount import KVAccount
from sim.engine.moves import preempt, reject, swap
from sim.engine.port import Port
from sim.engine.recorder import StepRecorder
from sim.engine.results import ReplicaResult, RunResult, StepLog
from sim.policies.batch import FINISHED, TRANSFERRING, Seq
from sim.policies.plan import DECODE, IDLE, StepKind, StepPlan
from sim.policies.scheduler import BatchPolicy, ReplicaState

__all__ = ["Replica", "ReplicaResult", "RunResult", "Step", "StepLog"]

_PREFILL, _DECODE, _MIXED, _PREEMPT = (StepKind.PREFILL, StepKind.DECODE, StepKind.MIXED,
                                       StepKind.PREEMPT)


@dataclass(slots=True)
class Step:
    """A step under way: what `Replica.start` began and `Replica.finish` completes."""

    plan: StepPlan
    seconds: float
    seqs: int = 0       # sequences computed
    tokens: int = 0     # tokens computed (or, for speculative rounds, emitted)
    kind: StepKind = _PREFILL  # as logged: PREFILL, DECODE, VERIFY or MIXED


class Replica:
    """One model replica: its state, its policy and its step latency model."""

    own_record = False  # a subclass overriding `record` sets it (finish inlines Replica's)

    def __init__(self, state: ReplicaState, policy: BatchPolicy, latency: StepLatency,
                 kv_bytes_per_token: float, pcie_bytes_per_s: float):
        self.st, self.policy, self.lat = state, policy, latency
        self.kernels = getattr(latency, "base", latency)  # the unjittered model (its kernel_s)
        self.kv = KVAccount(state.kv, state.prefix, state.batch)
        self.rec = StepRecorder()
        self.port = Port()
        self.holds_batch = policy.holds_batch  # static: rows keep their KV until the batch ends
        self.block_bytes = kv_bytes_per_token * state.kv.block_size
        self.pcie = pcie_bytes_per_s
        self.static_rows: list[Seq] = []
        self.done = 0  # requests this replica finished or rejected
        self.admitted = 0  # requests a prefill step under way admitted (in no queue or batch)
        self.step = Step(IDLE, 0.0)  # the step under way (start fills it, finish completes it)
        self.name, self.index = "r0", 0
        self.config = None       # the ReplicaConfig it was built from (sim/engine/build.py)
        self.speculator = None   # sim.policies.speculative.Speculator, when speculating
        # (new, cached) prefill shapes this server has run (a live runtime stalls on new ones)
        self.prefill_shapes: set[tuple[int, int]] = set()

    # ---- plan application -------------------------------------------------------------
    def reject(self, plan: StepPlan) -> None:
        """Drop the plan's rejected requests (they count as done)."""
        n = reject(self.st, plan)
        self.done += n
        self.port.load.outstanding -= n

    def admit(self, plan: StepPlan, now: float, chunked: bool = False) -> None:
        """Take the plan's new requests off the queue and give them KV for their whole
        prefill, or (`chunked`) for their cached prefix plus their first chunk's tokens,
        reusing cached prefix blocks (`KVAccount.admit`)."""
        st, kv = self.st, self.kv
        per_row = 0 if kv.paged else self.policy.row_reservation(st, plan.prefill)
        need = 0
        for a in plan.admit:
            s = a.seq
            st.waiting.popleft()
            first = s.sched_t < 0
            if first:
                s.sched_t = now
            if not kv.paged:
                s.reserved = per_row or st.admission_need(s)
                need += s.reserved
                s.prefilled = 0
                continue
            need += kv.admit(s, a.cached_blocks, a.chunk_tokens if chunked else None, first)
        kv.take(need)
        if self.holds_batch:
            self.static_rows = list(plan.prefill)

    def first_token(self, s: Seq, t_end: float) -> None:
        """`s` finished its (re)prefill at `t_end`: one token out, then decode or finish."""
        s.generated += 1
        if s.first_token_t < 0:
            s.first_token_t = t_end
        else:  # resumed after a recompute preemption: one long gap
            self.rec.resumed(t_end, s.last_token_t)
        if self.kv.prefix is not None:
            self.kv.cache(s, s.prompt)
        if s.generated >= s.output:
            s.finish_t = t_end
            self.release(s)
        elif self.port.handoff is not None:
            s.state = TRANSFERRING
            self.port.outside_tokens += s.prompt
            self.port.handoff(s, t_end)
        else:
            self.st.batch.join(s, t_end)

    def release(self, s: Seq) -> None:
        """A finished request gives back its KV (static contiguous rows wait for the batch)."""
        s.state = FINISHED
        self.done += 1
        self.port.load.outstanding -= 1
        kva = self.kv
        if kva.prefix is None and kva.paged:  # KVAccount.release without a prefix cache
            kv = kva.kv
            kv.free(kv.blocks_for(s.prompt + s.generated - 1))
            return
        if not kva.paged:
            if not self.holds_batch:
                self.st.kv.free(s.reserved)
            return
        kva.release(s)

    def preempt(self, plan: StepPlan) -> None:
        """Recompute preemption: victims lose their KV and go back to the queue's front."""
        preempt(self.st, self.kv, plan)

    def swap(self, plan: StepPlan) -> float:
        """Swap victims out and swapped requests back in; returns the seconds spent."""
        return self._pcie_seconds(swap(self.st, self.kv, plan))

    def _pcie_seconds(self, blocks: int) -> float:
        """Seconds to move `blocks` KV blocks between host and GPU memory (counted)."""
        if not blocks:
            return 0.0
        nbytes = blocks * self.block_bytes
        self.rec.swap_bytes += nbytes
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
            self.kv.take(need)
        n = batch.n_compute
        if self.speculator is not None:  # victims gone, the round keeps its planned lookahead
            return batch.seconds(plan.lookahead) + move_s, n
        return self.lat.decode(n, batch.sum_ctx(), batch.max_ctx()) + move_s, n

    def prefill_step(self, plan: StepPlan, now: float) -> tuple[float, int, int]:
        """Start an all-prefill step; returns (seconds, sequences, tokens)."""
        prefix = self.kv.prefix
        loads = prefix.loaded if prefix is not None else 0  # kv.loaded()
        self.admit(plan, now)
        self.admitted = len(plan.admit)
        chunks = []
        tokens = 0
        for a in plan.admit:
            s = a.seq
            q = s.prompt + s.generated - s.prefilled  # what its (re)prefill has left
            chunks.append((q, s.prefilled))
            tokens += q
        dur = self.lat.prefill(chunks, self.prefill_shapes)
        if prefix is not None:  # (+ 0.0 otherwise)
            dur += self._load_seconds(loads)
        return dur, len(chunks), tokens

    def _load_seconds(self, before: int) -> float:
        """PCIe time of the prefix blocks this step copied back from host memory."""
        loaded = self.kv.loaded()
        if loaded == before:
            return 0.0
        return self._pcie_seconds((loaded - before) * self.st.prefix.units)

    def mixed_step(self, plan: StepPlan, now: float) -> tuple[float, StepKind, int, int]:
        """Start a chunked step (decodes + prefill chunks); returns (seconds, kind,
        sequences, tokens)."""
        st, batch, kv = self.st, self.st.batch, self.st.kv
        if plan.preempt:
            self.preempt(plan)
        loads = self.kv.loaded()
        if plan.admit:
            self.admit(plan, now, chunked=True)
            st.prefilling.extend(plan.prefill)
        new = {a.seq for a in plan.admit}
        chunks = []
        for c in plan.chunks:
            s, q = c.seq, c.tokens
            if s not in new:
                self.kv.take(kv.blocks_for(s.prefilled + q) - kv.blocks_for(s.prefilled))
            chunks.append((q, s.prefilled))
        need = batch.new_blocks_needed()
        if need:
            self.kv.take(need)
        n = batch.n_compute
        dur = (self.lat.mixed(n, batch.sum_ctx(), batch.max_ctx(), chunks, self.prefill_shapes)
               + self._load_seconds(loads))
        kind = (_DECODE if n else _PREFILL) if not chunks else (_MIXED if n else _PREFILL)
        return dur, kind, n + len(chunks), n + sum(q for q, _ in chunks)

    def finish_prefill_step(self, plan: StepPlan, t_end: float) -> list[Seq]:
        """Every admitted request has its first token; returns those that finished."""
        self.admitted = 0
        seqs = [a.seq for a in plan.admit]  # plan.prefill
        for s in seqs:
            s.prefilled = s.prompt + s.generated  # s.tokens_to_prefill
            self.first_token(s, t_end)
        return [s for s in seqs if s.state == FINISHED]

    def finish_mixed_step(self, plan: StepPlan, t_end: float) -> list[Seq]:
        """Decodes advance and chunks complete; returns the requests that finished."""
        st = self.st
        done = []
        if st.batch.n_compute:
            done = st.batch.advance(t_end, self.rec.gaps, self.rec.weights)
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

    def places_taken(self) -> int:
        """Batch places held now (`ReplicaState.places`), with the admissions of a prefill
        step under way (in no queue or batch until it ends)."""
        return self.st.places() + self.admitted

    def check_conserved(self) -> None:
        """At the end of a run every KV block and every swap block is free again."""
        self.kv.check_conserved()
        if self.st.swapped:
            raise RuntimeError(f"{len(self.st.swapped)} requests left in host memory")

    def end_static_batch(self) -> None:
        """The batch's longest request finished: every row gives its slot back."""
        if not self.kv.paged:
            for s in self.static_rows:
                self.st.kv.free(s.reserved)
        self.static_rows = []
        self.st.batch.clear_padding()

    def record(self, t0: float, t1: float, step: Step) -> None:
        """The step's entry in the log, with the KV blocks and tokens held at its end (a
        decode step's, inlined in `finish`)."""
        st, prefix = self.st, self.kv.prefix
        held = st.batch.kv_tokens() + self.port.outside_tokens - (
            prefix.extra_refs * prefix.hash_tokens if prefix is not None else 0)
        self.rec.log.add(t0, t1, step.kind, step.seqs, step.tokens, st.kv.used_blocks, held)

    # ---- one plan, start to finish (the engine and the reference engine both use these) --
    def start(self, plan: StepPlan, now: float) -> Step | None:
        """Apply `plan` at `now`: rejections, preemption, swaps, admissions and KV for the
        step; returns the step to compute (the replica's one step under way, reused from
        step to step), or None when the plan computes nothing."""
        if plan is DECODE:  # the common step, flattened: nothing rejected, moved or admitted
            batch, step = self.st.batch, self.step
            need = batch.new_blocks_needed(plan.lookahead)
            if need:
                self.kv.take(need)
            n = batch.n_compute
            if self.speculator is not None:
                step.seconds = batch.seconds(plan.lookahead)
                self.rec.kernel_busy_s += self.speculator.kernel_s
            else:
                step.seconds = self.lat.decode(n, batch.sum_ctx(), batch.max_ctx())
                self.rec.kernel_busy_s += self.kernels.kernel_s
            step.seqs = step.tokens = n
            step.kind = _DECODE
            step.plan = plan
            return step
        if plan.reject:
            self.reject(plan)
        if plan.preempt or plan.swap_out or plan.swap_in:
            self.rec.moves(plan, now)
        kind = plan.kind
        step = self.step
        if kind is _DECODE:
            step.seconds, n = self.decode_step(plan)
            step.seqs = step.tokens = n
            step.kind = _DECODE
        elif kind is _PREFILL:
            step.seconds, step.seqs, step.tokens = self.prefill_step(plan, now)
            step.kind = _PREFILL
        elif kind is _MIXED:
            step.seconds, step.kind, step.seqs, step.tokens = self.mixed_step(plan, now)
        else:
            if kind is _PREEMPT:
                self.preempt(plan)
                self.swap(plan)
            return None
        self.rec.kernel_busy_s += (self.speculator.kernel_s if kind is _DECODE
                                   and self.speculator is not None else self.kernels.kernel_s)
        step.plan = plan
        return step

    def finish(self, step: Step, t0: float, t_end: float) -> list[Seq]:
        """The step begun at `t0` ended at `t_end`: tokens out, finished requests free
        their KV, the step is logged. Returns the requests that finished in it."""
        plan = step.plan
        kind = plan.kind
        st, rec = self.st, self.rec
        if kind is _DECODE or (kind is _MIXED and not plan.chunks and step.kind is _DECODE
                               and self.speculator is None):
            # finish_decode_step and record, inlined: the hot path (a chunked plan without
            # chunks, decodes only, ends as a decode step: finish_mixed_step's advance)
            batch = st.batch
            done = batch.advance(t_end, rec.gaps, rec.weights)
            for s in done:
                self.release(s)
            step.kind, step.tokens, rolled_back = batch.end_round(step.seqs)
            if rolled_back:  # the slots of rejected drafts
                st.kv.free(rolled_back)
            if self.own_record:  # a subclass that logs otherwise (sim/engine/pipeline.py)
                self.record(t0, t_end, step)
            else:
                prefix = self.kv.prefix
                held = batch.kv_tokens() + self.port.outside_tokens - (
                    prefix.extra_refs * prefix.hash_tokens if prefix is not None else 0)
                rec.log.add(t0, t_end, step.kind, step.seqs, step.tokens, st.kv.used_blocks,
                            held)
        else:
            if kind is _PREFILL:
                done = self.finish_prefill_step(step.plan, t_end)
            else:
                done = self.finish_mixed_step(step.plan, t_end)
            self.record(t0, t_end, step)
        if self.holds_batch:
            self.end_of_step()
        return done

    def end_of_step(self) -> None:
        """Static batching: once the batch's last row finished (at its prefill, too), every
        slot is given back."""
        if self.holds_batch and len(self.st.batch) == 0 and (self.st.batch.n_compute
                                                             or self.static_rows):
            self.end_static_batch()
