"""What a run leaves behind: each replica's step log and KV manager, and the run's
requests and inter-token gaps (records only; `sim/engine/metrics.py` turns them into tables)."""

from __future__ import annotations

import sys
from array import array
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from sim.io.spill import DiskColumn, SpillDir
from sim.policies.batch import Seq
from sim.policies.kv import PagedKV


def _floats() -> array:
    return array("d")


def _ints() -> array:
    return array("q")


COLUMN_TYPES = {"t_start": "d", "t_end": "d", "kind": "q", "num_seqs": "q", "num_tokens": "q",
                "kv_blocks_used": "q", "kv_tokens": "q"}


@dataclass
class StepLog:
    """Column arrays, one entry per iteration (cheap appends, 8 bytes an entry).

    With `spill_to`, once `limit` rows are held all but the last go to disk
    (sim/io/spill.py) and the arrays keep the rest: `rows()` counts them all and
    `column(name)` reads a whole column back (a lazy DiskColumn: sliced a block at a time
    by the tables and the summary). The arrays always hold the newest row once one was
    logged (`t_end[-1]` is the last step's end)."""

    t_start: array = field(default_factory=_floats)
    t_end: array = field(default_factory=_floats)
    kind: array = field(default_factory=_ints)  # StepKind codes: 0 prefill .. 3 mixed
    num_seqs: array = field(default_factory=_ints)
    num_tokens: array = field(default_factory=_ints)
    kv_blocks_used: array = field(default_factory=_ints)
    kv_tokens: array = field(default_factory=_ints)
    limit: int = sys.maxsize  # rows held in memory before spilling
    spill: SpillDir | None = None
    key: str = ""              # this log's file names in `spill`: "<key>.<column>"
    spilled: int = 0           # rows on disk
    then: Callable[[], None] | None = None  # called after each spill (the recorder's gaps)

    def spill_to(self, spill: SpillDir, key: str, limit: int,
                 then: Callable[[], None] | None = None) -> None:
        """Spill to `spill` once `limit` rows are held (at least 2)."""
        self.spill, self.key, self.limit, self.then = spill, key, max(2, limit), then

    def flush(self) -> None:
        """All rows but the newest to disk."""
        keep = len(self.t_end) - 1
        if keep <= 0 or self.spill is None:
            return
        for name in COLUMN_TYPES:
            col = getattr(self, name)
            self.spill.append(f"{self.key}.{name}", col[:keep])
            del col[:keep]
        self.spilled += keep
        if self.then is not None:
            self.then()

    def rows(self) -> int:
        """Iterations logged (on disk and in memory)."""
        return self.spilled + len(self.t_end)

    def room(self) -> int:
        """Rows `add` takes before it spills (at most 0: `flush` is due)."""
        return self.limit - len(self.t_end)

    def last_end(self) -> float | None:
        """The last step's end (None before any)."""
        return self.t_end[-1] if self.t_end else None

    def column(self, name: str):
        """A whole column: a numpy view of the arrays, or a DiskColumn once spilled."""
        buf = getattr(self, name)
        dtype = float if COLUMN_TYPES[name] == "d" else np.int64
        tail = np.frombuffer(buf, dtype=dtype) if len(buf) else np.zeros(0, dtype=dtype)
        if not self.spilled:
            return tail
        return DiskColumn(self.spill, f"{self.key}.{name}", dtype, self.spilled, tail)

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
        if len(self.t_end) >= self.limit:
            self.flush()


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
    # its whole step log's sums (sim/engine/metrics.py StepSums), when summed where it ran
    # (a split fleet's worker: in parallel, while its files are fresh), else None
    sums: object | None = None
    # its requests' figures for per_replica (sim/engine/metrics.py ReplicaRequests), when
    # figured where it ran (a split fleet's worker), else None
    requests: object | None = None

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
    # a fleet simulated replica by replica: the requests as records on disk
    # (sim/engine/records.py RequestRecords; `seqs` is then a SeqView of them)
    records: object | None = None
    # spilled gaps: their first level of bins, counted by the workers (sim/engine/bigstats.py)
    itl_first: object | None = None

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
