"""A lone replica fed its arrivals at its step boundaries (sim/engine/feed.py) gives the
same run as the arrivals process beside it, leaping both ways, where an arrival instant
equals a step's end: one scheduled before that end fires first (the replica sees it), one
scheduled after it fires after (the replica sees it at its next boundary). Every shipped
scenario is compared with stepping in tests/test_leap.py."""

from __future__ import annotations

import dataclasses
from unittest import mock

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings

import sim.engine.feed as feed
import sim.engine.processes as processes
from sim.config.scenario import scenario_from_dict
from sim.engine.build import build_fleet
from sim.engine.feed import Feed, instants
from sim.engine.metrics import request_table, step_tables
from sim.engine.prepare import prepare
from sim.engine.processes import Fleet, make_seqs, simulate
from sim.engine.runner import run
from sim.io.specload import SpecError
from sim.io.tablefile import Labels
from sim.policies.batch import FINISHED, Seq
from tests.test_leap import FILES, WALL
from tests.test_random_scenarios import scenarios

SCENARIO = {
    "name": "feed", "seed": 3, "model": "llama-3-8b", "gpu": "h200-sxm", "runtime": "cuda-graph",
    "scheduler": {"policy": "continuous"},
    "workload": {"num_requests": 1, "arrival": {"kind": "constant", "rate": 0.001},
                 "prompt": {"kind": "uniform", "low": 200, "high": 200},
                 "output": {"kind": "uniform", "low": 30, "high": 30}}}


def _run(sc, wl, fed: bool, monkeypatch) -> tuple[dict, list[dict], float]:
    """(requests, steps, the clock at the end) of one leaping run, fed or not."""
    configs, _, rng = prepare(sc)
    fleet = build_fleet(sc, configs, rng)
    if not fed:
        monkeypatch.setattr(processes, "feedable", lambda *_: False)
    res = simulate(wl, fleet.replicas, fleet.router, leap=True)
    monkeypatch.undo()
    return request_table(res), step_tables(res), res.end_time


def _same(a, b) -> None:
    (ra, sa, ea), (rb, sb, eb) = a, b
    assert ea == eb
    for x, y in ((ra, rb), *zip(sa, sb, strict=True)):
        assert list(x) == list(y)
        for k in x:
            u, v = (np.asarray(c.strings() if isinstance(c, Labels) else c) for c in (x[k], y[k]))
            assert u.dtype == v.dtype and np.array_equal(u, v), k


def _workload(arrival: list[float]):
    """The scenario's workload with `len(arrival)` requests at those times, and its
    first request's step ends when it runs alone."""
    sc = scenario_from_dict({**SCENARIO, "workload": {**SCENARIO["workload"],
                                                      "num_requests": len(arrival)}})
    wl = prepare(sc).workload
    return sc, dataclasses.replace(wl, arrival_s=np.asarray(arrival, dtype=float))


def _alone_step_ends(monkeypatch) -> np.ndarray:
    sc, wl = _workload([0.0])
    return np.asarray(_run(sc, wl, True, monkeypatch)[1][0]["t_end"])


@pytest.mark.parametrize("between", [False, True])
def test_an_arrival_at_a_steps_end_is_seen_as_the_arrivals_process_orders_it(monkeypatch,
                                                                            between):
    t_end = _alone_step_ends(monkeypatch)
    tie = float(t_end[2])
    if between:  # one arrives during the step: the tied one is scheduled after its end
        x = next(x for x in np.linspace(t_end[1], t_end[2], 50)[1:-1].tolist()
                 if instants(np.array([0.0, x, tie]))[0][2] == tie)
        arrival = [0.0, x, tie]
    else:  # scheduled at the start, before the step's end: it fires first
        arrival = [0.0, tie]
    sc, wl = _workload(arrival)
    assert instants(wl.arrival_s)[0][-1] == tie  # the clock reaches the very float
    fed, unfed = _run(sc, wl, True, monkeypatch), _run(sc, wl, False, monkeypatch)
    _same(fed, unfed)
    steps = fed[1][0]
    # the tied request is prefilled alone (between) or with nothing else pending (not)
    assert steps["num_seqs"][list(steps["t_start"]).index(tie)] == 1


