"""A step log that keeps only what the run's summary reads of it (`step_log: summary`).

A replica's step log (sim/engine/results.py `StepLog`) keeps seven numbers a step (56 B):
a fleet-day of ~2 G iterations would write ~115 GB of them to disk, and appending them is
~30 % of a plain decode step's CPU (issue 19). The summary reads only their sums
(sim/engine/metrics.py `StepSums`): steps by kind, busy seconds, and the time integrals of
sequences, KV blocks used and KV tokens held, and the peak of blocks used. `StepTally`
keeps those running sums instead of rows, with `StepLog.add`'s signature (the steps the
engine logs one by one) and `fold` for a run of plain decode steps that
sim/engine/decoderun.py summed in its own locals.

Exactness: the counts (steps, steps by kind) and the peak are exact; the float sums are
the same products (`num_seqs * (t_end - t_start)`, ...) added in another order (one by
one, or a run's partial sum at a time, where `StepSums` adds numpy blocks), so they equal
the rows mode's figures within float rounding of that order: relative 1e-9
(`TOLERANCE`, `tests/test_step_log_summary.py`). Every term is at least 0, so a running
sum's relative error is at most its chain of additions times 2^-53 (decode runs' partial
sums keep the chain short); measured: 6e-15 on the fleet-day slice's 8.6 M iterations
(benchmarks/speed/fleet_speed.py --day --hours 0.1), 2e-13 on its summary's figures
derived from them (reserved_unused_share, 1 - a ratio). The inter-token gaps are kept as
in the rows mode (the ITL percentiles stay exact).

What needs the rows refuses a tally: steps.csv, the timeline plot, a Perfetto trace, an
autoscaler's power per window, a closed loop's measured window (which drops the steps of
the warm-up after the run). A replica simulated apart from its fleet (sim/engine/split.py)
asks whether one of its step ends equals one of its own arrival instants (`ties`): the
tally answers that as the steps come (`watch`), without their rows.
"""

from __future__ import annotations

import sys
from bisect import bisect_right
from collections.abc import Callable

from sim.policies.stepkind import StepKind

TOLERANCE = 1e-9  # relative: a tally's float sums against StepSums of the rows
_PREFILLS = (StepKind.PREFILL, StepKind.MIXED)  # steps with a token budget
_DECODE = int(StepKind.DECODE)


