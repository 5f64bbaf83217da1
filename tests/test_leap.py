"""Leaping (sim/engine/processes.py: `replica`) changes no result: every shipped scenario,
and random small ones, give byte-identical requests.csv, steps.csv and summary.json (but
for its wall-clock fields), the same inter-token gaps and the same Perfetto events with
replicas leaping over the steps no one else can see as with one SimPy event per step
(LLMSIM_LEAP=0)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings

from sim.config.scenario import load_scenario, scenario_from_dict
from sim.engine.processes import leaping
from sim.engine.runner import run
from sim.io.specload import SpecError
from sim.report.perfetto import trace_events
from tests.test_clients import closed
from tests.test_random_scenarios import scenarios

ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = sorted((ROOT / "scenarios").glob("*.yaml"))
FILES = ("requests.csv", "steps.csv", "summary.json")
WALL = re.compile(rb'^\s*"(simulate_)?wall_s": .*$\n?', re.M)
EXAMPLES = int(os.environ.get("LLMSIM_LEAP_EXAMPLES", "60"))


def small(path: Path) -> dict:
    """Overrides that shrink a shipped scenario (fewer requests, a shorter trace or day)."""
    sc = load_scenario(path)
    wl = sc.workload
    if wl.num_requests is None:  # a trace, a closed loop or an autoscaled day: a minute
        return {"workload.duration_s": 60.0}
    return {"workload.num_requests": min(wl.num_requests, 150)}


def outputs(scenario, overrides: dict | None, leap: bool, tmp: Path) -> tuple[dict, object]:
    """The three output files' bytes (summary.json without wall clock) and the run."""
    old = os.environ.get("LLMSIM_LEAP")
    os.environ["LLMSIM_LEAP"] = "1" if leap else "0"
    try:
        out = run(scenario, overrides) if overrides is not None else run(scenario)
    finally:
        if old is None:
            del os.environ["LLMSIM_LEAP"]
        else:
            os.environ["LLMSIM_LEAP"] = old
    folder = out.write(tmp / ("leap" if leap else "step"), plots=False)
    files = {n: (folder / n).read_bytes() for n in FILES}
    files["summary.json"] = WALL.sub(b"", files["summary.json"])
    return files, out


def assert_identical(scenario, overrides: dict | None, tmp: Path) -> None:
    leapt, a = outputs(scenario, overrides, True, tmp)
    stepped, b = outputs(scenario, overrides, False, tmp)
    for name in FILES:
        assert leapt[name] == stepped[name], name
    for x, y in ((a.result.itl_gaps, b.result.itl_gaps), (a.result.itl_weights, b.result.itl_weights)):
        assert np.asarray(x).tobytes() == np.asarray(y).tobytes()  # arrays, or spilled Chains
    for ra, rb in zip(a.result.replicas, b.result.replicas, strict=True):
        assert ra.kernel_busy_s == rb.kernel_busy_s
        assert ra.events == rb.events
    assert trace_events(a.steps, a.requests) == trace_events(b.steps, b.requests)


def test_leaping_is_on_unless_llmsim_leap_is_0(monkeypatch):
    monkeypatch.delenv("LLMSIM_LEAP", raising=False)
    assert leaping()
    monkeypatch.setenv("LLMSIM_LEAP", "0")
    assert not leaping()


@pytest.mark.parametrize("path", SCENARIOS, ids=[p.stem for p in SCENARIOS])
def test_a_small_shipped_scenario_gives_the_same_bytes_leaping_or_stepping(path, tmp_path):
    assert_identical(path, small(path), tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("path", SCENARIOS, ids=[p.stem for p in SCENARIOS])
def test_a_whole_shipped_scenario_gives_the_same_bytes_leaping_or_stepping(path, tmp_path):
    assert_identical(path, None, tmp_path)


@settings(max_examples=EXAMPLES, deadline=None, derandomize="LLMSIM_LEAP_EXAMPLES" not in os.environ,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much,
                                 HealthCheck.function_scoped_fixture])
@given(data=scenarios())
def test_a_random_small_scenario_gives_the_same_bytes_leaping_or_stepping(data, tmp_path_factory):
    try:
        sc = scenario_from_dict(data)
    except SpecError:
        assume(False)  # a combination the loader refuses
    assert_identical(sc, None, tmp_path_factory.mktemp("leap"))


CLOSED = [  # one user at a time (a leap's end is not always env.now + a delay), and many
    closed({"concurrency": 1, "requests_per_client": 3}),
    closed({"concurrency": 4, "requests_per_client": 6, "warmup_requests": 4}),
    {**closed({"concurrency": 8, "requests_per_client": 5, "think": {"kind": "exponential", "mean_s": 0.05}}),
     "scheduler": {"max_num_seqs": 4}},
]


@pytest.mark.parametrize("data", CLOSED, ids=["one-user", "warm-up", "think-time"])
def test_a_closed_loop_gives_the_same_bytes_leaping_or_stepping(data, tmp_path):
    assert_identical(scenario_from_dict(data), None, tmp_path)
