"""A plan file (`plans/*.yaml`): the target rate, the SLOs, the candidates and the search.

`llmsim plan` reads it (`sim/planning/plan.py`); the fleet check (`sim/planning/fleet.py`)
reads the scenario it names.

- `scenario`: a single-replica scenario, or one with a `cluster:`, which is then planned
  as the unit it is: all its GPUs counted and priced per group, checked as itself, a fleet
  of N units its groups' counts times N (`sim/planning/units.py`).
- `candidates`: short names (`ALIASES`: gpu, tensor, policy, chunk_tokens, block_size,
  max_num_seqs, speculative, pipeline), dotted scenario fields, and over a cluster scenario's pools
  `prefill.KEY`, `decode.KEY`, `both.KEY` (KEY a short name or a group field: every group
  of that role) and `ratio` (`"P:D"` quoted, `[P, D]`, or `aggregated`: the scenario
  without its cluster) — `sim/planning/poolkeys.py`.
- `router`: the fleet check's load balancer; default random, or the scenario's own
  `cluster.router` when it has a cluster.
- `arrival`: the arrival process sized to — `auto` (a trace scenario: its trace's own
  arrivals, replayed at each probed rate; else its kind, Poisson or gamma), `poisson`, or
  `trace` (`sim/planning/traffic.py`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from sim.io.specload import ROOT, SpecError, build, load_yaml
from sim.planning.candidates import candidate_grid as _grid
from sim.planning.capacity import SLO
from sim.planning.dayspec import DaySpec
from sim.planning.steady import SteadyRule
from sim.policies.router import RouterSpec

DEFAULT_PRICES = ROOT / "gpu_profiles" / "prices.yaml"


@dataclass(frozen=True)
class SearchSpec:
    seeds: int = field(default=2, metadata={"ge": 1})  # seeds per probe
    need: int | None = field(default=None, metadata={"ge": 1})  # seeds that must pass; default all
    # a probe's first run has at least this many requests (the steady rule extends it)
    requests: int = field(default=300, metadata={"ge": 20})
    steady: SteadyRule = SteadyRule()  # how long a probe runs (sim/planning/steady.py)
    rate_start: float = field(default=4.0, metadata={"gt": 0})
    rate_min: float = field(default=0.05, metadata={"gt": 0})
    rate_max: float = field(default=1024.0, metadata={"gt": 0})
    rel_tol: float = field(default=0.1, metadata={"gt": 0})  # stop when hi/lo <= 1 + rel_tol
    max_probes: int = field(default=14, metadata={"ge": 2})
    # the other seeds run only where the first passed, from half the answer up (capacity.py)
    lazy_seeds: bool = True
    # a probe's run stops once its seed's failure is certain (sim/planning/probestop.py)
    stop_early: bool = True
    max_replicas: int = field(default=256, metadata={"ge": 1})
    fleet_checks: int = field(default=3, metadata={"ge": 1})  # candidates checked as fleets, at most
    fleet_traffic_s: float = field(default=600.0, metadata={"gt": 0})  # a fleet check's traffic
    # size and check fleets at target x (1 + margin): the SLOs then hold at the target on
    # seeds the plan never ran, and through a traffic estimate that is off by the margin
    margin: float = field(default=0.1, metadata={"ge": 0, "le": 10})
    redundancy: Literal["none", "n+1"] = "none"  # n+1: the SLOs hold with one replica down
    min_replicas: int = field(default=1, metadata={"ge": 1})
    headroom_probes: int = field(default=4, metadata={"ge": 0})  # fleet runs above the target

    def sizing_rate(self, target: float) -> float:
        """The rate fleets are sized and checked at: the target plus the margin."""
        return target * (1 + self.margin)

    def rule(self) -> SteadyRule:
        """The steady rule with this search's first-run request count."""
        import dataclasses

        return dataclasses.replace(self.steady, min_requests=self.requests)


