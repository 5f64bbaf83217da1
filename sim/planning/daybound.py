"""The lower bound of a day's fleet: per time window, the fewest replicas that meet the
SLOs at that window's rate, and static peak provisioning beside it.

Given one replica's sustained rate `r` (the highest Poisson rate at which it meets the
plan's p99 SLOs in steady state: `sim/planning/capacity.py`, probed as `llmsim plan`
probes) and the day's rate profile `rate(t)` (sim/workload/profile.py):

- window k = [k w, (k+1) w) (the last one ends at the day's end) has mean rate
  rate_k = (L(hi) - L(lo)) / (hi - lo), L the profile's integral, and peak rate
  peak_k = the highest rate(t) inside it;
- **the bound**: n_k = ceil(rate_k / r) replicas (none in a window with no traffic). No
  fleet that meets the SLOs in steady state can do with fewer in that window: fewer
  replicas would each carry more than r on average. It is a bound, not a plan: it
  assumes a replica appears and vanishes at the window's edge with no provisioning
  delay and no drain, and that load splits evenly (a random split of a Poisson stream is
  Poisson at rate / n, which is what r was probed at). Its GPU-hours are
  sum_k n_k (hi - lo) x GPUs per replica / 3600;
- **static peak provisioning**: ceil(max_t rate(t) / r) replicas for the whole day;
- a **schedule from the bound** (one autoscaled candidate): ceil(f x peak_k / r)
  replicas for window k (its *peak* rate, so the window's end is covered; `f` a headroom
  factor), asked for `lead` before it starts (the provisioning delay plus one scrape, so
  they are ready in time) and let go when it ends.
Every figure here is analytic arithmetic over the probed (measured-in-simulation) rate.
"""

from __future__ import annotations

import math

import numpy as np

from sim.workload.profile import RateProfile


def windows(duration_s: float, window_s: float) -> list[tuple[float, float]]:
    n = max(1, math.ceil(duration_s / window_s - 1e-9))
    return [(k * window_s, min((k + 1) * window_s, duration_s)) for k in range(n)]


def window_rates(profile: RateProfile, duration_s: float, window_s: float) -> list[dict]:
    """Per window: start, end, mean rate (from the profile's integral) and peak rate."""
    out = []
    for lo, hi in windows(duration_s, window_s):
        mean = float(profile.integral(hi) - profile.integral(lo)) / (hi - lo)
        t = np.linspace(lo, hi, 257)
        if profile.times is not None:  # a piecewise-linear profile peaks at a knot or an end
            t = np.concatenate((t, profile.times[(profile.times >= lo) & (profile.times <= hi)]))
        out.append({"start_s": lo, "end_s": hi, "rate": mean, "peak_rate": float(profile.rate(t).max())})
    return out


def replicas_for(rate: float, sustained: float) -> int:
    """The fewest replicas each carrying at most `sustained` (0 for no traffic)."""
    return 0 if rate <= 0 else math.ceil(rate / sustained - 1e-9)


def lower_bound(rates: list[dict], sustained: float, gpus_per_replica: int,
                usd_per_replica_hour: float) -> dict:
    """The bound per window (`replicas`) and over the day (replica-hours, GPU-hours, $)."""
    per = [{**w, "replicas": replicas_for(w["rate"], sustained)} for w in rates]
    replica_h = sum(w["replicas"] * (w["end_s"] - w["start_s"]) for w in per) / 3600
    return {"windows": per, "replica_hours": replica_h, "gpu_hours": replica_h * gpus_per_replica,
            "usd": replica_h * usd_per_replica_hour,
            "stands_on": f"ceil(window mean rate / {sustained:.4g} req/s sustained per replica), "
                         "per window (analytic over the probed rate)"}


def static_peak(profile: RateProfile, rates: list[dict], duration_s: float, sustained: float,
                gpus_per_replica: int, usd_per_replica_hour: float) -> dict:
    """ceil(the day's peak rate / sustained) replicas all day."""
    peak = max(w["peak_rate"] for w in rates)
    n = max(1, replicas_for(peak, sustained))
    replica_h = n * duration_s / 3600
    return {"replicas": n, "peak_rate": peak, "replica_hours": replica_h,
            "gpu_hours": replica_h * gpus_per_replica, "usd": replica_h * usd_per_replica_hour,
            "stands_on": f"ceil(peak rate {peak:.4g} / {sustained:.4g} req/s) replicas all day"}


def bound_schedule(rates: list[dict], sustained: float, factor: float,
                   lead_s: float) -> list[list[float]]:
    """[[time_s, replicas], ...]: at every time t, the most any window needs among those
    with start - lead_s <= t < end (window k's need: ceil(factor x its peak rate /
    sustained), at least 1). So replicas are asked for lead_s before the window that needs
    them starts, and let go when the last window that needs them ends."""
    need = [max(1, replicas_for(factor * w["peak_rate"], sustained)) for w in rates]
    early = [max(0.0, w["start_s"] - lead_s) for w in rates]
    times = sorted(set(early) | {w["end_s"] for w in rates[:-1]})
    out: list[list[float]] = []
    for t in times:
        n = max(need[j] for j, w in enumerate(rates) if early[j] <= t < w["end_s"])
        if not out or out[-1][1] != n:
            out.append([t, n])
    return out
