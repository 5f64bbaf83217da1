"""A fleet behind a feedback-free router simulated replica by replica (each replica alone
with its own requests, sim/engine/split.py) writes the same bytes as the whole fleet in
one engine: on every shipped fleet scenario with round robin and random, on
hypothesis-drawn fleets, and on a fleet built so that an arrival ties with a step's end
(where the short way alone would differ, and the tie check replays)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import simpy
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import sim.engine.reqsummary as reqsummary
import sim.engine.runner as runner
import sim.engine.split as split
import sim.io.spill as spill
from sim.config.scenario import load_scenario, scenario_from_dict
from sim.engine.build import build_fleet
from sim.engine.metrics import request_table
from sim.engine.parallel import assign, merge, refusal
from sim.engine.prepare import prepare
from sim.engine.processes import simulate
from sim.io.specload import SpecError
from sim.io.spill import SpillDir
from sim.io.tablefile import Labels
from tests.test_random_scenarios import scenarios
from tests.test_spill import _files  # the outputs compared, wall times left out

ROOT = Path(__file__).resolve().parents[1]
SHORT = {"workload.duration_s": 60.0}


def _fleets() -> list[str]:
    """Shipped scenarios with a fleet that only its router keeps from being split."""
    out = []
    for path in sorted((ROOT / "scenarios").glob("*.yaml")):
        try:
            sc = load_scenario(path, {"cluster.router.policy": "round_robin"})
        except SpecError:  # a length router's pools have no round robin
            continue
        if sc.cluster is None or sc.cluster is None or sc.cluster.autoscale is not None:
            continue
        configs, wl, _ = prepare(sc)
        if refusal(sc, configs, wl) is None:
            out.append(path.stem)
    return out


def test_the_shipped_fleets_that_can_split_are_the_known_ones():
    assert _fleets() == ["colocated", "fleet_routers", "hetero_fleet", "llama2_70b_2x_tp2"]


@pytest.mark.parametrize("router", ["round_robin", "random"])
@pytest.mark.parametrize("scenario", ["colocated", "fleet_routers", "hetero_fleet",
                                      "llama2_70b_2x_tp2"])
def test_a_shipped_fleet_split_by_replica_writes_the_whole_fleets_bytes(scenario, router,
                                                                         tmp_path):
    path = ROOT / f"scenarios/{scenario}.yaml"
    sets = {**SHORT, "cluster.router.policy": router}
    whole = runner.run(path, sets, split=False)
    apart = runner.run(path, sets)
    assert whole.engine == "single process"
    assert apart.engine.startswith(f"{len(apart.result.replicas)} replicas simulated apart, "
                                   "one after another")
    assert _files(apart, tmp_path / "apart") == _files(whole, tmp_path / "whole")


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(scenarios(), st.sampled_from(["round_robin", "random"]), st.integers(2, 4),
       st.sampled_from([None, "vllm"]))
def test_a_drawn_fleet_split_by_replica_has_the_whole_fleets_results(data, router, count,
                                                                      runtime):
    data = {**data, "speculative": {"method": "none"},
            "cluster": {"router": {"policy": router}, "groups": [{"name": "g", "count": count}]}}
    if runtime:  # a runtime with a per-request latency: arrivals enter the queue later
        data["runtime"] = runtime
    sc = scenario_from_dict(data)
    whole = runner.run(sc, split=False)
    apart = runner.run(sc)
    assert "simulated apart" in apart.engine
    _same_tables(request_table(whole.result), request_table(apart.result))
    assert [r.steps.rows() for r in whole.result.replicas] == \
        [r.steps.rows() for r in apart.result.replicas]
    for x, y in zip(whole.result.replicas, apart.result.replicas, strict=True):
        assert np.array_equal(np.asarray(x.steps.column("t_end")),
                              np.asarray(y.steps.column("t_end")))
    for k in ("ttft_s", "tpot_s", "itl_s", "e2e_s", "duration_s", "iterations", "kv"):
        assert whole.summary[k] == apart.summary[k], k


def _same_tables(a: dict, b: dict) -> None:
    assert list(a) == list(b)
    for k in a:
        x, y = (np.asarray(c.strings() if isinstance(c, Labels) else c) for c in (a[k], b[k]))
        assert x.dtype == y.dtype, k
        assert np.array_equal(x, y, equal_nan=x.dtype.kind == "f"), k


def _clock_of_a_simpy_run(arrival: list[float]) -> list[float]:
    """env.now at each dispatch of sim/engine/processes.arrivals' loop, run in SimPy."""
    env = simpy.Environment()
    seen = []

    def arrivals():
        t = 0.0
        for a in arrival:
            if a > t:
                yield env.timeout(a - t)
                t = a
            seen.append(env.now)
    env.process(arrivals())
    env.run()
    return seen


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.floats(0, 1e6), st.sampled_from([0.0, 0.1, 0.3, 1e-300, 7.0])),
                max_size=40))