def test_a_feed_delivers_an_instant_at_or_before_a_boundary_and_later_ones_only_before():
    sc, wl = _workload([0.0, 0.0])
    configs, _, rng = prepare(sc)
    fleet = Fleet(None, build_fleet(sc, configs, rng).replicas, None)
    seqs = [Seq(i, 0.0, 10, 5, 5) for i in range(5)]
    feed = Feed(fleet, seqs, np.array([0.0, 1.0, 2.0, 2.0, 3.0]), np.array([-1, 0, 1, 2, 3]))
    waiting = fleet.nodes[0].rep.st.waiting
    feed.deliver(0.0)
    assert [s.rid for s in waiting] == [0]
    feed.deliver(0.5)
    assert [s.rid for s in waiting] == [0]
    feed.deliver(2.0)  # 1 (the next one, at 1.0); 2, at 2.0, was scheduled after it
    assert [s.rid for s in waiting] == [0, 1]
    feed.deliver(2.0)  # now 2 is the next one; 3, also at 2.0, was scheduled after it
    assert [s.rid for s in waiting] == [0, 1, 2]
    feed.deliver(10.0)  # 3 and 4, both before
    assert [s.rid for s in waiting] == [0, 1, 2, 3, 4] and feed.next == float("inf")
    assert fleet.nodes[0].rep.port.load.outstanding == 5


def test_make_seqs_and_the_feed_agree_with_the_arrivals_process_clock():
    sc, wl = _workload([0.0, 0.2, 0.9, 0.9, 1e-300 + 0.9])
    seqs = make_seqs(wl, 4096)
    configs, _, rng = prepare(sc)
    fleet = Fleet(None, build_fleet(sc, configs, rng).replicas, None)
    feed = Feed.of(fleet, seqs, wl.arrival_s)
    assert feed.times == [0.0, 0.2, 0.8999999999999999]  # SimPy's running sum of the gaps
    assert feed.starts == [0, 1, 2, 5]


class _StopAt:
    """A watch (sim/engine/watch.py) that checks every `every_s` and stops the run at its
    first check at or after `at`, remembering the replicas' clocks it saw then."""

    def __init__(self, every_s: float, at: float, replicas) -> None:
        self.every_s, self.at, self.replicas, self.seen = every_s, at, replicas, None

    def __call__(self, now: float, seqs: list) -> str | None:
        if now < self.at:
            return None
        self.seen = (now, max(r.rec.log.t_end[-1] for r in self.replicas))
        return "stop"


def test_a_watched_fed_replica_yields_at_each_check_instead_of_running_ahead():
    # 400 requests at 50/s: one replica never idles, so unwatched it would run to the end
    # between two yields; watched, a check at 2 s sees it at its first step end after 2 s
    sc = scenario_from_dict({**SCENARIO, "workload": {
        "num_requests": 400, "arrival": {"kind": "constant", "rate": 50.0},
        "prompt": {"kind": "uniform", "low": 200, "high": 200},
        "output": {"kind": "uniform", "low": 300, "high": 300}}})
    configs, wl, rng = prepare(sc)
    fleet = build_fleet(sc, configs, rng)
    stop = _StopAt(0.5, 2.0, fleet.replicas)
    res = simulate(wl, fleet.replicas, fleet.router, leap=True, watcher=stop)
    now, last_end = stop.seen
    assert now == 2.0
    steps = step_tables(res)[0]
    longest = max(e - s for s, e in zip(steps["t_start"], steps["t_end"], strict=True))
    assert now <= last_end < now + longest + max(np.diff(wl.arrival_s))  # one step (and a prefill) late at most
    assert sum(s.state == FINISHED for s in res.seqs) < len(res.seqs)  # stopped mid-run


