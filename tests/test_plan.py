"""Capacity planning: the bisection, the fleet stand-in, the plan's validated fleet,
and a known answer (continuous vs static batching on the Azure conversation trace)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from sim.config.scenario import load_scenario
from sim.engine.runner import prepare, run
from sim.io.specload import SpecError
from sim.planning.capacity import SLO, max_rate, rate_overrides, violations
from sim.planning.fleet import simulate_fleet
from sim.planning.plan import binding, pareto, run_plan
from sim.planning.planspec import candidate_grid, load_plan
from sim.planning.steady import window, windowed_summary

pytestmark = pytest.mark.xdist_group("test_plan")

ROOT = Path(__file__).resolve().parent.parent
AZURE = str(ROOT / "scenarios" / "azure_conv_reference.yaml")


def _fake_summary(p99: float) -> dict:
    return {"ttft_s": {"p99": p99}, "tpot_s": {"p99": 0.01}, "e2e_s": {"p99": 1.0},
            "requests": {"rejected": 0}, "goodput": None}


def test_bisection_brackets_the_threshold_within_tolerance():
    def run_at(rate, seed):  # p99 TTFT crosses 1 s at rate 3.3 exactly
        return _fake_summary(0.5 if rate <= 3.3 else 2.0)

    cap = max_rate(run_at, SLO(ttft_p99_s=1.0), [0, 1], rate_start=1.0, rel_tol=0.05)
    assert cap.rate <= 3.3 < cap.fail_rate
    assert cap.fail_rate / cap.rate <= 1.05


def test_bisection_needs_every_seed_unless_told_otherwise():
    def run_at(rate, seed):  # seed 1 is unlucky: it breaks from rate 2 on, seed 0 from 4
        return _fake_summary(0.5 if rate < (4.0 if seed == 0 else 2.0) else 2.0)

    strict = max_rate(run_at, SLO(ttft_p99_s=1.0), [0, 1], rate_start=1.0, rel_tol=0.02)
    lenient = max_rate(run_at, SLO(ttft_p99_s=1.0), [0, 1], need=1, rate_start=1.0, rel_tol=0.02)
    assert strict.rate < 2.0 <= strict.fail_rate
    assert 3.9 < lenient.rate < 4.0
    assert strict.at_fail.seeds_passed == 1  # the spread: one of two seeds still passed


def test_fleet_routes_every_request_to_exactly_one_replica():
    sc = load_scenario(ROOT / "scenarios" / "quickstart.yaml",
                       {"workload.num_requests": 300, "workload.arrival.rate": 6.0, "seed": 5})
    fleet = simulate_fleet(sc, 3, seed=5)
    wl = prepare(sc).workload
    assert sorted(fleet.requests.id) == list(range(len(wl)))
    assert np.allclose(fleet.requests.sort_values("id").arrival_s, wl.arrival_s)
    assert set(fleet.requests.replica) == {0, 1, 2} and len(fleet.replica_steps) == 3
    assert fleet.summary["requests"]["finished"] == 300


def test_fleet_of_one_matches_the_single_replica_run():
    sc = load_scenario(ROOT / "scenarios" / "quickstart.yaml", {"workload.num_requests": 200})
    one = simulate_fleet(sc, 1, seed=sc.seed)
    alone = run(sc)
    assert one.summary["ttft_s"]["p99"] == pytest.approx(alone.summary["ttft_s"]["p99"], rel=1e-6)
    assert one.summary["e2e_s"]["p50"] == pytest.approx(alone.summary["e2e_s"]["p50"], rel=1e-6)


@pytest.fixture(scope="module")
def small_plan():
    spec = load_plan(ROOT / "tests" / "fixtures" / "plan_small.yaml")
    return spec, run_plan(spec, workers=2)


def test_recommended_fleet_meets_slos_at_target_and_one_replica_fewer_does_not(small_plan):
    spec, result = small_plan
    rec, check = result["recommended"], result["fleet_check"]
    assert rec is not None and check["holds"] and check["one_fewer_breaks"]
    n = rec["replicas"]
    assert n >= 2
    base = load_scenario(ROOT / "scenarios" / "quickstart.yaml")

    requests = int(spec.target_rate * spec.search.fleet_traffic_s)  # 10 minutes of traffic
    sc = load_scenario(ROOT / "scenarios" / "quickstart.yaml", {
        "slo": spec.slo.as_scenario_slo(), "gpu": "h200-sxm", "scheduler.policy": "continuous",
        **rate_overrides(base.workload.arrival, spec.target_rate, requests)})

    def broken(replicas: int, seed: int) -> list[str]:  # over the steady window, as the check
        f = simulate_fleet(sc, replicas, seed)
        w = window(f.requests, spec.search.rule(), spec.slo.bounds())
        return violations(windowed_summary(f.summary, w, requests, spec.target_rate), spec.slo)

    for seed in check["seeds"]:  # re-simulated here, independently of the plan's own check
        assert broken(n, seed) == []
    assert any(broken(n - 1, seed) for seed in check["seeds"])


def test_plan_prices_the_fleet_and_marks_infeasible_candidates(small_plan):
    _, result = small_plan
    rows = {r["candidate"]: r for r in result["candidates"]}
    cont = rows["h200-sxm continuous"]
    assert cont["status"] == "ok" and cont["gpus"] == cont["replicas"]
    assert cont["usd_per_hour"] == pytest.approx(4.0 * cont["replicas"])  # prices.yaml: h200 $4/h
    assert cont["replicas"] == math.ceil(result["target_rate"] / cont["sustained_rate"])
    assert rows["h200-sxm static"]["status"] == "infeasible"
    assert pareto(result["candidates"]) == ["h200-sxm continuous"]


def test_a_fleet_has_one_cost_per_million_tokens_whether_estimated_or_checked(small_plan):
    # every $/M of a plan divides by one mean output length (the plan scenario's workload
    # as drawn), so $/M over $/hour is one factor for every estimate and every check
    from sim.planning.estimate import output_tokens_per_request
    from sim.planning.planspec import plan_scenario

    spec, res = small_plan
    mean = output_tokens_per_request(spec)["per_request"]
    assert mean == pytest.approx(prepare(load_scenario(plan_scenario(spec))).workload.output_tokens.mean())
    factor = 1e6 / (spec.target_rate * mean * 3600)  # $/M per $/hour, by hand
    ok = [r for r in res["candidates"] if r["status"] == "ok"]
    for r in ok:
        assert r["usd_per_m_output_tokens"] == pytest.approx(r["usd_per_hour"] * factor, rel=1e-12)
    for c in res["fleet_checks"]:
        assert c["usd_per_m_output_tokens"] == pytest.approx(c["usd_per_hour"] * factor, rel=1e-12)
    assert res["output_tokens_per_request"]["per_request"] == mean


def test_the_seed_term_is_pooled_over_the_plans_passing_seed_groups_of_its_kind(small_plan):
    # the fleets' pool takes every fleet count and headroom probe that held and none that
    # broke, the units' pool the probes and share runs (seed_pool in plan.json); with fewer
    # than 4 df a figure's own seeds decide, else its interval is exp(log-mean +- t(0.95, df)
    # sd sqrt(1 + 1/n)) of its own seeds on the pooled sd, over (1 +- b), joined with their range
    # (a fleet pool under 4 df gives way to the units' pool, an upper bound, `fleet_pool`)
    from sim.planning.uncertainty import MIN_POOL_DF, T95, latency_interval

    _, r = small_plan
    rec, fleet, unit = r["recommended"], r["seed_pool"]["fleet"]["ttft_p99"], r["seed_pool"]["unit"]["ttft_p99"]
    names = set(fleet["groups"])
    for c in r["fleet_check"]["checks"]:
        assert (f"fleet h200-sxm continuous x{c['replicas']}" in names) == c["passed"]
    for t in rec["headroom"]["tried"]:
        assert (f"headroom x{t['factor']:.3g} of the target" in names) == t["passed"]
    assert all(n.startswith(("fleet ", "headroom ")) for n in names)
    assert unit["groups"] and all(n.startswith("h200-sxm continuous ") for n in unit["groups"])  # static never passed
    assert fleet["df"] >= len(names) and unit["df"] >= len(unit["groups"])
    at_n = next(c for c in r["fleet_check"]["checks"] if c["replicas"] == rec["replicas"])
    vals, b = at_n["ttft_p99_seeds_s"], rec["interval90_model"]
    used = fleet if fleet["df"] >= MIN_POOL_DF else unit
    if used["df"] < MIN_POOL_DF:
        assert "own seeds" in rec["seed_term"]
        assert rec["ttft_p99_interval90_s"] == latency_interval(vals, b)
        return
    assert "pooled over" in rec["seed_term"] and f"df {used['df']}" in rec["seed_term"]
    assert ("single units' probes" in rec["seed_term"]) == (used is unit)
    mean = sum(math.log(v) for v in vals) / len(vals)
    h = (T95[used["df"] - 1] if used["df"] <= 30 else 1.645) * used["sd_log"] * math.sqrt(1 + 1 / len(vals))
    want = (min(math.exp(mean - h), min(vals)) / (1 + b), max(math.exp(mean + h), max(vals)) / (1 - b))
    assert rec["ttft_p99_interval90_s"] == pytest.approx(want, rel=1e-12)


def test_continuous_batching_sustains_twice_static_at_equal_p99_latency():
    """h200-sxm, Azure 2023 conversation lengths, Poisson arrivals: the highest rate
    with p99 E2E <= 20 s, continuous (256 seqs) against static (batches of 32)."""
    base = {"runtime": "cuda-graph", "scheduler.max_batch_size": 32, "scheduler.max_num_seqs": 256}
    arrival = load_scenario(AZURE).workload.arrival
    slo = SLO(e2e_p99_s=20.0)
    rates = {}
    for policy in ("static", "continuous"):
        def run_at(rate, seed, policy=policy):
            over = {**base, "scheduler.policy": policy, **rate_overrides(arrival, rate, 300), "seed": seed}
            return run(AZURE, over).summary
        cap = max_rate(run_at, slo, [0], rate_start=2.0, rel_tol=0.1)
        rates[policy] = cap.rate
        assert cap.at_rate.summaries[0]["e2e_s"]["p99"] <= 20.0 < cap.at_fail.summaries[0]["e2e_s"]["p99"]
    assert rates["continuous"] >= 2 * rates["static"] > 0


def test_binding_constraint_is_read_from_the_summary():
    s = {"preemptions": 0, "requests": {"rejected": 0}, "kv": {"util_peak": 0.5},
         "gpu_busy_fraction": 0.4, "gpu_kernel_fraction": 0.4, "iterations": {"total": 100},
         "total_token_throughput": 1000.0, "duration_s": 10.0}
    assert binding(s, "h200-sxm") == "queueing"
    assert binding({**s, "preemptions": 3}, "h200-sxm") == "KV capacity"
    busy = {**s, "gpu_busy_fraction": 0.99, "gpu_kernel_fraction": 0.9}
    assert binding(busy, "h200-sxm") == "memory bandwidth"  # 100 tokens per iteration
    assert binding({**busy, "total_token_throughput": 1e5}, "h200-sxm") == "compute"
    assert binding({**busy, "gpu_kernel_fraction": 0.51}, "h200-sxm") == "memory bandwidth"
    assert binding({**busy, "gpu_kernel_fraction": 0.49}, "h200-sxm") == "host overhead"


def test_an_eager_stack_at_small_batch_is_bound_by_its_host_work():
    # Llama-3.2-1B on the eager reference stack, one sequence at a time: a decode step
    # takes 11.6 ms of which 3.3 ms are kernels (its fitted host terms: launches per layer)
    sc = load_scenario(ROOT / "scenarios" / "quickstart.yaml", {
        "model": "llama-3.2-1b", "kv.max_model_len": 8192,  # continuous: within the step budget
        "runtime": "h200-eager-reference", "workload.num_requests": 60,
        "workload.arrival.rate": 1.0, "scheduler.max_num_seqs": 1})
    s = run(sc).summary
    assert s["gpu_busy_fraction"] > 0.85
    assert binding(s, "h200-sxm") == "host overhead"


def test_candidate_short_names_expand_to_scenario_fields(tmp_path):
    p = tmp_path / "p.yaml"
    p.write_text("scenario: x.yaml\ntarget_rate: 1\nslo: {ttft_p99_s: 1}\n"
                 "candidates: {gpu: [a, b], tensor: [1], chunk_tokens: [512]}\n")
    grid = candidate_grid(load_plan(p))
    assert grid[0] == {"gpu": "a", "parallel.tensor": 1, "scheduler.max_num_batched_tokens": 512}
    assert len(grid) == 2


def test_plan_without_slo_bounds_is_a_one_line_error(tmp_path):
    p = tmp_path / "p.yaml"
    p.write_text("scenario: x.yaml\ntarget_rate: 1\nslo: {}\n")
    with pytest.raises(SpecError, match=r"p.yaml: slo.ttft_p99_s: give at least one"):
        load_plan(p)


def test_plan_whose_every_candidate_is_invalid_is_a_one_line_error(tmp_path, capsys):
    from sim.cli.main import main

    p = tmp_path / "p.yaml"
    p.write_text(f"scenario: {ROOT / 'scenarios' / 'quickstart.yaml'}\ntarget_rate: 1\n"
                 "slo: {ttft_p99_s: 1}\ncandidates: {scheduler.polcy: [static]}\n")
    assert main(["plan", str(p), "--out", str(tmp_path / "o"), "--workers", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("llmsim: error: ") and "scheduler.polcy: unknown key" in err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "o").exists()


@pytest.mark.parametrize("tensor", ["{bogus: 1}", ".inf", "x"])
def test_plan_with_a_tensor_candidate_of_the_wrong_type_is_a_one_line_error(tmp_path, capsys, tensor):
    from sim.cli.main import main

    p = tmp_path / "p.yaml"
    p.write_text(f"scenario: {ROOT / 'scenarios' / 'quickstart.yaml'}\ntarget_rate: 1\n"
                 f"slo: {{ttft_p99_s: 1}}\ncandidates: {{tensor: [{tensor}]}}\n")
    assert main(["plan", str(p), "--out", str(tmp_path / "o"), "--workers", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"llmsim: error: {p}: candidates.tensor[0]: expected an integer, got ")
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "o").exists()