def test_each_arrivals_clock_is_the_one_simpy_reaches(arrival):
    arrival = sorted(arrival)
    clock, _ = split.instants(np.asarray(arrival))
    assert clock.tolist() == _clock_of_a_simpy_run(arrival)


def test_a_clock_of_summed_gaps_is_not_the_arrival_time():
    # why `instants` exists: arriving at 0.2 then 0.9, SimPy's clock adds the gap 0.7
    # to 0.2 and reaches 0.8999999999999999; alone (one gap, 0.9) it would reach 0.9
    assert _clock_of_a_simpy_run([0.2, 0.9]) == [0.2, 0.8999999999999999]
    assert split.instants(np.array([0.2, 0.9]))[0].tolist() == [0.2, 0.8999999999999999]


def _tied_fleet():
    """Two replicas behind round robin, three requests: 0 at t=0 and 2 on replica 0, 1 on
    replica 1. Request 2 arrives exactly when replica 0's third step ends, and request 1
    arrives during that step: in the whole fleet the step's end fires first (scheduled at
    the step's start, before request 1's arrival scheduled request 2's), alone the
    arrival would (scheduled at request 0's arrival)."""
    sc = scenario_from_dict({
        "name": "tie", "seed": 3, "model": "llama-3-8b", "gpu": "h200-sxm",
        "runtime": "cuda-graph",
        "cluster": {"router": {"policy": "round_robin"}, "groups": [{"name": "g", "count": 2}]},
        "workload": {"num_requests": 3, "arrival": {"kind": "constant", "rate": 0.001},
                     "prompt": {"kind": "uniform", "low": 200, "high": 200},
                     "output": {"kind": "uniform", "low": 30, "high": 30}}})
    configs, wl, rng = prepare(sc)
    fleet = build_fleet(sc, configs, rng)
    t_end = np.asarray(simulate(wl, fleet.replicas, fleet.router).replicas[0].steps.t_end)
    x, tie = (t_end[1] + t_end[2]) / 2, float(t_end[2])
    wl = dataclasses.replace(wl, arrival_s=np.array([0.0, x, tie]))
    assert split.instants(wl.arrival_s)[0][2] == tie  # the clock reaches the very float
    return sc, configs, wl


def _split(sc, configs, wl, monkeypatch=None):
    choice = assign(sc, wl, len(configs))
    setup = split.Setup(configs, wl, choice, min(c.max_model_len for c in configs))
    spill = SpillDir()
    out = split.simulate_replicas(setup, [0, 1], str(spill.path))
    return merge([out], len(wl), choice, None, spill), out["every"]


def test_an_arrival_tied_with_a_steps_end_is_replayed_and_keeps_the_fleets_order(monkeypatch):
    sc, _, wl = _tied_fleet()
    configs, _, rng = prepare(sc)  # fresh step-time memos: their use counts compared below
    fleet = build_fleet(sc, configs, rng)
    whole = request_table(simulate(wl, fleet.replicas, fleet.router))
    configs_apart = prepare(sc).configs
    apart, every = _split(sc, configs_apart, wl)
    assert every == [True, False]  # replica 0 had the tie, and was replayed
    _same_tables(whole, request_table(apart))
    # the discarded first run's lookups are not counted
    assert configs_apart[0].latency.provenance_seconds() == \
        configs[0].latency.provenance_seconds()
    # without the check, alone, request 2 joins the batch one step earlier
    monkeypatch.setattr(split, "ties", lambda *a: False)
    short, every = _split(sc, configs, wl)
    assert every == [False, False]
    assert request_table(short)["first_token_s"][2] < whole["first_token_s"][2]


def test_a_replayed_replica_writes_the_same_bytes(tmp_path, monkeypatch):
    path = ROOT / "scenarios/fleet_routers.yaml"
    sets = {**SHORT, "cluster.router.policy": "random"}
    whole = _files(runner.run(path, sets, split=False), tmp_path / "whole")
    monkeypatch.setattr(split, "ties", lambda *a: True)  # every replica simulated twice
    apart = runner.run(path, sets)
    assert "4 replayed every arrival instant" in apart.engine
    assert _files(apart, tmp_path / "apart") == whole


def test_a_split_run_keeps_its_requests_on_disk_not_as_objects():
    out = runner.run(ROOT / "scenarios/fleet_routers.yaml",
                     {**SHORT, "cluster.router.policy": "round_robin"})
    rec = out.result.records
    assert rec is not None and len(rec) == out.summary["requests"]["total"]
    assert [p.name for p in rec.spill.path.glob("q0*")] == ["q0"]  # one file a replica
    # read back, the records are the requests: ids in order, each on its round-robin replica
    ids = rec.column("rid")
    assert ids.tolist() == list(range(len(rec)))
    assert (rec.column("replica") == ids % 4).all()


