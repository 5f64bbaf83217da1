"""90 % intervals on a plan's figures (sim/planning/uncertainty.py): the step model's
interval90 by what a run stands on (data/step_error_bands.yaml) and the seed spread."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.planning.uncertainty import (
    MIN_POOL_DF,
    candidate_intervals,
    fleet_pool,
    interval_band,
    latency_interval,
    load_bands,
    pool_words,
    rate_interval,
    replicas_needed,
    robustness,
    seed_interval,
    seed_pool,
    stands_on,
)


def test_every_class_names_its_source_and_a_worse_provenance_is_never_surer():
    bands = load_bands()
    assert list(bands) == ["measured", "derived", "extrapolated", "analytic"]  # surest first
    assert all(b["source"] for b in bands.values())
    assert all(0 < b["interval90"] < 1 for b in bands.values())
    widths = [b["interval90"] for b in bands.values()]
    assert widths == sorted(widths)
    assert all("band" not in b for b in bands.values())  # one word, one thing: interval90 only


def test_the_model_half_width_is_the_share_weighted_mean_of_the_classes():
    b = {k: v["interval90"] for k, v in load_bands().items()}
    assert interval_band({"exact": 0.3, "interpolated": 0.2, "derived": 0.0, "extrapolated": 0.0,
                          "analytic": 0.5}) == pytest.approx(0.5 * b["measured"] + 0.5 * b["analytic"])
    assert interval_band({"exact": 1.0}) == pytest.approx(b["measured"])
    assert interval_band({}) == max(b.values())  # unknown: the widest
    assert stands_on({"exact": 0.05, "extrapolated": 0.4, "analytic": 0.55}) == \
        "measured 5% / derived 0% / extrapolated 40% / analytic 55%"


def test_seed_interval_by_hand():
    # seeds 2, 4, 8: logs ln2 x (1, 2, 3), mean 2 ln2 (= ln 4), sample sd ln2 = 0.693147;
    # t(0.95, 2) = 2.920, sqrt(1 + 1/3) = 1.154701: h = 2.920 x 0.693147 x 1.154701 = 2.337096,
    # exp(h) = 10.3507: 4 / 10.3507 = 0.38645 .. 4 x 10.3507 = 41.403
    lo, hi = seed_interval([2.0, 4.0, 8.0])
    assert lo == pytest.approx(0.38645, rel=1e-4) and hi == pytest.approx(41.403, rel=1e-4)
    # two seeds 1/1.1 and 1.1: logs -+0.0953102, sd 0.134789; t(0.95, 1) = 6.314, sqrt(1.5):
    # h = 6.314 x 0.134789 x 1.224745 = 1.042316, exp(h) = 2.835835
    lo, hi = seed_interval([1 / 1.1, 1.1])
    assert (lo, hi) == pytest.approx((1 / 2.835835, 2.835835), rel=1e-5)
    assert seed_interval([0.3]) == (0.3, 0.3)  # one seed measures no spread
    assert seed_interval([None]) is None


def test_latency_and_rate_intervals_by_hand():
    # a time off by e = modelled / measured - 1 with |e| <= 0.25: measured in [m / 1.25, m / 0.75]
    assert latency_interval([0.5], 0.25) == pytest.approx((0.4, 2 / 3))
    # a rate moves inversely to step time: [low x 0.75, high x 1.25]
    assert rate_interval(10.0, 11.0, 0.25) == pytest.approx((7.5, 13.75))
    # 24 req/s over 7.5 .. 13.75 a unit: ceil(24 / 13.75) = 2 .. ceil(24 / 7.5) = 4; +1 for n+1
    assert replicas_needed(24.0, (7.5, 13.75)) == (2, 4)
    assert replicas_needed(24.0, (7.5, 13.75), extra=1, most=4) == (3, 4)


def test_candidate_intervals_by_hand():
    b = load_bands()["measured"]["interval90"]
    prov = {"exact": 1.0}
    r = candidate_intervals(target=24.0, rate=10.0, fail_rate=11.0, at_rate_prov=prov,
                            share_p99s={"ttft": [0.4]}, share_prov=prov, gpus_per_replica=2,
                            usd_per_gpu_hour=3.0, usd_per_m=1.5, usd_per_hour=18.0)
    assert r["sustained_rate_interval90"] == pytest.approx((10 * (1 - b), 11 * (1 + b)))
    need = (math.ceil(24 / (11 * (1 + b))), math.ceil(24 / (10 * (1 - b))))
    assert r["replicas_interval90"] == need
    assert r["usd_per_hour_interval90"] == pytest.approx(tuple(6.0 * n for n in need))
    assert r["usd_per_m_output_tokens_interval90"] == pytest.approx(tuple(6.0 * n * 1.5 / 18 for n in need))
    assert r["ttft_p99_interval90_s"] == pytest.approx((0.4 / (1 + b), 0.4 / (1 - b)))
    assert r["measured_share"] == 1.0 and r["interval90_model"] == pytest.approx(b)


def test_a_csv_row_splits_each_interval_into_low_and_high_columns():
    from sim.planning.uncertainty import interval_columns
    row = {"candidate": "x", "replicas_interval90": (3, 5), "ttft_p99_interval90_s": None,
           "interval90_model": 0.26, "latency_interval90_model": 0.2}
    assert interval_columns(row) == {"candidate": "x", "replicas_interval90_low": 3, "replicas_interval90_high": 5,
                                     "ttft_p99_interval90_low_s": None, "ttft_p99_interval90_high_s": None,
                                     "interval90_model": 0.26, "latency_interval90_model": 0.2}


def test_robustness_says_how_many_replicas_cover_the_interval():
    iv = {"replicas_interval90": (3, 5), "ttft_p99_interval90_s": (0.2, 0.9),
          "tpot_p99_interval90_s": (0.02, 0.07), "seeds": 2}
    r = robustness(4, iv, {"ttft_s": 1.0, "tpot_s": 0.06, "e2e_s": None}, 12.0)
    assert r["replicas_for_interval"] == 5 and not r["covers_interval"]
    assert r["usd_per_hour_for_interval"] == 60.0 and r["p99_past_slo"] == ["p99 TPOT"]
    assert r["words"].startswith("90 % interval of replicas needed 3-5; with 5 (+1, $60.00/hour) "
                                 "it meets the SLOs across the interval")
    ok = robustness(5, {**iv, "tpot_p99_interval90_s": (0.02, 0.05)}, {"ttft_s": 1.0, "tpot_s": 0.06}, 12.0)
    assert ok["covers_interval"] and ok["p99_past_slo"] == []
    assert "the recommended 5 cover the whole interval" in ok["words"]
    assert "every p99 interval stays within its SLO" in ok["words"]


positive = st.floats(min_value=1e-3, max_value=1e3, allow_nan=False)
SHARES = st.fixed_dictionaries({k: st.floats(0, 1) for k in ("exact", "interpolated", "derived",
                                                                "extrapolated", "analytic")})


@settings(max_examples=60, deadline=None)
@given(st.lists(positive, min_size=1, max_size=12), SHARES)
def test_an_interval_contains_every_seed_and_so_the_point_estimate(vals, prov):
    b = interval_band(prov)
    lo, hi = latency_interval(vals, b)
    assert lo <= min(vals) * (1 + 1e-12) and hi >= max(vals) * (1 - 1e-12)
    rlo, rhi = rate_interval(min(vals), max(vals), b)
    assert rlo <= min(vals) and rhi >= max(vals)


def _seeds(n: int, mean: float, sd: float) -> list[float]:
    """n values whose logs have exactly this mean and sample sd (an evenly spaced pattern)."""
    z = [i - (n - 1) / 2 for i in range(n)]
    s = math.sqrt(sum(x * x for x in z) / (n - 1))
    return [math.exp(mean + sd * x / s) for x in z]


@settings(max_examples=60, deadline=None)
@given(st.integers(2, 19), st.integers(1, 10), st.floats(-3, 3), st.floats(0.01, 0.5))
def test_fewer_seeds_give_a_wider_interval(n, more, mean, sd):
    few, many = seed_interval(_seeds(n, mean, sd)), seed_interval(_seeds(n + more, mean, sd))
    assert few[0] < many[0] and few[1] > many[1]


ORDER = ["exact", "interpolated", "derived", "extrapolated", "analytic"]  # tags, surest first


@settings(max_examples=80, deadline=None)
@given(SHARES, st.floats(0.01, 1), st.integers(0, 3), st.integers(1, 4))
def test_worse_provenance_gives_a_wider_interval(prov, moved, i, step):
    """Moving step time from any lookup class to a less sure one widens (or keeps) it."""
    src, dst = ORDER[i], ORDER[min(i + step, 4)]
    if prov[src] <= 0 or src == dst:
        return
    worse = {**prov, src: prov[src] * (1 - moved), dst: prov[dst] + prov[src] * moved}
    assert interval_band(worse) >= interval_band(prov) - 1e-12
    assert latency_interval([1.0], interval_band(worse))[1] >= latency_interval([1.0], interval_band(prov))[1] - 1e-12


def test_a_plan_shows_its_90_percent_intervals_in_output_json_csv_and_report(tmp_path, capsys):
    """End to end: a small plan on two seeds; every planner-facing figure carries its interval,
    the recommendation says how robust it is, and the report escapes every value."""
    import json
    from pathlib import Path

    import pandas as pd

    from sim.cli.main import main
    from sim.report.document import to_html
    from sim.report.plan_page import plan_sections

    root = Path(__file__).resolve().parent.parent
    plan = tmp_path / "plan.yaml"
    plan.write_text(f"name: iv\nscenario: {root / 'scenarios' / 'quickstart.yaml'}\ntarget_rate: 4\n"
                    "slo: {ttft_p99_s: 1.0, tpot_p99_s: 0.06}\n"
                    "search: {seeds: 2, requests: 40, max_probes: 4, fleet_checks: 1, fleet_traffic_s: 30, "
                    "headroom_probes: 0}\n"
                    "candidates: {gpu: [h200-sxm], tensor: [1], policy: [continuous]}\n")
    out = tmp_path / "o"
    assert main(["plan", str(plan), "--out", str(out), "--workers", "1", "--report"]) == 0
    text = capsys.readouterr().out
    assert "90 % intervals: replicas needed " in text and "robust? " in text
    assert "90 % interval of replicas needed" in text and "(seed spread over 2 seed(s)" in text
    result = json.loads((out / "plan.json").read_text())
    rec = result["recommended"]
    lo, hi = rec["replicas_interval90"]
    assert lo <= rec["replicas"] <= max(hi, rec["replicas"]) and rec["robust"]["replicas_for_interval"] == hi
    for k in ("usd_per_hour_interval90", "usd_per_m_output_tokens_interval90", "ttft_p99_interval90_s",
              "tpot_p99_interval90_s"):
        assert rec[k][0] <= rec[k][1], k
    assert rec["ttft_p99_interval90_s"][0] <= rec["ttft_p99_s"] <= rec["ttft_p99_interval90_s"][1]
    row = next(r for r in result["candidates"] if r["status"] == "ok")
    a, b = row["sustained_rate_interval90"]
    assert a <= row["sustained_rate"] <= b
    csv_row = pd.read_csv(out / "candidates.csv").iloc[0]
    assert (csv_row["sustained_rate_interval90_low"], csv_row["sustained_rate_interval90_high"]) == \
        pytest.approx((a, b))
    assert csv_row["ttft_p99_interval90_low_s"] <= csv_row["ttft_p99_interval90_high_s"]
    page = (out / "report.html").read_text()
    assert "How robust:" in page and "90 % interval of replicas needed" in page
    rec["candidate"] = "<script>alert(1)</script>"
    rec["stands_on_lookups"] = "<img src=x>"
    hostile = to_html(plan_sections(result))
    assert "<script>alert" not in hostile and "<img src=x>" not in hostile
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in hostile


def test_a_curve_point_carries_the_step_models_interval_and_the_plot_shades_the_p99s():
    """One seed a point: each latency's interval is value / (1 +- b), b by the point's lookups."""
    from pathlib import Path

    from matplotlib.collections import PolyCollection

    from sim.planning.curve import LATENCIES, plot_curves, run_curve

    root = Path(__file__).resolve().parent.parent
    table, knees = run_curve([str(root / "scenarios" / "quickstart.yaml")], [2.0, 6.0], requests=40,
                             executor="sequential")
    for _, row in table.iterrows():
        b = row["interval90_model"]
        assert min(v["interval90"] for v in load_bands().values()) <= b <= max(
            v["interval90"] for v in load_bands().values())
        for c in LATENCIES:
            assert row[f"{c}.low90"] == pytest.approx(row[c] / (1 + b))
            assert row[f"{c}.high90"] == pytest.approx(row[c] / (1 - b))
    fig = plot_curves(table, knees)
    shaded = [a for a in fig.axes[:3] if any(isinstance(c, PolyCollection) for c in a.collections)]
    assert len(shaded) == 3  # TTFT, TPOT and E2E panels shade their p99's interval


def test_an_edited_bands_file_is_read_again(tmp_path):
    from sim.planning.uncertainty import load_bands

    f = tmp_path / "bands.yaml"
    f.write_text("classes:\n  measured: {interval90: 0.25, source: a}\n")
    assert load_bands(str(f))["measured"]["interval90"] == 0.25
    f.write_text("classes:\n  measured: {interval90: 0.125, source: b, tags: [exact]}\n")
    assert load_bands(str(f))["measured"] == {"tags": ["exact"], "interval90": 0.125, "source": "b"}


# ---- the pooled seed term -----------------------------------------------------------------

def _group(name: str, logs: list[float], passed: bool = True, load: float | None = 0.9) -> dict:
    return {"name": name, "passed": passed, "load": load,
            "values": {"ttft_p99": [math.exp(x) for x in logs], "tpot_p99": [], "e2e_p99": [None]}}


def test_pooled_variance_of_given_groups_by_hand():
    # logs (0, 0.2): deviations +-0.1, sum of squares 0.02, 1 df; (0, 0.1, 0.2): 0.01 + 0 + 0.01
    # = 0.02, 2 df; (0.5, 0.9): +-0.2, 0.08, 1 df (a fleet count: load None counts).
    # pooled s^2 = (0.02 + 0.02 + 0.08) / (1 + 2 + 1) = 0.03, s = 0.173205, df 4.
    # Left out: a failing group, one under half its unit's sustained rate, one of one seed.
    groups = [_group("a", [0.0, 0.2]), _group("b", [0.0, 0.1, 0.2]), _group("c", [0.5, 0.9], load=None),
              _group("failed", [0.0, 3.0], passed=False), _group("idle", [0.0, 2.0], load=0.3),
              _group("one", [1.0])]
    pool = seed_pool(groups)
    assert pool["ttft_p99"]["sd_log"] == pytest.approx(0.173205, rel=1e-5)
    assert pool["ttft_p99"]["df"] == 4 and pool["ttft_p99"]["groups"] == ["a", "b", "c"]
    assert pool["tpot_p99"] == {"sd_log": None, "df": 0, "groups": []}  # no group has two values
    assert pool["e2e_p99"]["df"] == 0
    assert seed_pool([_group("half", [0.0, 0.2], load=0.5)])["ttft_p99"]["df"] == 1  # 0.5 counts


def test_the_interval_of_two_seeds_on_a_pool_by_hand():
    # seeds 1 and e^0.2: log-mean 0.1; pool sd 0.1 on 10 df: t(0.95, 10) = 1.812,
    # h = 1.812 x 0.1 x sqrt(1 + 1/2) = 0.1812 x 1.2247449 = 0.2219238;
    # exp(0.1 - 0.2219238) = exp(-0.1219238) = 0.885216, exp(0.3219238) = 1.379780
    lo, hi = seed_interval([1.0, math.exp(0.2)], {"sd_log": 0.1, "df": 10})
    assert (lo, hi) == pytest.approx((0.885216, 1.379780), rel=1e-5)
    # its own two seeds alone: s = 0.141421, t(0.95, 1) = 6.314: h = 6.314 x 0.141421 x 1.2247449
    # = 1.093617, exp(0.1 -+ 1.093617) = 0.370235 .. 3.298992
    assert seed_interval([1.0, math.exp(0.2)]) == pytest.approx((0.370235, 3.298992), rel=1e-5)
    # the latency interval divides by 1 +- b as before
    assert latency_interval([1.0, math.exp(0.2)], 0.25, {"sd_log": 0.1, "df": 10}) == \
        pytest.approx((0.885216 / 1.25, 1.379780 / 0.75), rel=1e-5)


def test_below_four_pooled_df_the_figures_own_seeds_decide():
    vals = [0.8, 1.1]
    assert seed_interval(vals, {"sd_log": 0.01, "df": 3}) == seed_interval(vals)
    assert seed_interval(vals, {"sd_log": None, "df": 0}) == seed_interval(vals)
    assert seed_interval(vals, {"sd_log": 0.01, "df": 4}) != seed_interval(vals)
    assert seed_interval([0.3], {"sd_log": 0.01, "df": 3}) == (0.3, 0.3)  # one seed, no pool


@settings(max_examples=60, deadline=None)
@given(st.integers(MIN_POOL_DF, 20), st.integers(1, 20), st.floats(0.001, 0.5), st.floats(-3, 3),
       st.lists(st.floats(-1, 1), min_size=1, max_size=5))
def test_more_groups_with_the_same_spread_narrow_it_but_never_inside_its_own_seeds(
        k, more, d, centre, own):
    # k (then k + more) groups of two seeds each d apart in log: each adds d^2 / 2 over 1 df,
    # so the pooled sd is d / sqrt(2) for any count and only t(0.95, df) moves (from the
    # fallback threshold up: below it the figure's own seeds decide, whatever the pool)
    few = seed_pool([_group(f"g{i}", [0.0, d]) for i in range(k)])["ttft_p99"]
    many = seed_pool([_group(f"g{i}", [0.0, d]) for i in range(k + more)])["ttft_p99"]
    assert few["sd_log"] == pytest.approx(d / math.sqrt(2)) == pytest.approx(many["sd_log"])
    vals = [math.exp(centre + x) for x in own]
    a, b = seed_interval(vals, few), seed_interval(vals, many)
    assert b[0] >= a[0] * (1 - 1e-12) and b[1] <= a[1] * (1 + 1e-12)
    if b[0] < min(vals) and b[1] > max(vals):  # not its own seeds' range
        assert b[0] > a[0] and b[1] < a[1]  # t(0.95, df) falls while df <= 30
    for lo, hi in (a, b):
        assert lo <= min(vals) * (1 + 1e-12) and hi >= max(vals) * (1 - 1e-12)


def test_a_fleet_stands_on_its_own_kinds_pool_else_the_units_else_its_own_seeds():
    def pool(df: int, sd: float) -> dict:
        return {f: {"sd_log": sd, "df": df, "groups": ["g"] * df} for f in ("ttft_p99", "tpot_p99", "e2e_p99")}

    # fleets with 5 df: theirs; with 3: the units' 40 (an upper bound); both short: own seeds
    assert fleet_pool({"fleet": pool(5, 0.05), "unit": pool(40, 0.2)})["ttft_p99"]["sd_log"] == 0.05
    used = fleet_pool({"fleet": pool(3, 0.05), "unit": pool(40, 0.2)})
    assert used["ttft_p99"]["sd_log"] == 0.2 and used["ttft_p99"]["kind"] == "unit"
    assert "single units' probes" in pool_words(used) and "df 40" in pool_words(used)
    short = fleet_pool({"fleet": pool(3, 0.05), "unit": pool(2, 0.2)})
    assert short["ttft_p99"]["df"] == 3 and "own seeds" in pool_words(short)
    assert seed_interval([0.5, 0.7], short["ttft_p99"]) == seed_interval([0.5, 0.7])
