"""Probes that reach steady state: how long a rate probe (of `llmsim plan`) or a curve
point (of `llmsim curve`) runs, and what it measures.

The rule (`SteadyRule`, a plan's `search.steady`), for one seed at one Poisson rate:

1. Run `n` requests, n = max(`min_requests`, rate x `min_traffic_s`) at first.
2. Measure over the *window*: requests arriving after the first `warmup` share of the
   arrival span (the empty-queue start) and before its last `cooldown` share (once
   arrivals stop, the last requests see a lighter load). The window's p99 TTFT, TPOT
   and E2E, goodput, and its steady throughput ratio: requests completed while the
   window's arrivals come in, over the window's arrivals (an overloaded replica
   completes at its service rate whatever the offered load).
3. **Clearly fails**: stop now (no longer run can pass) when a request was rejected, a
   window p99 is over `fail_factor` x its bound, or the queue grows: the steady ratio
   is under `min_ratio` *and* the p99 TTFT of the window's second half exceeds its first
   half's by more than `tolerance` x the first half's.
4. **Steady**: the p99s of the window's two halves (by arrival time) agree within
   `tolerance` x the metric's bound (x the larger of the two where the metric has no
   bound), for each of TTFT, TPOT and E2E that has a bound (TTFT always), and the steady
   ratio is at least `min_ratio`. The probe's figures are then the window's, and the SLOs
   decide it (`sim/planning/capacity.py: violations`).
5. Otherwise double `n` and run again, while the traffic stays within `max_traffic_s`;
   a run that is still not steady there fails ("not steady after N s").

Cost in time: a probe well inside or well past capacity costs one run of
`min_traffic_s` (60 s of traffic by default; ~0.1 ms of CPU a request for Llama-3-8B
on ShareGPT lengths, so 1,440 requests at 24 req/s take ~0.15 s); a probe near the
boundary doubles up to `max_traffic_s` (480 s: 60 + 120 + 240 + 480 = 900 s of traffic,
~15x the first run). The bisection spends its time near the boundary for that reason.

A batch-1 replica with fixed lengths is an M/D/1 queue: `tests/test_steady.py` checks
the rule's verdicts at rho = 0.5 and 1.1 and the window's mean wait against
Pollaczek-Khinchine.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from sim.policies.batch import FINISHED

METRICS = ("ttft_s", "tpot_s", "e2e_s")


@dataclass(frozen=True)
class SteadyRule:
    warmup: float = field(default=0.2, metadata={"ge": 0, "lt": 0.5})
    cooldown: float = field(default=0.05, metadata={"ge": 0, "lt": 0.5})
    min_requests: int = field(default=300, metadata={"ge": 20})
    min_traffic_s: float = field(default=60.0, metadata={"gt": 0})
    max_traffic_s: float = field(default=480.0, metadata={"gt": 0})
    tolerance: float = field(default=0.25, metadata={"gt": 0})
    min_ratio: float = field(default=0.9, metadata={"ge": 0, "le": 1})
    fail_factor: float = field(default=3.0, metadata={"gt": 1})
    # compare the window's halves (off for a trace replay: `sim/planning/traffic.py`)
    halves: bool = True

    def first_requests(self, rate: float) -> int:
        return max(self.min_requests, math.ceil(rate * self.min_traffic_s))

    def max_requests(self, rate: float) -> int:
        return max(self.first_requests(rate), math.ceil(rate * self.max_traffic_s))


def _p99(x: np.ndarray) -> float | None:
    x = x[~np.isnan(x)]
    return float(np.percentile(x, 99)) if len(x) else None


def _stats(x: np.ndarray) -> dict:
    x = x[~np.isnan(x)]
    if not len(x):
        return {"mean": None, "p50": None, "p90": None, "p99": None}
    p50, p90, p99 = np.percentile(x, [50, 90, 99])
    return {"mean": float(x.mean()), "p50": float(p50), "p90": float(p90), "p99": float(p99)}


def window(req: pd.DataFrame, rule: SteadyRule, bounds: dict[str, float | None]) -> dict:
    """The measured window of one run: its stats, its halves' p99s, steady ratio,
    goodput against `bounds` (metric -> bound or None), and the rule's verdict
    ('steady', 'clearly fails', or 'not steady')."""
    arr = req.arrival_s.to_numpy(dtype=float)
    t0, t1 = window_bounds(arr, rule)
    tm = (t0 + t1) / 2
    inside = (arr >= t0) & (arr < t1)
    fin = (req.status == FINISHED).to_numpy()
    finish = req.finish_s.to_numpy(dtype=float)
    arrived = int(inside.sum())
    done = int((fin & (finish >= t0) & (finish < t1)).sum())
    ratio = done / arrived if arrived else float("nan")
    w = inside & fin
    cols = {k: req[k].to_numpy(dtype=float) for k in (*METRICS, "queue_s")}
    stats = {k: _stats(v[w]) for k, v in cols.items()}
    first, second = w & (arr < tm), w & (arr >= tm)
    halves = {k: (_p99(cols[k][first]), _p99(cols[k][second])) for k in METRICS}
    rejected = int((req.status == "rejected").sum())
    ok = np.ones(int(w.sum()), dtype=bool)
    for k in METRICS:
        if bounds.get(k) is not None:
            v = cols[k][w]
            ok &= np.isnan(v) | (v <= bounds[k])
    verdict = _verdict(stats, halves, ratio, rejected, rule, bounds)
    return {"stats": stats, "halves": halves, "ratio": ratio, "arrived": arrived, "rejected": rejected,
            "fraction_met": float(ok.mean()) if len(ok) else 0.0, "window_s": (t0, t1),
            "verdict": verdict}


def window_bounds(arrival: np.ndarray, rule: SteadyRule) -> tuple[float, float]:
    """The measured window [t0, t1) of a run with these arrival times."""
    t_first, t_last = float(arrival.min()), float(arrival.max())
    span = max(t_last - t_first, 1e-12)
    return t_first + rule.warmup * span, t_last - rule.cooldown * span


def _agree(a: float | None, b: float | None, bound: float | None, tol: float) -> bool:
    if a is None or b is None:
        return a is None and b is None
    scale = bound if bound is not None else max(a, b)
    return abs(b - a) <= tol * scale


def _verdict(stats, halves, ratio, rejected, rule: SteadyRule, bounds) -> str:
    if rejected:
        return "clearly fails"
    for k in METRICS:
        b, p = bounds.get(k), stats[k]["p99"]
        if b is not None and p is not None and p > rule.fail_factor * b:
            return "clearly fails"
    a, b = halves["ttft_s"]
    low = not math.isnan(ratio) and ratio < rule.min_ratio
    grows = a is not None and b is not None and b - a > rule.tolerance * a
    if low and grows:
        return "clearly fails"
    checked = [k for k in METRICS if bounds.get(k) is not None or k == "ttft_s"]
    if not low and (not rule.halves or all(_agree(*halves[k], bounds.get(k), rule.tolerance)
                                           for k in checked)):
        return "steady"
    return "not steady"


def steady_run(run_n, rate: float, rule: SteadyRule, bounds: dict[str, float | None],
               stop=None) -> dict:
    """Run `run_n(n)` -> (requests frame, summary) with n doubling by the rule; return the
    last run's summary with its latency figures, goodput and `steady` replaced by the
    window's (the whole run's stay under `whole_run`).

    `stop(n, last)` (`last`: no run after this one) -> a watch (`ProbeStop`,
    sim/planning/probestop.py) or None: each run is then `run_n(n, watch)`, and a run the
    watch stopped, its failure certain, is the last; its summary says so (`stopped`)."""
    n, cap, runs, traffic = rule.first_requests(rate), rule.max_requests(rate), 0, 0.0
    while True:
        watch = stop(n, n * 2 > cap) if stop is not None else None
        req, summary = run_n(n) if watch is None else run_n(n, watch)
        runs += 1
        traffic += n / rate
        w = window(req, rule, bounds)
        if watch is not None and watch.stopped is not None:
            return watch.mark(windowed_summary(summary, {**w, "verdict": watch.stopped["verdict"]},
                                               n, rate, runs, traffic), req)
        if w["verdict"] != "not steady" or n * 2 > cap:
            break
        n *= 2
    return windowed_summary(summary, w, n, rate, runs, traffic)


def windowed_summary(summary: dict, w: dict, n: int, rate: float, runs: int = 1,
                     traffic: float | None = None) -> dict:
    """A run's summary with its latency figures, goodput and `steady` replaced by the
    window `w`'s (the whole run's stay under `whole_run`)."""
    out = {**summary, **{k: w["stats"][k] for k in (*METRICS, "queue_s")},
           "whole_run": {k: summary[k] for k in (*METRICS, "goodput")}}
    if summary.get("goodput") is not None:
        out["goodput"] = {**summary["goodput"], "fraction_met": w["fraction_met"]}
    out["steady"] = {"ratio": w["ratio"], "verdict": w["verdict"], "reached": w["verdict"] == "steady",
                     "requests": n, "traffic_s": n / rate, "runs": runs,
                     "traffic_run_s": n / rate if traffic is None else traffic,
                     "window_arrivals": w["arrived"], "window_s": w["window_s"][1] - w["window_s"][0],
                     **{f"{k}_p99_halves": list(w["halves"][k]) for k in METRICS}}
    return out


def not_steady(summary: dict) -> str | None:
    """Why a probe's summary is not a steady-state measurement, in words; None if it is."""
    st = summary.get("steady") or {}
    if st.get("verdict") == "not steady":
        return f"not steady after {st['traffic_s']:.0f} s of traffic"
    return None
