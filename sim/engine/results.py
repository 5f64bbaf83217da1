"""What a run leaves behind: each replica's step log and KV manager, and the run's
requests and inter-token gaps (records only; `sim/engine/metrics.py` turns them into tables)."""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field

from sim.policies.batch import Seq
from sim.policies.kv import PagedKV


def _floats() -> array:
    return array("d")


def _ints() -> array:
    return array("q")


@dataclass
class StepLog:
    """Column arrays, one entry per iteration (cheap appends, 8 bytes an entry)."""

    t_start: array = field(default_factory=_floats)
    t_end: array = field(default_factory=_floats)
    kind: array = field(default_factory=_ints)  # StepKind codes: 0 prefill .. 3 mixed
    num_seqs: array = field(default_factory=_ints)
    num_tokens: array = field(default_factory=_ints)
    kv_blocks_used: array = field(default_factory=_ints)
    kv_tokens: array = field(default_factory=_ints)

    def add(self, t_start: float, t_end: float, kind: int, num_seqs: int, num_tokens: int,
            kv_blocks_used: int, kv_tokens: int) -> None:
        """One iteration's entry."""
        self.t_start.append(t_start)
        self.t_end.append(t_end)
        self.kind.append(kind)
        self.num_seqs.append(num_seqs)
        self.num_tokens.append(num_tokens)
        self.kv_blocks_used.append(kv_blocks_used)
        self.kv_tokens.append(kv_tokens)


@dataclass(slots=True)
class Event:
    """Something that happened to one request on one replica, apart from its steps: a
    preemption ("preempt": recompute, "swap_out", "swap_in") or a KV transfer into this
    replica ("kv_transfer", lasting `seconds`, from replica `peer`)."""

    t: float
    rid: int
    kind: str
    seconds: float = 0.0
    peer: str = ""


def move_events(plan, now: float) -> list[Event]:
    """A plan's preemptions and swaps (a sim.policies.scheduler.StepPlan) as events at `now`
    (for traces; rare, off the hot path)."""
    return [Event(now, s.rid, kind) for kind, seqs in (
        ("preempt", plan.preempt), ("swap_out", plan.swap_out), ("swap_in", plan.swap_in))
        for s in seqs]


@dataclass
class ReplicaResult:
    """What one replica leaves behind after a run."""

    name: str
    index: int
    group: str
    role: str
    gpu: str
    steps: StepLog
    kv: PagedKV
    swap_bytes: float = 0.0
    transfer_bytes: float = 0.0
    prefix_cache: dict | None = None
    speculator: object | None = None  # sim.policies.speculative.Speculator, when speculating
    events: list[Event] = field(default_factory=list)  # preemptions, swaps, KV transfers
    kernel_busy_s: float = 0.0  # GPU kernel seconds of its steps (the step model's, before jitter)

    @classmethod
    def of(cls, rep) -> ReplicaResult:
        """The result of `rep` (a sim.engine.replica.Replica) after its run."""
        cfg = rep.config
        rec = rep.rec
        return cls(rep.name, rep.index, cfg.group if cfg else "", cfg.role if cfg else "both",
                   cfg.profile.name if cfg else "", rec.log, rep.st.kv, rec.swap_bytes,
                   rec.transfer_bytes,
                   rep.st.prefix.summary() if rep.st.prefix is not None else None,
                   rep.speculator, rec.events, rec.kernel_busy_s)


@dataclass
class RunResult:
    seqs: list[Seq]
    replicas: list[ReplicaResult]
    itl_gaps: array
    itl_weights: array
    end_time: float
    warmup: object | None = None  # closed loop: bool numpy array [len(seqs)], warm-up requests

    @property
    def kv(self) -> PagedKV:
        """The KV manager of a one-replica run (fleets: see `replicas`)."""
        if len(self.replicas) != 1:
            raise ValueError("a fleet has one KV manager per replica: use .replicas[i].kv")
        return self.replicas[0].kv

    @property
    def steps(self) -> StepLog:
        if len(self.replicas) != 1:
            raise ValueError("a fleet has one step log per replica: use .replicas[i].steps")
        return self.replicas[0].steps

    @property
    def swap_bytes(self) -> float:
        return sum(r.swap_bytes for r in self.replicas)
