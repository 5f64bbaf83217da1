"""Screening a day plan's fleets (sim/planning/dayscreen.py): a day stops once the fleet
cannot reach the attainment target or costs more than the best passing fleet, fleets run
cheapest first, and the pick is the exhaustive search's (known answers by hand, and the
screened plan against `day.screen: false` on the same days)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest

from sim.engine.autoscale import Life, Stopped
from sim.planning.dayscreen import (
    DayWatch,
    estimate_usd,
    fewest_replicas,
    floor_hours,
    passing_usd,
    run_screened,
    seed_limit,
)
from sim.policies.batch import FINISHED, REJECTED, WAITING

pytestmark = pytest.mark.xdist_group("test_dayscreen")

ROOT = Path(__file__).resolve().parents[1]
DAY = ROOT / "scenarios" / "autoscale_day.yaml"


def _seq(arrival, state=FINISHED, first=None, finish=None, output=11):
    return SimpleNamespace(arrival=arrival, state=state, output=output,
                           first_token_t=-1.0 if first is None else first,
                           finish_t=-1.0 if finish is None else finish)


def _lc(*lives):
    return SimpleNamespace(lives=list(lives))


# ---- the watch, by hand -------------------------------------------------------------


def test_watch_stops_once_certain_misses_rule_out_the_target():
    slo = {"ttft_s": 1.0, "tpot_s": 0.1, "e2e_s": None}
    # 100 requests, target 0.95: at most 5 may miss
    good = [_seq(float(i), first=i + 0.5, finish=i + 1.5) for i in range(94)]  # TPOT 0.1: meets
    bad = [_seq(94.0, first=95.5, finish=96.0),                 # TTFT 1.5 s
           _seq(95.0, first=95.2, finish=97.3),                 # TPOT 0.21 s
           _seq(96.0, state=REJECTED)]                          # rejected: a miss
    waiting = [_seq(97.0, state=WAITING), _seq(98.0, state=WAITING), _seq(99.0, state=WAITING)]
    seqs = good + bad + waiting
    w = DayWatch(slo, 0.95, math.inf)
    w(99.5, _lc(), seqs)  # 3 certain misses; the open ones have waited 2.5, 1.5, 0.5 s
    assert w.misses == 5  # ... two of them past the 1 s TTFT bound: certain misses too
    w(99.9, _lc(), seqs)  # still 5: (100 - 5) / 100 = 0.95 can still be met
    with pytest.raises(Stopped, match="attainment at most 0.9400"):
        w(100.1, _lc(), seqs)  # the last one is past 1 s too: at most 94 %


def test_watch_counts_a_one_token_request_as_meeting_tpot_like_the_request_table():
    w = DayWatch({"ttft_s": 1.0, "tpot_s": 0.01}, 0.5, math.inf)
    w(10.0, _lc(), [_seq(0.0, first=0.5, finish=9.0, output=1)])
    assert w.misses == 0


def test_watch_stops_once_replica_hours_pass_the_limit():
    lives = [Life(0, 0.0, 0.0), Life(1, 600.0, gone=1500.0), Life(2, 1800.0)]
    w = DayWatch({"ttft_s": 1.0}, 0.9, 1.5)
    w(3100.0, _lc(*lives), [])  # 3100 + 900 + 1300 s = 1.472 h: under 1.5
    with pytest.raises(Stopped, match="1.528 replica-hours"):
        w(3200.0, _lc(*lives), [])  # 3200 + 900 + 1400 s = 1.528 h


def test_seed_limit_is_the_best_mean_left_for_this_seed():
    # best $10, $2 per replica-hour, 2 seeds: 10 replica-hours in all; seed 1 took 4
    assert seed_limit(10.0, 2.0, 2, [4.0], []) == pytest.approx(6.0, rel=1e-8)
    # before seed 1, seed 2 will take at least 3: seed 1 may reach 7
    assert seed_limit(10.0, 2.0, 2, [], [3.0]) == pytest.approx(7.0, rel=1e-8)
    assert seed_limit(math.inf, 2.0, 2, [], [3.0]) == math.inf
    assert floor_hours(3, [3600.0, 1800.0], 2) == [3.0, 1.5]
    assert floor_hours(3, None, 2) == [0.0, 0.0]


def test_fewest_replicas_and_estimates_read_the_schedule():
    assert fewest_replicas({"schedule": [[0.0, 3], [100.0, 2], [200.0, 4]]}) == 2
    assert fewest_replicas({"policy": "queue"}) == 1
    # 3 x 100 s + 2 x 100 s + 4 x 100 s = 900 replica-s at $4/h
    assert estimate_usd({"schedule": [[0.0, 3], [100.0, 2], [200.0, 4]]}, 0.5, 4.0, 300.0) == \
        pytest.approx(1.0)
    assert estimate_usd({"policy": "queue"}, 0.5, 4.0, 300.0) == pytest.approx(0.6)


def _fake_day(cost_h: float, attainment: float, screen: dict) -> dict:
    """A fleet whose day costs `cost_h` replica-hours at `attainment`; it is screened when
    the best known rules it out (a stand-in for simulate_day)."""
    if cost_h * screen["usd_per_replica_hour"] > screen["best_usd"] * (1 + 1e-9):
        return {"status": "screened", "note": "dearer"}
    return {"status": "ok", "replica_hours": cost_h, "slo_attainment": attainment}


@pytest.mark.parametrize("workers", [1, 2])
def test_run_screened_runs_cheapest_first_and_hands_on_the_best(workers):
    days = [(5.0, 0.999), (2.0, 0.95), (3.0, 0.995), (4.0, 0.999)]  # target 0.99, $1/h
    jobs = [{"args": d, "estimate": d[0], "screen": {"attainment": 0.99, "usd_per_replica_hour": 1.0,
                                                     "floors_h": [0.0]}} for d in days]
    res = run_screened(_fake_day, jobs, workers)
    assert [r["status"] for r in res][1:3] == ["ok", "ok"]  # 2.0 misses, 3.0 passes: best $3
    if workers == 1:  # in order: 4.0 and 5.0 start once $3 is known
        assert [r["status"] for r in res] == ["screened", "ok", "ok", "screened"]
    picks = [passing_usd(r, 0.99, 1.0) for r in res]
    assert min(p for p in picks if p is not None) == 3.0


# ---- the day plan, screened against exhaustive ---------------------------------------


def _plan(tmp_path: Path, attainment: float, screen: bool, seeds: int = 1) -> Path:
    f = tmp_path / f"day_{attainment}_{screen}.yaml"
    f.write_text(
        "name: day\n"
        f"scenario: {DAY}\n"
        "slo: {ttft_p99_s: 1.0, tpot_p99_s: 0.05}\n"
        "search: {seeds: 1}\n"
        "router: {policy: least_outstanding}\n"
        f"day:\n  attainment: {attainment}\n  window_s: 60\n  seeds: {seeds}\n"
        f"  screen: {json.dumps(screen)}\n"
        "  policies: {utilization: [0.5, 0.8], queue: [4], slo: [0.99], schedule: [1.0, 1.25]}\n")
    return f


@pytest.fixture(scope="module")
def exhaustive(tmp_path_factory):
    """Every fleet's whole day (the figures do not depend on the target)."""
    from sim.planning.dayplan import run_day_plan
    from sim.planning.planspec import load_plan

    return run_day_plan(load_plan(_plan(tmp_path_factory.mktemp("full"), 0.99, False)), workers=1)


