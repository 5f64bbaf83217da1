"""One candidate of a plan on its own: its sustained rate, replica count, cost and p99s at
its share of the target (the *estimate*), or the one-line reason it is skipped.

`llmsim plan` (sim/planning/plan.py) maps `evaluate` over the candidate grid, in worker
processes, before it ranks the rows and checks the cheapest as fleets; keeping one
candidate's work here keeps what a worker runs apart from what the parent decides. The
steady-state probe runner (`_runner`) and a capacity search's row (`_capacity_row`) are
shared with the day and mixed plans (sim/planning/dayplan.py, mixed.py), and
`output_tokens_per_request` is the one mean that every $/M output tokens of a plan
divides by, estimates and fleet checks alike."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from sim.config.scenario import Scenario, load_scenario
from sim.io.specload import SpecError
from sim.planning.binding import binding
from sim.planning.candidates import label, resolve
from sim.planning.capacity import Capacity, max_rate
from sim.planning.planspec import PlanSpec, plan_groups, plan_scenario
from sim.planning.probestop import stopper
from sim.planning.steady import SteadyRule, steady_run
from sim.planning.traffic import probe_overrides, process, steady_rule
from sim.planning.uncertainty import candidate_intervals, seed_group
from sim.planning.units import Unit, unit_of


def _base(spec: PlanSpec) -> dict:
    return {"slo": spec.slo.as_scenario_slo()}


def screen(spec: PlanSpec, cand: dict, prices: dict[str, float]) -> dict | None:
    """The skipped row of a candidate the scenario refuses or that has no price (its
    one-line reason in `note`); None for a candidate to evaluate."""
    row: dict[str, Any] = {"candidate": label(cand, plan_groups(spec)), **cand, "status": "skipped"}
    sc = resolve(plan_scenario(spec), {**_base(spec), **cand})
    if isinstance(sc, SpecError):
        return {**row, "note": f"refused by the scenario: {sc.path}: {sc.message}"}
    gpu = unit_of(sc).unpriced(prices)
    if gpu is not None:
        return {**row, "note": f"no price for GPU '{gpu}' in the prices file"}
    return None


def evaluate(spec: PlanSpec, cand: dict, prices: dict[str, float]) -> dict:
    """One candidate: sustained rate, fleet size, cost, latency at its share, binding.
    Never raises SpecError (it runs in worker processes): a refusal is a skipped row."""
    row: dict[str, Any] = {"candidate": label(cand, plan_groups(spec)), **cand}
    try:
        return {**row, **_evaluate(spec, cand, prices)}
    except SpecError as e:
        return {**row, "status": "skipped", "note": f"refused by the scenario: {e.path}: {e.message}"}


def _evaluate(spec: PlanSpec, cand: dict, prices: dict[str, float]) -> dict:
    scen = plan_scenario(spec)
    base = {**_base(spec), **cand}
    sc = load_scenario(scen, base)
    unit = unit_of(sc)
    unpriced = unit.unpriced(prices)
    if unpriced is not None:
        return {"status": "skipped", "note": f"no price for GPU '{unpriced}' in the prices file"}
    gpu = unit.pools[0].gpu  # the binding constraint reads the first pool's GPU
    s = spec.search
    rule = steady_rule(dataclasses.replace(s.rule(), min_requests=s.rule().min_requests * unit.replicas),
                       sc, spec.arrival)
    run_at = _runner(scen, base, sc, rule, spec.slo.bounds(), spec.arrival)
    seeds = [sc.seed + i for i in range(s.seeds)]
    probe_at = _runner(scen, base, sc, rule, spec.slo.bounds(), spec.arrival,
                       stopper(rule, spec.slo.bounds(), spec.slo.goodput_min)) if s.stop_early else run_at
    cap = max_rate(probe_at, spec.slo, seeds, s.need, s.rate_start, s.rate_min, s.rate_max,
                   s.rel_tol, s.max_probes, s.lazy_seeds)
    row = {**_capacity_row(cap, gpu), "arrival": process(sc, spec.arrival)}
    if cap.rate <= 0:
        return {**row, "status": "infeasible", "note": "SLOs broken even at the lowest rate tried"}
    extra = 1 if s.redundancy == "n+1" else 0
    sizing = s.sizing_rate(spec.target_rate)
    replicas = max(s.min_replicas, math.ceil(sizing / cap.rate - 1e-9) + extra)
    if replicas > s.max_replicas:
        return {**row, "status": "infeasible", "note": f"needs {replicas} replicas > max_replicas"}
    share = spec.target_rate / max(replicas - extra, 1)  # with n+1, one unit down
    at_share = [run_at(share, seed) for seed in seeds]
    out_per_req = output_tokens_per_request(spec)["per_request"]
    unit_usd_h = unit.usd_per_hour(prices)
    usd_h = replicas * unit_usd_h
    usd_m = _usd_per_m(usd_h, spec.target_rate, out_per_req)
    worst = {k: max((a[f"{k}_s"]["p99"] for a in at_share if a[f"{k}_s"]["p99"] is not None), default=None)
             for k in ("ttft", "tpot", "e2e")}
    rng = candidate_intervals(sizing, cap.rate, cap.fail_rate,
                           cap.at_rate.summaries[0].get("lookup_provenance"),
                           {k: [a[f"{k}_s"]["p99"] for a in at_share] for k in ("ttft", "tpot", "e2e")},
                           at_share[0].get("lookup_provenance"), 1, unit_usd_h, usd_m, usd_h,
                           extra, s.min_replicas)
    return {**row, "status": "ok", "note": "", **unit_fields(unit, prices), "replicas": replicas,
            "gpus": replicas * unit.gpus, "usd_per_hour": usd_h, "usd_per_m_output_tokens": usd_m,
            "ttft_p99_at_target_s": worst["ttft"], "tpot_p99_at_target_s": worst["tpot"],
            "e2e_p99_at_target_s": worst["e2e"], **rng, **stage_fields(at_share[0]),
            "seed_groups": _seed_groups(label(cand, plan_groups(spec)), cap, at_share, share, spec)}


def _seed_groups(name: str, cap: Capacity, at_share: list[dict], share: float, spec: PlanSpec) -> list[dict]:
    """A candidate's seed groups for the pooled seed term (`uncertainty.seed_pool`): each
    probe (passed: every seed run met the SLOs) and its runs at its share; the last is the
    share's. Loads are shares of the sustained rate."""
    from sim.planning.capacity import violations

    out = [seed_group(f"{name} probe {p.rate:.4g}/s", p.summaries, p.passed and p.seeds_passed == p.seeds_run,
                      p.rate / cap.rate) for p in cap.probes]
    return out + [seed_group(f"{name} at share {share:.4g}/s", at_share,
                             not any(violations(a, spec.slo) for a in at_share), share / cap.rate)]


