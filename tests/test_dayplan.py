"""A plan over a day: the per-window lower bound, static peak, the bound's schedule, the
SLO-attainment autoscaler, `llmsim plan` with a `day:` section and its report and trace
(sim/planning/daybound.py, dayplan.py, sim/policies/autoscale.py SLOPolicy,
sim/engine/autoscale.py Attainment, sim/report/day_page.py, sim/report/perfetto.py)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from sim import run
from sim.io.specload import SpecError
from sim.planning.daybound import bound_schedule, lower_bound, static_peak, window_rates
from sim.policies.autoscale import FleetMetrics, SLOPolicy
from sim.workload.profile import RateProfile, diurnal

pytestmark = pytest.mark.xdist_group("test_dayplan")

ROOT = Path(__file__).resolve().parents[1]
DAY = ROOT / "scenarios" / "autoscale_day.yaml"


def _knots(*pairs) -> RateProfile:
    t, r = zip(*pairs, strict=True)
    return RateProfile(np.array(t, dtype=float), np.array(r, dtype=float))


# ---- the bound, by hand ---------------------------------------------------------------


def test_bound_is_ceil_of_window_mean_rate_over_sustained_rate():
    # 2 -> 10 req/s over 100 s, 10 for 100 s, 10 -> 2 over 100 s: window means 6, 10, 6
    prof = _knots((0, 2), (100, 10), (200, 10), (300, 2))
    rates = window_rates(prof, 300, 100)
    assert [w["rate"] for w in rates] == pytest.approx([6, 10, 6])
    assert [w["peak_rate"] for w in rates] == pytest.approx([10, 10, 10])
    b = lower_bound(rates, 4.0, gpus_per_replica=2, usd_per_replica_hour=5.0)
    assert [w["replicas"] for w in b["windows"]] == [2, 3, 2]  # ceil(1.5), ceil(2.5), ceil(1.5)
    assert b["replica_hours"] == pytest.approx(700 / 3600)  # (2 + 3 + 2) x 100 s
    assert b["gpu_hours"] == pytest.approx(1400 / 3600)
    assert b["usd"] == pytest.approx(5.0 * 700 / 3600)
    s = static_peak(prof, rates, 300, 4.0, 2, 5.0)
    assert s["replicas"] == 3  # ceil(10 / 4)
    assert s["gpu_hours"] == pytest.approx(3 * 2 * 300 / 3600)
    assert b["usd"] < s["usd"]


def test_bound_of_a_diurnal_day_matches_trapezoids_of_the_cosine():
    mean, ratio, period, win, r = 12.5, 4.0, 900.0, 60.0, 5.0
    a = (ratio - 1) / (ratio + 1)
    rates = window_rates(diurnal(mean, ratio, period, None), period, win)
    for w in rates:  # the cosine integrated by trapezoids, independent of profile.integral
        t = np.linspace(w["start_s"], w["end_s"], 4001)
        x = mean * (1 + a * np.cos(2 * np.pi * (t - period / 2) / period))
        expect = float(np.sum(0.5 * (x[1:] + x[:-1]) * np.diff(t))) / win
        assert w["rate"] == pytest.approx(expect, rel=1e-6)
    b = lower_bound(rates, r, 1, 1.0)
    assert [w["replicas"] for w in b["windows"]] == [math.ceil(w["rate"] / r) for w in rates]
    assert static_peak(diurnal(mean, ratio, period, None), rates, period, r, 1, 1.0)["replicas"] == 4  # 20 / 5


def test_bound_schedule_asks_a_lead_early_and_lets_go_when_the_window_ends():
    up = window_rates(_knots((0, 2), (100, 6), (200, 10), (300, 2)), 300, 100)
    # window peaks 6, 10, 10 -> needs 2, 3, 3 at 4 req/s; asked 30 s before window 1 starts
    assert bound_schedule(up, 4.0, 1.0, 30.0) == [[0.0, 2], [70.0, 3]]
    down = window_rates(_knots((0, 10), (100, 10), (200, 2), (300, 2)), 300, 100)
    # needs 3, 3, 1: held through window 1, down when it ends (not 30 s early)
    assert bound_schedule(down, 4.0, 1.0, 30.0) == [[0.0, 3], [200.0, 1]]
    assert bound_schedule(down, 4.0, 2.0, 30.0) == [[0.0, 5], [200.0, 1]]  # ceil(20/4), ceil(4/4)


# ---- the SLO-attainment policy, by hand -----------------------------------------------


def test_slo_policy_scales_up_under_the_target_and_waits_for_starting_replicas():
    p = SLOPolicy(0.99, 1, 10, step=0.25, stabilization_s=0)
    assert p.plan(0, FleetMetrics(4, 4, 0.3, 0.95)) == 5  # 4 + ceil(0.25 x 4)
    assert p.plan(1, FleetMetrics(5, 4, 0.3, 0.90)) == 5  # one starting: wait for it
    assert p.plan(2, FleetMetrics(9, 9, 0.9, 0.5)) == 10  # 9 + 3, clamped to max
    assert p.plan(3, FleetMetrics(4, 4, 0.3, None)) == 4  # nothing ended yet: no change
    assert p.plan(4, FleetMetrics(4, 4, 0.3, 0.993)) == 4  # between target and high (0.995)


def test_slo_policy_scales_down_only_when_the_rest_carry_the_load():
    p = SLOPolicy(0.99, 1, 10, down_utilization=0.5, stabilization_s=0)
    assert p.plan(0, FleetMetrics(4, 4, 0.3, 1.0)) == 3  # 0.3 x 4 / 3 = 0.4 <= 0.5
    assert p.plan(1, FleetMetrics(4, 4, 0.45, 1.0)) == 4  # 0.45 x 4 / 3 = 0.6 > 0.5
    assert p.plan(2, FleetMetrics(1, 1, 0.0, 1.0)) == 1  # never below one


def test_slo_policy_scale_down_waits_out_the_stabilisation_window():
    p = SLOPolicy(0.99, 1, 10, stabilization_s=60)
    assert p.plan(0, FleetMetrics(4, 4, 0.3, 0.99)) == 4
    assert p.plan(30, FleetMetrics(4, 4, 0.3, 1.0)) == 4  # 4 was wanted 30 s ago
    assert p.plan(61, FleetMetrics(4, 4, 0.3, 1.0)) == 3


def test_windowed_attainment_counts_ended_requests_and_ones_already_late():
    from sim.engine.autoscale import Attainment
    from sim.policies.batch import FINISHED, Seq

    a, b, c, d, e = (Seq(i, t, 16, 10, 10) for i, t in enumerate((0.0, 1.0, 2.0, 20.0, 95.0)))
    a.state, a.first_token_t, a.finish_t = FINISHED, 0.5, 0.5 + 9 * 0.05  # meets both
    b.state, b.first_token_t, b.finish_t = FINISHED, 2.5, 3.0  # TTFT 1.5 > 1
    att = Attainment([a, b, c, d, e], 1.0, 0.1, 60.0)
    assert att.at(10.0) == pytest.approx(1 / 3)  # a met; b missed; c waiting 8 s > 1 s: missed
    c.state, c.first_token_t, c.finish_t = FINISHED, 2.2, 2.2 + 9 * 0.2  # TPOT 0.2 > 0.1
    assert att.at(30.0) == pytest.approx(1 / 4)  # c ended missed; d (arrived 20) is late too
    assert att.at(90.0) == pytest.approx(0.0)  # a, b, c ended before 30: out; d still late
    d.state, d.first_token_t, d.finish_t = FINISHED, 89.5, 90.0  # TTFT 69.5 s
    e.state, e.first_token_t, e.finish_t = FINISHED, 95.1, 95.1 + 9 * 0.05  # meets both
    assert att.at(100.0) == pytest.approx(1 / 2)  # d missed, e met


# ---- the SLO policy in the engine -----------------------------------------------------


def test_slo_policy_day_accounts_for_every_request_and_moves_the_fleet():
    out = run(DAY, {"cluster.autoscale": {"policy": "slo", "target": 0.99, "max_replicas": 8,
                                          "scrape_s": 15, "stabilization_s": 60, "window_s": 60}})
    req, a = out.summary["requests"], out.summary["autoscale"]
    assert req["finished"] + req["rejected"] == req["total"] == len(out.request_table["status"])
    assert a["peak_ready"] >= 2 and any(t["draining_s"] is not None for t in a["timeline"])


def test_slo_policy_without_an_slo_is_a_one_line_error():
    with pytest.raises(SpecError) as e:
        run(DAY, {"slo.ttft_s": None, "slo.tpot_s": None, "cluster.autoscale": {"policy": "slo", "target": 0.99, "max_replicas": 4},
                  "workload.duration_s": 5})
    assert "cluster.autoscale.policy: 'slo' needs the scenario's slo" in str(e.value)


def test_window_power_sums_to_the_runs_energy():
    out = run(DAY, {"workload.duration_s": 300, "workload.arrival.period_s": 300})
    a, e = out.summary["autoscale"], out.summary["energy"]
    end = out.result.end_time
    widths = [min(w["start_s"] + 60, end) - w["start_s"] for w in a["windows"]]
    assert sum(w["power_w"] * dt for w, dt in zip(a["windows"], widths, strict=True)) == \
        pytest.approx(e["energy_j"], rel=1e-9)


# ---- the plan over a day --------------------------------------------------------------


def _day_plan(tmp_path: Path, name: str = "day") -> Path:
    f = tmp_path / "day.yaml"
    f.write_text(
        f"name: {json.dumps(name)}\n"
        f"scenario: {DAY}\n"
        "slo: {ttft_p99_s: 1.0, tpot_p99_s: 0.05}\n"
        "search: {seeds: 1}\n"
        "router: {policy: least_outstanding}\n"
        "day:\n  attainment: 0.99\n  window_s: 60\n  seeds: 1\n  screen: false\n"  # every day whole
        "  policies: {utilization: [0.5], slo: [0.99], schedule: [1.0]}\n")
    return f


@pytest.fixture(scope="module")
def day_plan(tmp_path_factory):
    from sim.planning.dayplan import run_day_plan
    from sim.planning.planspec import load_plan

    tmp = tmp_path_factory.mktemp("dayplan")
    return run_day_plan(load_plan(_day_plan(tmp, "<b>day</b>")), workers=1), tmp


def test_day_plan_bound_is_the_hand_computed_ceiling_per_window(day_plan):
    plan, _ = day_plan
    c = plan["candidates"][0]
    r = c["capacity"]["sustained_rate"]
    a = (4 - 1) / (4 + 1)
    hand = []
    for lo in np.arange(0, 900, 60):
        t = np.linspace(lo, lo + 60, 2001)
        x = 12.5 * (1 + a * np.cos(2 * np.pi * (t - 450) / 900))
        hand.append(math.ceil(float(np.sum(0.5 * (x[1:] + x[:-1]) * np.diff(t))) / 60 / r - 1e-9))
    assert [w["replicas"] for w in c["bound"]["windows"]] == hand
    assert c["bound"]["replica_hours"] == pytest.approx(sum(hand) * 60 / 3600)
    assert c["static"]["replicas"] == math.ceil(20.0 / r - 1e-9)  # the cosine's peak is 20 req/s


def test_day_plan_recommends_a_fleet_between_the_bound_and_static_peak(day_plan):
    plan, _ = day_plan
    c = plan["candidates"][0]
    rec = plan["recommended"]
    assert rec is not None and rec["slo_attainment"] >= 0.99 and rec["rejected"] == 0
    assert c["bound"]["usd"] < rec["usd"] <= c["static"]["usd"] * (1 + 1e-9)
    static = next(f for f in plan["fleets"] if f["fleet"] == "static peak")
    # static peak simulated: its replicas all day, as the analytic figure says
    assert static["replica_hours"] == pytest.approx(c["static"]["replica_hours"], rel=0.01)
    assert rec["usd"] == min(f["usd"] for f in plan["fleets"] if f["meets"])
    for f in plan["fleets"]:  # every fleet reports attainment per window, every request counted
        assert sum(w["requests"] for w in f["windows"]) == f["requests"]
        assert all(w["slo_attainment"] is not None for w in f["windows"] if w["requests"])
    assert {f["fleet"] for f in plan["fleets"]} == {"static peak", "utilization 0.5", "slo 0.99",
                                                    "bound schedule x1"}


def test_day_plan_report_escapes_every_value_and_plots_the_day(day_plan):
    from sim.planning.dayplan import write_day_plan
    from sim.report.pages import build_report, write_report

    plan, tmp = day_plan
    out = write_day_plan(plan, tmp / "out")
    assert {"plan.json", "fleets.csv", "bound.csv"} <= {p.name for p in out.iterdir()}
    page = write_report(build_report(out), out).read_text()
    assert "<b>day</b>" not in page and "&lt;b&gt;day&lt;/b&gt;" in page
    assert "data:image/png;base64," in page and "lower bound" in page


def test_day_plan_needs_a_time_varying_scenario(tmp_path):
    from sim.planning.dayplan import run_day_plan
    from sim.planning.planspec import load_plan

    f = _day_plan(tmp_path)
    f.write_text(f.read_text().replace(str(DAY), str(ROOT / "scenarios" / "quickstart.yaml")))
    with pytest.raises(SpecError, match="day: needs a scenario whose workload.arrival is time-varying"):
        run_day_plan(load_plan(f), workers=1)


@pytest.mark.parametrize(("text", "error"), [
    ("target_rate: 3\n", "target_rate: not used by a day plan"),
    ("day:\n  policies: {hpa: [1]}\n", "day.policies.hpa: unknown policy"),
    ("day:\n  policies: {slo: [2]}\n", "day.policies.slo: 2 is out of range"),
])
def test_bad_day_plan_is_a_one_line_error(tmp_path, text, error):
    from sim.planning.planspec import load_plan

    f = tmp_path / "p.yaml"
    body = f"scenario: {DAY}\nslo: {{ttft_p99_s: 1.0}}\n"
    f.write_text(body + text + ("day: {}\n" if "day:" not in text else ""))
    with pytest.raises(SpecError) as e:
        load_plan(f)
    assert error in str(e.value) and "\n" not in str(e.value)


# ---- the trace ------------------------------------------------------------------------


def test_perfetto_trace_shows_replicas_starting_serving_and_draining(tmp_path):
    from sim.report.perfetto import replica_parts, write_trace

    out = run(DAY, {"workload.duration_s": 300, "workload.arrival.period_s": 300})
    names = [r.name for r in out.result.replicas]
    timeline = out.summary["autoscale"]["timeline"]
    path = write_trace(tmp_path / "t.json", replica_parts(out.steps, out.requests, names),
                       [r.events for r in out.result.replicas], names, timeline)
    ev = [e for e in json.loads(path.read_text())["traceEvents"] if e.get("cat") == "lifecycle"]
    drained = [t for t in timeline if t["draining_s"] is not None]
    assert drained
    for t in timeline:
        mine = {e["name"]: e for e in ev if e["pid"] == t["replica"] + 1 and
                e["ts"] >= t["start_s"] * 1e6 - 1 and e["ts"] + e["dur"] <= t["gone_s"] * 1e6 + 1}
        if t["ready_s"] is None:
            assert "starting (cancelled)" in mine
            continue
        assert mine["serving"]["ts"] == pytest.approx(t["ready_s"] * 1e6)
        if t["start_s"] < t["ready_s"]:
            assert mine["starting"]["dur"] == pytest.approx((t["ready_s"] - t["start_s"]) * 1e6)
        if t["draining_s"] is not None:
            assert mine["draining"]["ts"] + mine["draining"]["dur"] == pytest.approx(t["gone_s"] * 1e6)


# ---- the command line -----------------------------------------------------------------


def test_llmsim_plan_with_a_day_section_prints_the_bound_and_the_pick(tmp_path, llmsim):
    f = tmp_path / "day.yaml"
    f.write_text(
        f"name: cli_day\nscenario: {DAY}\n"
        "slo: {ttft_p99_s: 1.0, tpot_p99_s: 0.05}\nsearch: {seeds: 1}\n"
        "candidates: {workload.duration_s: [120], workload.arrival.period_s: [120]}\n"
        "day: {window_s: 30, policies: {schedule: [1.0]}}\n")
    p = llmsim("plan", str(f), "--out", str(tmp_path / "out"), "--workers", "1")
    assert p.returncode == 0, p.stderr
    assert "lower bound" in p.stdout and "static peak" in p.stdout
    assert "recommended:" in p.stdout and "bound schedule x1" in p.stdout
    assert {"plan.json", "fleets.csv", "bound.csv"} <= {q.name for q in (tmp_path / "out").iterdir()}


def test_llmsim_plan_with_a_day_on_a_constant_rate_is_refused(tmp_path, refused):
    f = _day_plan(tmp_path)
    f.write_text(f.read_text().replace(str(DAY), str(ROOT / "scenarios" / "quickstart.yaml")))
    refused(["plan", str(f), "--out", str(tmp_path / "out")], tmp_path, "day: needs a scenario")
