"""A fleet behind a feedback-free router simulated replica by replica in several processes
writes the same bytes as the single-process run; every other run stays single-process and
says why."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

import sim.engine.recorder as recorder
import sim.engine.runner as runner
from sim.config.scenario import load_scenario
from sim.engine.parallel import FEEDBACK_FREE, assign, parts, refusal
from sim.policies.router import ROUTERS
from tests.test_spill import _files  # the outputs compared, wall times left out

ROOT = Path(__file__).resolve().parents[1]
FLEET = ROOT / "scenarios/fleet_routers.yaml"
SHORT = {"workload.duration_s": 120.0}  # the first 2 minutes of the 15: ~1,200 requests


@pytest.mark.parametrize(("scenario", "router", "workers"), [
    ("fleet_routers", "round_robin", 2), ("fleet_routers", "random", 3),
    ("hetero_fleet", "round_robin", 2),  # two GPU groups: two step-time memos merged
])
def test_a_parallel_fleet_writes_the_single_process_bytes(scenario, router, workers, tmp_path):
    sets = {**SHORT, "cluster.router.policy": router}
    path = ROOT / f"scenarios/{scenario}.yaml"
    single = runner.run(path, sets, split=False)
    split = runner.run(path, sets, workers=workers)
    assert f"simulated apart, on {workers} processes" in split.engine
    assert _files(split, tmp_path / "split") == _files(single, tmp_path / "single")


def test_a_parallel_fleet_that_spills_its_logs_writes_the_same_bytes(tmp_path, monkeypatch):
    sets = {**SHORT, "cluster.router.policy": "round_robin"}
    single = _files(runner.run(FLEET, sets, split=False), tmp_path / "single")
    monkeypatch.setattr(recorder, "MEMORY_ROWS", 64)
    monkeypatch.setattr(recorder, "MIN_REPLICA_ROWS", 50)
    split = runner.run(FLEET, sets, workers=2)
    assert all(r.steps.spilled for r in split.result.replicas)
    assert _files(split, tmp_path / "split") == single


def test_routes_decided_up_front_are_the_round_robin_cycle():
    sc = load_scenario(FLEET, {**SHORT, "cluster.router.policy": "round_robin"})
    configs, wl, _ = runner.prepare(sc)
    choice = assign(sc, wl, len(configs))
    assert choice.tolist() == [i % 4 for i in range(len(wl))]  # 0, 1, 2, 3, 0, ...
    assert parts(4, 3) == [[0, 3], [1], [2]]


@pytest.mark.parametrize(("scenario", "sets", "why"), [
    ("fleet_routers", {}, "router least_outstanding chooses by the replicas' load"),
    ("fleet_routers", {"cluster.router.policy": "least_kv"}, "router least_kv"),
    ("fleet_routers", {"cluster.router.policy": "affinity"}, "router affinity"),
    ("fleet_routers", {"cluster.router.policy": "power_of_two"}, "router power_of_two"),
    ("disaggregated", {}, "disaggregated"),
    ("closed_loop", {}, None),  # one replica, or a closed loop: either way refused
    ("autoscale_day", {}, "autoscaling"),
    ("quickstart", {}, "one replica"),
])
def test_runs_that_need_feedback_stay_single_process(scenario, sets, why):
    sc = load_scenario(ROOT / f"scenarios/{scenario}.yaml", sets)
    configs, wl, _ = runner.prepare(sc)
    reason = refusal(sc, configs, wl)
    assert reason is not None
    if why is not None:
        assert why in reason


def test_every_router_is_classified():
    assert set(FEEDBACK_FREE) == set(ROUTERS)


def test_a_refused_run_says_so_once_and_runs_single_process(caplog, tmp_path):
    with caplog.at_level(logging.WARNING, logger="llmsim"):
        out = runner.run(FLEET, SHORT, workers=2)
    lines = [r.getMessage() for r in caplog.records if "single process" in r.getMessage()]
    assert len(lines) == 1 and "least_outstanding" in lines[0]
    assert out.engine.startswith("single process (router least_outstanding")


@pytest.mark.slow
def test_a_parallel_fleet_on_ray_writes_the_same_bytes(tmp_path):
    pytest.importorskip("ray")
    sets = {**SHORT, "cluster.router.policy": "round_robin"}
    single = _files(runner.run(FLEET, sets, split=False), tmp_path / "single")
    split = runner.run(FLEET, sets, workers=2, executor="ray")
    assert _files(split, tmp_path / "split") == single
