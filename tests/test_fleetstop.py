"""A plan's fleet runs stop once a seed's failure is certain (sim/planning/fleetstop.py):
a fleet simulated replica by replica is screened between replicas
(sim/engine/screensplit.py). Known answers of the rule, the screened run against the
plain one byte for byte, and verdicts with and without the stop."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.config.scenario import load_scenario, scenario_from_dict
from sim.engine.runner import run
from sim.engine.screensplit import NOT_SIMULATED, Screened, run_screened
from sim.planning.capacity import violations
from sim.planning.fleet import fresh_seeds, run_fleet, scenario_dict, validate_fleet
from sim.planning.fleetstop import FleetStop
from sim.planning.planspec import load_plan
from sim.planning.steady import SteadyRule, window
from sim.planning.units import fleet_cluster
from sim.policies.batch import FINISHED
from sim.policies.router import RouterSpec

ROOT = Path(__file__).resolve().parents[1]
SCEN = str(ROOT / "scenarios" / "quickstart.yaml")
TTFT = {"ttft_s": 1.0, "tpot_s": None, "e2e_s": None}


def _fleet(replicas: int, rate: float, requests: int, seed: int = 1):
    sc = load_scenario(SCEN, {"workload.num_requests": requests,
                              "workload.arrival": {"kind": "poisson", "rate": rate}, "seed": seed})
    data = scenario_dict(sc)
    data["cluster"] = fleet_cluster(sc, replicas, RouterSpec(policy="random"))
    return scenario_from_dict(data, file=sc.file, base_dir=sc.base_dir)


class _Never:
    """A screen that reads every replica and never stops the run."""

    def begin(self, arrival):
        self.frames = []

    def replica(self, index, frame):
        self.frames.append(frame)
        return None


def _same_summary(a: dict, b: dict) -> bool:
    drop = ("wall_s", "simulate_wall_s")
    return json.dumps({k: v for k, v in a.items() if k not in drop}, sort_keys=True, default=str) == \
        json.dumps({k: v for k, v in b.items() if k not in drop}, sort_keys=True, default=str)


def test_a_screened_fleet_never_stopped_is_the_plain_run_byte_for_byte():
    sc = _fleet(3, 9.0, 900)
    plain, never = run(sc), _Never()
    screened = run_screened(sc, never)
    assert screened.requests.equals(plain.requests) and screened.steps.equals(plain.steps)
    assert _same_summary(screened.summary, plain.summary)
    # each replica's frame holds the request table's own values for its requests
    table = plain.requests
    for i, frame in enumerate(never.frames):
        mine = table[table.replica == plain.result.replicas[i].name].reset_index(drop=True)
        for col in ("arrival_s", "status", "ttft_s", "tpot_s", "e2e_s", "queue_s", "finish_s"):
            assert frame[col].reset_index(drop=True).equals(mine[col]), col


def test_the_screen_stops_once_enough_of_the_fleets_window_requests_certainly_miss():
    # arrivals 0..99 s: window [19.8, 94.05) holds 75 requests, so 2 over a level decide
    stop = FleetStop(SteadyRule(), TTFT, last=False)
    stop.begin(np.arange(100, dtype=float))

    def frame(ids, ttft):
        ids = np.asarray(ids)
        return pd.DataFrame({"id": ids, "arrival_s": ids.astype(float), "status": FINISHED,
                             "ttft_s": ttft, "tpot_s": np.nan, "e2e_s": np.asarray(ttft) + 1.0})

    assert stop.replica(0, frame([10, 20, 22], [9.0, 3.5, 0.1])) is None  # 10 is before the window
    why = stop.replica(1, frame([21, 95], [3.5, 9.0]))  # 95 is after it
    assert why == "p99 TTFT > 3 s certain (2 of 75 window requests over it)"
    assert stop.stopped["verdict"] == "clearly fails" and stop.stopped["replicas_run"] == 2


@settings(max_examples=150, deadline=None)
@given(n=st.integers(20, 400), k=st.integers(2, 6), seed=st.integers(0, 2**32 - 1),
       last=st.booleans())
def test_when_the_screen_stops_the_fleets_window_p99_is_over_the_level_whatever_the_rest(n, k, seed, last):
    rng = np.random.default_rng(seed)
    arrival = np.sort(rng.uniform(0, 100, n))
    replica = rng.integers(0, k, n)
    ttft = rng.choice([0.2, 0.9, 1.5, 4.0], n, p=rng.dirichlet(np.ones(4)))
    req = pd.DataFrame({"id": np.arange(n), "arrival_s": arrival, "status": FINISHED, "finish_s": arrival + ttft + 1,
                        "ttft_s": ttft, "tpot_s": np.nan, "e2e_s": ttft + 1, "queue_s": 0.0, "replica": replica})
    stop = FleetStop(SteadyRule(), TTFT, last=last)
    stop.begin(arrival)
    for i in range(k):
        if stop.replica(i, req[req.replica == i]) is not None:
            break
    if stop.stopped is None:
        return
    level = 3.0 if stop.stopped["verdict"] == "clearly fails" else 1.0
    ran = req.replica < stop.stopped["replicas_run"]
    for rest in (0.0, 100.0):  # the replicas never simulated: as fast or as slow as can be
        full = req.copy()
        full.loc[~ran, "ttft_s"] = rest
        assert window(full, SteadyRule(), TTFT)["stats"]["ttft_s"]["p99"] > level


def _plan(tmp_path, traffic_s: float = 60.0):
    p = tmp_path / "p.yaml"
    p.write_text(f"scenario: {SCEN}\ntarget_rate: 12\nslo: {{ttft_p99_s: 1.0, tpot_p99_s: 0.06}}\n"
                 f"search: {{seeds: 1, fleet_traffic_s: {traffic_s}, headroom_probes: 0, "
                 "steady: {min_traffic_s: 20, max_traffic_s: 40}}\n"
                 "candidates: {gpu: [h200-sxm]}\n")
    return load_plan(p)


@pytest.mark.parametrize("replicas", [1, 2, 3])
def test_a_stopped_fleet_check_fails_as_the_whole_run_and_a_passing_one_is_the_whole_run(tmp_path, replicas):
    spec = _plan(tmp_path)
    cand = {"gpu": "h200-sxm", "scheduler.policy": "continuous"}
    rate, seed = spec.search.sizing_rate(spec.target_rate), fresh_seeds(spec, cand)[0]
    full = run_fleet(spec, cand, replicas, rate, seed, 60.0)
    fast = run_fleet(spec, cand, replicas, rate, seed, 60.0, stop=True)
    assert (not violations(full, spec.slo)) == (not violations(fast, spec.slo))
    if "stopped" not in fast:
        drop = ("wall_s", "simulate_wall_s")
        assert {k: v for k, v in full.items() if k not in drop} == {k: v for k, v in fast.items() if k not in drop}
    else:
        assert violations(full, spec.slo)
        st_ = fast["stopped"]
        if replicas > 1:  # split by replica: screened between replicas
            assert st_["replicas_run"] < replicas
            assert f"stopped after {st_['replicas_run']} of {replicas} replicas" in violations(fast, spec.slo)[0]


def test_one_overloaded_replica_of_three_decides_the_fleet():
    sc = _fleet(3, 60.0, 1200)  # ~20 req/s each: past an H200's chat capacity
    stop = FleetStop(SteadyRule(), TTFT, last=True)
    out = run_screened(sc, stop)
    assert isinstance(out, Screened) and out.replicas_run == 1 and out.replicas == 3
    assert stop.stopped["reason"].startswith("p99 TTFT > 3 s certain")
    # the other replicas' requests are there, never simulated
    assert len(out.requests) == 1200 and list(out.requests.id) == list(range(1200))
    assert (out.requests.status[out.requests.replica > 0] == NOT_SIMULATED).all()


def test_the_count_a_check_settles_on_is_run_whole_when_its_run_was_stopped(tmp_path, monkeypatch):
    # stand-in fleets that never hold (max_replicas 2): the stopped runs' figures are
    # partial (p99 TTFT 4), the whole runs' are 9; the settled count (2) must show 9
    import sim.planning.fleet as fleet

    calls = []

    def run_seeds(spec, cand, n, rate, seeds, traffic_s, stop=False):
        calls.append((n, stop))
        out = {"ttft_s": {"p99": 4.0 if stop else 9.0}, "tpot_s": {"p99": 0.02}, "e2e_s": {"p99": 5.0},
               "goodput": None, "requests": {"rejected": 0}, "steady": {"ratio": 1.0, "verdict": "steady"},
               "output_token_throughput": 250.0, "request_throughput": 1.0}
        if stop:
            out["stopped"] = {"reason": "p99 TTFT > 3 s certain (9 of 99 window requests over it)",
                              "verdict": "clearly fails", "at_s": 1.0, "last_arrival_s": 60.0,
                              "unfinished": 10}
        return [out for _ in seeds]

    monkeypatch.setattr(fleet, "run_seeds", run_seeds)
    p = tmp_path / "p.yaml"
    p.write_text(f"scenario: {SCEN}\ntarget_rate: 10\nslo: {{ttft_p99_s: 1.0}}\n"
                 "search: {seeds: 1, max_replicas: 2}\ncandidates: {gpu: [h100-sxm]}\n")
    spec = load_plan(p)
    check = validate_fleet(spec, {"candidate": "h100-sxm", "replicas": 1, "fail_rate": 4.0}, {"gpu": "h100-sxm"})
    assert not check["holds"] and check["replicas"] == 2
    assert calls == [(1, True), (2, True), (2, False)]
    rows = {c["replicas"]: c for c in check["checks"]}
    assert rows[2]["ttft_p99_s"] == 9.0 and rows[1]["ttft_p99_s"] == 4.0


def test_a_plan_recommends_the_same_fleet_with_its_fleet_runs_stopped_or_not(tmp_path):
    # one candidate: its fleet check tries counts that fail (stopped) and one that holds;
    # the headroom search fails above the target (stopped) and passes below
    import dataclasses

    from sim.planning.plan import run_plan

    spec = _plan(tmp_path)
    spec = dataclasses.replace(spec, search=dataclasses.replace(spec.search, headroom_probes=2))
    object.__setattr__(spec, "file", tmp_path / "p.yaml")
    off = dataclasses.replace(spec, search=dataclasses.replace(spec.search, stop_early=False))
    object.__setattr__(off, "file", spec.file)
    fast, full = run_plan(spec, workers=1), run_plan(off, workers=1)
    stopped = [c for f in fast["fleet_checks"] for c in f["checks"] if "stopped" in c["broke"]]
    assert stopped, "no fleet run was stopped: the test's plan no longer exercises the stop"
    head_f, head_o = fast["recommended"].pop("headroom"), full["recommended"].pop("headroom")
    assert fast["recommended"] == full["recommended"] and fast["candidates"] == full["candidates"]
    assert fast["seed_pool"] == full["seed_pool"]
    assert head_f["factor"] == head_o["factor"]
    assert [t["passed"] for t in head_f["tried"]] == [t["passed"] for t in head_o["tried"]]
    for f, o in zip(fast["fleet_checks"], full["fleet_checks"], strict=True):
        assert [c["passed"] for c in f["checks"]] == [c["passed"] for c in o["checks"]]
        assert [c for c in f["checks"] if c["passed"]] == [c for c in o["checks"] if c["passed"]]
