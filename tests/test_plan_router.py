"""The plan's fleet check runs behind the router the plan names (`router:`, default random)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sim.config.scenario import load_scenario
from sim.planning.fleet import router_label, simulate_fleet
from sim.planning.plan import validate_fleet
from sim.planning.planspec import load_plan
from sim.policies.router import RouterSpec
from sim.report.plan_page import plan_sections

ROOT = Path(__file__).resolve().parent.parent
QUICKSTART = ROOT / "scenarios" / "quickstart.yaml"
POLICIES = "round_robin, random, least_outstanding, least_kv, power_of_two, affinity, length"


def _plan(tmp_path: Path, router: str | None = None) -> Path:
    """A plan light enough to check as a fleet in a second: 2 req/s, 20 requests a replica."""
    p = tmp_path / "p.yaml"
    p.write_text(f"scenario: {QUICKSTART}\ntarget_rate: 2\nslo: {{ttft_p99_s: 5.0}}\n"
                 "search: {seeds: 1, requests: 20}\n" + (f"router: {router}\n" if router else ""))
    return p


def _fleet_check(spec, monkeypatch) -> tuple[dict, list]:
    """validate_fleet from an estimate of 2 replicas, recording every fleet it simulates."""
    import sim.planning.fleet

    fleets = []

    def recording(*args, **kwargs):
        fleets.append(simulate_fleet(*args, **kwargs))
        return fleets[-1]

    monkeypatch.setattr(sim.planning.fleet, "simulate_fleet", recording)
    return validate_fleet(spec, {"candidate": "base", "replicas": 2}, {}), fleets


def _report_text(spec, check: dict) -> str:
    plan = {"name": "p", "target_rate": spec.target_rate, "slo": spec.slo.__dict__,
            "candidates": [], "recommended": {"candidate": "base", "replicas": check["replicas"],
                                              "gpus": check["replicas"], "usd_per_hour": 4.0,
                                              "usd_per_m_output_tokens": 1.0},
            "fleet_check": check}
    return " ".join(t for sec in plan_sections(plan).sections for t in sec.text)


def test_plan_router_defaults_to_random_and_the_report_says_so(tmp_path, monkeypatch):
    spec = load_plan(_plan(tmp_path))
    assert spec.router == RouterSpec(policy="random", staleness_s=0.0, affinity_slack=8)
    check, fleets = _fleet_check(spec, monkeypatch)
    assert fleets and all(f.summary["stands_on"] == "the cluster engine, random router (sim/planning/fleet.py)"
                          for f in fleets)
    assert {k: check["router"][k] for k in ("policy", "staleness_s", "affinity_slack")} == \
        {"policy": "random", "staleness_s": 0.0, "affinity_slack": 8}
    assert not check["router"]["length_thresholds"]  # the length router's fields, unused
    assert "req/s (random router, seeds" in _report_text(spec, check)


def test_plan_router_mapping_without_policy_keeps_random(tmp_path):
    assert RouterSpec().policy == "round_robin"  # a scenario's default, not a plan's
    spec = load_plan(_plan(tmp_path, "{staleness_s: 0.1}"))
    assert spec.router == RouterSpec(policy="random", staleness_s=0.1)


def test_round_robin_fleet_sends_request_i_to_replica_i_mod_n():
    sc = load_scenario(QUICKSTART, {"workload.num_requests": 30, "workload.arrival.rate": 6.0})
    rr = simulate_fleet(sc, 3, seed=4, router=RouterSpec(policy="round_robin")).requests
    assert (rr.replica == rr.id % 3).all() and len(rr) == 30
    rand = simulate_fleet(sc, 3, seed=4).requests  # the default: random
    assert not (rand.replica == rand.id % 3).all()
    assert set(rand.replica) <= {0, 1, 2}


def test_plan_with_round_robin_router_checks_its_fleet_behind_round_robin(tmp_path, monkeypatch):
    spec = load_plan(_plan(tmp_path, "{policy: round_robin}"))
    assert spec.router == RouterSpec(policy="round_robin")
    check, fleets = _fleet_check(spec, monkeypatch)
    assert {f.replicas for f in fleets} == {r["replicas"] for r in check["checks"]}
    for f in fleets:  # arrival order (the request id) decides the replica, nothing else
        assert (f.requests.replica == f.requests.id % f.replicas).all()
        assert "round_robin router" in f.summary["stands_on"]
    assert check["router"]["policy"] == "round_robin" and check["router_label"] == "round_robin router"
    text = _report_text(spec, check)
    assert "(round_robin router, seeds" in text and "random router" not in text


def test_router_label_names_the_settings_its_policy_reads():
    assert router_label(RouterSpec(policy="least_kv", staleness_s=0.1)) == \
        "least_kv router (reports 0.1 s stale)"
    assert router_label(RouterSpec(policy="least_kv")) == "least_kv router"
    assert router_label(RouterSpec(policy="random", staleness_s=0.1)) == "random router"
    assert router_label(RouterSpec(policy="affinity", affinity_slack=3)) == "affinity router (slack 3)"


def test_plan_report_of_a_plan_written_before_router_existed_says_random(tmp_path):
    spec = load_plan(_plan(tmp_path))
    old = {"candidate": "base", "replicas": 2, "estimated_replicas": 2, "holds": True,
           "one_fewer_breaks": True, "seeds": [101], "checks": []}
    assert "req/s (random router, seeds" in _report_text(spec, old)


def test_plan_with_an_unknown_router_policy_exits_2_with_one_line(tmp_path, llmsim):
    p = _plan(tmp_path, "{policy: nearest}")
    out = tmp_path / "o"
    proc = llmsim("plan", str(p), "--out", str(out), timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip() == (f"llmsim: error: {p}: router.policy: unknown 'nearest' "
                                   f"(allowed: {POLICIES})")
    assert not out.exists()


@pytest.mark.parametrize(("router", "says"), [
    ("{staleness_s: -1}", "router.staleness_s: -1.0 is out of range (allowed: >= 0)"),
    ("{affinity_slack: 1.5}", "router.affinity_slack: expected an integer, got 1.5 (allowed: an integer >= 0)"),
    ("{polcy: random}", "router.polcy: unknown key (allowed: affinity_slack, length_by, length_groups, length_thresholds, policy, staleness_s, within)"),
    ("round_robin", "router: expected a mapping, got 'round_robin' (allowed: a YAML mapping, {key: value, ...})"),
])
def test_plan_with_a_bad_router_field_is_a_one_line_error(tmp_path, capsys, router, says):
    from sim.cli.main import main

    p = _plan(tmp_path, router)
    assert main(["plan", str(p), "--out", str(tmp_path / "o"), "--workers", "1"]) == 2
    err = capsys.readouterr().err
    assert err == f"llmsim: error: {p}: {says}\n" and not (tmp_path / "o").exists()
