"""Time-varying request rates: a non-homogeneous Poisson (or gamma-renewal) process.

Two shapes (`workload.arrival`):

- `kind: profile`: a CSV with columns `time_s` and `rate` (requests/s). The rate is
  **piecewise linear** between rows and held at the last row's rate after it; the first
  row must be at time_s 0, times strictly increasing, rates >= 0 and finite.
- `kind: diurnal`: rate(t) = mean * (1 + a cos(2 pi (t - peak_s) / period_s)) with
  a = (ratio - 1) / (ratio + 1), so peak / trough = `peak_to_trough` and the day-average
  is `rate`. The ramp is the cosine's: trough to peak in half a period. `peak_s`
  defaults to period_s / 2 (the run starts at the trough, the morning ramp first).
  This is an **illustrative** shape, not fitted to a trace: the shipped Azure 2023
  traces cover one hour (data/traces/README.md) and hold no daily cycle.

Arrivals by **inversion** (time change): draw a unit-rate renewal process S_k (exponential
gaps: Poisson; gamma gaps of mean 1 and coefficient of variation `cv`: bursty) and set
t_k = L^-1(S_k), where L(t) is the integral of the rate from 0 to t. With cv = 1 (the
default) this is exactly a non-homogeneous Poisson process; a constant rate gives the
same arrivals as `kind: poisson`. The first request arrives at t = 0 (S_0 = 0), as for
every synthetic arrival kind.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from sim.io.specload import MAX_TIME_S, SpecError, read_text, show


@dataclass(frozen=True, eq=False)
class RateProfile:
    """A rate over time: piecewise-linear knots, or the diurnal cosine."""

    times: np.ndarray | None = None  # float64 knots, times[0] == 0 (piecewise linear)
    rates: np.ndarray | None = None  # float64 requests/s at each knot
    mean: float = 0.0  # diurnal: day-average rate
    amplitude: float = 0.0  # diurnal: a in [0, 1)
    period_s: float = 1.0
    peak_s: float = 0.0

    def rate(self, t: np.ndarray) -> np.ndarray:
        t = np.asarray(t, dtype=np.float64)
        if self.times is None:
            return self.mean * (1 + self.amplitude * np.cos(2 * np.pi * (t - self.peak_s) / self.period_s))
        return np.interp(t, self.times, self.rates)  # held at the ends

    def integral(self, t: np.ndarray) -> np.ndarray:
        """L(t): expected arrivals in [0, t]."""
        t = np.asarray(t, dtype=np.float64)
        if self.times is None:
            w = 2 * np.pi / self.period_s
            return self.mean * (t + self.amplitude / w * (np.sin(w * (t - self.peak_s))
                                                          + np.sin(w * self.peak_s)))
        cum = self._cumulative()
        i = np.clip(np.searchsorted(self.times, t, side="right") - 1, 0, len(self.times) - 1)
        dt = t - self.times[i]
        r0 = self.rates[i]
        slope = self._slopes()[i]
        return cum[i] + r0 * dt + 0.5 * slope * dt**2

    def inverse(self, s: np.ndarray) -> np.ndarray:
        """L^-1(s): the earliest t with L(t) = s (inf past a profile that ends at rate 0)."""
        s = np.asarray(s, dtype=np.float64)
        if self.times is None:
            m, a, w = self.mean, self.amplitude, 2 * np.pi / self.period_s
            lo, hi = (s - 2 * m * a / w) / m, (s + 2 * m * a / w) / m  # |L(t) - m t| <= 2ma/w
            lo = np.maximum(lo, 0.0)
            for _ in range(64):  # bisection: L is increasing (the rate is > 0)
                mid = 0.5 * (lo + hi)
                below = self.integral(mid) < s
                lo, hi = np.where(below, mid, lo), np.where(below, hi, mid)
            return hi
        cum = self._cumulative()
        i = np.clip(np.searchsorted(cum, s, side="right") - 1, 0, len(cum) - 1)
        # skip knots after which the rate is 0 for a whole segment (cum does not grow)
        i = np.searchsorted(cum, cum[i], side="right") - 1
        r0, slope, ds = self.rates[i], self._slopes()[i], s - cum[i]
        with np.errstate(divide="ignore", invalid="ignore"):
            root = np.sqrt(np.maximum(r0**2 + 2 * slope * ds, 0.0))
            dt = np.where(ds > 0, 2 * ds / (r0 + root), 0.0)  # stable quadratic root
        return self.times[i] + dt

    def _slopes(self) -> np.ndarray:
        d = np.diff(self.rates) / np.diff(self.times)
        return np.append(d, 0.0)  # held after the last knot

    def _cumulative(self) -> np.ndarray:
        seg = 0.5 * (self.rates[1:] + self.rates[:-1]) * np.diff(self.times)
        return np.concatenate(([0.0], np.cumsum(seg)))


def diurnal(mean: float, peak_to_trough: float, period_s: float, peak_s: float | None) -> RateProfile:
    a = (peak_to_trough - 1.0) / (peak_to_trough + 1.0)
    return RateProfile(mean=mean, amplitude=a, period_s=period_s,
                       peak_s=period_s / 2 if peak_s is None else peak_s)


def load_profile(p: Path) -> RateProfile:
    """A `time_s,rate` CSV; errors name the file and line."""
    lines = read_text(p).splitlines()
    if not lines or [h.strip() for h in lines[0].split(",")] != ["time_s", "rate"]:
        raise SpecError(p, "line 1", "header must be 'time_s,rate' (a rate profile: seconds, requests/s)")
    times, rates = [], []
    for k, line in enumerate(lines[1:], start=2):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        cells = line.split(",")
        try:
            t, r = (float(c) for c in cells)
        except ValueError:
            raise SpecError(p, f"line {k}", f"{show(line)} is not two numbers (allowed: time_s,rate)") from None
        if not (np.isfinite(t) and np.isfinite(r) and 0 <= t <= MAX_TIME_S and r >= 0):
            raise SpecError(p, f"line {k}", f"{show(line)} is out of range (allowed: 0 <= time_s <= {MAX_TIME_S:.0e}, rate >= 0, finite)")
        if not times and t != 0:
            raise SpecError(p, f"line {k}", f"the first time_s is {t:g} (allowed: 0)")
        if times and t <= times[-1]:
            raise SpecError(p, f"line {k}", f"time_s {t:g} is not after {times[-1]:g} (allowed: increasing)")
        times.append(t)
        rates.append(r)
    if not times or max(rates) <= 0:
        raise SpecError(p, "line 1", "no positive rate (allowed: at least one row with rate > 0)")
    if len(times) == 1:  # one row: a constant rate
        times, rates = [0.0, 1.0], rates * 2
    return RateProfile(np.array(times), np.array(rates))


def profile_arrivals(profile: RateProfile, n: int | None,
                     duration: float | None, unit: Any) -> np.ndarray:
    """Arrival times by inversion; `unit(n, horizon)` draws the unit-rate renewal process."""
    horizon = float(profile.integral(duration)) if duration is not None else None
    s = unit(n, horizon)
    t = profile.inverse(s)
    t = t[np.isfinite(t)]
    return t[t < duration] if duration is not None else t
