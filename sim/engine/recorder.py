"""What a replica's steps leave on the record, apart from the state they change: the step
log, inter-token gaps, events (preemptions, swaps, KV transfers) and byte and time
counters. `sim/engine/results.py` keeps the record after the run."""

from __future__ import annotations

from array import array

import numpy as np

from sim.engine.results import Event, StepLog, move_events
from sim.policies.plan import StepKind


class StepRecorder:
    """One replica's record of a run."""

    __slots__ = ("log", "gaps", "weights", "events", "swap_bytes", "transfer_bytes",
                 "kernel_busy_s")

    def __init__(self) -> None:
        self.log = StepLog()
        self.gaps = array("d")     # inter-token gaps, weighted (see RunningBatch.advance)
        self.weights = array("q")
        self.events: list[Event] = []  # preemptions, swaps and KV transfers, with their times
        self.swap_bytes = 0.0      # KV bytes over PCIe (swaps, prefix blocks from host memory)
        self.transfer_bytes = 0.0  # KV bytes received from prefill replicas
        self.kernel_busy_s = 0.0   # GPU kernel seconds of the steps run (unjittered model)

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
        if not len(log.num_seqs):
            return
        seqs = np.frombuffer(log.num_seqs, dtype=np.int64)
        if seqs.max() > max_seqs:
            i = int(seqs.argmax())
            raise RuntimeError(f"replica {name}: the step at {log.t_start[i]:.6f} s ran "
                               f"{seqs[i]} sequences, more than its limit of {max_seqs}")
        if step_tokens is None:
            return
        kind = np.frombuffer(log.kind, dtype=np.int64)
        tokens = np.frombuffer(log.num_tokens, dtype=np.int64)
        prefills = (kind == StepKind.PREFILL) | (kind == StepKind.MIXED)
        over = np.flatnonzero(prefills & (tokens > step_tokens))
        if len(over):
            i = int(over[0])
            raise RuntimeError(f"replica {name}: the step at {log.t_start[i]:.6f} s computed "
                               f"{tokens[i]} tokens, more than its budget of {step_tokens}")
