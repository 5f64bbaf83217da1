"""Chunked prefill (Sarathi-Serve; vLLM's chunked prefill): every step runs every
running decode first, then fills what is left of the token budget
(`max_num_batched_tokens`) with prefill chunks, oldest request first, so a long
prompt is spread over several steps that also decode, instead of one long step
that stalls every decode. A chunk attends over the earlier chunks of its own
prompt. Decode growth that cannot get a block preempts the newest request
(a prefill under way first), by recomputation.
"""

from __future__ import annotations

from sim.policies.batch import Seq
from sim.policies.plan import (
    CHANGES,
    IDLE,
    THROUGH_FINISH,
    UNTIL_FINISH,
    Admission,
    Chunk,
    Rejection,
    StepKind,
    StepPlan,
)
from sim.policies.protocols import KVManager
from sim.policies.scheduler import ReplicaState, SchedulerSpec, never_fits, resumed

_MIXED = StepKind.MIXED
_NONE: frozenset = frozenset()
DECODING = StepPlan(_MIXED)  # the running batch's decodes alone (shared: nobody mutates a plan)


class ChunkedPolicy:
    holds_batch = False

    def __init__(self, spec: SchedulerSpec, kv: KVManager):
        self.spec = spec
        self.watermark = int(spec.watermark * kv.num_blocks)
        self.max_seqs, self.step_tokens = spec.max_num_seqs, spec.max_num_batched_tokens
        # the longest prefill (prompt + generated) known to fit an empty replica, first
        # chunk and all (`never_fits`, `first_chunk_never_fits`): with paged KV the verdict
        # is a function of the length alone, the limits being the replica's own, and a
        # shorter prefill needs no more of any (the context window, its blocks, its first
        # chunk's blocks: each a non-decreasing function of the length), so every length up
        # to one that fits fits too (`tests/test_chunked_fast.py`)
        self.fit_max = -1

    @staticmethod
    def row_reservation(st: ReplicaState, seqs: list[Seq]) -> int:
        """0: each admitted request takes its own KV."""
        return 0

    def schedule(self, st: ReplicaState, now: float) -> StepPlan:
        batch, kv, spec = st.batch, st.kv, self.spec
        prefilling, waiting = st.prefilling, st.waiting
        running = len(batch.members)  # len(batch)
        quiet = not prefilling and not waiting
        if quiet and not running:
            return IDLE
        need = batch.new_blocks_needed()
        free = kv.free_blocks
        if quiet and need <= free:
            return DECODING  # what the rest would plan: the batch's decodes alone
        plan = StepPlan(_MIXED)
        chunks = plan.chunks
        if need > free:
            free, need = self.preempt(st, plan, free, need)
        gone = set(plan.preempt) if plan.preempt else _NONE
        budget = spec.max_num_batched_tokens - (running - len(gone))
        free -= need
        if prefilling:
            budget, free = self.next_chunks(st, chunks, gone, budget, free)
        blocks_for = kv.blocks_for
        seqs = running + len(prefilling) - len(gone)
        fit_max, prefix, watermark = self.fit_max, st.prefix, self.watermark
        for s in waiting if not plan.preempt else ():
            n = s.prompt + s.generated  # tokens_to_prefill
            if n > fit_max:  # (a length up to `fit_max` fits: no need to ask)
                if reason := self.why_never(st, s):
                    plan.reject.append(Rejection(s, reason))
                    continue
                fit_max = self.fit_max
            if budget <= 0 or seqs + st.held_places + 1 > spec.max_num_seqs:
                break
            if prefix is None:  # (0, 0, _): nothing cached (ReplicaState.admission)
                h = 0
                q = n if n < budget else budget
                blocks = blocks_for(q)
            else:
                h, q, blocks = self.cached_chunk(st, s, budget)
            if free - blocks < watermark and h and not seqs:
                # the cached prefix's blocks do not fit, and nothing else runs that could
                # free any: start from scratch (its first chunk fits, or it was rejected)
                h, q = 0, min(n, budget)
                blocks = blocks_for(q)
            if free - blocks < watermark:
                break
            plan.admit.append(Admission(s, h, q))
            chunks.append(Chunk(s, q))
            budget -= q
            free -= blocks
            seqs += 1
        if not chunks and running == len(gone):
            self.stalled(st, plan, gone)
        return plan

    def whole_arrival(self, st: ReplicaState) -> Seq | None:
        """The one waiting request, where `schedule` would plan its whole prefill in one
        chunk beside the running batch's decodes and nothing else (no prefill under way or
        prefix cache, the request within `fit_max`, the token budget, the places and the
        free blocks above the watermark); None where it may plan otherwise (ask it). The
        common step of an arrival to a decoding replica, without building its plan."""
        waiting = st.waiting
        if len(waiting) != 1 or st.prefilling or st.prefix is not None:
            return None
        batch, kv = st.batch, st.kv
        s = waiting[0]
        n = s.prompt + s.generated
        running = len(batch.members)
        budget = self.step_tokens - running
        free = kv.free_blocks - batch.new_blocks_needed()
        if (n > self.fit_max or n > budget or budget <= 0 or free < 0
                or running + st.held_places + 1 > self.max_seqs
                or free - kv.blocks_for(n) < self.watermark):
            return None
        return s

    @staticmethod
    def next_chunks(st: ReplicaState, chunks: list[Chunk], gone: set[Seq] | frozenset,
                    budget: int, free: int) -> tuple[int, int]:
        """The next chunk of each prefill under way (but `gone`), oldest first, while the
        token budget and the free blocks last; returns what is left of both."""
        blocks_for = st.kv.blocks_for
        for s in st.prefilling:
            if s in gone:
                continue
            q = min(s.prompt + s.generated - s.prefilled, budget)  # tokens_to_prefill
            blocks = blocks_for(s.prefilled + q) - blocks_for(s.prefilled)
            if q <= 0 or blocks > free:
                break
            chunks.append(Chunk(s, q))
            budget -= q
            free -= blocks
        return budget, free

    @staticmethod
    def cached_chunk(st: ReplicaState, s: Seq, budget: int) -> tuple[int, int, int]:
        """A waiting request's first chunk with a prefix cache: (cached hash blocks, new
        tokens, KV blocks to take)."""
        h, cached, _ = st.admission(s)
        q = min(s.prompt + s.generated - cached, budget)  # tokens_to_prefill
        if s.prefix:
            return h, q, st.prefix.admission_blocks(s, h, cached + q)
        return h, q, st.kv.blocks_for(cached + q)

    @staticmethod
    def stalled(st: ReplicaState, plan: StepPlan, gone: set[Seq] | frozenset) -> None:
        """A plan that computes nothing (no chunk, every decode preempted, `gone`) rejects,
        preempts or idles; where prefills under way hold the blocks each needs, the newest
        of them is preempted."""
        stuck = [s for s in st.prefilling if s not in gone]
        if stuck and not plan.reject:
            plan.preempt.append(stuck[-1])
        plan.kind = StepKind.REJECT if plan.reject else (
            StepKind.PREEMPT if plan.preempt else StepKind.IDLE)

    @staticmethod
    def steady(st: ReplicaState, plan: StepPlan) -> int:
        """A plan that only decodes (no chunk, preemption or rejection, no prefill under way)
        holds through finishes while nothing waits. With requests waiting, none admitted, it
        holds until a request finishes: what stops admission (places, the token budget left
        by the decodes, free blocks less the step's own) changes only when one finishes
        (decode steps only take blocks); with a prefix cache, a decode step's evictions
        change what the waiting request would reuse: ask at each step."""
        if plan.kind is not _MIXED or plan.chunks or plan.preempt or plan.reject or st.prefilling:
            return CHANGES
        if not st.waiting:
            return THROUGH_FINISH
        return UNTIL_FINISH if st.prefix is None else CHANGES

    def why_never(self, st: ReplicaState, s: Seq) -> str:
        """Why `s` can never be admitted (`never_fits`, `first_chunk_never_fits`; "" if it
        can); the longest length that fits is remembered in `fit_max` (paged KV: the verdict
        is a function of the length alone, and every shorter length fits too)."""
        reason = never_fits(st, s) or self.first_chunk_never_fits(st, s)
        if not reason and st.kv.paged and s.prompt + s.generated > self.fit_max:
            self.fit_max = s.prompt + s.generated
        return reason

    def first_chunk_never_fits(self, st: ReplicaState, s: Seq) -> str:
        """Why the first chunk of `s` cannot be admitted even into an empty replica, whose
        whole token budget it gets, for want of blocks above the watermark ("" if it can)."""
        first = st.kv.blocks_for(min(s.tokens_to_prefill, self.spec.max_num_batched_tokens))
        room = st.kv.num_blocks - self.watermark
        if first <= room:
            return ""
        return resumed(s, f"its first prefill chunk needs {first} KV blocks, more than the {room} "
                          f"an empty cache offers above its watermark")

    @staticmethod
    def preempt(st: ReplicaState, plan: StepPlan, free: int, need: int) -> tuple[int, int]:
        """Victims, newest first: prefills under way, then running requests."""
        batch, kv = st.batch, st.kv
        for v in reversed(st.prefilling):
            plan.preempt.append(v)
            free += st.freed_by(v, kv.blocks_for(v.prefilled))
            if need <= free:
                return free, need
        for v in reversed(batch.members):
            plan.preempt.append(v)
            free += st.freed_by(v, batch.held_blocks(v))
            need -= batch.needs_block(v)
            if need <= free:
                break
        return free, need
