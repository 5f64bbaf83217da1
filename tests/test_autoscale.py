"""Autoscaling: replicas that come and go (sim/engine/autoscale.py, sim/policies/autoscale.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from sim import run
from sim.io.specload import SpecError
from sim.policies.autoscale import FleetMetrics, HPAPolicy, SchedulePolicy

pytestmark = pytest.mark.xdist_group("test_autoscale")

DAY = "scenarios/autoscale_day.yaml"
PERIOD, MEAN, RATIO = 900.0, 12.5, 4.0  # the scenario's diurnal shape


@pytest.fixture(scope="module")
def days():
    """The shipped day with a fast (0 s node start) and a slow (180 s) provisioning delay."""
    return {ns: run(DAY, {"cluster.autoscale.provisioning.node_start_s": ns}) for ns in (0, 180)}


@pytest.fixture(scope="module")
def saturated_rate() -> float:
    """One static replica's throughput under overload (12 req/s offered, ~8.5 served)."""
    out = run(DAY, {"cluster": None, "workload.arrival": {"kind": "poisson", "rate": 12.0},
                    "workload.duration_s": 200})
    return out.summary["request_throughput"]


def _rate(t):
    a = (RATIO - 1) / (RATIO + 1)
    return MEAN * (1 + a * np.cos(2 * np.pi * (t - PERIOD / 2) / PERIOD))


def _window_counts(win: float) -> list[float]:
    """Expected requests per window: trapezoids of the cosine, independent of the code."""
    out = []
    for lo in np.arange(0, PERIOD, win):
        t = np.linspace(lo, lo + win, 2001)
        r = _rate(t)
        out.append(float(np.sum(0.5 * (r[1:] + r[:-1]) * np.diff(t))))
    return out


# ---- the known-answer day ---------------------------------------------------------


def test_autoscaled_day_costs_between_the_lower_bound_and_static_peak(days, saturated_rate):
    out = days[0]
    a = out.summary["autoscale"]
    win = a["windows"][1]["start_s"] - a["windows"][0]["start_s"]
    # lower bound: per window, the fewest replicas whose saturated throughput carries
    # the window's expected requests
    bound_h = sum(math.ceil(c / win / saturated_rate) * win for c in _window_counts(win)) / 3600
    end = out.result.end_time
    static_h = a["peak_ready"] * end / 3600  # the autoscaler's own peak, all day
    assert a["peak_ready"] >= 3  # the peak needs several replicas
    assert bound_h < a["gpu_hours"] < 0.8 * static_h
    assert a["gpu_hours"] == pytest.approx(
        sum(t["gone_s"] - t["start_s"] for t in a["timeline"]) / 3600)


def test_autoscaled_day_loses_no_request_and_reports_attainment_per_window(days):
    for out in days.values():
        req = out.summary["requests"]
        assert req["total"] == req["finished"] + req["rejected"] == len(out.request_table["status"])
        assert req["rejected"] == 0
        windows = out.summary["autoscale"]["windows"]
        assert all(w["slo_attainment"] is not None for w in windows if w["requests"])
        assert sum(w["requests"] for w in windows) == req["total"]


def test_slow_provisioning_costs_attainment_in_the_morning_ramp(days):
    def ramp(out) -> float:  # trough (t=0) to peak (t=450 s)
        ws = [w for w in out.summary["autoscale"]["windows"] if w["start_s"] < PERIOD / 2]
        return sum(w["slo_attainment"] * w["requests"] for w in ws) / sum(w["requests"] for w in ws)
    fast, slow = ramp(days[0]), ramp(days[180])
    assert fast > 0.95
    assert slow < fast - 0.1
    # the loss is the ramp's: its worst window is there and far under the fast fleet's
    # worst, while after the peak (falling load: no replica is waited for) both hold
    wf, ws = (days[k].summary["autoscale"]["windows"] for k in (0, 180))
    worst = min((w for w in ws if w["requests"]), key=lambda w: w["slo_attainment"])
    assert worst["start_s"] < PERIOD / 2 and worst["slo_attainment"] < 0.5
    assert min(w["slo_attainment"] for w in wf if w["requests"]) > 0.95
    for w in (*wf, *ws):
        if w["start_s"] >= PERIOD / 2 and w["requests"]:
            assert w["slo_attainment"] > 0.99
    # and the slow fleet's first added replica is ready exactly 180 s later after its start
    first = {k: next(t for t in days[k].summary["autoscale"]["timeline"] if t["start_s"] > 0)
             for k in (0, 180)}
    load = days[0].summary["autoscale"]["provisioning"]["weights_load_s"]
    assert first[0]["ready_s"] - first[0]["start_s"] == pytest.approx(load)
    assert first[180]["ready_s"] - first[180]["start_s"] == pytest.approx(180 + load)


