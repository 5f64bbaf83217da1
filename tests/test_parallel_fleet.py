"""A fleet behind a feedback-free router simulated replica by replica in several processes
writes the same bytes as the single-process run; every other run stays single-process and
says why."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest

import sim.engine.parallel as parallel
import sim.engine.recorder as recorder
import sim.engine.runner as runner
import sim.engine.splitrule as splitrule
from sim.config.scenario import load_scenario
from sim.engine.parallel import (
    AUTO_MIN_REQUESTS,
    FEEDBACK_FREE,
    assign,
    auto_workers,
    parts,
    refusal,
)
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


def _no_prepare(sc):
    raise AssertionError("a forked worker resolved the scenario again")


def test_forked_workers_inherit_the_run_and_its_warm_memos(tmp_path, monkeypatch):
    """Workers forked from the run inherit its configs (step-time memos warmed from the
    step cache) and workload, resolving nothing again; the bytes and the lookup
    provenance (memo uses counted in the workers, merged here) are the single run's."""
    sets = {**SHORT, "cluster.router.policy": "round_robin"}
    cache = tmp_path / "cache"
    single = _files(runner.run(FLEET, sets, split=False, step_cache=cache), tmp_path / "single")
    assert any(cache.iterdir())  # the memos the forked workers will inherit, warm
    monkeypatch.setattr(parallel, "prepare", _no_prepare)  # (inherited by the forks)
    split = runner.run(FLEET, sets, workers=3, step_cache=cache)
    assert len(split.worker_usage) == 2  # this process simulated the first group itself
    assert all(u.cpu_s > 0 and u.peak_rss_gib > 0 for u in split.worker_usage)
    assert _files(split, tmp_path / "split") == single


def test_spawned_workers_resolve_the_run_again_with_the_same_bytes(tmp_path, monkeypatch):
    sets = {**SHORT, "cluster.router.policy": "random"}
    single = _files(runner.run(FLEET, sets, split=False), tmp_path / "single")
    monkeypatch.setattr(parallel, "START_METHOD", "spawn")
    split = runner.run(FLEET, sets, workers=2)
    assert len(split.worker_usage) == 2
    assert _files(split, tmp_path / "split") == single


def test_auto_workers_use_the_cores_only_for_a_run_large_enough():
    big = 16 * AUTO_MIN_REQUESTS
    assert auto_workers(16, big, cores_=2) == 2
    assert auto_workers(3, big, cores_=8) == 3  # no more than replicas
    assert auto_workers(16, 3 * AUTO_MIN_REQUESTS, cores_=8) == 3  # each with enough requests
    assert auto_workers(16, 2 * AUTO_MIN_REQUESTS - 1, cores_=8) == 1
    assert auto_workers(16, big, cores_=1) == 1


def test_auto_workers_follow_the_run(caplog, monkeypatch):
    monkeypatch.setattr(splitrule, "AUTO_MIN_REQUESTS", 100)
    monkeypatch.setattr(parallel, "cores", lambda: 2)
    with caplog.at_level(logging.WARNING, logger="llmsim"):
        split = runner.run(FLEET, {**SHORT, "cluster.router.policy": "round_robin"}, workers="auto")
        refused = runner.run(FLEET, SHORT, workers="auto")  # least_outstanding: feedback
    assert "on 2 processes" in split.engine
    assert refused.engine == "single process" and not caplog.records  # silently


def test_a_parallel_fleet_that_spills_its_logs_writes_the_same_bytes(tmp_path, monkeypatch):
    sets = {**SHORT, "cluster.router.policy": "round_robin"}
    single = _files(runner.run(FLEET, sets, split=False), tmp_path / "single")
    monkeypatch.setattr(recorder, "MEMORY_ROWS", 64)
    monkeypatch.setattr(recorder, "MIN_REPLICA_ROWS", 50)
    split = runner.run(FLEET, sets, workers=2)
    assert all(r.steps.spilled for r in split.result.replicas)
    assert _files(split, tmp_path / "split") == single
    # the workers counted the gaps' first level of bins: the parent read them once
    weights = np.asarray(split.result.itl_weights)
    assert split.result.itl_first.total == int(weights.sum()) and len(weights) > 0


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


@pytest.mark.parametrize("policy", ["round_robin", "random"])
def test_routes_decided_all_at_once_are_the_routers_one_by_one_choices(policy):
    """A key-blind feedback-free router's choices for a whole workload at once (`choices`)
    are the ones its `choose` makes request by request, and leave it where those leave it."""
    import numpy as np

    from sim.policies.router import RouterSpec, make_router

    for n, replicas in [(0, 3), (1, 1), (7, 3), (1000, 4), (5000, 128)]:
        one, many = (make_router(RouterSpec(policy), np.random.default_rng([5, 2]))
                     for _ in range(2))
        each = [one.choose(None, [None] * replicas) for _ in range(n)]
        at_once = many.choices(n, replicas)
        assert at_once.dtype == np.int64 and at_once.tolist() == each
        assert one.choose(None, [None] * replicas) == many.choose(None, [None] * replicas)
        if policy == "round_robin":  # from where it stands, not from 0
            assert many.choices(5, replicas).tolist() == [
                one.choose(None, [None] * replicas) for _ in range(5)]
