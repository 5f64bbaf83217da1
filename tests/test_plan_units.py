"""Plans over any deployment: a scenario with a `cluster:` is planned as the unit it is
(every GPU counted and priced per group, its fleet the groups' counts scaled), pool
candidate keys (`prefill.gpu`, `decode.tensor`, `ratio`) and the aggregated-vs-
disaggregated fronts. Known answers priced by hand from gpu_profiles/prices.yaml."""

from __future__ import annotations

from pathlib import Path

import pytest

from sim.config.scenario import load_scenario
from sim.io.specload import SpecError
from sim.planning.deployments import deployment_fronts, front
from sim.planning.fleet import simulate_fleet
from sim.planning.plan import evaluate, load_prices, run_plan
from sim.planning.planspec import candidate_grid, load_plan
from sim.planning.units import fleet_cluster, unit_of
from sim.policies.router import RouterSpec

ROOT = Path(__file__).resolve().parent.parent
SCEN = ROOT / "scenarios"
# gpu_profiles/prices.yaml, USD per GPU-hour
A100, H100, H200 = 1.30, 3.00, 4.00


def _plan(tmp_path: Path, scenario: str, candidates: str = "{}", extra: str = "") -> Path:
    p = tmp_path / "p.yaml"
    p.write_text(f"scenario: {SCEN / scenario}\ntarget_rate: 8\nslo: {{ttft_p99_s: 1.0, tpot_p99_s: 0.05}}\n"
                 "search: {seeds: 1, requests: 20, rate_start: 2, max_probes: 2, fleet_checks: 1}\n"
                 f"candidates: {candidates}\n{extra}")
    return p


def test_a_cluster_scenario_is_one_unit_of_all_its_gpus_priced_per_group():
    prices = load_prices(None)
    dis = unit_of(load_scenario(SCEN / "disaggregated.yaml"))  # 2 prefill + 2 decode H200s
    assert (dis.gpus, dis.replicas, dis.deployment) == (4, 4, "disaggregated")
    assert dis.usd_per_hour(prices) == pytest.approx(4 * H200)
    het = unit_of(load_scenario(SCEN / "hetero_fleet.yaml"))  # 2 H200 + 2 A100
    assert (het.gpus, het.deployment) == (4, "aggregated")
    assert het.usd_per_hour(prices) == pytest.approx(2 * H200 + 2 * A100)
    tp = unit_of(load_scenario(SCEN / "disaggregated.yaml", {"cluster.groups.1.parallel.tensor": 2}))
    assert tp.gpus == 2 + 2 * 2 and tp.usd_per_hour(prices) == pytest.approx(6 * H200)


def test_planning_from_a_cluster_scenario_counts_and_prices_all_its_gpus(tmp_path):
    spec = load_plan(_plan(tmp_path, "disaggregated.yaml"))
    row = evaluate(spec, {}, load_prices(None))
    assert row["status"] == "ok", row.get("note")
    assert row["unit_gpus"] == 4 and row["unit_usd_per_hour"] == pytest.approx(4 * H200)
    assert row["deployment"] == "disaggregated" and row["replicas"] >= 1
    assert row["gpus"] == 4 * row["replicas"]
    assert row["usd_per_hour"] == pytest.approx(16.0 * row["replicas"])
    assert spec.router.policy == "least_outstanding"  # the scenario's own router: part of the unit


def test_a_plan_of_a_cluster_scenario_recommends_whole_units_priced_as_such(tmp_path):
    result = run_plan(load_plan(_plan(tmp_path, "disaggregated.yaml")), workers=1)
    rec = result["recommended"]
    assert rec is not None, result["candidates"]
    assert rec["gpus"] == 4 * rec["replicas"] and rec["usd_per_hour"] == pytest.approx(16.0 * rec["replicas"])
    assert rec["unit"] == "2 x h200-sxm prefill + 2 x h200-sxm decode (4 GPUs)"


def test_a_fleet_of_n_units_scales_every_group_and_keeps_roles_and_link():
    sc = load_scenario(SCEN / "disaggregated.yaml", {"workload.num_requests": 60})
    cl = fleet_cluster(sc, 3, RouterSpec(policy="random"))
    assert [(g["name"], g["role"], g["count"]) for g in cl["groups"]] == [("prefill", "prefill", 6),
                                                                          ("decode", "decode", 6)]
    assert cl["kv_transfer"]["link"] == "infiniband-ndr400"
    fleet = simulate_fleet(sc, 2, seed=3)
    names = set(fleet.requests.replica_name)
    assert len(fleet.replica_steps) == 8 and names <= {f"decode-{i}" for i in range(4)}
    assert set(fleet.requests.prefill_replica) <= {f"prefill-{i}" for i in range(4)}
    assert fleet.summary["requests"]["finished"] == 60


def test_a_plain_scenario_fleet_is_still_n_plain_replicas():
    sc = load_scenario(SCEN / "quickstart.yaml")
    cl = fleet_cluster(sc, 5, RouterSpec(policy="random"))
    assert cl["groups"] == [{"name": "r", "count": 5}] and cl["router"]["policy"] == "random"
    assert unit_of(sc).describe() == "1 x h200-sxm"


