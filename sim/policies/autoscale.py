"""Autoscaling decisions: how many replicas the fleet should have. Plain classes; they
never touch the clock (the engine's `autoscaler` process calls `plan` every scrape).

The HPA rule (Kubernetes Horizontal Pod Autoscaler, kubernetes.io "Horizontal Pod
Autoscaling", algorithm details): desired = ceil(current * metric / target), no change
while |metric / target - 1| <= tolerance, clamped to [min, max]; a scale-down takes the
highest desired count of the last `stabilization_s` (the scale-down stabilisation
window), a scale-up applies at once.

The SLO rule (`SLOPolicy`): the metric is the share of requests meeting their TTFT and
TPOT SLOs over the last window (`FleetMetrics.attainment`, sim/engine/autoscale.py
`Attainment`). Under `target`, add max(1, ceil(step x current)) replicas, unless
replicas are already starting (attainment lags the fleet by the provisioning delay,
so it waits for them rather than asking again and again); at or over `high`
("comfortably over"), remove one replica, but only while the others would carry the
load at utilisation at most `down_utilization` (the batch-slot use of the ready
replicas times ready / (ready - 1)): without that guard a fleet meeting its SLOs
would shrink until it broke them. Scale-down is stabilised as the HPA's is.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass


@dataclass(frozen=True)
class FleetMetrics:
    """What the scaler scrapes: replicas counted (ready plus starting) and the metric,
    averaged over ready replicas."""

    current: int  # ready + starting (the replicas the scaler has asked for)
    ready: int
    metric: float  # the policy's metric, the average over ready replicas
    # share of requests meeting the SLOs over the last window (None: none resolved)
    attainment: float | None = None


class HPAPolicy:
    """Target a per-replica average of a metric (utilisation or queue length)."""

    def __init__(self, target: float, min_replicas: int, max_replicas: int, *,
                 tolerance: float = 0.1, stabilization_s: float = 300.0):
        self.target, self.lo, self.hi = target, min_replicas, max_replicas
        self.tolerance, self.window = tolerance, stabilization_s
        self.recent: deque[tuple[float, int]] = deque()  # (time, desired) within the window

    def plan(self, now: float, m: FleetMetrics) -> int:
        ratio = m.metric / self.target
        base = max(m.ready, 1)  # HPA scales the replicas it has metrics for
        if abs(ratio - 1.0) <= self.tolerance:
            desired = m.current
        else:
            desired = math.ceil(base * ratio - 1e-9)
            if ratio > 1 and m.current > m.ready:  # replicas starting already count
                desired = max(desired, m.current)
        desired = min(self.hi, max(self.lo, desired))
        self.recent.append((now, desired))
        while self.recent and self.recent[0][0] < now - self.window:
            self.recent.popleft()
        if desired < m.current:  # scale down only as far as the window's highest allows
            desired = min(m.current, max(d for _, d in self.recent))
        return desired


class _Stabilized:
    """The HPA's scale-down stabilisation: a scale-down goes only as far as the highest
    count wanted within the last `window` seconds."""

    def __init__(self, window: float):
        self.window = window
        self.recent: deque[tuple[float, int]] = deque()

    def apply(self, now: float, desired: int, current: int) -> int:
        self.recent.append((now, desired))
        while self.recent and self.recent[0][0] < now - self.window:
            self.recent.popleft()
        if desired < current:
            desired = min(current, max(d for _, d in self.recent))
        return desired


class SLOPolicy:
    """Scale on the windowed SLO attainment (TTFT and TPOT): up under `target`, down
    (one at a time, load permitting) at or over `high`."""

    def __init__(self, target: float, min_replicas: int, max_replicas: int, *,
                 high: float | None = None, step: float = 0.25, down_utilization: float = 0.5,
                 stabilization_s: float = 300.0):
        self.target, self.lo, self.hi = target, min_replicas, max_replicas
        self.high = high if high is not None else target + (1.0 - target) / 2
        self.step, self.down_util = step, down_utilization
        self.stable = _Stabilized(stabilization_s)

    def plan(self, now: float, m: FleetMetrics) -> int:
        desired = m.current
        att = m.attainment
        if att is not None and att < self.target:
            if m.current <= m.ready:  # none starting: ask for more
                desired = m.current + max(1, math.ceil(self.step * m.current - 1e-9))
        elif att is not None and att >= self.high and m.ready > 1 \
                and m.metric * m.ready / (m.ready - 1) <= self.down_util:
            desired = m.current - 1
        desired = min(self.hi, max(self.lo, desired))
        return self.stable.apply(now, desired, m.current)


class SchedulePolicy:
    """A replica count by time of day: the last entry at or before `now`."""

    def __init__(self, schedule: tuple[tuple[float, int], ...], min_replicas: int,
                 max_replicas: int):
        self.times = [float(t) for t, _ in schedule]
        self.counts = [min(max_replicas, max(min_replicas, int(n))) for _, n in schedule]
        self.lo = min_replicas

    def plan(self, now: float, m: FleetMetrics) -> int:
        i = -1
        for k, t in enumerate(self.times):
            if t <= now:
                i = k
        return self.counts[i] if i >= 0 else max(self.lo, m.current)
