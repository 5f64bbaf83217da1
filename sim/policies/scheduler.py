"""Batching policies. A policy reads the replica's state and returns a `StepPlan`;
it never touches the clock or mutates anything (the engine applies the plan).

The default is `chunked` (sim/policies/chunked.py), what current vLLM runs (the V1
scheduler: chunked prefill always on, steps that mix prefill chunks and decodes under one
token budget). The older prefill-first behaviour is the named choice `continuous`:

* `ContinuousPolicy`: iteration-level scheduling with vLLM-v0 semantics. FCFS;
  a step is all-prefill (admit waiting requests while `max_num_seqs`,
  `max_num_batched_tokens` and free KV blocks above the watermark allow) or
  all-decode. A decode step that cannot get a block for every running request
  preempts the most recently admitted one (recompute: its blocks are freed and
  it returns to the front of the queue; swap: its blocks move to host memory
  and come back before any new prefill).
* `StaticPolicy`: request-level batching. Collect up to `max_batch_size`
  requests (waiting at most `max_wait_s` after the first one queued), prefill
  them together, decode until the longest finishes; finished rows keep their
  slot (and are computed as padding) until the batch ends.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

from sim.io.specload import MAX_TIME_S
from sim.policies.batch import Seq
from sim.policies.plan import (
    CHANGES,
    DECODE,
    IDLE,
    THROUGH_FINISH,
    UNTIL_FINISH,
    Admission,
    Rejection,
    StepKind,
    StepPlan,
)
from sim.policies.prefix import PrefixCache
from sim.policies.protocols import DecodeBatch, KVManager


@dataclass(frozen=True)
class SchedulerSpec:
    # chunked (default): vLLM V1, mixed prefill+decode steps under the token budget;
    # continuous: vLLM v0's prefill-first steps; static: request-level batches
    policy: Literal["continuous", "static", "chunked"] = "chunked"
    # continuous (vLLM v0) and chunked prefill: admission limits per step (for chunked,
    # max_num_batched_tokens is the per-step token budget shared by decodes and chunks)
    max_num_seqs: int = field(default=256, metadata={"gt": 0})
    # default (None): 8192 (vLLM V1's budget for its API server on H100/H200-class GPUs),
    # raised under `continuous` to the context window (a prompt is
    # prefilled in one step; vLLM v0 raises its default the same way, from 2048); a value
    # set below the window is refused under `continuous`, as vLLM refuses it
    max_num_batched_tokens: int | None = field(default=None, metadata={"gt": 0})
    watermark: float = field(default=0.01, metadata={"ge": 0, "lt": 1})
    preemption: Literal["recompute", "swap"] = "recompute"
    # static (request-level): collect up to max_batch_size, waiting at most max_wait_s
    max_batch_size: int = field(default=8, metadata={"gt": 0})
    max_wait_s: float = field(default=1.0, metadata={"ge": 0, "le": MAX_TIME_S})


@dataclass
class ReplicaState:
    """What a policy may look at (the engine owns and mutates it)."""

    kv: KVManager
    batch: DecodeBatch
    max_model_len: int
    waiting: deque[Seq] = field(default_factory=deque)
    swapped: deque[Seq] = field(default_factory=deque)
    swap_free_blocks: int = 0
    reserve_max_model_len: bool = True  # contiguous KV: reserve the whole window
    prefix: PrefixCache | None = None
    prefilling: list[Seq] = field(default_factory=list)  # chunked: prefills under way, FCFS
    # batch places held by requests outside the batch and the queues: KV transfers under
    # way into a disaggregated decode replica, and those arrived but not yet joined
    held_places: int = 0

    def places(self) -> int:
        """Batch places taken (what `max_num_seqs` bounds): the running batch, prefills under
        way, and KV transfers into this replica (the one count admission, re-prefill,
        swap-in and the KV link share)."""
        return len(self.batch) + len(self.prefilling) + self.held_places

    def max_total(self, s: Seq) -> int:
        """The longest a request may grow: what a contiguous manager reserves for it."""
        if self.reserve_max_model_len:
            return self.max_model_len
        return min(s.prompt + s.max_tokens, self.max_model_len)

    def admission_need(self, s: Seq) -> int:
        return self.kv.reserve_for(s.tokens_to_prefill, self.max_total(s))

    def freed_by(self, s: Seq, held: int) -> int:
        """Blocks that preempting `s`, holding `held` logical blocks, gives back."""
        return held - self.prefix.shared_blocks(s) if self.prefix is not None else held

    def admission(self, s: Seq) -> tuple[int, int, int]:
        """(cached hash blocks, tokens served from the prefix cache, KV blocks to take)."""
        if self.prefix is not None and s.prefix:
            h = self.prefix.match(s)
            return h, h * self.prefix.hash_tokens, self.prefix.admission_blocks(s, h)
        return 0, 0, self.admission_need(s)


class BatchPolicy(Protocol):
    """Reads a replica's state and returns a plan; never touches the clock."""

    watermark: int      # KV blocks admission keeps free
    holds_batch: bool   # static: a batch's rows keep their KV until its longest request ends
    max_seqs: int       # the most sequences one step computes
    step_tokens: int | None  # the most tokens a step's prefill computes (None: no budget)

    def schedule(self, st: ReplicaState, now: float) -> StepPlan: ...
    def row_reservation(self, st: ReplicaState, seqs: Sequence[Seq]) -> int: ...
    def steady(self, st: ReplicaState, plan: StepPlan) -> int:
        """How long `plan`, just returned by `schedule`, holds while the replica only decodes
        (sim/policies/plan.py: CHANGES, UNTIL_FINISH, THROUGH_FINISH)."""
        ...