def stage_fields(summary: dict) -> dict:
    """A pipelined candidate's per-stage figures at its share of the target (a probe's
    summary → `pipeline`): each stage's busy and bubble shares, stage 0 first."""
    pipe = summary.get("pipeline")
    if not pipe:
        return {}
    stages = pipe["per_stage"]
    return {"stage_busy_share": " / ".join(f"{s['busy_share']:.2f}" for s in stages),
            "stage_bubble_share": " / ".join(f"{s['bubble_share']:.2f}" for s in stages)}


def unit_fields(unit: Unit, prices: dict[str, float]) -> dict:
    """A candidate row's unit: `tp` (None when its pools differ), `deployment`
    (aggregated / disaggregated), `unit` in words, its GPUs and $/hour (the sum of its
    pools'); `replicas` in the row then counts units."""
    return {"tp": unit.tensor, "deployment": unit.deployment, "unit": unit.describe(),
            "unit_replicas": unit.replicas, "unit_gpus": unit.gpus,
            "unit_usd_per_hour": unit.usd_per_hour(prices)}


def _usd_per_m(usd_per_hour: float, rate: float, output_tokens_per_request: float) -> float:
    return usd_per_hour / (rate * output_tokens_per_request * 3600) * 1e6


def output_tokens_per_request(spec: PlanSpec) -> dict:
    """The plan's one figure of output tokens per request, which every $/M output tokens
    of the plan (estimates and fleet checks alike) divides by: the mean over the plan
    scenario's own workload as drawn with its seed (a probe's or check's run draws from
    the same lengths, so its own mean would differ by sampling alone)."""
    from sim.workload.requests import generate

    sc = load_scenario(plan_scenario(spec), _base(spec))
    wl = generate(sc.workload, np.random.default_rng(sc.seed), file=sc.file or None,
                  path="workload", base_dir=sc.base_dir or None)
    return {"per_request": float(np.mean(wl.output_tokens)),
            "stands_on": f"the mean output length of the plan scenario's {len(wl):,} requests "
                         f"(seed {sc.seed})"}


def _runner(scen: str, base: dict, sc: Scenario, rule: SteadyRule, bounds: dict,
            arrival: str = "auto", stop=None):
    """run_at(rate, seed) -> a steady-state probe's summary (`sim/planning/steady.py`), on
    the plan's arrival process (a trace replay takes the seed's own window of the trace).
    `stop` (`probestop.stopper`): each run stops once the seed's failure is certain."""
    from sim.engine.runner import run

    def run_at(rate: float, seed: int) -> dict:
        def run_n(n: int, watch=None):
            traffic = probe_overrides(sc, arrival, rate, n, window=seed - sc.seed)
            out = run(scen, {**base, **traffic, "seed": seed}, watch=watch)
            return out.requests, out.summary
        return steady_run(run_n, rate, rule, bounds, stop)
    return run_at


def _capacity_row(cap: Capacity, gpu: str) -> dict:
    spread = cap.spread("ttft_s")
    fail = cap.at_fail
    stopped = [x["stopped"] for p in cap.probes for x in p.summaries if x.get("stopped")]
    return {"sustained_rate": cap.rate, "fail_rate": cap.fail_rate,
            "seeds_passed_at_fail": f"{fail.seeds_passed}/{fail.seeds_run}" if fail else "",
            "ttft_p99_spread_s": f"{spread[0]:.3g}-{spread[1]:.3g}" if spread else "",
            "broke": "; ".join(fail.broke) if fail else "",
            "binding": binding(fail.summaries[-1], gpu, fail.broke) if fail else "none up to rate_max",
            "probes": len(cap.probes), "runs": sum(p.seeds_run for p in cap.probes),
            "probe_traffic_s": sum(x["steady"]["traffic_run_s"] for p in cap.probes for x in p.summaries
                                   if "steady" in x),
            # seeds' runs stopped once their failure was certain, and their arrivals left out
            "probe_runs_stopped": len(stopped),
            "probe_traffic_stopped_s": sum(st["last_arrival_s"] - st["at_s"] for st in stopped)}
