"""What a replica's steps leave on the record, apart from the state they change: the step
log, inter-token gaps, events (preemptions, swaps, KV transfers) and byte and time
counters. `sim/engine/results.py` keeps the record after the run."""

from __future__ import annotations

from array import array

import numpy as np

from sim.engine.results import Event, StepLog, move_events
from sim.engine.steptally import StepTally
from sim.io.spill import Chain, DiskColumn, SpillDir, blocks
from sim.policies.plan import StepKind

MEMORY_ROWS = 1 << 22      # step-log rows (~90 B each with their gaps) a run holds in memory
MIN_REPLICA_ROWS = 1 << 12  # ... and each replica at least, before spilling to disk


class StepRecorder:
    """One replica's record of a run."""

    __slots__ = ("log", "gaps", "weights", "events", "swap_bytes", "transfer_bytes",
                 "kernel_busy_s", "gaps_spilled")

    def __init__(self, summary: bool = False) -> None:
        # `summary` (step_log: summary): the step log's sums only (sim/engine/steptally.py)
        self.log: StepLog | StepTally = StepTally() if summary else StepLog()
        self.gaps = array("d")     # inter-token gaps, weighted (see RunningBatch.advance)
        self.weights = array("q")
        self.events: list[Event] = []  # preemptions, swaps and KV transfers, with their times
        self.swap_bytes = 0.0      # KV bytes over PCIe (swaps, prefix blocks from host memory)
        self.transfer_bytes = 0.0  # KV bytes received from prefill replicas
        self.kernel_busy_s = 0.0   # GPU kernel seconds of the steps run (unjittered model)
        self.gaps_spilled = 0      # gaps (and weights) written to disk before those held

    def spill_to(self, spill: SpillDir, key: str, limit: int) -> None:
        """Keep at most about `limit` steps (and their gaps) in memory, the rest in files
        `<key>.*` of `spill` (sim/io/spill.py)."""
        self.log.spill_to(spill, key, limit, then=self._spill_gaps)

    def _spill_gaps(self) -> None:
        log = self.log
        for name, col in (("gaps", self.gaps), ("weights", self.weights)):
            log.spill.append(f"{log.key}.{name}", col)
        self.gaps_spilled += len(self.gaps)
        del self.gaps[:]  # in place: the batch appends to these very arrays
        del self.weights[:]

    def gap_columns(self, mark: int = 0) -> tuple:
        """(gaps, weights) from the `mark`-th on: numpy arrays, or lazy columns once spilled."""
        tail = [np.frombuffer(c, dtype=t) if len(c) else np.zeros(0, dtype=t)
                for c, t in ((self.gaps, float), (self.weights, np.int64))]
        if not self.gaps_spilled:
            return tail[0][mark:], tail[1][mark:]
        if mark:
            raise ValueError("a spilled recorder's gaps are pooled whole")
        key, spill, n = self.log.key, self.log.spill, self.gaps_spilled
        return (DiskColumn(spill, f"{key}.gaps", float, n, tail[0]),
                DiskColumn(spill, f"{key}.weights", np.int64, n, tail[1]))

    def moves(self, plan, now: float) -> None:
        """A plan's preemptions and swaps, as events at `now`."""
        self.events.extend(move_events(plan, now))

    def resumed(self, t_end: float, last_token_t: float) -> None:
        """A request preempted by recompute streams its next token: one long gap."""
        self.gaps.append(t_end - last_token_t)
        self.weights.append(1)

    def check_limits(self, name: str, max_seqs: int, step_tokens: int | None) -> None:
        """No logged step computed more than `max_seqs` sequences, nor a step that
        prefills (prefill, mixed) more than `step_tokens` tokens."""
        log = self.log
        if isinstance(log, StepTally):
            log.check_limits(name, max_seqs, step_tokens)
            return
        t_start = log.column("t_start")
        for lo, seqs in blocks(log.column("num_seqs")):
            if seqs.max() > max_seqs:
                i = int(seqs.argmax())
                raise RuntimeError(f"replica {name}: the step at {t_start[lo + i]:.6f} s ran "
                                   f"{seqs[i]} sequences, more than its limit of {max_seqs}")
        if step_tokens is None:
            return
        kinds = log.column("kind")
        for lo, tokens in blocks(log.column("num_tokens")):
            kind = np.asarray(kinds[lo:lo + len(tokens)])
            prefills = (kind == StepKind.PREFILL) | (kind == StepKind.MIXED)
            over = np.flatnonzero(prefills & (tokens > step_tokens))
            if len(over):
                i = int(over[0])
                raise RuntimeError(f"replica {name}: the step at {t_start[lo + i]:.6f} s "
                                   f"computed {tokens[i]} tokens, more than its budget of "
                                   f"{step_tokens}")


def pooled_gaps(recorders: list[StepRecorder], marks: list[int]) -> tuple:
    """Every recorder's gaps and weights end to end (from its mark on): arrays when all are
    in memory, else lazy `Chain`s (sim/io/spill.py)."""
    if not any(r.gaps_spilled for r in recorders):
        gaps, weights = array("d"), array("q")
        for r, mark in zip(recorders, marks, strict=True):  # a drained warm-up's gaps left out
            gaps.extend(r.gaps[mark:])
            weights.extend(r.weights[mark:])
        return gaps, weights
    cols = [r.gap_columns(m) for r, m in zip(recorders, marks, strict=True)]
    return Chain([c[0] for c in cols]), Chain([c[1] for c in cols])


def spill_logs(replicas: list, spill: SpillDir | None = None,
               fleet_size: int | None = None) -> SpillDir:
    """Let the replicas' step logs and gaps go to disk past MEMORY_ROWS steps held in all
    (sim/io/spill.py): a run's memory stops growing with its iterations; its outputs are
    the same bytes (the tables and the summary read the files back a block at a time).
    `fleet_size`: the whole fleet's replicas, when `replicas` are a worker's share."""
    spill = spill if spill is not None else SpillDir()
    limit = max(MEMORY_ROWS // max(fleet_size or len(replicas), 1), MIN_REPLICA_ROWS)
    for r in replicas:
        r.rec.spill_to(spill, f"r{r.index}", limit)
    return spill
