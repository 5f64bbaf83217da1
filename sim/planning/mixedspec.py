"""A mixed-fleet plan's file (`sim/planning/mixed.py`: what the plan does with it) and
how its options are named: read by the plan and by its fleet check (`mixed_check`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from sim.io.specload import build, load_yaml
from sim.planning.capacity import SLO
from sim.planning.planspec import SearchSpec

Within = Literal["round_robin", "random", "least_outstanding", "least_kv", "power_of_two", "affinity"]


@dataclass(frozen=True)
class MixedSpec:
    gpus: tuple[str, ...]
    thresholds: tuple[int, ...]
    length_by: Literal["prompt", "total"] = "prompt"
    within: Within = "least_outstanding"
    check_rounds: int = field(default=4, metadata={"ge": 0, "le": 64})
    # the most length classes (pools) a mix may have: 2 (short | long) up to 4,
    # each split a strictly increasing choice of `thresholds`
    classes: int = field(default=2, metadata={"ge": 2, "le": 4})

    def check(self):
        if not self.gpus:
            return "gpus", "empty list (allowed: one or more GPU names)"
        if not self.thresholds or any(t < 1 for t in self.thresholds):
            return "thresholds", f"{list(self.thresholds)} (allowed: one or more whole tokens >= 1)"
        if len(set(self.thresholds)) != len(self.thresholds):
            return "thresholds", f"{list(self.thresholds)} (allowed: distinct whole tokens)"
        if self.classes - 1 > len(self.thresholds):
            return "classes", (f"{self.classes} classes need {self.classes - 1} thresholds, the list has "
                               f"{len(self.thresholds)} (allowed: classes <= thresholds + 1)")
        return None


@dataclass(frozen=True)
class MixedPlanSpec:
    scenario: str
    target_rate: float = field(metadata={"gt": 0})
    slo: SLO
    mixed: MixedSpec
    name: str = "mixed"
    prices: str | None = None
    search: SearchSpec = SearchSpec()
    # the arrival process sized to: auto (the workload's own: Poisson stays Poisson; a
    # trace, gamma or time-varying stream is replayed, sim/planning/mixed_stream.py) or
    # poisson (Poisson at the probed rate whatever the scenario says)
    arrival: Literal["auto", "poisson"] = "auto"
    file: str = field(default="", init=False, compare=False)


def is_mixed_plan(file: str | Path) -> bool:
    """Whether a plan file is a mixed-fleet plan (it has a `mixed:` section)."""
    data = load_yaml(Path(file))
    return isinstance(data, dict) and "mixed" in data


def load_mixed_plan(file: str | Path) -> MixedPlanSpec:
    p = Path(file)
    spec = build(MixedPlanSpec, load_yaml(p), file=p)
    object.__setattr__(spec, "file", str(p))
    return spec


def _base(spec: MixedPlanSpec) -> dict:
    return {"slo": spec.slo.as_scenario_slo(), "cluster": None}


POOL_NAMES = {2: ("short", "long"), 3: ("short", "medium", "long"), 4: ("short", "medium", "long", "longest")}


def span_label(lo: int, hi: int | None) -> str:
    """A length class (lo, hi]: '<= 2048', '> 2048' or '1025-4096' (tokens)."""
    if lo == 0:
        return "all" if hi is None else f"<= {hi}"
    return f"> {lo}" if hi is None else f"{lo + 1}-{hi}"


def spans(thresholds: tuple[int, ...] | list[int]) -> list[tuple[int, int | None]]:
    """The length classes (lo, hi] that thresholds T1 < T2 < ... cut: (0, T1], (T1, T2], ..."""
    edges = [0, *sorted(thresholds), None]
    return list(zip(edges[:-1], edges[1:], strict=True))


def describe(o: dict) -> str:
    """'3 x h100-sxm', '2 x a100-80gb (<= 2048) + 1 x h200-sxm (> 2048)', or with three
    classes '... (<= 1024) + 1 x h100-sxm (1025-4096) + 1 x h200-sxm (> 4096)'."""
    if o["kind"] == "single":
        p = o["pools"][0]
        return f"{p['replicas']} x {p['gpu']}"
    cuts = o.get("thresholds") or [o["threshold"]]
    return " + ".join(f"{p['replicas']} x {p['gpu']} ({span_label(lo, hi)})"
                      for p, (lo, hi) in zip(o["pools"], spans(cuts), strict=True))
