"""Stopping a probe's run as soon as its failure is certain (`search.stop_early`).

A probe's run (`sim/planning/steady.py: steady_run`) is judged on its measured window:
the requests arriving in [t0, t1), fixed by the arrival times before the run starts. Its
seed fails whatever the rest of the run does, and the engine may stop it
(`sim/engine/watch.py`), when at a check:

* **a request was rejected**: the window's verdict is "clearly fails" (the last run) and
  `violations` lists the rejection;
* **a window p99 is certainly over `fail_factor` x its bound**: "clearly fails" again;
* **on the rule's last run** (no doubling after it, so its summary is the seed's): a
  window p99 certainly over its bound, or goodput certainly under `goodput_min`.

A p99 over m values (numpy's linear interpolation, as `window` computes it) is at least
its value at index lo = floor(0.99 (m - 1)), so it is over X once m - lo of the values
are: `misses_to_fail(m)` (m = 1,000: 11). m is the window's count of requests (TTFT and
E2E; TPOT: those with over one output token), all of which finish unless one is
rejected, which decides the seed anyway; m - lo grows with m, so a count over a larger m
is safe. A request counts as over X when its metric is *certainly* over X: a finished
request's own; an unfinished one's lower bound at the check, `now` (its TTFT when no
first token yet, its E2E) or its TPOT so far, (now - first token) / (outputs - 1). A
runtime's per-request latency (added after the run: `closedloop.streamed`) only adds to
each, and a margin of 1e-9 x X covers the rounding of the sums.

Pass is never called early: a passing probe's figures (every p99, the whole run's) are
reported and pooled, and would move. The stopped run keeps its unfinished requests
(`stopped.unfinished`), its window figures are the finished requests', and its
violations say it was stopped (`capacity.violations`).
"""

from __future__ import annotations

import numpy as np

from sim.planning.steady import METRICS, SteadyRule, window_bounds
from sim.policies.batch import FINISHED, REJECTED

MARGIN = 1e-9  # a lower bound counts as over X only past X x (1 + MARGIN)
CHECKS = 100  # checks per run (every 1 % of its arrival span)
LABELS = {"ttft_s": "TTFT", "tpot_s": "TPOT", "e2e_s": "E2E"}


def misses_to_fail(m: int) -> int:
    """How many of m values over X make their p99 (numpy's linear) certainly over X."""
    if m <= 0:
        return 1
    lo = int(np.floor(np.percentile(np.arange(m, dtype=float), 99)))
    return m - lo


