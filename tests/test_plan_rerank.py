"""After a fleet check changes a candidate's cost the plan re-ranks: it checks the next
candidates whose estimate is at most the cheapest validated cost (up to
`search.fleet_checks`) and recommends the cheapest validated fleet, every figure of it
from its own fleet check. Known answers from stand-in estimates and fleet checks."""

from __future__ import annotations

from pathlib import Path

import pytest

import sim.planning.plan
from sim.cli.planning import plan_verdict
from sim.planning.plan import run_plan
from sim.planning.planspec import load_plan
from sim.report.plan_page import plan_sections

ROOT = Path(__file__).resolve().parent.parent
H100 = 3.0  # gpu_profiles/prices.yaml, $ per GPU-hour


def _plan(tmp_path: Path, fleet_checks: int = 3) -> Path:
    p = tmp_path / "p.yaml"
    p.write_text(f"scenario: {ROOT / 'scenarios' / 'quickstart.yaml'}\ntarget_rate: 10\n"
                 f"slo: {{ttft_p99_s: 1.0}}\nsearch: {{seeds: 1, requests: 40, fleet_checks: {fleet_checks}, headroom_probes: 0}}\n"
                 "candidates: {gpu: [h100-sxm], tensor: [1, 2, 4]}\n")
    return p


def _stand_ins(monkeypatch, estimate: dict[int, tuple[int, float]], fleet: dict[int, tuple[int, float]]):
    """Per TP degree: the estimate (replicas, p99 TTFT) and the fleet check's
    (replicas, p99 TTFT); records which TP degrees were fleet-checked."""
    checked = []

    def evaluate(spec, cand, prices):
        tp = cand["parallel.tensor"]
        n, ttft = estimate[tp]
        return {"candidate": f"h100-sxm tp{tp}", **cand, "status": "ok", "note": "", "tp": tp,
                "sustained_rate": 10 / n, "fail_rate": 11 / n, "binding": "compute", "replicas": n,
                "gpus": n * tp, "usd_per_hour": n * tp * H100, "usd_per_m_output_tokens": 1.0,
                "ttft_p99_at_target_s": ttft, "tpot_p99_at_target_s": 0.02, "e2e_p99_at_target_s": 5.0}

    def validate_fleet(spec, row, cand):
        tp = cand["parallel.tensor"]
        checked.append(tp)
        n, ttft = fleet[tp]
        at = {"replicas": n, "passed": True, "broke": "", "ttft_p99_s": ttft, "tpot_p99_s": 0.03 * tp,
              "e2e_p99_s": 6.0 + tp, "goodput": 0.99, "output_tokens_per_request": 250.0}
        fewer = {**at, "replicas": n - 1, "passed": False, "broke": "p99 TTFT 2 s > 1 s"}
        return {"candidate": row["candidate"], "replicas": n, "estimated_replicas": row["replicas"],
                "holds": True, "one_fewer_breaks": True, "seeds": [101], "router": {"policy": "random"},
                "router_label": "random router", "checks": [fewer, at] if n > 1 else [at]}

    monkeypatch.setattr(sim.planning.plan, "evaluate", evaluate)
    monkeypatch.setattr(sim.planning.plan, "validate_fleet", validate_fleet)
    return checked


