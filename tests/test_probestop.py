"""A probe's run stops once its failure is certain (sim/planning/probestop.py), and that
never changes a seed's verdict: known answers of the rule, and runs compared with and
without the stop."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sim.config.scenario import load_scenario
from sim.planning.binding import binding
from sim.planning.capacity import SLO, violations
from sim.planning.estimate import _runner
from sim.planning.probestop import ProbeStop, misses_to_fail, stopper
from sim.planning.steady import SteadyRule
from sim.policies.batch import FINISHED, REJECTED, RUNNING, Seq

ROOT = Path(__file__).resolve().parents[1]
SCEN = str(ROOT / "scenarios" / "quickstart.yaml")
SLO_ = SLO(ttft_p99_s=1.0, tpot_p99_s=0.06)
# short probes: 80 requests or 10 s of traffic first, doubled up to 40 s
RULE = SteadyRule(min_requests=80, min_traffic_s=10.0, max_traffic_s=40.0)


def test_misses_to_fail_is_where_numpys_p99_index_lands():
    # lo = floor(0.99 (m - 1)): m = 1000 -> 989, so 11 values; m = 100 -> 98; m = 75 -> 73
    assert [misses_to_fail(m) for m in (1, 2, 75, 100, 1000, 1001)] == [1, 2, 2, 2, 11, 11]
    assert misses_to_fail(1002) == 12


@settings(max_examples=200, deadline=None)
@given(m=st.integers(1, 3000), seed=st.integers(0, 2**32 - 1))
def test_that_many_values_over_a_level_put_the_p99_over_it(m, seed):
    rng = np.random.default_rng(seed)
    need = misses_to_fail(m)
    x = rng.uniform(0.0, 1.0, m)  # at most the level 1.0 ...
    x[rng.choice(m, need, replace=False)] = 1.0 + 1e-6 + rng.uniform(0, 5, need)  # ... but these
    assert np.percentile(x, 99) > 1.0


def _seqs(n: int = 100) -> list[Seq]:
    """n requests arriving 1 s apart from t = 0, 10 output tokens each."""
    return [Seq(i, float(i), 100, 10, 10) for i in range(n)]


def test_the_rule_stops_once_enough_window_requests_certainly_miss_three_times_the_bound():
    # arrivals 0..99 s: window [19.8, 94.05) holds requests 20..94, m = 75, 2 misses decide
    seqs = _seqs()
    for s in seqs[:20]:  # before the window: done, however slow
        s.state, s.first_token_t, s.finish_t = FINISHED, s.arrival + 50.0, s.arrival + 60.0
    stop = ProbeStop(SteadyRule(), {"ttft_s": 1.0, "tpot_s": None, "e2e_s": None}, last=False)
    assert stop(23.5, seqs) is None  # request 20 has waited 3.5 s: one certain miss of 3 s
    reason = stop(24.5, seqs)  # and now request 21 has waited 3.5 s too
    assert reason == "p99 TTFT > 3 s certain (2 of 75 window requests over it)"
    assert stop.stopped == {"reason": reason, "verdict": "clearly fails", "at_s": 24.5,
                            "last_arrival_s": 99.0}


def test_on_a_run_that_is_not_the_last_only_a_clear_failure_stops_it():
    seqs = _seqs()
    for s in seqs[20:30]:  # ten window requests with TTFT 2 s: over the bound, not 3 x
        s.state, s.first_token_t, s.finish_t = FINISHED, s.arrival + 2.0, s.arrival + 2.5
    bounds = {"ttft_s": 1.0, "tpot_s": None, "e2e_s": None}
    assert ProbeStop(SteadyRule(), bounds, last=False)(30.0, seqs) is None  # may yet be "not steady"
    last = ProbeStop(SteadyRule(), bounds, last=True)
    assert last(30.0, seqs) == "p99 TTFT > 1 s certain (10 of 75 window requests over it)"
    assert last.stopped["verdict"] == "fails"


def test_tpot_counts_a_running_request_by_its_pace_so_far_and_a_rejection_stops_at_once():
    seqs = _seqs()
    bounds = {"ttft_s": None, "tpot_s": 0.06, "e2e_s": None}
    for s in seqs[20:22]:  # first token 0.1 s after arriving, still running 2 s later
        s.state, s.first_token_t = RUNNING, s.arrival + 0.1
    # at 23.5 s: (23.5 - 21.1) / 9 = 0.27 s a token so far, over 3 x 0.06 for both
    stop = ProbeStop(SteadyRule(), bounds, last=False)
    assert stop(23.5, seqs).startswith("p99 TPOT > 0.18 s certain (2 of 75")
    seqs = _seqs()
    seqs[3].state = REJECTED  # anywhere in the run, not only the window
    stop = ProbeStop(SteadyRule(), bounds, last=False)
    assert stop(5.0, seqs) == "1 rejected" and stop.stopped["verdict"] == "clearly fails"


def test_a_stopped_probe_says_why_and_how_many_requests_it_left_unfinished():
    sc = load_scenario(SCEN, {"slo": SLO_.as_scenario_slo()})
    fast = _runner(SCEN, {"slo": SLO_.as_scenario_slo()}, sc, RULE, SLO_.bounds(),
                   stop=stopper(RULE, SLO_.bounds()))
    s = fast(40.0, 3)  # far past one replica's capacity
    st_ = s["stopped"]
    assert st_["verdict"] == "clearly fails" == s["steady"]["verdict"]
    assert st_["at_s"] < st_["last_arrival_s"]
    total, req = s["requests"]["total"], s["requests"]
    assert st_["unfinished"] == total - req["finished"] - req["rejected"] > 0
    broke = violations(s, SLO_)
    assert len(broke) == 1 and broke[0].startswith("p99 TTFT > 3 s certain (")
    assert f"{st_['unfinished']} requests unfinished)" in broke[0]
    assert binding(s, "h200-sxm", broke).endswith("(stopped probe)")


def _same(a: dict, b: dict) -> bool:
    """Two summaries alike but for the time their simulations took."""
    drop = ("wall_s", "simulate_wall_s")
    return {k: v for k, v in a.items() if k not in drop} == {k: v for k, v in b.items() if k not in drop}


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rate=st.floats(0.0, 5.0).map(lambda e: 2.0 ** e), seed=st.integers(0, 10_000), goodput=st.sampled_from([None, 0.95]))
def test_stopping_early_never_changes_a_seeds_verdict(rate, seed, goodput):
    slo = SLO(ttft_p99_s=1.0, tpot_p99_s=0.06, goodput_min=goodput)
    base = {"slo": slo.as_scenario_slo()}
    sc = load_scenario(SCEN, base)
    full = _runner(SCEN, base, sc, RULE, slo.bounds())(rate, seed)
    fast = _runner(SCEN, base, sc, RULE, slo.bounds(), stop=stopper(RULE, slo.bounds(), goodput))(rate, seed)
    assert (not violations(full, slo)) == (not violations(fast, slo))
    if "stopped" not in fast:  # never stopped: the very same run, figure for figure
        assert _same(full, fast)
    else:
        assert violations(full, slo)
        if fast["stopped"]["verdict"] == "clearly fails":
            assert full["steady"]["verdict"] == "clearly fails"
        assert fast["steady"]["requests"] == full["steady"]["requests"]  # stopped on the same run


@pytest.mark.parametrize("rate", [3.0, 9.0, 30.0])
def test_a_run_never_stopped_is_the_run_without_a_watch(rate):
    base = {"slo": SLO_.as_scenario_slo()}
    sc = load_scenario(SCEN, base)
    never = SLO(ttft_p99_s=1e9, tpot_p99_s=1e9)  # a watch that checks, and never stops it
    full = _runner(SCEN, base, sc, RULE, SLO_.bounds())(rate, 7)
    watched = _runner(SCEN, base, sc, RULE, SLO_.bounds(), stop=stopper(RULE, never.bounds()))(rate, 7)
    assert "stopped" not in watched and _same(full, watched)
