"""Mixed-fleet plans: sizing a length mix over GPU types behind the length router."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.io.specload import SpecError
from sim.planning.mixed import is_mixed_plan, load_mixed_plan, options, replicas_for, run_mixed_plan
from sim.planning.planspec import SearchSpec

ROOT = Path(__file__).resolve().parent.parent


def test_the_cheapest_option_is_a_mix_of_types_when_each_side_suits_another_type():
    # hand-worked: target 10 req/s + 10 % margin = 11; 60 % of requests at or under 1000 tokens.
    # a ($1/h): whole 1.5, short 5, long 0.5 req/s;  b ($2.5/h): whole 4, short 8, long 4
    caps = {("a", "all"): 1.5, ("a", (0, 1000)): 5.0, ("a", (1000, None)): 0.5,
            ("b", "all"): 4.0, ("b", (0, 1000)): 8.0, ("b", (1000, None)): 4.0}
    opts = options(10, {(0, 1000): 0.6, (1000, None): 0.4}, caps, {"a": 1.0, "b": 2.5}, SearchSpec())
    cost = {o["label"]: o["usd_per_hour"] for o in opts}
    # single a: ceil(11/1.5) = 8 -> $8; single b: ceil(11/4) = 3 -> $7.5
    assert cost["8 x a"] == 8 and cost["3 x b"] == 7.5
    # a short, b long: ceil(6.6/5) = 2 x $1 + ceil(4.4/4) = 2 x $2.5 = $7
    assert cost["2 x a (<= 1000) + 2 x b (> 1000)"] == 7
    # a/a: 2 + ceil(4.4/0.5) = 9 -> $11; b/b: 1 x 2.5 + 2 x 2.5 = $7.5; b/a: 2.5 + 9 = $11.5
    assert cost["2 x a (<= 1000) + 9 x a (> 1000)"] == 11
    assert cost["1 x b (<= 1000) + 2 x b (> 1000)"] == 7.5
    assert cost["1 x b (<= 1000) + 9 x a (> 1000)"] == 11.5
    assert opts[0]["label"] == "2 x a (<= 1000) + 2 x b (> 1000)"


def test_n_plus_1_adds_one_replica_to_each_pool():
    s = SearchSpec(redundancy="n+1")
    assert replicas_for(10, 0.6, 5.0, s) == 3  # ceil(6.6 / 5) + 1
    assert replicas_for(10, 0.4, 4.0, s) == 3  # ceil(4.4 / 4) + 1
    assert replicas_for(10, 0.4, 0.0, s) is None


@settings(max_examples=80, deadline=None)
@given(st.floats(0.5, 200), st.lists(st.floats(0.05, 0.95), min_size=1, max_size=3),
       st.lists(st.tuples(st.floats(0.2, 40), st.floats(0.2, 40), st.floats(0.2, 40), st.floats(0.3, 8)),
                min_size=1, max_size=3), st.sampled_from(["none", "n+1"]))
def test_a_mix_never_costs_more_than_the_best_single_type_and_every_pool_covers_its_share(
        target, shares, gpus, redundancy):
    s = SearchSpec(redundancy=redundancy)
    ts = {1000 * (i + 1): f for i, f in enumerate(shares)}
    caps, usd, split = {}, {}, {}
    for t, f in ts.items():
        split[(0, t)], split[(t, None)] = f, 1 - f
    for i, (whole, short, long_, price) in enumerate(gpus):
        g = f"g{i}"
        usd[g] = price
        caps[(g, "all")] = whole
        for t in ts:
            caps[(g, (0, t))], caps[(g, (t, None))] = short, long_
    opts = options(target, split, caps, usd, s)
    best_single = min(o["usd_per_hour"] for o in opts if o["kind"] == "single")
    assert opts[0]["usd_per_hour"] <= best_single
    assert [o["usd_per_hour"] for o in opts] == sorted(o["usd_per_hour"] for o in opts)
    extra = 1 if redundancy == "n+1" else 0
    for o in opts:
        for p in o["pools"]:  # without the spare, the pool sustains its share of target + margin
            assert (p["replicas"] - extra) * p["sustained_rate"] >= target * 1.1 * p["share"] * (1 - 1e-9)
            assert (p["replicas"] - extra - 1) * p["sustained_rate"] < target * 1.1 * p["share"]
        assert math.isclose(o["usd_per_hour"], sum(p["replicas"] * usd[p["gpu"]] for p in o["pools"]))


def _plan(tmp_path, **over) -> Path:
    import yaml

    data = {"name": "t", "scenario": str(ROOT / "scenarios/mixed_fleet.yaml"), "target_rate": 4,
            "slo": {"ttft_p99_s": 2.0, "tpot_p99_s": 0.06},
            "search": {"seeds": 1, "fleet_traffic_s": 60, "rel_tol": 0.5, "requests": 100},
            "mixed": {"gpus": ["a100-80gb", "h200-sxm"], "thresholds": [2048]}}
    data.update(over)
    p = tmp_path / "plan.yaml"
    p.write_text(yaml.safe_dump(data))
    return p


def test_a_uniform_length_mix_splits_at_the_threshold_share(tmp_path):
    from sim.planning.mixed import length_mix

    spec = load_mixed_plan(_plan(tmp_path))
    scen = tmp_path / "u.yaml"
    scen.write_text((ROOT / "scenarios/mixed_fleet.yaml").read_text().replace(
        "lengths: {path: data/traces/chat_docs_mix_lengths.csv}",
        "prompt: {kind: uniform, low: 1, high: 4000}\n  output: {kind: fixed, value: 10}"))
    import dataclasses
    spec = dataclasses.replace(spec, scenario=str(scen))
    object.__setattr__(spec, "file", str(tmp_path / "plan.yaml"))
    mix = length_mix(spec, tmp_path)
    # 2,000 requests drawn uniformly on 1..4000: P(<= 2048) = 2048 / 4000 = 0.512 (sd 0.011)
    assert abs(mix["shares"][(0, 2048)] - 0.512) < 0.04
    assert mix["shares"][(0, 2048)] + mix["shares"][(2048, None)] == pytest.approx(1)
    import pandas as pd
    assert pd.read_csv(mix["files"][(0, 2048)]).num_prefill_tokens.max() <= 2048
    assert pd.read_csv(mix["files"][(2048, None)]).num_prefill_tokens.min() > 2048


def test_a_mixed_plan_checks_its_fleets_and_recommends_no_dearer_than_the_best_single(tmp_path):
    spec = load_mixed_plan(_plan(tmp_path))
    r = run_mixed_plan(spec, workers=1)
    rec, single = r["recommended"], r["checks"]["best_single"]
    assert rec is not None and rec["holds"]
    assert rec["traffic_s"] == 60 and rec["rate"] == pytest.approx(4.4)
    if single["holds"]:
        assert rec["usd_per_hour"] <= single["usd_per_hour"]
    mix = r["checks"]["best_mix"]
    # the check's pools are those of the option, each at least as many replicas as estimated
    est = {p["name"]: p["replicas"] for p in r["best_mix"]["pools"]}
    assert all(p["replicas"] >= est[p["name"]] for p in mix["pools"])
    # one seed a group: nothing to pool, so each figure's own seed decides and says so
    assert r["seed_pool"]["fleet"]["ttft_p99"] == {"sd_log": None, "df": 0, "groups": []}
    assert all("own seeds" in c["seed_term"] for c in r["checks"].values())
    json.dumps(r, default=str)


def test_a_mixed_plan_naming_an_unknown_gpu_is_refused_in_one_line_with_exit_2(tmp_path):
    p = _plan(tmp_path, mixed={"gpus": ["a100-80gb", "h999"], "thresholds": [2048]})
    with pytest.raises(SpecError, match=r"mixed.gpus\[1\]"):
        run_mixed_plan(load_mixed_plan(p), workers=1)
    out = subprocess.run([sys.executable, "-m", "sim", "plan", str(p), "--out", str(tmp_path / "o")],
                         capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1
    assert "mixed.gpus[1]" in out.stderr and not (tmp_path / "o").exists()


def test_a_mixed_plan_with_no_threshold_is_refused():
    with pytest.raises(SpecError, match="mixed.thresholds"):
        from sim.io.specload import build
        from sim.planning.mixed import MixedPlanSpec
        build(MixedPlanSpec, {"scenario": "x", "target_rate": 1, "slo": {"ttft_p99_s": 1},
                              "mixed": {"gpus": ["h200-sxm"], "thresholds": []}}, file="p.yaml")


@pytest.mark.parametrize("plan", [p for p in sorted((ROOT / "plans").glob("*.yaml")) if is_mixed_plan(p)],
                         ids=lambda p: p.name)
def test_every_shipped_mixed_plan_loads_and_prices_its_gpus(plan):
    from sim.planning.mixed import gpu_prices
    from sim.planning.planspec import load_prices

    spec = load_mixed_plan(plan)
    usd = gpu_prices(spec, load_prices(None))
    assert set(usd) == set(spec.mixed.gpus) and all(v > 0 for v in usd.values())
