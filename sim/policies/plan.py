"""What a batching policy returns: a `StepPlan` of one step kind
(`sim/policies/stepkind.py`) that names its requests (`Admission`, `Chunk`, `Rejection`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from sim.policies.batch import Seq
from sim.policies.stepkind import LOGGED_KINDS, StepKind

__all__ = ["CHANGES", "DECODE", "IDLE", "LOGGED_KINDS", "THROUGH_FINISH", "UNTIL_FINISH", "Admission", "Chunk", "Rejection", "StepKind",
           "StepPlan"]


@dataclass(slots=True)
class Admission:
    """A waiting request the plan admits, and what it gets."""

    seq: Seq
    cached_blocks: int = 0  # prefix-cache hash blocks it reuses (0 without prefix caching)
    chunk_tokens: int = 0   # chunked prefill: new tokens of its first chunk (0: whole prefill)


@dataclass(slots=True)
class Chunk:
    """Chunked prefill: a request computes `tokens` more of its (re)prefill this step."""

    seq: Seq
    tokens: int


@dataclass(slots=True)
class Rejection:
    """A request that can never be served here, and why (one line, for requests.csv)."""

    seq: Seq
    reason: str


@dataclass(slots=True)
class StepPlan:
    kind: StepKind                                     # PREFILL | DECODE | MIXED | IDLE | ...
    admit: list[Admission] = field(default_factory=list)  # admitted this step, FCFS order
    preempt: list[Seq] = field(default_factory=list)   # running -> waiting front (recompute)
    swap_out: list[Seq] = field(default_factory=list)  # running -> host memory
    swap_in: list[Seq] = field(default_factory=list)   # host memory -> running
    reject: list[Rejection] = field(default_factory=list)  # can never be served
    wake_at: float | None = None                       # idle: wake by then at the latest
    chunks: list[Chunk] = field(default_factory=list)  # mixed: prefills under way, then admitted
    # speculative decode after preemption: the lookahead the plan's block count stands on
    # (the batch's before its victims leave); 0: whatever the batch decides
    lookahead: int = 0

    @property
    def prefill(self) -> list[Seq]:
        """The requests this step (re)prefills from the start (its admissions)."""
        return [a.seq for a in self.admit]


IDLE = StepPlan(StepKind.IDLE)      # shared plans for the common cases: nobody mutates a plan
DECODE = StepPlan(StepKind.DECODE)

# How long a plain decode plan (one that only decodes the running batch: nothing admitted,
# chunked, preempted, swapped or rejected) holds while the replica only decodes, as a policy's
# `steady` says: CHANGES, it may change at any step (ask at each); UNTIL_FINISH, until a request
# finishes (then a waiting one may fit); THROUGH_FINISH, through finishes. Either way until a
# step needs more new KV blocks than are free, or an event from outside changes the state.
CHANGES, UNTIL_FINISH, THROUGH_FINISH = 0, 1, 2