def test_the_summary_percentiles_of_a_split_run_are_numpys_on_its_requests(tmp_path):
    out = runner.run(ROOT / "scenarios/fleet_routers.yaml",
                     {**SHORT, "cluster.router.policy": "round_robin"})
    out.write(tmp_path / "o", plots=False)
    import pandas as pd

    req = pd.read_csv(tmp_path / "o" / "requests.csv")
    done = req[req.status == "finished"]
    for col in ("ttft_s", "e2e_s"):
        want = np.percentile(np.asarray(request_table(out.result)[col])[
            np.asarray(request_table(out.result)["status"]) == "finished"], [50, 90, 99])
        got = [out.summary[col][f"p{p}"] for p in (50, 90, 99)]
        assert got == want.tolist()
        # and, to the CSV's six decimals, the written table's
        assert np.allclose(got, np.percentile(done[col], [50, 90, 99]), atol=2e-6)


def test_the_streamed_summary_selects_exact_percentiles_from_disk(monkeypatch):
    """With requests read 100 at a time and every latency column selected on disk (not
    sorted in memory), the summary is still the whole fleet's, float for float."""
    sets = {**SHORT, "cluster.router.policy": "random", "slo.ttft_s": 0.05,
            "slo.tpot_s": 0.02}
    path = ROOT / "scenarios/fleet_routers.yaml"
    whole = runner.run(path, sets, split=False).summary
    monkeypatch.setattr(reqsummary, "SORT_VALUES", 10)
    monkeypatch.setattr(spill, "READ_ROWS", 100)
    apart = runner.run(path, sets)
    assert apart.summary["requests"]["finished"] > 300  # several blocks, every path taken
    for k in ("requests", "duration_s", "request_throughput", "output_token_throughput",
              "total_token_throughput", "ttft_s", "tpot_s", "e2e_s", "queue_s", "preemptions",
              "goodput"):
        assert apart.summary[k] == whole[k], k
    assert 0 < whole["goodput"]["fraction_met"] < 1


def test_a_fleet_that_splits_is_sized_by_its_records_not_its_request_objects(monkeypatch):
    from sim.engine import hostmem

    rr = load_scenario(ROOT / "scenarios/fleet_routers.yaml", {"cluster.router.policy": "random"})
    lo = load_scenario(ROOT / "scenarios/fleet_routers.yaml")  # least_outstanding
    assert split.may_split(rr) and not split.may_split(lo)
    # 25 M requests: 37 GB as objects, 1.7 GB as records
    monkeypatch.setenv(hostmem.ENV, "4")
    hostmem.check_host_memory(rr, 25_000_000)
    with pytest.raises(SpecError, match="1,500 B per request"):
        hostmem.check_host_memory(lo, 25_000_000)


def test_step_sums_made_in_the_workers_are_the_ones_made_from_the_logs_after():
    """A split run's replicas bring their step sums (made right after each one's run); they
    are every float of StepSums made afresh from the merged logs, and a measured window
    (t0) never reuses them."""
    from sim.engine.metrics import StepSums, step_sums

    out = runner.run(ROOT / "scenarios/fleet_routers.yaml",
                     {**SHORT, "cluster.router.policy": "round_robin"}, workers=2)
    res = out.result
    assert all(r.sums is not None for r in res.replicas)
    for carried, r in zip(step_sums(res), res.replicas, strict=True):
        fresh = StepSums(r)
        assert vars(carried).keys() == vars(fresh).keys()
        for k, v in vars(fresh).items():
            assert np.array_equal(getattr(carried, k), v), k
    t0 = float(res.replicas[0].steps.column("t_end")[0])
    assert step_sums(res, t0)[0] is not res.replicas[0].sums


@pytest.mark.parametrize("workers", [1, 2])
def test_request_figures_made_in_the_workers_are_per_replicas_from_the_table(workers):
    """A split run's replicas bring their request figures (made from their own records as
    each finished); per_replica of them is every float per_replica computes from the
    request table instead, which it no longer reads."""
    from sim.engine.metrics import per_replica

    out = runner.run(ROOT / "scenarios/fleet_routers.yaml",
                     {**SHORT, "cluster.router.policy": "round_robin"}, workers=workers)
    res = out.result
    assert all(r.requests is not None for r in res.replicas)
    carried = out.summary["per_replica"]
    for r in res.replicas:
        r.requests = None
    from_table = per_replica(out.request_table, None, res)
    assert carried == from_table
    assert [list(c) for c in carried] == [list(t) for t in from_table]  # keys in order
    assert sum(c["finished"] for c in carried) == out.summary["requests"]["finished"]
