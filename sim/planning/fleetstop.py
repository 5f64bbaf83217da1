"""Stopping a plan's fleet run once its failure is certain (`search.stop_early`): the fleet
checks' runs at each replica count and the headroom search's steady fleet probes.

The rule is the probes' (sim/planning/probestop.py `ProbeStop`): a run's seed fails
whatever the rest of the run does once a request is rejected, a window p99 is certainly
over `fail_factor` x its bound, or, on the run's last doubling (a fleet check's one
fixed-length run is its last), a window p99 is certainly over its bound or goodput
certainly under `goodput_min`. A fleet simulated whole (a router that reads the
replicas' load, one replica) is watched by the engine as a probe is. A fleet behind a
router that needs no feedback is simulated replica by replica (sim/engine/split.py),
each to its end before the next begins; it is screened after each replica
(`sim/engine/screensplit.py`): the window [t0, t1) is fixed by the whole fleet's
arrival times, m counts the fleet's window requests (every one finishes unless one is
rejected, which decides the seed), and the simulated replicas' window requests over a
level are final values, so `misses_to_fail(m)` of them put the fleet's p99 over it. A
run never stopped is the run itself, byte for byte.

What changes in a plan's output: the figures of a failing count's or headroom factor's
runs (its p99s are the simulated replicas' finished window requests'; `broke` says where
it stopped). Those are never pooled (only passing groups are: sim/planning/uncertainty.py)
and never priced; the count a check settles on (`replicas`) is run again unstopped if its
run was stopped (it failed: `holds` false), so every figure of a fleet the plan reports
as checked is the whole run's.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from sim.planning.probestop import MARGIN, ProbeStop, misses_to_fail
from sim.planning.steady import METRICS, SteadyRule, window_bounds
from sim.policies.batch import FINISHED, REJECTED


class FleetStop(ProbeStop):
    """`ProbeStop` that is also a screen for a fleet simulated replica by replica:
    `begin(arrival_s)` with the fleet's arrivals, then `replica(index, frame)` after
    each replica with its requests (sim/engine/screensplit.py `records_frame`)."""

    def __init__(self, rule: SteadyRule, bounds: dict[str, float | None], last: bool,
                 goodput_min: float | None = None):
        super().__init__(rule, bounds, last, goodput_min)
        self.replicas_run = 0

    def begin(self, arrival: np.ndarray) -> None:
        t0, t1 = window_bounds(arrival, self.rule) if len(arrival) else (0.0, 0.0)
        self.window = (t0, t1)
        # m of every metric: the fleet's window requests (TPOT counts those with over one
        # output token, at most this many: a larger m asks for more misses, so is safe)
        inside = int(((arrival >= t0) & (arrival < t1)).sum())
        self.m = dict.fromkeys(METRICS, inside)
        self.need = {k: misses_to_fail(self.m[k]) for k in self.bounds}
        self.fin_over = {(k, x): 0 for k, xs in self.levels.items() for x in xs}
        self.fin_missed, self.rejected = 0, 0
        self.last_arrival = float(arrival.max()) if len(arrival) else 0.0
        self._ready = True

    def replica(self, index: int, frame: pd.DataFrame) -> str | None:
        """Count replica `index`'s requests (final: it ran to its end); why the fleet
        certainly fails, or None."""
        self.replicas_run += 1
        status = frame["status"].to_numpy(dtype=object)
        self.rejected += int((status == REJECTED).sum())
        arr = frame["arrival_s"].to_numpy(dtype=float)
        t0, t1 = self.window
        w = (arr >= t0) & (arr < t1) & (status == FINISHED)
        missed = np.zeros(int(w.sum()), dtype=bool)
        for k, b in self.bounds.items():
            v = frame[k].to_numpy(dtype=float)[w]
            v = np.where(np.isnan(v), -np.inf, v)
            for x in self.levels[k]:
                self.fin_over[(k, x)] += int((v > x * (1 + MARGIN)).sum())
            missed |= v > b * (1 + MARGIN)
        self.fin_missed += int(missed.sum())
        why = self._decide(dict.fromkeys(self.fin_over, 0), 0)
        if why is not None:
            self.stopped = {"reason": why[0], "verdict": why[1], "at_s": self.last_arrival,
                            "last_arrival_s": self.last_arrival, "replicas_run": self.replicas_run}
            return why[0]
        return None


def fleet_stopper(rule: SteadyRule, bounds: dict[str, float | None], goodput_min: float | None = None):
    """`steady_run`'s `stop` for fleet runs: (n, last) -> a fresh FleetStop."""
    def stop(n: int, last: bool) -> FleetStop:
        return FleetStop(rule, bounds, last, goodput_min)
    return stop


def partial_summary(req: pd.DataFrame, replicas: int) -> dict:
    """A fleet run stopped between replicas has no run summary: the figures a plan reads
    of one (latency stats, goodput, throughputs), over the requests simulated."""
    from sim.planning.steady import _stats

    status = req["status"].to_numpy(dtype=object)
    fin = status == FINISHED
    arrival, finish = req["arrival_s"].to_numpy(dtype=float), req["finish_s"].to_numpy(dtype=float)
    span = float(np.nanmax(finish) - arrival.min()) if fin.any() else 0.0
    span = max(span, 1e-12)
    out_tokens = float(req["output_tokens"].to_numpy(dtype=float)[fin].sum())
    return {**{k: _stats(req[k].to_numpy(dtype=float)[fin]) for k in (*METRICS, "queue_s")},
            "goodput": {}, "replicas": replicas,  # its fraction met: the window's (windowed_summary)
            "requests": {"total": len(req), "finished": int(fin.sum()),
                         "rejected": int((status == REJECTED).sum())},
            "request_throughput": int(fin.sum()) / span, "output_token_throughput": out_tokens / span,
            "lookup_provenance": None}