class ProbeStop:
    """The stopping rule for one run of a probe (module docstring); the engine calls it
    (`sim/engine/watch.py`) with the time and the run's requests, in arrival order."""

    def __init__(self, rule: SteadyRule, bounds: dict[str, float | None], last: bool,
                 goodput_min: float | None = None):
        self.rule, self.last = rule, last
        self.bounds = {k: b for k, b in bounds.items() if k in METRICS and b is not None}
        self.goodput_min = goodput_min if last else None
        # metric -> the levels a p99 over which decides the seed: fail_factor x bound, and
        # on the last run the bound itself
        self.levels = {k: sorted({rule.fail_factor * b, *((b,) if last else ())})
                       for k, b in self.bounds.items()}
        self.every_s = 1.0
        self.stopped: dict | None = None
        self._ready = False

    def _setup(self, seqs: list) -> None:
        arr = np.fromiter((s.arrival for s in seqs), dtype=float, count=len(seqs))
        t0, t1 = window_bounds(arr, self.rule) if len(arr) else (0.0, 0.0)
        self.inside = ((arr >= t0) & (arr < t1)).tolist()
        self.m = {k: int(sum(self.inside)) for k in METRICS}
        self.m["tpot_s"] = sum(1 for s, w in zip(seqs, self.inside, strict=True) if w and s.output > 1)
        self.need = {k: misses_to_fail(self.m[k]) for k in self.bounds}
        self.fin_over = {(k, x): 0 for k, xs in self.levels.items() for x in xs}
        self.fin_missed = 0  # finished window requests that missed a bound (goodput)
        self.rejected, self.next, self.open = 0, 0, []
        self.last_arrival = float(arr.max()) if len(arr) else 0.0
        self.every_s = max(float(arr.max() - arr.min()) / CHECKS, 1e-3) if len(arr) else 1.0
        self._ready = True

    def __call__(self, now: float, seqs: list) -> str | None:
        if not self._ready:
            self._setup(seqs)
        while self.next < len(seqs) and seqs[self.next].arrival <= now:
            self.open.append(self.next)
            self.next += 1
        over = dict.fromkeys(self.fin_over, 0)
        missed, still = 0, []
        for i in self.open:
            s = seqs[i]
            if s.state == REJECTED:
                self.rejected += 1
                continue
            if s.state == FINISHED:
                if self.inside[i]:
                    self.fin_missed += self._count(_finished(s), self.fin_over)
                continue
            still.append(i)
            if self.inside[i]:
                missed += self._count(_lower_bounds(s, now), over)
        self.open = still
        why = self._decide(over, missed)
        if why is not None:
            self.stopped = {"reason": why[0], "verdict": why[1], "at_s": now,
                            "last_arrival_s": self.last_arrival}
            return why[0]
        return None

    def _count(self, values: dict[str, float], into: dict) -> int:
        """Add a request's metrics (or lower bounds) to the counts over each level; 1 if it
        certainly missed a bound."""
        miss = 0
        for k, b in self.bounds.items():
            v = values[k]
            if v is None:
                continue
            for x in self.levels[k]:
                if v > x * (1 + MARGIN):
                    into[(k, x)] += 1
            miss |= v > b * (1 + MARGIN)
        return int(miss)

    def _decide(self, over: dict, missed: int) -> tuple[str, str] | None:
        """(why, the window's verdict) once the seed certainly fails, else None."""
        if self.rejected:
            return f"{self.rejected} rejected", "clearly fails"
        for k, xs in self.levels.items():
            for x in reversed(xs):  # the clear failure first
                n = self.fin_over[(k, x)] + over[(k, x)]
                if self.m[k] and n >= self.need[k]:
                    verdict = "clearly fails" if x > self.bounds[k] else "fails"
                    return (f"p99 {LABELS[k]} > {x:g} s certain ({n} of {self.m[k]} window requests "
                            f"over it)", verdict)
        m = self.m["ttft_s"]
        if self.goodput_min is not None and m and (m - self.fin_missed - missed) / m < self.goodput_min:
            return (f"goodput < {self.goodput_min:.1%} certain ({self.fin_missed + missed} of {m} "
                    "window requests miss an SLO)", "fails")
        return None

    def mark(self, summary: dict, req) -> dict:
        """A stopped run's windowed summary with `stopped`: why, when, and how many
        requests were left unfinished (also in its `steady`)."""
        status = np.asarray(req["status"], dtype=object)
        unfinished = int(((status != FINISHED) & (status != REJECTED)).sum())
        st = {**self.stopped, "unfinished": unfinished, "last_run": self.last}
        return {**summary, "stopped": st, "steady": {**summary["steady"], "stopped": st}}


def stopper(rule: SteadyRule, bounds: dict[str, float | None], goodput_min: float | None = None):
    """`steady_run`'s `stop`: (n, last) -> a fresh ProbeStop for that run."""
    def stop(n: int, last: bool) -> ProbeStop:
        return ProbeStop(rule, bounds, last, goodput_min)
    return stop


def _finished(s) -> dict[str, float | None]:
    """A finished request's metrics, on the engine's clock (a runtime's per-request latency
    is added after the run, and only adds)."""
    ttft, e2e = s.first_token_t - s.arrival, s.finish_t - s.arrival
    return {"ttft_s": ttft, "e2e_s": e2e,
            "tpot_s": (e2e - ttft) / (s.output - 1) if s.output > 1 else None}


def _lower_bounds(s, now: float) -> dict[str, float | None]:
    """What an unfinished request's metrics will be at least: it finishes, and gets its
    first token if it has none, at `now` or later."""
    first = s.first_token_t
    return {"ttft_s": (first if first >= 0 else now) - s.arrival, "e2e_s": now - s.arrival,
            "tpot_s": (now - first) / (s.output - 1) if first >= 0 and s.output > 1 else None}
