"""Autoscaling decisions: how many replicas the fleet should have. Plain classes; they
never touch the clock (the engine's `autoscaler` process calls `plan` every scrape).

The HPA rule (Kubernetes Horizontal Pod Autoscaler, kubernetes.io "Horizontal Pod
Autoscaling", algorithm details): desired = ceil(current * metric / target), no change
while |metric / target - 1| <= tolerance, clamped to [min, max]; a scale-down takes the
highest desired count of the last `stabilization_s` (the scale-down stabilisation
window), a scale-up applies at once.
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