def test_a_disaggregated_candidates_cost_is_the_sum_of_its_pools(tmp_path):
    spec = load_plan(_plan(tmp_path, "disaggregated.yaml",
                           "{ratio: ['1:2'], prefill.gpu: [h100-sxm], decode.tensor: [2]}"))
    (cand,) = candidate_grid(spec)
    assert cand == {"cluster.groups.0.count": 1, "cluster.groups.1.count": 2,
                    "cluster.groups.0.gpu": "h100-sxm", "cluster.groups.1.parallel.tensor": 2}
    row = evaluate(spec, cand, load_prices(None))
    pools = 1 * 1 * H100 + 2 * 2 * H200  # one H100 prefill replica, two TP-2 H200 decode replicas
    assert row["unit_gpus"] == 5 and row["unit_usd_per_hour"] == pytest.approx(pools)
    assert row["candidate"] == "prefill(x1 h100-sxm) decode(x2 tp2)"
    assert row["status"] == "ok", row.get("note")
    assert row["usd_per_hour"] == pytest.approx(pools * row["replicas"])


def test_ratio_aggregated_is_the_scenario_without_its_cluster_once_per_combination(tmp_path):
    spec = load_plan(_plan(tmp_path, "disaggregated.yaml",
                           "{ratio: [aggregated, '1:1'], decode.gpu: [h100-sxm, h200-sxm], gpu: [h200-sxm]}"))
    cands = candidate_grid(spec)
    assert cands == [{"cluster": None, "gpu": "h200-sxm"},
                     {"cluster.groups.0.count": 1, "cluster.groups.1.count": 1,
                      "cluster.groups.1.gpu": "h100-sxm", "gpu": "h200-sxm"},
                     {"cluster.groups.0.count": 1, "cluster.groups.1.count": 1,
                      "cluster.groups.1.gpu": "h200-sxm", "gpu": "h200-sxm"}]
    agg = load_scenario(SCEN / "disaggregated.yaml", cands[0])
    assert agg.cluster is None and unit_of(agg).usd_per_hour(load_prices(None)) == H200


@pytest.mark.parametrize(("scenario", "candidates", "says"), [
    ("disaggregated.yaml", "{ratio: [2:1]}", "candidates.ratio: 121 is no prefill:decode ratio"),
    ("disaggregated.yaml", "{ratio: ['0:1']}", "is no prefill:decode ratio"),
    ("colocated.yaml", "{ratio: ['1:1']}", "needs a scenario whose cluster has one prefill and one decode"),
    ("quickstart.yaml", "{prefill.gpu: [h100-sxm]}", "candidates.prefill.gpu: the scenario has no 'prefill' group"),
    ("disaggregated.yaml", "{decode.gpu: [h100, h200-sxm]}", "candidates.decode.gpu[0]: unknown 'h100'"),
])
def test_a_bad_pool_key_is_a_one_line_error_naming_the_candidate(tmp_path, scenario, candidates, says):
    spec = load_plan(_plan(tmp_path, scenario, candidates))
    with pytest.raises(SpecError) as e:
        run_plan(spec, workers=1)
    assert says in str(e.value) and "\n" not in str(e.value)


def _row(name, kind, usd_m, ttft, tpot):
    return {"candidate": name, "status": "ok", "deployment": kind, "gpus": 2, "usd_per_hour": usd_m,
            "usd_per_m_output_tokens": usd_m, "ttft_p99_at_target_s": ttft, "tpot_p99_at_target_s": tpot}


def test_deployment_fronts_keep_what_nothing_beats_on_cost_ttft_and_tpot():
    rows = [_row("agg-a", "aggregated", 1.0, 0.3, 0.020),   # cheapest: on the front
            _row("agg-b", "aggregated", 2.0, 0.4, 0.030),   # beaten by agg-a on all three
            _row("dis-a", "disaggregated", 1.5, 0.5, 0.008),  # best TPOT: on the front
            _row("dis-b", "disaggregated", 1.6, 0.5, 0.009),  # beaten by dis-a
            {"candidate": "x", "status": "infeasible", "deployment": "aggregated"}]
    out = deployment_fronts(rows)
    assert out["front"] == ["agg-a", "dis-a"]
    assert out["by_deployment"]["aggregated"]["cheapest"]["candidate"] == "agg-a"
    assert out["by_deployment"]["disaggregated"]["front"] == ["dis-a"]
    assert deployment_fronts([r for r in rows if r["deployment"] == "aggregated"]) is None


def test_front_is_every_point_when_none_dominates_another():
    pts = {str(i): {"usd_per_m_output_tokens": i, "ttft_p99_s": 5 - i, "tpot_p99_s": 1.0} for i in range(5)}
    assert front(pts) == list(pts)


@pytest.mark.parametrize("plan", sorted((ROOT / "plans").glob("*.yaml")), ids=lambda p: p.name)
def test_every_shipped_plan_loads_and_its_candidates_check(plan):
    from sim.planning.candidates import check_candidates
    from sim.planning.concurrency import is_concurrency_plan
    from sim.planning.mixed import is_mixed_plan
    from sim.planning.planspec import plan_scenario

    if is_mixed_plan(plan) or is_concurrency_plan(plan):
        pytest.skip("another plan kind: tests/test_plan_mixed.py, tests/test_plan_concurrency.py")
    spec = load_plan(plan)
    check_candidates(spec.file, spec.candidates, plan_scenario(spec), {"slo": spec.slo.as_scenario_slo()})
    assert len(candidate_grid(spec)) >= 2
