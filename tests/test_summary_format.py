"""What the summary says and how the tables print it: step-time provenance, the prefix
cache hit rate in tokens, the curve's rate panel, number formatting, memory keys, the
disaggregated replica table."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sim.costmodel.models import load_model
from sim.engine.runner import run
from sim.planning.curve import COLUMNS, plot_curves
from sim.report.text import ROWS, fmt, frame_text, provenance_shares, replica_table
from tests.test_cluster import scenario as fleet_scenario
from tests.test_engine import ROOT, scenario


def _row(label_start: str):
    return next(f for label, f in ROWS if label.startswith(label_start))


# ---- 1. what the step time stands on ------------------------------------------------

def test_step_time_row_counts_only_exact_and_interpolated_points_as_measured():
    extrapolated = {"exact": 0.0, "interpolated": 0.0, "derived": 0.0,
                    "extrapolated": 0.789, "analytic": 0.211}
    assert _row("step time")({"lookup_provenance": extrapolated}) == "0% / 0% / 79% / 21%"
    mixed = {"exact": 0.3, "interpolated": 0.2, "derived": 0.004, "extrapolated": 0.496, "analytic": 0.0}
    assert provenance_shares(mixed) == "50% / <1% / 50% / 0%"
    assert provenance_shares({"exact": 0.996, "analytic": 0.004}) == ">99% / 0% / 0% / <1%"


def test_tp4_70b_on_h100_shows_no_measured_step_time_and_mostly_derived():
    # the H100's tables are the H200's rows scaled (profile.yaml tables_from): derived
    out = run(ROOT / "scenarios" / "llama2_70b_tp.yaml", {"workload.num_requests": 30})
    p = out.summary["lookup_provenance"]
    assert p["exact"] + p["interpolated"] == 0.0 and p["derived"] > 0.5
    assert _row("step time")(out.summary).startswith("0% / ")


# ---- 2. prefix cache hit rate: tokens, as vLLM counts it ----------------------------

def test_hit_rate_is_cached_over_looked_up_prompt_tokens_of_every_request():
    sc = scenario(kv={"prefix_caching": True},
                  workload={"num_requests": 3, "arrival": {"kind": "constant", "rate": 0.1},
                            "prompt": {"kind": "fixed", "value": 200},
                            "output": {"kind": "fixed", "value": 10},
                            "shared_prefix": {"tokens": 1024, "fraction": 1.0}})
    pc = run(sc).summary["prefix_cache"]
    # requests 2 and 3 each reuse the 1,024-token system prompt of their 1,224
    assert pc["hit_rate"] == pytest.approx(2 * 1024 / (3 * 1224))
    assert pc["block_hit_rate"] == pytest.approx(2 * 64 / (3 * (1224 // 16)))


def test_prompts_without_a_shared_prefix_count_in_the_hit_rate():
    out = run(ROOT / "scenarios" / "quickstart.yaml", {
        "kv.prefix_caching": True, "workload.num_requests": 120,
        "workload.shared_prefix": {"tokens": 1000, "fraction": 0.8, "groups": 2}})
    pc, req = out.summary["prefix_cache"], out.requests
    looked_up = req[req.queue_s.notna()]
    assert pc["query_tokens"] == looked_up.prompt_tokens.sum()
    assert pc["hit_tokens"] == req.cached_tokens.sum()
    assert pc["hit_rate"] == pytest.approx(req.cached_tokens.sum() / looked_up.prompt_tokens.sum())
    # nearly every hashed block hits, but most prompt tokens carry no hash at all
    assert pc["block_hit_rate"] > 0.9 and pc["hit_rate"] < 0.4


def test_a_fleet_hit_rate_comes_from_the_summed_token_counts():
    wl = {"num_requests": 60, "arrival": {"kind": "poisson", "rate": 20},
          "prompt": {"kind": "uniform", "low": 64, "high": 512},
          "output": {"kind": "uniform", "low": 1, "high": 32},
          "shared_prefix": {"tokens": 512, "fraction": 0.5, "groups": 2}}
    out = run(fleet_scenario({"groups": [{"count": 3}]}, workload=wl, kv={"prefix_caching": True}))
    pc, req = out.summary["prefix_cache"], out.requests
    looked_up = req[req.queue_s.notna()]
    assert pc["hit_rate"] == pytest.approx(req.cached_tokens.sum() / looked_up.prompt_tokens.sum())


# ---- 3. the curve's fourth panel ------------------------------------------------------

def _curve(goodput):
    recs = [{"scenario": "a", "rate": r, "seed": 0, "goodput.requests_per_s": g,
             "request_throughput": 0.9 * r} for r, g in zip((1.0, 2.0), goodput, strict=True)]
    for rec in recs:
        for c in COLUMNS:
            rec.setdefault(c, 0.1)
    table = pd.DataFrame.from_records(recs, columns=COLUMNS)
    return table, pd.DataFrame({"scenario": ["a"], "knee_rate": [None], "ttft_bound_s": [2.0]})


def test_without_slos_the_rate_panel_shows_throughput_and_says_so():
    table, knees = _curve([None, None])
    ax = plot_curves(table, knees).axes[3]
    assert ax.get_title().startswith("throughput")
    assert list(ax.lines[0].get_ydata()) == pytest.approx([0.9, 1.8])


def test_with_slos_the_rate_panel_shows_goodput():
    table, knees = _curve([0.5, 1.0])
    ax = plot_curves(table, knees).axes[3]
    assert ax.get_title().startswith("goodput")
    assert list(ax.lines[0].get_ydata()) == pytest.approx([0.5, 1.0])


def test_result_tables_print_missing_values_as_dash_and_booleans_as_yaml():
    table, knees = _curve([None, None])
    text = frame_text(table, ["scenario", "rate", "seed"])
    assert "None" not in text and "nan" not in text.lower()
    assert text.splitlines()[1].split()[COLUMNS.index("goodput.requests_per_s")] == "-"
    sweep = pd.DataFrame({"kv.prefix_caching": [False, True], "request_throughput": [1070.4, 2.5]})
    lines = frame_text(sweep, ["kv.prefix_caching"]).splitlines()
    assert lines[1].split() == ["false", "1,070"] and lines[2].split() == ["true", "2.50"]
    assert frame_text(knees, ["scenario"]).splitlines()[1].split() == ["a", "-", "2.00"]


# ---- 4. number formatting, memory keys, replica table ------------------------------

@pytest.mark.parametrize("value, unit, text", [
    (1070.4, "", "1,070"), (3460.0, "", "3,460"), (28302.4, "", "28,302"), (999.7, "", "1,000"),
    (9.0, "", "9.00"), (4.7, "", "4.70"), (20.8, "", "20.8"), (0.01234, "", "0.0123"),
    (0.2555, "ms", "256"), (0.0138, "ms", "13.8"), (1495, "", "1,495"), (7, "", "7"),
    (None, "", "-"), (float("nan"), "", "-"), (True, "", "true"), (np.bool_(False), "", "false"),
])
def test_table_cells_have_commas_from_a_thousand_and_three_figures_below(value, unit, text):
    assert fmt(value, unit) == text


@given(st.floats(1e-3, 1e12))
def test_a_table_number_reads_back_within_rounding(v):
    text = fmt(v)
    assert "e" not in text
    back = float(text.replace(",", ""))
    assert math.isclose(back, v, rel_tol=5e-3, abs_tol=0.5)


def test_memory_budget_keys_say_gib():
    s = run(scenario(workload={"num_requests": 2, "arrival": {"kind": "constant", "rate": 1.0},
                               "prompt": {"kind": "fixed", "value": 64},
                               "output": {"kind": "fixed", "value": 4}})).summary
    mem = s["memory_gib"]
    assert set(mem) == {"gpu_gib", "usable_gib", "weights_gib", "activations_gib",
                        "attention_scratch_gib", "kv_gib", "kv_tokens"}
    assert mem["weights_gib"] == pytest.approx(load_model("llama-3-8b").weight_bytes / 2**30)


def test_a_prefill_replica_row_counts_prefills_in_both_columns():
    wl = {"num_requests": 60, "arrival": {"kind": "poisson", "rate": 8},
          "prompt": {"kind": "uniform", "low": 256, "high": 1024},
          "output": {"kind": "uniform", "low": 4, "high": 32}}
    out = run(fleet_scenario({"groups": [{"name": "p", "role": "prefill"},
                                         {"name": "d", "role": "decode"}]}, workload=wl))
    rows = out.summary["per_replica"]
    pre = next(r for r in rows if r["role"] == "prefill")
    assert pre["prefills"] == 60 and pre["request_throughput"] == 0.0
    assert pre["prefill_throughput"] == pytest.approx(60 / out.summary["duration_s"])
    line = next(ln for ln in replica_table(rows).splitlines() if ln.startswith(pre["replica"]))
    assert line.split()[3:5] == ["60", fmt(pre["prefill_throughput"])]


def test_sweep_table_prints_swept_booleans_as_the_yaml_does(tmp_path, llmsim):
    res = llmsim("sweep", str(ROOT / "scenarios" / "quickstart.yaml"),
                 "--grid", "kv.prefix_caching=false,true", "--set", "workload.num_requests=10",
                 "--executor", "sequential", "--out", str(tmp_path / "sw"))
    assert res.returncode == 0, res.stderr
    first = [ln.split()[0] for ln in res.stdout.splitlines()[1:3]]
    assert first == ["false", "true"]


def test_the_busy_row_shows_a_dash_where_kernel_time_is_not_modelled():
    from sim.report.text import ROWS

    busy = next(f for name, f in ROWS if name.startswith("busy"))
    assert busy({"gpu_busy_fraction": 0.5, "gpu_kernel_fraction": None}) == "50% / -"
    assert busy({"gpu_busy_fraction": 0.5, "gpu_kernel_fraction": 0.003}) == "50% / <1%"
