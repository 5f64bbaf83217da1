"""A run's lookup provenance (summary.json `lookup_provenance`): the simulated milliseconds
per kind of lookup are the exactly rounded sums of each memo entry's breakdown times its
uses, whatever loop sums them (sim/costmodel/latency.py `provenance_seconds`)."""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace

from hypothesis import given
from hypothesis import strategies as st

from sim.config.scenario import load_scenario
from sim.costmodel.latency import StepLatency
from sim.costmodel.ranks import TAGS
from sim.engine.build import build_fleet
from sim.engine.prepare import prepare
from sim.engine.processes import simulate

ROOT = Path(__file__).resolve().parent.parent

_ENTRY = st.tuples(st.floats(0, 1e6), st.lists(st.floats(0, 1e3), min_size=len(TAGS),
                                                max_size=len(TAGS)), st.integers(0, 10**6))


def _by_the_definition(memo: dict) -> dict[str, float]:
    entries = list(memo.values())
    return {t: math.fsum(e[1][i] * e[2] for e in entries) for i, t in enumerate(TAGS)}


@given(st.lists(_ENTRY, max_size=60))
def test_provenance_seconds_are_the_fsum_of_breakdown_times_uses(entries):
    memo = {("dense", k): [ms, breakdown, uses] for k, (ms, breakdown, uses) in enumerate(entries)}
    got = StepLatency.provenance_seconds(SimpleNamespace(_memo=memo))
    assert got == _by_the_definition(memo)
    assert list(got) == list(TAGS)


def test_a_run_s_memo_gives_the_definition_s_sums():
    sc = load_scenario(ROOT / "scenarios" / "quickstart.yaml", {"workload.num_requests": 60})
    configs, wl, rng = prepare(sc)
    fleet = build_fleet(sc, configs, rng)
    simulate(wl, fleet.replicas, fleet.router)
    lat = configs[0].latency
    assert len(lat._memo) > 10
    assert lat.provenance_seconds() == _by_the_definition(lat._memo)