def drop_from_head(queue: deque[Seq], gone: set[Seq]) -> None:
    """Remove `gone` (all in `queue`) from `queue`, scanning only up to the last of them."""
    kept = []
    left = len(gone)
    while left:
        s = queue.popleft()
        if s in gone:
            left -= 1
        else:
            kept.append(s)
    queue.extendleft(reversed(kept))


def never_fits(st: ReplicaState, s: Seq, step_budget: int | None = None, watermark: int = 0) -> str:
    """Why `s` can never be admitted, even into an empty replica ("" if it can), naming the
    limit that binds: the context window (max_model_len, as vLLM says), then the per-step
    token budget (`step_budget`: continuous batching prefills a prompt in one step; None
    where a prompt may span steps or the budget does not apply), then the whole KV cache."""
    n = s.tokens_to_prefill
    if n > st.max_model_len:
        return resumed(s, f"prompt of {n} tokens exceeds max_model_len {st.max_model_len} "
                          f"(the context window)")
    if step_budget is not None and n > step_budget:
        return resumed(s, f"prompt of {n} tokens exceeds the per-step token budget {step_budget} "
                          f"(scheduler.max_num_batched_tokens)")
    need = st.admission_need(s)
    if need > st.kv.num_blocks - watermark:
        return resumed(s, f"needs {need} KV slots/blocks, more than the {st.kv.num_blocks - watermark} "
                          f"the whole (empty) KV cache offers above its watermark")
    return ""


def resumed(s: Seq, reason: str) -> str:
    """A reject reason, told apart for a request preempted (by recompute) after its first
    token: its re-prefill of prompt + generated tokens is what no longer fits."""
    if not s.generated:
        return reason
    return (f"preempted after {s.generated} output tokens, and its re-prefill of "
            f"{s.tokens_to_prefill} tokens no longer fits: {reason}")