def test_requests_go_only_to_ready_replicas_and_draining_ones_finish_theirs(days):
    for out in days.values():
        lives = out.summary["autoscale"]["timeline"]
        rep = out.request_table["replica"].codes  # the replica's index
        arr = np.asarray(out.request_table["arrival_s"])
        fin = np.asarray(out.request_table["finish_s"])
        ok = np.zeros(len(arr), dtype=bool)
        for life in lives:
            if life["ready_s"] is None:
                continue  # cancelled while starting: never routed to
            stop = life["draining_s"] if life["draining_s"] is not None else np.inf
            mine = (rep == life["replica"]) & (arr >= life["ready_s"]) & (arr <= stop)
            assert (fin[mine] <= life["gone_s"] + 1e-9).all()  # gone only after its last
            ok |= mine
        assert ok.all()
        assert any(life["draining_s"] is not None for life in lives)  # it did scale down


# ---- a schedule, the delay's arithmetic --------------------------------------------


def test_schedule_brings_replicas_up_after_the_provisioning_delay():
    out = run(DAY, {"cluster.autoscale": {"policy": "schedule", "schedule": [[0, 1], [100, 3]],
                                          "max_replicas": 3, "provisioning": {"node_start_s": 30}},
                    "workload.duration_s": 300})
    a = out.summary["autoscale"]
    delay = 30 + a["provisioning"]["weight_gb_per_gpu"] / 6.8  # local NVMe, 6.8 GB/s
    assert a["provisioning"]["delay_s"] == pytest.approx(delay)
    started = [t for t in a["timeline"] if t["start_s"] > 0]
    assert len(started) == 2
    for t in started:  # the first scrape at or after 100 s (every 15 s: 105 s)
        assert t["start_s"] == pytest.approx(105.0)
        assert t["ready_s"] == pytest.approx(105.0 + delay)
    arr = np.asarray(out.request_table["arrival_s"])
    rep = out.request_table["replica"].strings()
    assert set(rep[arr < 105.0 + delay]) == {out.result.replicas[0].name}
    assert len(set(rep[arr > 105.0 + delay + 1])) == 3
    assert a["ready_over_time"][-1][1] == 3


def test_weights_gib_of_llama3_8b_load_in_about_2_4_s_from_nvme():
    out = run(DAY, {"workload.duration_s": 20})
    p = out.summary["autoscale"]["provisioning"]
    # 8.03e9 parameters x 2 bytes = 16.06 GB; / 6.8 GB/s
    assert p["weight_gb_per_gpu"] == pytest.approx(16.06, rel=0.01)
    assert p["weights_load_s"] == pytest.approx(16.06 / 6.8, rel=0.01)
    assert p["delay_s"] == pytest.approx(60 + p["weights_load_s"])


# ---- the policies, by hand ----------------------------------------------------------


def test_hpa_scales_to_ceil_of_replicas_times_metric_over_target():
    p = HPAPolicy(0.5, 1, 10, tolerance=0.1, stabilization_s=0)
    assert p.plan(0, FleetMetrics(2, 2, 0.9)) == 4  # ceil(2 * 0.9 / 0.5) = ceil(3.6)
    assert p.plan(1, FleetMetrics(2, 2, 0.54)) == 2  # within 10 % of the target: no change
    assert p.plan(2, FleetMetrics(4, 4, 0.1)) == 1  # ceil(0.8)
    assert p.plan(3, FleetMetrics(4, 4, 5.0)) == 10  # clamped to max


def test_hpa_scale_down_waits_out_the_stabilisation_window():
    p = HPAPolicy(0.5, 1, 10, stabilization_s=60)
    assert p.plan(0, FleetMetrics(4, 4, 0.5)) == 4
    assert p.plan(30, FleetMetrics(4, 4, 0.1)) == 4  # 4 was wanted 30 s ago
    assert p.plan(61, FleetMetrics(4, 4, 0.1)) == 1  # the 4 has left the window


def test_hpa_does_not_cancel_starting_replicas_while_scaling_up():
    p = HPAPolicy(0.5, 1, 10, stabilization_s=0)
    assert p.plan(0, FleetMetrics(5, 2, 0.6)) == 5  # wants ceil(2.4) = 3, 5 already asked for


