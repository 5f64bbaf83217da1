"""Cluster specs: replica groups behind a router, optionally split into prefill and
decode pools (disaggregated serving).

```yaml
cluster:
  router: {policy: least_outstanding, staleness_s: 0.05}
  groups:
    - {name: h200, count: 2, gpu: h200-sxm}
    - {name: a100, count: 2, gpu: a100-80gb, runtime: vllm, scheduler: {max_num_seqs: 128}}
  kv_transfer: {link: infiniband-ndr400}   # disaggregated only: prefill -> decode KV moves
```

A group is the scenario's own settings with the group's fields laid over them:
`gpu`, `runtime`, `elementwise` replace the scenario's (a scenario-level `elementwise`
applies to every group's runtime unless the group names its own); `scheduler`, `kv`, `attention`,
`speculative` and `parallel` are merged key by key into the scenario's sections.
`role: prefill` / `role: decode` groups make a disaggregated cluster (DistServe,
Splitwise): arrivals go to the prefill pool; a finished prefill's KV moves over
the `kv_transfer` link to a decode replica with room for it.

Without a `cluster` section a scenario is one replica (a fleet of one).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from sim.policies.router import RouterSpec


@dataclass(frozen=True)
class ReplicaGroupSpec:
    name: str = ""
    count: int = field(default=1, metadata={"ge": 1, "le": 4096})
    role: Literal["both", "prefill", "decode"] = "both"
    gpu: str | None = None
    runtime: str | None = None
    elementwise: Literal["fused", "unfused"] | None = None  # the group's stack's kernels
    # merged key by key into the scenario's sections of the same name
    scheduler: dict[str, Any] | None = None
    kv: dict[str, Any] | None = None
    attention: dict[str, Any] | None = None
    speculative: dict[str, Any] | None = None
    parallel: dict[str, Any] | None = None


@dataclass(frozen=True)
class KVTransferSpec:
    """The link a prefill replica's KV crosses to reach a decode replica."""

    link: str = "infiniband-ndr400"  # gpu_profiles/links.yaml
    # overrides the link's; 1 MB/s to 1 PB/s and at most an hour, so transfer times stay
    # on the scale of the steps they interleave with (1e-300 GB/s put requests at 1e298 s)
    bandwidth_gbs: float | None = field(default=None, metadata={"ge": 1e-3, "le": 1e6})
    latency_us: float | None = field(default=None, metadata={"ge": 0, "le": 3.6e9})


@dataclass(frozen=True)
class ProvisioningSpec:
    """How long a new replica takes: node start plus loading its weights
    (data/autoscale/provisioning.yaml holds the numbers and their sources)."""

    source: str = "local-nvme"  # where the weights are read from (a name in that file)
    node_start_s: float | None = field(default=None, metadata={"ge": 0, "le": 86400})
    bandwidth_gbs: float | None = field(default=None, metadata={"ge": 1e-3, "le": 1e6})


@dataclass(frozen=True)
class AutoscaleSpec:
    """Replicas that come and go (sim/engine/autoscale.py, sim/policies/autoscale.py).

    `policy`: `utilization` (HPA on batch-slot use: requests dispatched and unfinished per
    ready replica over max_num_seqs), `queue` (HPA on requests dispatched and unfinished
    per ready replica), `slo` (the share of requests meeting the scenario's TTFT and TPOT
    SLOs over the last `window_s`, target 0-1: sim/policies/autoscale.py SLOPolicy, with
    `high`, `step` and `down_utilization`), or `schedule` (`[[time_s, replicas], ...]`).
    The group's `count` is the number ready at t = 0."""

    policy: Literal["utilization", "queue", "slo", "schedule"] = "utilization"
    target: float | None = field(default=None, metadata={"gt": 0, "le": 1e6})
    schedule: tuple[tuple[float, int], ...] | None = None
    min_replicas: int = field(default=1, metadata={"ge": 1, "le": 4096})
    max_replicas: int = field(default=1, metadata={"ge": 1, "le": 4096})
    scrape_s: float = field(default=15.0, metadata={"gt": 0, "le": 86400})  # metrics interval
    tolerance: float = field(default=0.1, metadata={"ge": 0, "le": 1})  # HPA default 0.1
    # scale down to the highest target of the last window (HPA default 300 s)
    stabilization_s: float = field(default=300.0, metadata={"ge": 0, "le": 86400})
    provisioning: ProvisioningSpec = ProvisioningSpec()
    window_s: float = field(default=600.0, metadata={"gt": 0, "le": 86400})  # report windows
    # policy slo: scale down at attainment >= high (default halfway from target to 1),
    # up by max(1, ceil(step x replicas)), down only while the rest stay <= down_utilization
    high: float | None = field(default=None, metadata={"gt": 0, "le": 1})
    step: float = field(default=0.25, metadata={"gt": 0, "le": 10})
    down_utilization: float = field(default=0.5, metadata={"gt": 0, "le": 1})
    attainment_window_s: float = field(default=60.0, metadata={"gt": 0, "le": 86400})

    def check(self):
        if self.min_replicas > self.max_replicas:
            return "min_replicas", f"{self.min_replicas} > max_replicas={self.max_replicas} (allowed: min <= max)"
        if self.policy == "schedule":
            if not self.schedule:
                return "schedule", "policy 'schedule' needs schedule: [[time_s, replicas], ...]"
            times = [t for t, _ in self.schedule]
            if times != sorted(times) or times[0] < 0:
                return "schedule", "times must be >= 0 and increasing"
        elif self.target is None:
            return "target", f"policy '{self.policy}' needs a target (utilization: 0-1, queue: requests per replica, slo: attainment 0-1)"
        elif self.schedule is not None:
            return "schedule", f"not used by policy '{self.policy}'"
        if self.policy in ("utilization", "slo") and self.target > 1:
            return "target", f"{self.target} is out of range (allowed: 0 < target <= 1 for {self.policy})"
        if self.policy == "slo" and self.high is not None and self.high < self.target:
            return "high", f"{self.high} is under target {self.target} (allowed: target <= high <= 1)"
        return None


