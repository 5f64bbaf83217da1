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

    def check(self):
        if not self.gpus:
            return "gpus", "empty list (allowed: one or more GPU names)"
        if not self.thresholds or any(t < 1 for t in self.thresholds):
            return "thresholds", f"{list(self.thresholds)} (allowed: one or more whole tokens >= 1)"
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


def _scenario_path(spec: MixedPlanSpec) -> str:
    q = Path(spec.scenario)
    return str(q if q.is_absolute() else Path(spec.file).resolve().parent / q)


def _base(spec: MixedPlanSpec) -> dict:
    return {"slo": spec.slo.as_scenario_slo(), "cluster": None}


def describe(o: dict) -> str:
    """'3 x h100-sxm' or '2 x a100-80gb (<= 2048) + 1 x h200-sxm (> 2048)'."""
    if o["kind"] == "single":
        p = o["pools"][0]
        return f"{p['replicas']} x {p['gpu']}"
    s, lo = o["pools"]
    return f"{s['replicas']} x {s['gpu']} (<= {o['threshold']}) + {lo['replicas']} x {lo['gpu']} (> {o['threshold']})"