class ContinuousPolicy:
    holds_batch = False

    def __init__(self, spec: SchedulerSpec, kv: KVManager):
        self.spec = spec
        self.watermark = int(spec.watermark * kv.num_blocks)
        self.swap = spec.preemption == "swap"
        self.max_seqs, self.step_tokens = spec.max_num_seqs, spec.max_num_batched_tokens

    @staticmethod
    def row_reservation(st: ReplicaState, seqs: list[Seq]) -> int:
        """0: each admitted request reserves its own KV (`ReplicaState.admission_need`)."""
        return 0

    def schedule(self, st: ReplicaState, now: float) -> StepPlan:
        if st.waiting and not st.swapped:
            plan = self.admit(st)
            if plan.admit or plan.reject:
                return plan
        if len(st.batch) == 0 and not st.swapped:
            return IDLE
        return self._decode(st)

    @staticmethod
    def steady(st: ReplicaState, plan: StepPlan) -> int:
        """A plain DECODE holds through finishes while nothing waits (or is swapped out).
        With requests waiting, none admitted, it holds until a request finishes: a waiting
        request is admitted once places or free blocks allow, and only a finish gives either
        back (decode steps only take blocks); with a prefix cache, a decode step's evictions
        change what the waiting request would reuse: ask at each step."""
        if plan is not DECODE or st.swapped:
            return CHANGES
        if not st.waiting:
            return THROUGH_FINISH
        return UNTIL_FINISH if st.prefix is None else CHANGES

    def admit(self, st: ReplicaState) -> StepPlan:
        spec, kv, watermark = self.spec, st.kv, self.watermark
        budget, max_seqs, max_len = spec.max_num_batched_tokens, spec.max_num_seqs, st.max_model_len
        usable = kv.num_blocks - watermark
        prefix = st.prefix
        plan = StepPlan(StepKind.PREFILL)
        tokens, seqs, blocks = 0, st.places(), 0
        for s in st.waiting:
            n = s.prompt + s.generated  # its (re)prefill, s.tokens_to_prefill
            need = st.admission_need(s)
            # never_fits's limits, checked here once (it names the one that binds)
            if n > max_len or (budget is not None and n > budget) or need > usable:
                plan.reject.append(Rejection(s, never_fits(st, s, budget, watermark)))
                continue
            h = 0
            if prefix is not None and s.prefix:  # st.admission, its admission_need reused
                h, cached, need = st.admission(s)
                n -= cached
            if tokens + n > budget or seqs + 1 > max_seqs:
                break
            if not kv.can_allocate(blocks + need, watermark):
                break
            plan.admit.append(Admission(s, h))
            tokens += n
            seqs += 1
            blocks += need
        if not plan.admit:
            plan.kind = StepKind.IDLE if not plan.reject else StepKind.REJECT
        return plan

    def _decode(self, st: ReplicaState) -> StepPlan:
        batch, kv = st.batch, st.kv
        need = batch.new_blocks_needed()
        free = kv.free_blocks
        if need <= free and not st.swapped:
            return DECODE
        plan = StepPlan(StepKind.DECODE)
        if need > free:
            plan.lookahead = batch.lookahead()  # what `need` stands on, victims still in
            swap_room = st.swap_free_blocks
            for victim in reversed(batch.members):
                held = batch.held_blocks(victim)
                if self.swap and held <= swap_room and st.prefix is None:
                    plan.swap_out.append(victim)
                    swap_room -= held
                else:
                    plan.preempt.append(victim)
                free += st.freed_by(victim, held)
                need -= batch.needs_block(victim)
                if need <= free:
                    break
        elif st.swapped:
            seqs = st.places()
            for s in st.swapped:
                n = s.reserved + batch.join_growth(s)  # its blocks and room for its next step
                if n > kv.num_blocks:  # it outgrew the whole cache
                    plan.reject.append(Rejection(s, f"grew to {s.prompt + s.generated} tokens, "
                                                    "more than the KV cache holds"))
                    continue
                if seqs + 1 > self.spec.max_num_seqs or free - n - need < self.watermark:
                    break
                plan.swap_in.append(s)
                free -= n
                seqs += 1
        if len(batch) - len(plan.preempt) - len(plan.swap_out) + len(plan.swap_in) == 0:
            plan.kind = StepKind.PREEMPT if (plan.preempt or plan.swap_out) else (
                StepKind.REJECT if plan.reject else StepKind.IDLE)
        return plan


class StaticPolicy:
    holds_batch = True
    watermark = 0
    step_tokens = None  # a static batch prefills its prompts whatever their length

    def __init__(self, spec: SchedulerSpec, kv: KVManager):
        self.spec = spec
        self.max_seqs = spec.max_batch_size

    def schedule(self, st: ReplicaState, now: float) -> StepPlan:
        if len(st.batch):
            return DECODE
        if not st.waiting:
            return IDLE
        deadline = st.waiting[0].arrival + self.spec.max_wait_s
        if len(st.waiting) < self.spec.max_batch_size and now < deadline:
            return StepPlan(StepKind.IDLE, wake_at=deadline)
        plan = StepPlan(StepKind.PREFILL)
        chosen: list[Seq] = []
        for s in st.waiting:
            reason = never_fits(st, s)
            if not reason and self.batch_reservation(st, [s]) > st.kv.num_blocks:
                reason = resumed(s, f"its prompt and output cap need "
                                    f"{self.batch_reservation(st, [s])} KV slots/blocks, more "
                                    f"than the {st.kv.num_blocks} that exist")
            if reason:
                plan.reject.append(Rejection(s, reason))
                continue
            if len(chosen) == self.spec.max_batch_size:
                break
            trial = chosen + [s]
            if not st.kv.can_allocate(self.batch_reservation(st, trial)):
                break
            chosen = trial
        plan.admit = [Admission(s) for s in chosen]
        if not chosen:
            plan.kind = StepKind.REJECT if plan.reject else StepKind.IDLE
        return plan

    @staticmethod
    def steady(st: ReplicaState, plan: StepPlan) -> int:
        """A static batch decodes until its last request finishes, whatever waits."""
        return THROUGH_FINISH if plan is DECODE else CHANGES

    @staticmethod
    def row_reservation(st: ReplicaState, seqs: list[Seq]) -> int:
        """Each row holds room for the batch's longest prompt plus its largest output cap."""
        longest = max(s.prompt for s in seqs) + max(s.max_tokens for s in seqs)
        return st.kv.blocks_for(min(longest, st.max_model_len))

    def batch_reservation(self, st: ReplicaState, seqs: list[Seq]) -> int:
        return self.row_reservation(st, seqs) * len(seqs)