def test_a_fleet_check_that_raises_the_first_pick_above_the_next_estimate_recommends_the_next(
        tmp_path, monkeypatch):
    # tp1: estimated 1 replica ($3/h) but its fleet needs 3 ($9/h); tp2: estimated and
    # validated at 1 replica ($6/h); tp4's estimate ($12/h) is above $6/h: never checked
    checked = _stand_ins(monkeypatch, estimate={1: (1, 0.5), 2: (1, 0.3), 4: (1, 0.2)},
                         fleet={1: (3, 0.6), 2: (1, 0.35), 4: (1, 0.25)})
    result = run_plan(load_plan(_plan(tmp_path)), workers=1)
    assert checked == [1, 2]
    rec, check = result["recommended"], result["fleet_check"]
    assert rec["candidate"] == check["candidate"] == "h100-sxm tp2"
    assert (rec["replicas"], rec["gpus"], rec["usd_per_hour"]) == (1, 2, 6.0)
    assert (rec["ttft_p99_s"], rec["tpot_p99_s"], rec["e2e_p99_s"]) == (0.35, 0.06, 8.0)  # its check's
    mean = result["output_tokens_per_request"]["per_request"]  # the plan's one figure, not a check's
    assert rec["usd_per_m_output_tokens"] == pytest.approx(6.0 / (10 * mean * 3600) * 1e6)
    assert rec["estimate"]["ttft_p99_at_target_s"] == 0.3 and "ttft_p99_at_target_s" not in rec
    assert [c["usd_per_hour"] for c in result["fleet_checks"]] == [9.0, 6.0]
    assert result["unchecked_within"] == 0
    rows = {r["candidate"]: r for r in result["candidates"]}
    assert rows["h100-sxm tp1"]["fleet_usd_per_hour"] == 9.0 and "fleet_replicas" not in rows["h100-sxm tp4"]
    assert not rows["h100-sxm tp1"]["pareto"]  # $9/h validated, beaten by tp2's $6/h and 0.35 s
    assert rows["h100-sxm tp2"]["pareto"] and rows["h100-sxm tp4"]["pareto"]
    lines = plan_verdict(result)
    assert lines[0] == "fleet checks at 10 req/s, random router (2 checked, cheapest estimate first):"
    assert lines[3].startswith("recommended: h100-sxm tp2 x 1 replica (2 GPUs), $6.00/hour,")
    text = " ".join(t for sec in plan_sections(result).sections for t in sec.text)
    assert "2 candidate(s) checked as fleets" in text and "p99 TTFT 0.35 s" in text


def test_a_tie_after_the_fleet_check_is_shown_and_goes_to_more_replicas(tmp_path, monkeypatch):
    # tp1's fleet needs 2 replicas ($6/h), tying tp2's estimate: tp2 is checked too and
    # validated at $6/h with 1 replica; the tie is shown, and goes to the fleet that survives
    # losing a replica better (2 x tp1), not to the single replica; tp4 ($12/h) is not checked
    checked = _stand_ins(monkeypatch, estimate={1: (1, 0.5), 2: (1, 0.3), 4: (1, 0.2)},
                         fleet={1: (2, 0.6), 2: (1, 0.35), 4: (1, 0.25)})
    result = run_plan(load_plan(_plan(tmp_path)), workers=1)
    assert checked == [1, 2]
    assert result["recommended"]["candidate"] == "h100-sxm tp1"
    assert result["recommended"]["usd_per_hour"] == 6.0
    assert result["recommended"]["ties"] == ["h100-sxm tp2"]


def test_the_bound_on_fleet_checks_is_reported_with_what_it_left_unchecked(tmp_path, monkeypatch):
    checked = _stand_ins(monkeypatch, estimate={1: (1, 0.5), 2: (1, 0.3), 4: (1, 0.2)},
                         fleet={1: (3, 0.6), 2: (1, 0.35), 4: (1, 0.25)})
    result = run_plan(load_plan(_plan(tmp_path, fleet_checks=1)), workers=1)
    assert checked == [1]
    assert result["recommended"]["usd_per_hour"] == 9.0 and result["unchecked_within"] == 1
    assert plan_verdict(result)[-1] == ("  1 more candidate(s) estimated at <= $9.00/hour were not "
                                        "fleet-checked (search.fleet_checks)")


def test_a_fleet_check_that_confirms_the_estimate_checks_nothing_more_expensive(tmp_path, monkeypatch):
    checked = _stand_ins(monkeypatch, estimate={1: (1, 0.5), 2: (1, 0.3), 4: (1, 0.2)},
                         fleet={1: (1, 0.55), 2: (1, 0.35), 4: (1, 0.25)})
    result = run_plan(load_plan(_plan(tmp_path)), workers=1)
    assert checked == [1] and result["recommended"]["candidate"] == "h100-sxm tp1"
    assert result["recommended"]["ttft_p99_s"] == 0.55


