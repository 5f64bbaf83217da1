"""A plan over a day (`day:` in a plan file): the SLO-attainment target and the
autoscaling policies searched (sim/planning/dayplan.py).

```yaml
day:
  attainment: 0.99        # the target: SLO attainment over the day >= 99 % (every seed)
  window_s: 300           # the bound's and the report's windows
  seeds: 1                # days simulated per fleet (fresh seeds)
  policies:               # policy -> thresholds searched (cluster.autoscale.policy, .target)
    utilization: [0.5, 0.7]   # HPA on batch-slot use
    queue: [4, 8]             # HPA on outstanding requests per replica
    slo: [0.99]               # windowed SLO attainment (sim/policies/autoscale.py SLOPolicy)
    schedule: [1.0, 1.25]     # the bound's schedule at each window's peak rate x factor
  max_replicas: null      # the autoscaler's ceiling; default 2 x static peak
  screen: true            # stop fleets that can no longer be the pick (false: every whole day)
```
"""

from __future__ import annotations

from dataclasses import dataclass, field

POLICIES = ("utilization", "queue", "slo", "schedule")


@dataclass(frozen=True)
class DaySpec:
    attainment: float = field(default=0.99, metadata={"gt": 0, "le": 1})
    window_s: float = field(default=300.0, metadata={"gt": 0, "le": 86400})
    seeds: int = field(default=1, metadata={"ge": 1, "le": 16})
    policies: dict[str, tuple[float, ...]] = field(default_factory=lambda: {
        "utilization": (0.5, 0.7), "queue": (4.0, 8.0), "slo": (0.99,), "schedule": (1.0, 1.25)})
    max_replicas: int | None = field(default=None, metadata={"ge": 1, "le": 4096})
    # stop a fleet's day once it can no longer be the pick (sim/planning/dayscreen.py)
    screen: bool = True

    def check(self):
        for k, values in self.policies.items():
            if k not in POLICIES:
                return f"policies.{k}", f"unknown policy (allowed: {', '.join(POLICIES)})"
            if not values:
                return f"policies.{k}", "empty list (allowed: one or more thresholds)"
            for v in values:
                if isinstance(v, bool) or not isinstance(v, int | float) or v <= 0:
                    return f"policies.{k}", f"{v!r} is not a positive number"
                if k in ("utilization", "slo") and v > 1:
                    return f"policies.{k}", f"{v:g} is out of range (allowed: 0 < target <= 1)"
        if not self.policies:
            return "policies", "empty (allowed: one or more of " + ", ".join(POLICIES) + ")"
        return None