class StepTally:
    """One replica's step log as running sums (no rows). Counts in `n` and `by_kind`, the
    sums of StepSums (`busy`, `seqs_dur`, `used_dur`, `toks_dur`, `used_peak`), the largest
    step for `check_limits` (`seqs_peak`, `budget_peak`: tokens of a prefill or mixed
    step), the last step's end. `limit`, `spill`, `key`, `then` as StepLog's: every `limit`
    steps `then` runs (the recorder's gaps go to disk), so the gaps' memory stays bounded."""

    __slots__ = ("n", "by_kind", "busy", "seqs_dur", "used_dur", "toks_dur", "used_peak",
                 "seqs_peak", "budget_peak", "last", "early", "pending", "limit", "spill", "key",
                 "spilled", "then", "instants", "own", "tied")

    def __init__(self) -> None:
        self.n = 0
        self.by_kind = [0, 0, 0, 0]  # StepKind codes 0 prefill .. 3 mixed
        self.busy = self.seqs_dur = self.used_dur = self.toks_dur = 0.0
        self.used_peak = self.seqs_peak = self.budget_peak = 0
        self.last: float | None = None  # the last step's end
        self.early = float("inf")  # no step ended at or before this (`covers`)
        self.pending = 0  # steps since `then` last ran
        self.limit = sys.maxsize
        self.spill = None
        self.key = ""
        self.spilled = 0  # (no rows ever go to disk: for code that asks a StepLog)
        self.then: Callable[[], None] | None = None
        self.instants: list[float] | None = None  # own arrival instants, sorted (`watch`)
        self.own: set[float] | None = None  # the same, to look a step's end up in
        self.tied = False

    # ---- as StepLog ----------------------------------------------------------------------
    def spill_to(self, spill, key: str, limit: int, then: Callable[[], None] | None = None) -> None:
        """Run `then` every `limit` steps (at least 2): StepLog.spill_to without rows."""
        self.spill, self.key, self.limit, self.then = spill, key, max(2, limit), then

    def flush(self) -> None:
        self.pending = 0
        if self.then is not None and self.spill is not None:
            self.then()

    def rows(self) -> int:
        """Iterations logged."""
        return self.n

    def room(self) -> int:
        """Steps before the next `flush` (StepLog.room)."""
        return self.limit - self.pending

    def last_end(self) -> float | None:
        return self.last

    def column(self, name: str):
        raise ValueError(f"step_log: summary keeps no step rows (no column {name!r}; "
                         "allowed: step_log: rows)")

    def add(self, t_start: float, t_end: float, kind: int, num_seqs: int, num_tokens: int,
            kv_blocks_used: int, kv_tokens: int) -> None:
        """One iteration, summed."""
        dur = t_end - t_start
        self.n += 1
        self.by_kind[kind] += 1
        self.busy += dur
        self.seqs_dur += num_seqs * dur
        self.used_dur += kv_blocks_used * dur
        self.toks_dur += kv_tokens * dur
        if kv_blocks_used > self.used_peak:
            self.used_peak = kv_blocks_used
        if num_seqs > self.seqs_peak:
            self.seqs_peak = num_seqs
        if num_tokens > self.budget_peak and kind in _PREFILLS:
            self.budget_peak = num_tokens
        self.last = t_end
        if t_end < self.early:
            self.early = t_end
        if self.own is not None and t_end in self.own:
            self.tied = True
        self.pending += 1
        if self.pending >= self.limit:
            self.flush()

    # ---- a run of plain decode steps (sim/engine/decoderun.py) ---------------------------
    def fold(self, rows: int, busy: float, seqs: int, used_dur: float, toks_dur: float,
             used_peak: int, t_from: float, t_to: float) -> None:
        """`rows` decode steps of `seqs` sequences each, back to back from `t_from` to
        `t_to`, their sums taken by the caller: `busy` seconds, `used_dur` and `toks_dur`
        (blocks used and tokens held times each step's seconds), `used_peak`."""
        if rows <= 0:
            return
        self.n += rows
        self.by_kind[_DECODE] += rows
        self.busy += busy
        self.seqs_dur += seqs * busy
        self.used_dur += used_dur
        self.toks_dur += toks_dur
        if used_peak > self.used_peak:
            self.used_peak = used_peak
        if seqs > self.seqs_peak:
            self.seqs_peak = seqs
        self.last = t_to
        if t_from < self.early:
            self.early = t_from
        if self.instants is not None and not self.tied:
            # a step of these may end at an instant in (t_from, t_to]: counted as tied (a
            # superset: never missed; sim/engine/decoderun.py runs end before the next event)
            ins = self.instants
            i = bisect_right(ins, t_from)
            self.tied = i < len(ins) and ins[i] <= t_to
        self.pending += rows

    # ---- what the rows would have answered -----------------------------------------------
    def covers(self, t0: float) -> bool:
        """Whether every step ended after `t0` (StepSums' window from `t0` is then all the
        steps: a closed loop without warm-up, whose window opens at its first send)."""
        return self.early > t0

    def watch(self, instants) -> None:
        """Note whether a step ends at one of `instants` (sorted; a replica's own arrival
        instants, sim/engine/split.py `ties`): `tied`."""
        self.instants = list(instants)
        self.own = set(self.instants)

    def unwatch(self) -> bool:
        """Whether a step ended at a watched instant; the instants forgotten (a result
        shipped from a worker does not carry them)."""
        self.instants = self.own = None
        return self.tied

    def check_limits(self, name: str, max_seqs: int, step_tokens: int | None) -> None:
        """StepRecorder.check_limits from the largest steps (no rows: no step's time)."""
        if self.seqs_peak > max_seqs:
            raise RuntimeError(f"replica {name}: a step ran {self.seqs_peak} sequences, more "
                               f"than its limit of {max_seqs}")
        if step_tokens is not None and self.budget_peak > step_tokens:
            raise RuntimeError(f"replica {name}: a step computed {self.budget_peak} tokens, "
                               f"more than its budget of {step_tokens}")


__all__ = ["TOLERANCE", "StepTally"]