@dataclass(frozen=True)
class PlanSpec:
    scenario: str
    slo: SLO
    # requests/s a static fleet must serve; a day plan (`day:`) reads its scenario's rate profile
    target_rate: float | None = field(default=None, metadata={"gt": 0})
    candidates: dict[str, tuple[Any, ...]] = field(default_factory=dict)
    name: str = "plan"
    prices: str | None = None
    search: SearchSpec = SearchSpec()
    router: RouterSpec = RouterSpec(policy="random")  # the fleet check's router
    # the arrival process sized to: auto (a trace scenario replays its trace's, else its
    # kind), poisson, or trace (sim/planning/traffic.py)
    arrival: Literal["auto", "poisson", "trace"] = "auto"
    day: DaySpec | None = None  # a plan over a time-varying day (sim/planning/dayplan.py)
    file: str = field(default="", init=False, compare=False)

    def check(self):
        if self.target_rate is None and self.day is None:
            return "target_rate", "missing (allowed: a rate in requests/s, or a day: section)"
        if self.target_rate is not None and self.day is not None:
            return "target_rate", "not used by a day plan (its scenario's rate profile sets the rate)"
        return None


def load_plan(file: str | Path) -> PlanSpec:
    p = Path(file)
    data = load_yaml(p)
    if isinstance(data.get("router"), dict):  # a plan's router is random unless it says otherwise
        data = {**data, "router": {"policy": "random", **data["router"]}}
    elif "router" not in data:  # ... or its scenario is a cluster, whose router is part of the unit
        data = {**data, **_cluster_router(p, data.get("scenario"))}
    return built_plan(PlanSpec, data, p)


def built_plan(cls: type, data: dict, p: Path):
    """A plan spec of `cls` built from its file's mapping, which remembers its file (its
    relative paths are taken from there) and refuses an empty candidate list there, where
    the grid would otherwise silently hold no candidate."""
    spec = build(cls, data, file=p)
    object.__setattr__(spec, "file", str(p))
    for k, values in spec.candidates.items():
        if not values:
            raise SpecError(p, f"candidates.{k}", "empty list (allowed: one or more values)")
    return spec


def _cluster_router(plan: Path, scenario: object) -> dict:
    """{'router': the scenario's cluster router} when the plan's scenario has a `cluster:`,
    else {} (a scenario that does not load is left for run_plan to refuse)."""
    from dataclasses import asdict

    from sim.config.scenario import load_scenario

    if not isinstance(scenario, str):
        return {}
    q = Path(scenario)
    try:
        sc = load_scenario(q if q.is_absolute() else plan.resolve().parent / q)
    except SpecError:
        return {}
    return {"router": asdict(sc.cluster.router)} if sc.cluster is not None else {}


def _resolve(spec: Any, rel: str) -> Path:
    q = Path(rel)
    return q if q.is_absolute() else (Path(spec.file).resolve().parent / q)


def plan_scenario(spec: Any) -> str:
    """The plan's scenario file (a relative path is taken from the plan's folder): of any
    plan spec with `scenario` and `file` (by rate, by concurrency, mixed)."""
    return str(_resolve(spec, spec.scenario))


def load_prices(path: str | Path | None) -> dict[str, float]:
    p = Path(path) if path else DEFAULT_PRICES
    gpus = load_yaml(p).get("gpus")
    if not isinstance(gpus, dict):
        raise SpecError(p, "gpus", "missing (allowed: a mapping gpu -> {usd_per_hour, source})")
    out = {}
    for name, rec in gpus.items():
        v = rec.get("usd_per_hour") if isinstance(rec, dict) else None
        if not isinstance(v, int | float) or v <= 0:
            raise SpecError(p, f"gpus.{name}.usd_per_hour", f"expected a positive number, got {v!r}")
        out[str(name)] = float(v)
    return out


def candidate_grid(spec: PlanSpec) -> list[dict]:
    """Every candidate as scenario overrides (short names expanded; pool keys over the
    scenario's cluster groups, sim/planning/poolkeys.py)."""
    return _grid(spec.candidates, plan_groups(spec), spec.file)


def plan_groups(spec: PlanSpec):
    """The plan's scenario's cluster groups as (name, role), when a candidate key needs them
    (a pool key: `prefill.gpu`, `ratio`) or a label names them; else None."""
    from sim.config.scenario import load_scenario
    from sim.planning.poolkeys import groups_of, is_pool_key

    if not any(is_pool_key(k) for k in spec.candidates):
        return None
    return groups_of(load_scenario(plan_scenario(spec)))