def _one_call_or_not(sc, one_call: bool, tmp) -> tuple[dict, object, int]:
    """The output files' bytes (summary.json without wall clock), the run, and how many
    steps `feed.mixed_through` ran, with the fed replica's one-call steps on or off (off:
    every plan through Replica.start and Replica.finish)."""
    calls = []
    through = feed.mixed_through

    def counted(*args):
        calls.append(1)
        return through(*args)
    with mock.patch.object(feed, "mixed_through", counted), mock.patch.object(
            feed, "plain_prefills", feed.plain_prefills if one_call else lambda rep: False):
        out = run(sc)
    folder = out.write(tmp / ("one" if one_call else "two"), plots=False)
    files = {n: (folder / n).read_bytes() for n in FILES}
    files["summary.json"] = WALL.sub(b"", files["summary.json"])
    return files, out, len(calls)


def _same_either_way(sc, tmp) -> int:
    """Asserts a run is the same with one-call steps and without; returns the steps
    `mixed_through` ran."""
    (one, a, calls), (two, b, none) = (_one_call_or_not(sc, x, tmp) for x in (True, False))
    assert none == 0
    for name in FILES:
        assert one[name] == two[name], name
    for x, y in ((a.result.itl_gaps, b.result.itl_gaps),
                 (a.result.itl_weights, b.result.itl_weights)):
        assert np.asarray(x).tobytes() == np.asarray(y).tobytes()
    for ra, rb in zip(a.result.replicas, b.result.replicas, strict=True):
        assert ra.kernel_busy_s == rb.kernel_busy_s
    return calls


def test_a_chunked_replica_runs_its_mixed_steps_in_one_call_with_the_same_results(tmp_path):
    # long prompts over a small budget (several chunks each) among decodes, with jitter
    sc = scenario_from_dict({**SCENARIO, "runtime": "h200-eager-live",
                             "scheduler": {"policy": "chunked", "max_num_batched_tokens": 512},
                             "workload": {"num_requests": 60,
                                          "arrival": {"kind": "poisson", "rate": 20.0},
                                          "prompt": {"kind": "uniform", "low": 10, "high": 2000},
                                          "output": {"kind": "uniform", "low": 1, "high": 200}}})
    assert _same_either_way(sc, tmp_path) > 60


@settings(max_examples=40, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much,
                                 HealthCheck.function_scoped_fixture])
@given(data=scenarios())
def test_a_random_chunked_replica_gives_the_same_bytes_with_one_call_steps_or_not(
        data, tmp_path_factory):
    data = {k: v for k, v in data.items() if k != "cluster"}  # one replica, fed
    data["scheduler"] = {**data["scheduler"], "policy": "chunked"}
    data["kv"] = {**data["kv"], "manager": "paged"}
    data["speculative"] = {"method": "none"}
    try:
        sc = scenario_from_dict(data)
    except SpecError:
        assume(False)  # a combination the loader refuses
    _same_either_way(sc, tmp_path_factory.mktemp("feed"))


def test_an_arrival_prefilled_whole_in_one_step_takes_the_flat_path_with_the_same_results(
        tmp_path):
    """Prompts that mostly fit the token budget, some not (several chunks): the flat path
    of an arrival's one-chunk step (`feed._one_arrival`) and the general one both run, and
    the bytes are those of Replica.start and Replica.finish."""
    flat = []
    one_arrival = feed._one_arrival

    def counted(*args):
        flat.append(1)
        return one_arrival(*args)
    sc = scenario_from_dict({**SCENARIO, "runtime": "h200-eager-live",
                             "scheduler": {"policy": "chunked", "max_num_batched_tokens": 1024},
                             "workload": {"num_requests": 80,
                                          "arrival": {"kind": "poisson", "rate": 8.0},
                                          "prompt": {"kind": "uniform", "low": 10, "high": 1500},
                                          "output": {"kind": "uniform", "low": 1, "high": 120}}})
    with mock.patch.object(feed, "_one_arrival", counted):
        calls = _same_either_way(sc, tmp_path)
    assert 0 < len(flat) < calls