def test_when_no_fleet_check_holds_nothing_is_recommended(tmp_path, monkeypatch):
    _stand_ins(monkeypatch, {1: (1, 0.5), 2: (1, 0.4), 4: (1, 0.3)}, {1: (2, 3.0), 2: (2, 3.0), 4: (2, 3.0)})
    failing = sim.planning.plan.validate_fleet

    def never_holds(spec, row, cand):
        return {**failing(spec, row, cand), "holds": False}

    monkeypatch.setattr(sim.planning.plan, "validate_fleet", never_holds)
    result = run_plan(load_plan(_plan(tmp_path)), workers=1)
    assert result["recommended"] is None and result["fleet_checks"]
    assert plan_verdict(result)[-1] == ("recommended: none: no fleet checked meets the SLOs at 10 req/s "
                                        "with up to 256 replicas (search.max_replicas)")
    assert "No candidate meets the SLOs as a fleet" in str(plan_sections(result).sections[0].text)


def test_the_fleet_check_never_grows_a_fleet_past_max_replicas(tmp_path):
    from sim.planning.fleet import validate_fleet

    p = tmp_path / "p.yaml"  # an SLO no fleet meets: the upward search stops at the limit
    p.write_text(f"scenario: {ROOT / 'scenarios' / 'quickstart.yaml'}\ntarget_rate: 4\n"
                 "slo: {ttft_p99_s: 0.000001}\nsearch: {seeds: 1, requests: 20, max_replicas: 2}\n"
                 "candidates: {gpu: [h200-sxm]}\n")
    spec = load_plan(p)
    row = {"candidate": "h200-sxm", "replicas": 1, "fail_rate": 4.0}
    check = validate_fleet(spec, row, {"gpu": "h200-sxm"})
    assert (check["replicas"], check["holds"]) == (2, False)
    assert [c["replicas"] for c in check["checks"]] == [1, 2]


@pytest.mark.parametrize("redundancy, min_replicas, serving", [("none", 1, 3), ("n+1", 1, 4), ("none", 5, 5)])
def test_redundancy_and_min_replicas_size_the_checked_fleet(tmp_path, monkeypatch, redundancy, min_replicas,
                                                            serving):
    # stand-in fleets: the SLOs hold from 3 replicas on; n+1 serves 4 so that losing one
    # leaves 3; min_replicas 5 serves 5
    import sim.planning.fleet as fleet

    def run_seeds(spec, cand, n, rate, seeds, traffic_s, stop=False):
        ttft = 0.5 if n >= 3 else 5.0
        return [{"ttft_s": {"p99": ttft}, "tpot_s": {"p99": 0.02}, "e2e_s": {"p99": 5.0}, "goodput": None,
                 "requests": {"rejected": 0}, "steady": {"ratio": 1.0, "verdict": "steady"},
                 "output_token_throughput": 250.0, "request_throughput": 1.0} for _ in seeds]

    monkeypatch.setattr(fleet, "run_seeds", run_seeds)
    p = tmp_path / "p.yaml"
    p.write_text(f"scenario: {ROOT / 'scenarios' / 'quickstart.yaml'}\ntarget_rate: 10\nslo: {{ttft_p99_s: 1.0}}\n"
                 f"search: {{seeds: 2, redundancy: '{redundancy}', min_replicas: {min_replicas}}}\n"
                 "candidates: {gpu: [h100-sxm]}\n")
    spec = load_plan(p)
    extra = 1 if redundancy == "n+1" else 0
    row = {"candidate": "h100-sxm", "replicas": 3 + extra, "fail_rate": 4.0}
    check = fleet.validate_fleet(spec, row, {"gpu": "h100-sxm"})
    assert check["needed"] == 3 and check["replicas"] == serving and check["holds"]
    assert check["holds_one_down"] == (redundancy == "n+1")
    assert check["rate"] == pytest.approx(11.0)  # target + the 10 % margin