@dataclass(frozen=True)
class ClusterSpec:
    groups: tuple[ReplicaGroupSpec, ...] = (ReplicaGroupSpec(),)
    router: RouterSpec = RouterSpec()
    kv_transfer: KVTransferSpec = KVTransferSpec()
    autoscale: AutoscaleSpec | None = None

    def check(self):
        if not self.groups:
            return "groups", "needs at least one group"
        a = self.autoscale
        if a is not None and (len(self.groups) != 1 or self.disaggregated):
            return "autoscale", "autoscaling needs one group of role 'both' (allowed: one group)"
        if a is not None and not a.min_replicas <= self.groups[0].count <= a.max_replicas:
            return "groups", f"count {self.groups[0].count} (replicas ready at the start) is outside autoscale min_replicas..max_replicas ({a.min_replicas}..{a.max_replicas})"
        names = [g.name for g in self.groups if g.name]
        dup = next((n for n in names if names.count(n) > 1), None)
        if dup:
            return "groups", f"group name '{dup}' used twice (allowed: distinct names)"
        if sum(g.count for g in self.groups) > 4096:
            return "groups", "more than 4096 replicas in all (allowed: at most 4096)"
        roles = {g.role for g in self.groups}
        problem = self._length_pools()
        if problem:
            return problem
        if "prefill" in roles and "decode" not in roles:
            return "groups", "a 'prefill' group needs a 'decode' group to hand its requests to"
        if "decode" in roles and not roles & {"prefill", "both"}:
            return "groups", "a 'decode' group needs a 'prefill' (or 'both') group in front of it"
        return None

    def _length_pools(self):
        """A length router's pools: cluster groups that take arrivals, one per pool."""
        r = self.router
        if r.policy != "length":
            return None
        front = [g.name or f"g{i}" for i, g in enumerate(self.groups) if g.role != "decode"]
        pools = len(r.length_thresholds) + 1
        if not r.length_groups:
            if len(front) != pools:
                return "router.length_thresholds", (
                    f"{pools - 1} threshold(s) make {pools} pools but the cluster has {len(front)} "
                    f"group(s) taking arrivals (allowed: {len(front) - 1} threshold(s), or name the "
                    "pools in router.length_groups)")
            return None
        bad = next((n for n in r.length_groups if n not in front), None)
        if bad is not None:
            return "router.length_groups", f"'{bad}' is no group taking arrivals (allowed: {', '.join(front)})"
        idle = next((n for n in front if n not in r.length_groups), None)
        if idle is not None:
            return "router.length_groups", f"group '{idle}' takes arrivals but is in no pool (allowed: every one of {', '.join(front)})"
        return None

    @property
    def disaggregated(self) -> bool:
        return any(g.role != "both" for g in self.groups)


@dataclass(frozen=True)
class Link:
    """A prefill -> decode KV link: seconds = bytes / bandwidth + latency."""

    bandwidth_bytes_per_s: float
    latency_s: float

    def seconds(self, nbytes: float) -> float:
        return nbytes / self.bandwidth_bytes_per_s + self.latency_s
