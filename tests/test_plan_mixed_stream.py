"""Mixed-fleet plans on the workload's own arrival process, with more than two length
classes, and with 90 % intervals on their figures."""

from __future__ import annotations

import dataclasses
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from sim.io.specload import SpecError
from sim.planning.mixed import load_mixed_plan, options, rate_intervals, replicas_for
from sim.planning.mixed_stream import class_spans, length_mix
from sim.planning.planspec import SearchSpec

ROOT = Path(__file__).resolve().parent.parent
MIXED = (ROOT / "scenarios/mixed_fleet.yaml").read_text()


def _scenario(tmp_path: Path, workload: str) -> Path:
    """scenarios/mixed_fleet.yaml with its workload replaced."""
    text = MIXED[:MIXED.index("workload:")] + "workload:\n" + workload
    p = tmp_path / "scen.yaml"
    p.write_text(text)
    return p


def _plan(tmp_path: Path, scen: Path, **over) -> Path:
    data = {"name": "t", "scenario": str(scen), "target_rate": 4,
            "slo": {"ttft_p99_s": 2.0, "tpot_p99_s": 0.06},
            "search": {"seeds": 1, "fleet_traffic_s": 60, "rel_tol": 0.5, "requests": 100},
            "mixed": {"gpus": ["a100-80gb", "h200-sxm"], "thresholds": [2048]}}
    data.update(over)
    p = tmp_path / "plan.yaml"
    p.write_text(yaml.safe_dump(data))
    return p


# ---- more than two classes -----------------------------------------------------------

def test_two_classes_cut_at_either_end_and_three_add_every_middle_class():
    assert class_spans([1000, 2000], 2) == [(0, 1000), (0, 2000), (1000, None), (2000, None)]
    assert class_spans([2000, 1000], 3) == [(0, 1000), (0, 2000), (1000, 2000), (1000, None), (2000, None)]
    # 3 thresholds: the 5 edges make C(5, 2) = 10 classes, less the whole range: 9
    assert len(class_spans([1, 2, 3], 4)) == 9


def test_a_middle_length_class_goes_to_the_type_that_suits_it_when_three_classes_are_allowed():
    # hand-worked: target 10 (+10 % margin = 11); classes (0,1000] 50 %, (1000,4000] 30 %,
    # (4000,inf) 20 %. GPU s ($1/h) is fast on short prompts only, m ($2/h) on the middle,
    # l ($4/h) on long; each is poor (0.5 req/s) elsewhere.
    shares = {(0, 1000): 0.5, (0, 4000): 0.8, (1000, 4000): 0.3, (1000, None): 0.5,
              (4000, None): 0.2}
    good = {"s": {(0, 1000)}, "m": {(1000, 4000)}, "l": {(4000, None), (1000, None)}}
    caps = {}
    for g in ("s", "m", "l"):
        caps[(g, "all")] = 1.0
        for k in shares:
            caps[(g, k)] = 10.0 if k in good[g] else 0.5
    usd = {"s": 1.0, "m": 2.0, "l": 4.0}
    three = options(10, shares, caps, usd, SearchSpec(), classes=3)
    # s on <= 1000: ceil(5.5/10) = 1 ($1); m on 1001-4000: ceil(3.3/10) = 1 ($2);
    # l on > 4000: ceil(2.2/10) = 1 ($4): $7. Best two-class: 1 x s (<= 1000) + 1 x l (> 1000)
    # = $5 -- cheaper still, so check the three-class one is priced and ranked by cost
    cost = {o["label"]: o["usd_per_hour"] for o in three}
    assert cost["1 x s (<= 1000) + 1 x m (1001-4000) + 1 x l (> 4000)"] == 7
    assert three[0]["label"] == "1 x s (<= 1000) + 1 x l (> 1000)" and three[0]["usd_per_hour"] == 5
    # now l is poor on the middle class too: the two-class split at 1000 needs
    # ceil(5.5/0.5) = 11 x l = $44 on > 1000; at 4000, s/m poor on (0,4000]: the three-class mix wins
    caps[("l", (1000, None))] = 0.5
    three = options(10, shares, caps, usd, SearchSpec(), classes=3)
    two = options(10, shares, caps, usd, SearchSpec(), classes=2)
    assert three[0]["label"] == "1 x s (<= 1000) + 1 x m (1001-4000) + 1 x l (> 4000)"
    assert three[0]["usd_per_hour"] == 7 and two[0]["usd_per_hour"] > 7
    assert three[0]["thresholds"] == [1000, 4000]
    # every option count: singles 3 + two-class 2 cuts x 3^2 + three-class 1 x 3^3
    assert len(three) == 3 + 2 * 9 + 27 and len(two) == 3 + 2 * 9