def _pick(full: dict, attainment: float) -> dict | None:
    """The exhaustive search's pick at `attainment` (dayplan.py's rule, by hand)."""
    ok = [f for f in full["fleets"] if f["status"] == "ok" and f["slo_attainment"] >= attainment - 1e-12]
    return min(ok, key=lambda f: (f["usd"], -f["slo_attainment"])) if ok else None


def _same_pick(full: dict, fast: dict, attainment: float) -> None:
    key = ("candidate", "fleet", "usd", "slo_attainment")
    a, b = _pick(full, attainment), fast["recommended"]
    assert (a is None) == (b is None)
    if a is not None:
        assert {k: a[k] for k in key} == {k: b[k] for k in key}
    by = {(f["candidate"], f["fleet"]): f for f in full["fleets"]}
    for f in fast["fleets"]:
        whole = by[(f["candidate"], f["fleet"])]
        if f["status"] == "ok":  # a fleet run to the end has the exhaustive figures
            assert {k: v for k, v in f.items() if k != "meets"} == \
                {k: v for k, v in whole.items() if k != "meets"}
        else:  # a screened one misses the target or costs more than the pick
            assert f["status"] == "screened"
            assert whole["slo_attainment"] < attainment - 1e-12 or whole["usd"] > a["usd"]


@pytest.mark.parametrize("attainment", [0.9, 0.99, 0.9999])
def test_screened_day_plan_recommends_what_exhaustive_search_does(exhaustive, tmp_path, attainment):
    from sim.planning.dayplan import run_day_plan
    from sim.planning.planspec import load_plan

    fast = run_day_plan(load_plan(_plan(tmp_path, attainment, True)), workers=1)
    _same_pick(exhaustive, fast, attainment)
    assert sum(f["status"] == "screened" for f in fast["fleets"]) >= 1


@pytest.mark.slow
def test_screened_shipped_day_plan_recommends_what_exhaustive_search_does(tmp_path):
    from sim.io.specload import load_yaml
    from sim.planning.dayplan import run_day_plan
    from sim.planning.planspec import load_plan

    data = load_yaml(ROOT / "plans" / "day_8b.yaml")
    data["scenario"] = str(DAY)
    out = {}
    for screen in (False, True):
        f = tmp_path / f"day_8b_{screen}.yaml"
        f.write_text(json.dumps({**data, "day": {**data["day"], "screen": screen}}))
        out[screen] = run_day_plan(load_plan(f))
    _same_pick(out[False], out[True], 0.99)
    assert out[True]["recommended"]["fleet"] == "bound schedule x1"