def test_schedule_policy_takes_the_last_entry_at_or_before_now():
    p = SchedulePolicy(((0, 1), (100, 4), (200, 9)), 1, 6)
    assert [p.plan(t, FleetMetrics(1, 1, 0)) for t in (0, 99, 100, 250)] == [1, 1, 4, 6]


# ---- errors ---------------------------------------------------------------------------


@pytest.mark.parametrize(("change", "text"), [
    ({"cluster.autoscale.min_replicas": 9}, "cluster.autoscale.min_replicas: 9 > max_replicas=8"),
    ({"cluster.autoscale": {"policy": "queue"}}, "cluster.autoscale.target: policy 'queue' needs a target"),
    ({"cluster.autoscale.target": 2}, "cluster.autoscale.target: 2"),
    ({"cluster.autoscale": {"policy": "schedule"}}, "cluster.autoscale.schedule: policy 'schedule' needs"),
    ({"cluster.groups": [{"name": "a", "count": 9}]}, "count 9 (replicas ready at the start) is outside"),
    ({"cluster.groups": [{"name": "a"}, {"name": "b"}]}, "cluster.autoscale: autoscaling needs one group"),
    ({"cluster.autoscale.provisioning.source": "floppy"}, "provisioning.source: unknown 'floppy'"),
])
def test_bad_autoscale_spec_is_a_one_line_error(change, text):
    with pytest.raises(SpecError) as e:
        run(DAY, {**change, "workload.duration_s": 5})
    assert text in str(e.value) and "\n" not in str(e.value)


# ---- accounting -----------------------------------------------------------------------


def test_accounting_check_fails_when_a_replica_did_not_end_what_it_was_routed():
    from sim.config.cluster import AutoscaleSpec
    from sim.engine.autoscale import Lifecycle

    lc = Lifecycle(AutoscaleSpec(target=0.5, max_replicas=2), 0.0, 1, 2)
    lc.begin(2)
    lc.routed[:] = [3, 2]
    lc.check_accounted([3, 2], 5)
    with pytest.raises(RuntimeError, match="replica 1 was routed 2 requests and ended 1"):
        lc.check_accounted([3, 1], 5)
    with pytest.raises(RuntimeError, match="5 requests routed, 6 in the run"):
        lc.check_accounted([3, 2], 6)


@pytest.mark.parametrize("seed", [2, 3])
def test_queue_policy_with_stale_reports_and_bursts_accounts_for_every_request(seed):
    out = run(DAY, {"seed": seed, "cluster.router": {"policy": "least_kv", "staleness_s": 0.5},
                    "cluster.autoscale": {"policy": "queue", "target": 3, "max_replicas": 4,
                                          "scrape_s": 5, "stabilization_s": 10,
                                          "provisioning": {"node_start_s": 5}},
                    "workload.arrival.cv": 3.0, "workload.duration_s": 240,
                    "workload.arrival.period_s": 240})
    req, a = out.summary["requests"], out.summary["autoscale"]
    assert req["finished"] + req["rejected"] == req["total"] > 0
    assert len(a["timeline"]) > 2 and any(t["draining_s"] is not None for t in a["timeline"])


def test_a_run_that_ends_while_a_replica_starts_closes_it_at_the_runs_end():
    out = run(DAY, {"workload.duration_s": 120})  # the ramp has a replica starting at the end
    lives = out.summary["autoscale"]["timeline"]
    end = out.result.end_time
    assert any(t["ready_s"] is None for t in lives)
    assert all(t["gone_s"] == pytest.approx(end) for t in lives if t["draining_s"] is None)


def test_an_autoscaled_fleet_pays_and_draws_power_only_while_its_replicas_are_up(days):
    # the pool holds max_replicas replicas; those never started cost nothing, and the
    # energy figures count each replica from its start to its leaving, as GPU-hours do
    s = days[0].summary
    a, e, c = s["autoscale"], s["energy"], s["cost"]
    assert c["gpu_hours"] == pytest.approx(a["gpu_hours"], rel=1e-9)
    assert c["gpu_hours"] < a["max_replicas"] * s["duration_s"] / 3600  # not the whole pool all day
    idle_w, board_w = 53.0, 350.0  # the L40S power block (gpu_profiles/l40s/profile.yaml)
    hours = a["gpu_hours"]
    assert idle_w * hours * 3600 <= e["energy_j"] <= board_w * hours * 3600