def test_more_classes_than_thresholds_allow_is_refused_in_one_line(tmp_path):
    p = _plan(tmp_path, ROOT / "scenarios/mixed_fleet.yaml",
              mixed={"gpus": ["h200-sxm"], "thresholds": [2048], "classes": 3})
    with pytest.raises(SpecError, match=r"mixed.classes.*need 2 thresholds"):
        load_mixed_plan(p)
    out = subprocess.run([sys.executable, "-m", "sim", "plan", str(p), "--out", str(tmp_path / "o")],
                         capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1
    assert "mixed.classes" in out.stderr and not (tmp_path / "o").exists()


# ---- the workload's own arrival process --------------------------------------------------

def test_a_poisson_scenario_keeps_the_poisson_path_and_writes_lengths_only(tmp_path):
    spec = load_mixed_plan(_plan(tmp_path, ROOT / "scenarios/mixed_fleet.yaml"))
    mix = length_mix(spec, tmp_path)
    assert mix["process"] == "poisson"
    assert list(pd.read_csv(mix["files"]["all"]).columns) == ["num_prefill_tokens", "num_decode_tokens"]


def test_a_gamma_workload_is_replayed_and_each_class_sees_its_thinned_stream(tmp_path):
    # gamma gaps with CV 3; prompts uniform on 1..4096 independent of time, split at 2048
    # (share 0.5). Thinning a renewal process with keep-probability p gives gaps that are
    # a geometric sum: CV^2 = p CV0^2 + (1 - p) = 0.5 x 9 + 0.5 = 5, CV = 2.236.
    scen = _scenario(tmp_path, "  num_requests: 2000\n  arrival: {kind: gamma, rate: 8, cv: 3}\n"
                               "  prompt: {kind: uniform, low: 1, high: 4096}\n"
                               "  output: {kind: fixed, value: 10}\n")
    spec = load_mixed_plan(_plan(tmp_path, scen, search={"seeds": 1, "requests": 2000}))
    mix = length_mix(spec, tmp_path)
    assert mix["process"] == "replay" and "gamma" in mix["arrival"]["label"]
    assert mix["requests"] == 40_000
    assert mix["interarrival_cv"]["all"] == pytest.approx(3, rel=0.1)
    assert mix["interarrival_cv"][(0, 2048)] == pytest.approx(math.sqrt(5), rel=0.1)
    whole = pd.read_csv(mix["files"]["all"])
    short = pd.read_csv(mix["files"][(0, 2048)])
    assert whole.arrival_s.iloc[0] == 0 and short.arrival_s.iloc[0] == 0
    assert short.prompt_tokens.max() <= 2048 and len(short) == (whole.prompt_tokens <= 2048).sum()
    # the class's stream is the whole stream's own times (shifted to start at 0)
    times = whole.arrival_s[whole.prompt_tokens <= 2048].to_numpy()
    assert np.allclose(short.arrival_s, times - times[0])


def test_a_trace_scenario_is_replayed_on_the_traces_own_times(tmp_path):
    scen = _scenario(tmp_path, "  trace: {path: %s, format: azure}\n  num_requests: 500\n"
                     % (ROOT / "data/traces/azure_2023_conv.csv"))
    spec = load_mixed_plan(_plan(tmp_path, scen, search={"seeds": 1, "requests": 20}))
    mix = length_mix(spec, tmp_path)
    from sim.config.scenario import load_scenario
    from sim.workload.requests import generate

    sc = load_scenario(scen)
    wl = generate(dataclasses.replace(sc.workload, num_requests=500), np.random.default_rng(sc.seed),
                  file=sc.file, path="workload")
    whole = pd.read_csv(mix["files"]["all"])
    assert mix["process"] == "replay" and mix["requests"] == 500
    assert np.allclose(whole.arrival_s, wl.arrival_s - wl.arrival_s[0])
    assert (whole.prompt_tokens.to_numpy() == wl.prompt_tokens).all()


def test_a_time_varying_workload_is_replayed_over_the_scenarios_own_day(tmp_path):
    # diurnal, mean 4 req/s, peak/trough 4, over one 900 s period: 3,600 requests expected
    # (Poisson count: sd 60); the profile's mean (p + t) / 2 = 4 with p = 4t gives a trough
    # of 1.6 and a peak of 6.4 req/s, so the busiest sixth of the day holds well over twice
    # the quietest
    scen = _scenario(tmp_path, "  duration_s: 900\n  arrival: {kind: diurnal, rate: 4, peak_to_trough: 4, "
                               "period_s: 900}\n  lengths: {path: %s}\n"
                     % (ROOT / "data/traces/chat_docs_mix_lengths.csv"))
    mix = length_mix(load_mixed_plan(_plan(tmp_path, scen)), tmp_path)
    assert mix["process"] == "replay" and "diurnal" in mix["arrival"]["label"]
    assert abs(mix["requests"] - 3600) < 4 * 60
    t = pd.read_csv(mix["files"]["all"]).arrival_s
    counts = t.groupby(t // 150).size()
    assert t.iloc[-1] < 900 and counts.max() > 2 * counts.min()


def test_forcing_poisson_on_a_bursty_workload_takes_the_poisson_path(tmp_path):
    scen = _scenario(tmp_path, "  num_requests: 200\n  arrival: {kind: gamma, rate: 8, cv: 3}\n"
                               "  lengths: {path: %s}\n" % (ROOT / "data/traces/chat_docs_mix_lengths.csv"))
    spec = load_mixed_plan(_plan(tmp_path, scen, arrival="poisson"))
    assert length_mix(spec, tmp_path)["process"] == "poisson"


def test_a_closed_loop_workload_is_refused_in_one_line_with_exit_2(tmp_path):
    p = _plan(tmp_path, ROOT / "scenarios/closed_loop.yaml")
    out = subprocess.run([sys.executable, "-m", "sim", "plan", str(p), "--out", str(tmp_path / "o")],
                         capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert "closed loop" in out.stderr and not (tmp_path / "o").exists()


def test_a_bursty_mixed_plan_checks_the_mix_and_the_single_type_on_the_same_requests(tmp_path):
    from sim.planning.mixed import run_mixed_plan

    scen = _scenario(tmp_path, "  num_requests: 400\n  arrival: {kind: gamma, rate: 4, cv: 2}\n"
                               "  lengths: {path: %s}\n" % (ROOT / "data/traces/chat_docs_mix_lengths.csv"))
    r = run_mixed_plan(load_mixed_plan(_plan(tmp_path, scen)), workers=1)
    assert r["arrival"]["process"] == "replay" and r["kind"] == "mixed"
    mix, single = r["checks"]["best_mix"], r["checks"]["best_single"]
    # one stream, the same window per seed: the same number of requests reached both fleets
    n = {k: [sum(p["requests"] for p in ps if p) for ps in zip(*c["tries"][0]["pools"].values(), strict=True)]
         for k, c in (("mix", mix), ("single", single))}
    assert n["mix"] == n["single"]
    rec = r["recommended"]
    assert rec is not None
    lo, hi = rec["usd_per_hour_interval90"]
    assert lo <= rec["usd_per_hour"] <= hi
    assert not any("_range" in k or "band" in k for k in rec)  # one word, one thing: interval90
    for k in ("ttft", "tpot"):
        a, b = rec[f"{k}_p99_interval90_s"]
        assert a <= rec[f"{k}_p99_s"] <= b


# ---- 90 % intervals --------------------------------------------------------------------------

def test_a_pools_rate_interval_is_the_bisection_bracket_widened_by_the_step_models_error():
    # rate 2 sustained, 3 failed, 90 % error b = 10 %: [2 x 0.9, 3 x 1.1] = [1.8, 3.3]
    got = rate_intervals({("g", "all"): {"rate": 2.0, "fail_rate": 3.0, "interval90_model": 0.1}})[("g", "all")]
    assert got == pytest.approx((1.8, 3.3))
    # no failing rate found: the sustained rate x (1 + b) is the top
    got = rate_intervals({("g", "all"): {"rate": 2.0, "fail_rate": None, "interval90_model": 0.1}})[("g", "all")]
    assert got == pytest.approx((1.8, 2.2))


def test_an_options_replica_and_dollar_intervals_follow_from_its_pools_rate_intervals():
    # target 10 + 10 % = 11 req/s, one class of share 1 at rate 2 (interval 1.8-3.3), $3/h:
    # replicas ceil(11/3.3) = 4 .. ceil(11/1.8) = 7, $12 .. $21; the estimate ceil(11/2) = 6
    opts = options(10, {}, {("g", "all"): 2.0}, {"g": 3.0}, SearchSpec(),
                   rate_intervals={("g", "all"): (1.8, 3.3)})
    assert opts[0]["pools"][0]["replicas"] == 6 == replicas_for(10, 1, 2.0, SearchSpec())
    assert opts[0]["pools"][0]["replicas_interval90"] == (4, 7)
    assert opts[0]["usd_per_hour_interval90"] == (12.0, 21.0)
    # n+1: one spare on each end of the interval, 5 .. 8 replicas
    opts = options(10, {}, {("g", "all"): 2.0}, {"g": 3.0}, SearchSpec(redundancy="n+1"),
                   rate_intervals={("g", "all"): (1.8, 3.3)})
    assert opts[0]["pools"][0]["replicas_interval90"] == (5, 8)


def test_a_checked_fleets_intervals_move_each_pool_and_each_p99_by_the_step_models_error():
    from sim.planning.capacity import SLO
    from sim.planning.mixed_check import fleet_intervals
    from sim.planning.mixedspec import MixedPlanSpec, MixedSpec
    from sim.planning.uncertainty import load_bands

    spec = MixedPlanSpec("s", 4, SLO(ttft_p99_s=1), MixedSpec(("a", "b"), (10,)))
    prov = {"exact": 1.0}  # all step time on exact lookups of measured tables: the measured class
    b = load_bands()["measured"]["interval90"]
    tried = {"pools_at": [{"name": "short", "gpu": "a", "replicas": 4}, {"name": "long", "gpu": "b", "replicas": 1}],
             "lookup_provenance": prov, "ttft_p99_seeds_s": [0.5, 0.7], "tpot_p99_seeds_s": [0.02, 0.03]}
    got = fleet_intervals(spec, tried, {"a": 1.0, "b": 3.0})
    assert got["interval90_model"] == pytest.approx(b) and got["measured_share"] == 1.0
    # each replica's capacity moves by b: 4 replicas' load needs 4 / (1 +- b) of them
    short = (math.ceil(4 / (1 + b) - 1e-9), math.ceil(4 / (1 - b) - 1e-9))
    assert got["replicas_interval90"]["short"] == short
    assert got["usd_per_hour_interval90"][0] == short[0] * 1.0 + got["replicas_interval90"]["long"][0] * 3.0
    # two seeds: exp(mean log +- t(0.95, 1) s sqrt(1 + 1/2)), t = 6.314 (tables), s the logs'
    # sample deviation |ln 0.7 - ln 0.5| / sqrt 2; then / (1 + b) low, / (1 - b) high
    mean, s = (math.log(0.5) + math.log(0.7)) / 2, abs(math.log(0.7) - math.log(0.5)) / math.sqrt(2)
    h = 6.314 * s * math.sqrt(1.5)
    assert got["ttft_p99_interval90_s"] == pytest.approx((math.exp(mean - h) / (1 + b), math.exp(mean + h) / (1 - b)))
    assert got["e2e_p99_interval90_s"] is None  # no seeds measured it
    assert not any("_range" in k or "band" in k for k in got)


def test_a_checked_fleets_p99s_stand_on_the_pooled_seed_term_of_the_fleets_that_held():
    from sim.planning.mixed_check import pooled_p99s, tried_groups
    from sim.planning.uncertainty import seed_pool

    held = {"fleet": "2 x a", "holds": True, "ttft_p99_seeds_s": [0.5, 0.7], "tpot_p99_seeds_s": [0.02, 0.02]}
    broke = {"fleet": "1 x a", "holds": False, "ttft_p99_seeds_s": [3.0, 9.0], "tpot_p99_seeds_s": [0.1, 0.2]}
    check = {"tries": [broke, held], "interval90_model": 0.2}
    groups = tried_groups(check)
    assert [g["passed"] for g in groups] == [False, True]
    pool = seed_pool(groups)["ttft_p99"]  # the fleet that broke is left out: one group, 1 df
    assert pool["groups"] == ["fleet 2 x a"] and pool["df"] == 1
    # 1 df < 4: the fleet's own two seeds decide, as without a pool
    own = pooled_p99s(check, seed_pool(groups))
    assert "own seeds" in own["seed_term"]
    # a pool of sd 0.1 on 10 df (given): around log-mean (ln 0.5 + ln 0.7) / 2 = ln sqrt(0.35),
    # h = t(0.95, 10) 1.812 x 0.1 x sqrt(1.5) = 0.2219238; joined with [0.5, 0.7]; / (1 +- 0.2)
    got = pooled_p99s(check, {"ttft_p99": {"sd_log": 0.1, "df": 10, "groups": ["x"] * 10}})
    mid = math.sqrt(0.35)
    lo, hi = min(mid * math.exp(-0.2219238), 0.5), max(mid * math.exp(0.2219238), 0.7)
    assert got["ttft_p99_interval90_s"] == pytest.approx((lo / 1.2, hi / 0.8), rel=1e-6)
    assert "pooled over 10" in got["seed_term"]


def test_the_day_plan_reads_the_public_rate_profile():
    from sim.workload.requests import ArrivalSpec, rate_profile

    # a diurnal profile's mean rate over whole periods is its stated rate: 12.5 x 900 s
    prof = rate_profile(ArrivalSpec("diurnal", rate=12.5, peak_to_trough=4, period_s=900), 900, None,
                        "x.yaml", "workload")
    assert float(prof.integral(900)) == pytest.approx(12.5 * 900, rel=1e-6)


# ---- the fleet check's search ------------------------------------------------------------

@pytest.mark.parametrize("start,need,rounds", [({"short": 16, "long": 3}, {"short": 5, "long": 3}, 4),
                                               ({"short": 1, "long": 2}, {"short": 9, "long": 2}, 4),
                                               ({"short": 2, "long": 2}, {"short": 2, "long": 2}, 4)])
def test_the_fleet_check_finds_the_fewest_replicas_per_pool_from_an_estimate_far_off(monkeypatch, start,
                                                                                    need, rounds):
    # a stand-in fleet that holds exactly when every pool has at least `need` replicas (each
    # pool's own requests break below it): from 16 the bisection reaches 5 in 4 fleets
    # (8 holds, 4 breaks, 6 holds, 5 holds); from 1 the doubling steps reach 1+1+2+4+8 = 16
    # (holds), then the bisection between 8 (broke) and 16 finds 9
    from sim.planning import mixed_check
    from sim.planning.capacity import SLO
    from sim.planning.mixedspec import MixedPlanSpec, MixedSpec

    def fake_run(spec, opt, seed, mix=None):
        short = {p["name"]: p["replicas"] < need[p["name"]] for p in opt["pools"]}
        whole = {"ok": not any(short.values()), "lookup_provenance": None,
                 **{f"{k}_s": {"p99": 0.1} for k in ("ttft", "tpot", "e2e")}}
        return whole, {n: {"broke": ["x"] if b else [], "requests": 10} for n, b in short.items()}

    monkeypatch.setattr(mixed_check, "run_option", fake_run)
    monkeypatch.setattr(mixed_check, "violations", lambda w, slo: [] if w["ok"] else ["breaks"])
    monkeypatch.setattr(mixed_check, "_seed", lambda spec: 1)
    spec = MixedPlanSpec("s", 4, SLO(ttft_p99_s=1), MixedSpec(("a", "b"), (10,), check_rounds=rounds),
                         search=SearchSpec(seeds=1))
    option = {"kind": "mix", "threshold": 10, "thresholds": [10], "label": "x",
              "pools": [{"name": n, "gpu": g, "replicas": start[n]} for n, g in (("short", "a"), ("long", "b"))]}
    got = mixed_check.check_option(spec, option, {"a": 1.0, "b": 2.0})
    assert got["holds"] and {p["name"]: p["replicas"] for p in got["pools"]} == need
    assert got["usd_per_hour"] == need["short"] * 1.0 + need["long"] * 2.0
