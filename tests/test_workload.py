"""Workloads: arrival processes, length distributions, traces and their errors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.io.specload import ROOT, SpecError, build
from sim.workload import traces
from sim.workload.requests import Workload, WorkloadSpec, generate

SCENARIO = "scenario.yaml"  # the file name errors should report for spec problems
FIXED = {"prompt": {"kind": "fixed", "value": 100}, "output": {"kind": "fixed", "value": 10}}
AZURE_CONV = {"path": "data/traces/azure_2023_conv.csv", "format": "azure"}
MOONCAKE = {"path": "data/traces/mooncake_conversation.jsonl", "format": "mooncake"}


def make(data: dict, seed: int = 0, base_dir: Path | None = None) -> Workload:
    spec = build(WorkloadSpec, data, file=SCENARIO, path="workload")
    return generate(spec, np.random.default_rng(seed), file=SCENARIO, base_dir=base_dir)


def error(data: dict, base_dir: Path | None = None) -> str:
    with pytest.raises(SpecError) as e:
        make(data, base_dir=base_dir)
    text = str(e.value)
    assert "\n" not in text
    return text


def write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


# ---- arrivals ---------------------------------------------------------------------


def test_poisson_mean_interarrival_is_one_over_rate():
    w = make({"num_requests": 20_000, "arrival": {"kind": "poisson", "rate": 5.0}, **FIXED})
    gaps = np.diff(w.arrival_s)
    assert len(w) == 20_000 and w.arrival_s[0] == 0.0
    assert gaps.mean() == pytest.approx(0.2, rel=0.03)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, rel=0.05)


def test_gamma_with_cv_3_has_interarrival_cv_3():
    w = make({"num_requests": 200_000, "arrival": {"kind": "gamma", "rate": 5.0, "cv": 3.0}, **FIXED})
    gaps = np.diff(w.arrival_s)
    assert gaps.mean() == pytest.approx(0.2, rel=0.05)
    assert gaps.std() / gaps.mean() == pytest.approx(3.0, rel=0.05)


def test_constant_arrivals_are_exactly_evenly_spaced():
    w = make({"num_requests": 1000, "arrival": {"kind": "constant", "rate": 4.0}, **FIXED})
    np.testing.assert_array_equal(w.arrival_s, np.arange(1000) / 4.0)


def test_duration_s_stops_arrivals_before_it():
    w = make({"duration_s": 10.0, "arrival": {"kind": "constant", "rate": 2.0}, **FIXED})
    assert len(w) == 20 and w.arrival_s[-1] == 9.5
    p = make({"duration_s": 100.0, "arrival": {"kind": "poisson", "rate": 50.0}, **FIXED})
    assert p.arrival_s.max() < 100.0 and len(p) == pytest.approx(5000, rel=0.05)


def test_duration_and_num_requests_stop_at_whichever_comes_first():
    spec = {"arrival": {"kind": "poisson", "rate": 10.0}, **FIXED}
    assert len(make({"num_requests": 50, "duration_s": 1000.0, **spec})) == 50
    assert make({"num_requests": 10**6, "duration_s": 10.0, **spec}).arrival_s.max() < 10.0


def test_same_seed_gives_identical_workload_and_another_seed_a_different_one():
    data = {
        "num_requests": 500,
        "arrival": {"kind": "gamma", "rate": 3.0, "cv": 2.0},
        "prompt": {"kind": "lognormal", "mean": 1000, "sigma": 0.8, "max": 8192},
        "output": {"kind": "uniform", "low": 1, "high": 512},
    }
    a, b, c = make(data, seed=7), make(data, seed=7), make(data, seed=8)
    for name in ("arrival_s", "prompt_tokens", "output_tokens", "max_tokens"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name))
    assert not np.array_equal(a.arrival_s, c.arrival_s)
    assert not np.array_equal(a.prompt_tokens, c.prompt_tokens)


# ---- lengths ----------------------------------------------------------------------


def test_fixed_lengths_are_exact_and_max_tokens_is_the_fixed_output():
    w = make({"num_requests": 100, "arrival": {"kind": "poisson", "rate": 1.0}, **FIXED})
    assert (w.prompt_tokens == 100).all() and (w.output_tokens == 10).all()
    assert (w.max_tokens == 10).all()
    assert w.prompt_tokens.dtype == np.int64 and w.arrival_s.dtype == np.float64


def test_lognormal_respects_min_and_max_and_its_mean():
    w = make({
        "num_requests": 50_000,
        "arrival": {"kind": "poisson", "rate": 1.0},
        "prompt": {"kind": "lognormal", "mean": 1000, "sigma": 1.5, "min": 64, "max": 4096},
        "output": {"kind": "lognormal", "median": 200, "sigma": 0.5},
    })
    assert w.prompt_tokens.min() == 64 and w.prompt_tokens.max() == 4096
    assert np.median(w.output_tokens) == pytest.approx(200, rel=0.03)
    assert (w.max_tokens == w.output_tokens.max()).all()  # unbounded: the largest drawn
    u = make({"num_requests": 50_000, "arrival": {"kind": "poisson", "rate": 1.0},
              "prompt": {"kind": "lognormal", "mean": 1000, "sigma": 0.5}, "output": FIXED["output"]})
    assert u.prompt_tokens.mean() == pytest.approx(1000, rel=0.02)


def test_uniform_lengths_cover_both_bounds_inclusive():
    w = make({"num_requests": 5000, "arrival": {"kind": "poisson", "rate": 1.0},
              "prompt": {"kind": "uniform", "low": 5, "high": 8}, "output": {"kind": "uniform", "low": 1, "high": 3}})
    assert set(w.prompt_tokens.tolist()) == {5, 6, 7, 8}
    assert (w.max_tokens == 3).all()


def test_lengths_file_keeps_prompt_and_output_paired():
    w = make({"num_requests": 2000, "arrival": {"kind": "poisson", "rate": 1.0},
              "lengths": {"path": "data/traces/sharegpt_lengths.csv"}})
    rows = np.loadtxt(ROOT / "data/traces/sharegpt_lengths.csv", delimiter=",", skiprows=1, usecols=(0, 1))
    pairs = {(int(p), int(o)) for p, o in rows}
    assert all(pair in pairs for pair in zip(w.prompt_tokens.tolist(), w.output_tokens.tolist(), strict=True))
    assert (w.max_tokens == int(rows[:, 1].max())).all()


def test_file_kind_samples_one_column_with_replacement():
    w = make({"num_requests": 3000, "arrival": {"kind": "poisson", "rate": 1.0},
              "prompt": {"kind": "file", "path": "data/traces/arxiv_summarization_lengths.csv",
                         "column": "num_prefill_tokens"},
              "output": {"kind": "fixed", "value": 16}})
    assert 1 <= w.prompt_tokens.min() and w.prompt_tokens.max() <= 4054
    assert w.prompt_tokens.mean() == pytest.approx(2588, rel=0.05)


def test_max_output_tokens_caps_outputs_and_sets_max_tokens():
    w = make({"num_requests": 1000, "arrival": {"kind": "poisson", "rate": 1.0}, "max_output_tokens": 100,
              "prompt": FIXED["prompt"], "output": {"kind": "uniform", "low": 50, "high": 500}})
    assert w.output_tokens.max() == 100 and (w.max_tokens == 100).all()


# ---- traces -----------------------------------------------------------------------


def test_azure_conv_trace_loads_an_hour_of_19366_requests():
    traces._CACHE.clear()  # parsed from the file, not the cache (its speed: benchmarks/speed/run_speed.py)
    w = make({"trace": AZURE_CONV})
    assert len(w) == 19_366
    assert w.arrival_s[0] == 0.0 and 3400 < w.arrival_s[-1] <= 3600
    assert (np.diff(w.arrival_s) >= 0).all()
    assert w.prompt_tokens.mean() == pytest.approx(1155, abs=1)
    assert w.output_tokens.mean() == pytest.approx(211, abs=1)
    assert (w.max_tokens == w.output_tokens.max()).all() and w.prefix_hashes is None


def test_time_scale_2_doubles_the_trace_span():
    one = make({"trace": AZURE_CONV})
    two = make({"trace": {**AZURE_CONV, "time_scale": 2.0}})
    np.testing.assert_allclose(two.arrival_s, 2 * one.arrival_s)
    np.testing.assert_array_equal(two.prompt_tokens, one.prompt_tokens)


def test_limit_and_start_s_pick_a_window_of_the_trace():
    full = make({"trace": AZURE_CONV})
    w = make({"trace": {**AZURE_CONV, "limit": 100}})
    assert len(w) == 100
    np.testing.assert_array_equal(w.prompt_tokens, full.prompt_tokens[:100])
    late = make({"trace": {**AZURE_CONV, "start_s": 1800.0, "limit": 10}})
    i0 = int(np.searchsorted(full.arrival_s, 1800.0))
    np.testing.assert_allclose(late.arrival_s, full.arrival_s[i0:i0 + 10] - 1800.0)
    assert len(make({"trace": AZURE_CONV, "num_requests": 7})) == 7
    assert make({"trace": AZURE_CONV, "duration_s": 60.0}).arrival_s.max() < 60.0


def test_azure_code_trace_is_burstier_than_conv():
    code = make({"trace": {"path": "data/traces/azure_2023_code.csv", "format": "azure"}})
    conv = make({"trace": AZURE_CONV})
    cv = [np.diff(w.arrival_s).std() / np.diff(w.arrival_s).mean() for w in (code, conv)]
    assert len(code) == 8819 and cv[0] > 5 * cv[1]


def test_mooncake_trace_loads_12031_requests_with_prefix_hashes():
    w = make({"trace": MOONCAKE})
    assert len(w) == 12_031 and w.block_tokens == 512
    assert w.arrival_s[0] == 0.0 and w.arrival_s[-1] == pytest.approx(3536.999)
    assert len(w.prefix_hashes) == len(w)
    blocks = np.array([len(h) for h in w.prefix_hashes])
    np.testing.assert_array_equal(blocks, -(-w.prompt_tokens // 512))
    assert w.prefix_hashes[0][0] == w.prefix_hashes[1][0] == 0  # a shared first block


def test_redrawn_prompts_drop_prefix_hashes_and_redrawn_outputs_keep_them():
    p = make({"trace": MOONCAKE, "prompt": {"kind": "fixed", "value": 64}})
    o = make({"trace": MOONCAKE, "output": {"kind": "fixed", "value": 8}})
    assert p.prefix_hashes is None and p.block_tokens is None and (p.prompt_tokens == 64).all()
    assert o.block_tokens == 512 and (o.output_tokens == 8).all() and (o.max_tokens == 8).all()


def test_synthetic_arrivals_over_a_trace_take_its_rows_in_order_wrapping_around():
    w = make({"trace": {**AZURE_CONV, "limit": 3}, "num_requests": 7,
              "arrival": {"kind": "constant", "rate": 1.0}})
    full = make({"trace": AZURE_CONV})
    np.testing.assert_array_equal(w.prompt_tokens, full.prompt_tokens[[0, 1, 2, 0, 1, 2, 0]])
    np.testing.assert_array_equal(w.arrival_s, np.arange(7.0))


def test_csv_trace_is_rebased_to_its_first_request_in_file_order(tmp_path):
    write(tmp_path, "t.csv", "arrival_s,prompt_tokens,output_tokens\n10,20,2\n\n11,30,3\n12.5,10,1\n")
    w = make({"trace": {"path": "t.csv"}}, base_dir=tmp_path)
    np.testing.assert_array_equal(w.arrival_s, [0.0, 1.0, 2.5])
    np.testing.assert_array_equal(w.prompt_tokens, [20, 30, 10])
    np.testing.assert_array_equal(w.max_tokens, [3, 3, 3])


def test_csv_trace_out_of_time_order_is_refused_at_its_line(tmp_path):
    write(tmp_path, "t.csv", "arrival_s,prompt_tokens,output_tokens\n12.5,10,1\n\n10,20,2\n")
    with pytest.raises(SpecError) as e:
        make({"trace": {"path": "t.csv"}}, base_dir=tmp_path)
    assert str(e.value) == (f"{tmp_path / 't.csv'}: line 4: arrival_s: 2.5 s before the previous "
                            "row's (line 2; allowed: non-decreasing arrival times)")


def test_relative_paths_resolve_against_the_scenario_folder_before_the_root(tmp_path):
    (tmp_path / "data/traces").mkdir(parents=True)
    write(tmp_path / "data/traces", "azure_2023_conv.csv",
          "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.5,5,6\n")
    assert len(make({"trace": AZURE_CONV}, base_dir=tmp_path)) == 1
    assert len(make({"trace": AZURE_CONV}, base_dir=tmp_path / "data")) == 19_366  # falls back to ROOT


# ---- bad input --------------------------------------------------------------------

SYNTH = {"num_requests": 10, "arrival": {"kind": "poisson", "rate": 1.0}}


@pytest.mark.parametrize("data, expected", [
    ({**SYNTH, **FIXED, "arrival": {"kind": "weibull", "rate": 1.0}},
     "scenario.yaml: workload.arrival.kind: unknown 'weibull' (allowed: poisson, gamma, constant, trace, profile, diurnal)"),
    ({**SYNTH, **FIXED, "arrival": {"kind": "poisson", "rate": -1.0}},
     "scenario.yaml: workload.arrival.rate: -1.0 is out of range (allowed: > 0)"),
    ({**SYNTH, **FIXED, "arrival": {"kind": "gamma", "rate": 1.0}},
     "scenario.yaml: workload.arrival.cv: missing required field for kind 'gamma' (its fields: rate, cv)"),
    ({**FIXED, "arrival": {"kind": "trace"}},
     "scenario.yaml: workload.arrival.kind: 'trace' needs workload.trace"),
    ({**FIXED, "arrival": {"kind": "poisson", "rate": 1.0}},
     "scenario.yaml: workload.num_requests: arrival kind 'poisson' needs num_requests or duration_s"),
    ({**SYNTH, "prompt": {"kind": "lognormal", "mean": 100, "sigma": 1, "min": 50, "max": 10},
      "output": FIXED["output"]},
     "scenario.yaml: workload.prompt.min: 50 > max=10 (allowed: min <= max)"),
    ({**SYNTH, "prompt": {"kind": "fixed", "value": 10, "mean": 5}, "output": FIXED["output"]},
     "scenario.yaml: workload.prompt.mean: not used by kind 'fixed' (its fields: value)"),
    ({**SYNTH, "prompt": {"kind": "fixed", "value": 0}, "output": FIXED["output"]},
     "scenario.yaml: workload.prompt.value: 0 is out of range (allowed: >= 1)"),
    ({**SYNTH, "prompt": FIXED["prompt"]},
     "scenario.yaml: workload.output: missing required field"),
    ({"trace": {**AZURE_CONV, "format": "parquet"}},
     "scenario.yaml: workload.trace.format: unknown 'parquet' (allowed: csv, azure, mooncake)"),
    ({"trace": {"path": "data/traces/nope.csv"}},
     "scenario.yaml: workload.trace.path: file not found: 'data/traces/nope.csv'"),
    ({"trace": {**AZURE_CONV, "start_s": 99999.0}},
     "scenario.yaml: workload.trace.start_s: 99999.0 is past the last request"),
    ({**SYNTH, "lengths": {"path": "data/traces/sharegpt_lengths.csv", "output_column": "decode"}},
     "scenario.yaml: workload.lengths.output_column: no column 'decode' in sharegpt_lengths.csv (line 1 names 4 columns;"),
    ({**SYNTH, **FIXED, "lengths": {"path": "data/traces/sharegpt_lengths.csv"}},
     "scenario.yaml: workload.lengths: give either lengths or prompt/output, not both"),
    ({"trace": {"path": "data/traces/azure_2023_conv.csv"}},  # format defaults to csv
     "azure_2023_conv.csv: line 1: no column 'arrival_s' (needed: arrival_s, prompt_tokens, output_tokens; is trace.format right?)"),
])
def test_bad_spec_is_a_one_line_error_naming_file_and_field(data, expected):
    assert expected in error(data)


@pytest.mark.parametrize("text, expected", [
    ("arrival_s,prompt_tokens,output_tokens\n0,10,5\n1,abc,5\n", "t.csv: line 3: prompt_tokens: not a number (allowed: integers from 1 to 10,000,000)"),
    ("arrival_s,prompt_tokens,output_tokens\n0,10,5\n1,10,-5\n", "t.csv: line 3: output_tokens: out of range (allowed: integers from 1 to 10,000,000)"),
    ("arrival_s,prompt_tokens,output_tokens\n0,10,5\n\n1,10\n", "t.csv: line 4: 2 fields, expected 3 (as many as the header line names)"),
    ("arrival_s,prompt_tokens,output_tokens\n-1,10,5\n", "t.csv: line 2: arrival_s: out of range (allowed: numbers from 0 to 1,000,000,000)"),
    ("arrival_s,prompt_tokens,output_tokens\n0,1.5,5\n", "t.csv: line 2: prompt_tokens: out of range (allowed: integers from 1 to 10,000,000)"),
    ("arrival_s,prompt_tokens,output_tokens\n", "t.csv: no data rows"),
])
def test_malformed_csv_trace_row_names_the_trace_file_and_line(tmp_path, text, expected):
    write(tmp_path, "t.csv", text)
    msg = error({"trace": {"path": "t.csv"}}, base_dir=tmp_path)
    assert msg.startswith(str(tmp_path)) and expected in msg


def test_malformed_azure_timestamp_names_the_line(tmp_path):
    write(tmp_path, "a.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,5,6\nyesterday,5,6\n")
    msg = error({"trace": {"path": "a.csv", "format": "azure"}}, base_dir=tmp_path)
    assert "a.csv: line 3: TIMESTAMP: not a date-time" in msg


@pytest.mark.parametrize("line, expected", [
    ('{"timestamp": 5, "input_length": 10}', "m.jsonl: line 2: no key 'output_length' (expected a JSON object with keys timestamp, input_length, output_length, hash_ids)"),
    ('{"timestamp": 5, "input_length": 10, "output_length": 2, "hash_ids": [1, "x"]}', "m.jsonl: line 2: hash_ids: not a list of integers below 2**63 (allowed: a list of integers below 2**63)"),
    ('not json', "m.jsonl: line 2: not valid JSON (expected a JSON object"),
    ('{"timestamp": "soon", "input_length": 10, "output_length": 2, "hash_ids": []}', "m.jsonl: line 2: timestamp: a JSON string (allowed: a number)"),
])
def test_malformed_mooncake_line_names_the_trace_file_and_line(tmp_path, line, expected):
    good = '{"timestamp": 0, "input_length": 10, "output_length": 2, "hash_ids": [0]}'
    write(tmp_path, "m.jsonl", good + "\n" + line + "\n")
    assert expected in error({"trace": {"path": "m.jsonl", "format": "mooncake"}}, base_dir=tmp_path)


def test_bad_length_file_value_names_the_length_file_and_line(tmp_path):
    write(tmp_path, "l.csv", "num_prefill_tokens,num_decode_tokens\n10,5\n0,5\n")
    msg = error({**SYNTH, "lengths": {"path": "l.csv"}}, base_dir=tmp_path)
    assert "l.csv: line 3: num_prefill_tokens: out of range (allowed: integers from 1 to 10,000,000)" in msg


def test_edited_trace_file_is_parsed_again(tmp_path):
    p = write(tmp_path, "t.csv", "arrival_s,prompt_tokens,output_tokens\n0,10,5\n")
    assert len(make({"trace": {"path": "t.csv"}}, base_dir=tmp_path)) == 1
    p.write_text("arrival_s,prompt_tokens,output_tokens\n0,10,5\n1,10,5\n")
    assert len(make({"trace": {"path": "t.csv"}}, base_dir=tmp_path)) == 2


# ---- invariants -------------------------------------------------------------------


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    kind=st.sampled_from(["poisson", "gamma", "constant"]),
    n=st.integers(1, 300),
    cap=st.one_of(st.none(), st.integers(1, 600)),
)
def test_any_synthetic_workload_is_sorted_with_outputs_within_max_tokens(seed, kind, n, cap):
    arrival = {"kind": kind, "rate": 3.0, **({"cv": 2.5} if kind == "gamma" else {})}
    w = make({"num_requests": n, "arrival": arrival, "max_output_tokens": cap,
              "prompt": {"kind": "lognormal", "mean": 500, "sigma": 1.0, "max": 4096},
              "output": {"kind": "uniform", "low": 1, "high": 512}}, seed=seed)
    assert len(w) == n == len(w.prompt_tokens) == len(w.output_tokens) == len(w.max_tokens)
    assert w.arrival_s[0] == 0.0 and (np.diff(w.arrival_s) >= 0).all()
    assert (w.output_tokens >= 1).all() and (w.output_tokens <= w.max_tokens).all()
    assert (w.prompt_tokens >= 1).all() and not w.arrival_s.flags.writeable


# ---- time-varying rates (sim/workload/profile.py) ------------------------------------


def _expected(rate, lo: float, hi: float, k: int = 20_001) -> float:
    """Trapezoid integral of rate(t) over [lo, hi], independent of the code under test."""
    t = np.linspace(lo, hi, k)
    r = rate(t)
    return float(np.sum(0.5 * (r[1:] + r[:-1]) * np.diff(t)))


def test_diurnal_counts_per_window_match_the_rates_integral_within_4_sigma():
    mean, ratio, period = 5.0, 4.0, 7200.0
    w = make({"duration_s": 2 * period, "arrival": {"kind": "diurnal", "rate": mean,
              "peak_to_trough": ratio, "period_s": period}, **FIXED}, seed=3)
    a = (ratio - 1) / (ratio + 1)  # peak/trough = (1+a)/(1-a); peak at period/2

    def rate(t):
        return mean * (1 + a * np.cos(2 * np.pi * (t - period / 2) / period))
    edges = np.arange(0, 2 * period + 1, 600.0)
    counts = np.histogram(w.arrival_s, bins=edges)[0]
    for lo, hi, c in zip(edges[:-1], edges[1:], counts, strict=True):
        exp = _expected(rate, lo, hi)
        assert abs(c - exp) < 4 * np.sqrt(exp) + 1, (lo, c, exp)
    assert counts.max() / counts.min() > 3.0  # the peak-to-trough shape is there


def test_piecewise_linear_profile_counts_match_trapezoids(tmp_path):
    p = write(tmp_path, "day.csv", "time_s,rate\n0,1\n1000,9\n2000,9\n3000,0\n")
    w = make({"duration_s": 4000, "arrival": {"kind": "profile", "path": str(p)}, **FIXED}, seed=1)
    edges = np.array([0, 500, 1000, 1500, 2000, 2500, 3000, 4000.0])
    counts = np.histogram(w.arrival_s, bins=edges)[0]
    exp = [1500, 3500, 4500, 4500, 3375, 1125, 0]  # by hand: trapezoids of the knots
    for c, e in zip(counts, exp, strict=True):
        assert abs(c - e) <= 4 * np.sqrt(e) + 1, (c, e)
    assert w.arrival_s.max() < 3000  # rate 0 after the last knot: no arrivals


def test_constant_profile_reproduces_poisson_arrivals(tmp_path):
    p = write(tmp_path, "flat.csv", "time_s,rate\n0,3\n100,3\n")
    flat = make({"num_requests": 20_000, "arrival": {"kind": "profile", "path": str(p)}, **FIXED})
    pois = make({"num_requests": 20_000, "arrival": {"kind": "poisson", "rate": 3.0}, **FIXED})
    np.testing.assert_allclose(flat.arrival_s, pois.arrival_s, rtol=1e-9, atol=1e-9)
    gaps = np.diff(flat.arrival_s)
    assert gaps.mean() == pytest.approx(1 / 3, rel=0.03)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, rel=0.05)


def test_profile_with_cv_keeps_the_mean_rate_and_adds_burstiness(tmp_path):
    p = write(tmp_path, "flat.csv", "time_s,rate\n0,4\n")
    w = make({"num_requests": 100_000, "arrival": {"kind": "profile", "path": str(p), "cv": 3.0},
              **FIXED})
    gaps = np.diff(w.arrival_s)
    assert gaps.mean() == pytest.approx(0.25, rel=0.05)
    assert gaps.std() / gaps.mean() == pytest.approx(3.0, rel=0.05)


def test_shipped_illustrative_day_profile_loads():
    w = make({"duration_s": 86_400, "arrival": {"kind": "profile",
              "path": "data/profiles/illustrative_day.csv"}, **FIXED})
    # by hand: trapezoids of the shipped knots (relative rate, peak 1.0/s)
    exp = (0.35 * 14400 + 0.375 * 7200 + 0.725 * 10800 + 1.0 * 10800 + 0.975 * 10800
           + 0.875 * 10800 + 0.725 * 10800 + 0.525 * 10800)
    assert abs(len(w) - exp) < 4 * np.sqrt(exp)


@pytest.mark.parametrize(("data", "text"), [
    ({"kind": "profile"}, "workload.arrival.path: missing required field for kind 'profile'"),
    ({"kind": "diurnal", "rate": 1.0, "period_s": 10},
     "workload.arrival.peak_to_trough: missing required field for kind 'diurnal'"),
    ({"kind": "diurnal", "rate": 1.0, "period_s": 10, "peak_to_trough": 0.5},
     "workload.arrival.peak_to_trough"),
    ({"kind": "poisson", "rate": 1.0, "period_s": 10}, "workload.arrival.period_s: not used by kind 'poisson'"),
])
def test_profile_spec_errors_are_one_line(data, text):
    assert text in error({"duration_s": 10, "arrival": data, **FIXED})


@pytest.mark.parametrize(("body", "text"), [
    ("t,rate\n0,1\n", "line 1: header must be 'time_s,rate'"),
    ("time_s,rate\n5,1\n", "line 2: the first time_s is 5"),
    ("time_s,rate\n0,1\n0,2\n", "line 3: time_s 0 is not after 0"),
    ("time_s,rate\n0,-1\n", "line 2:"),
    ("time_s,rate\n0,x\n", "line 2:"),
    ("time_s,rate\n0,0\n", "no positive rate"),
])
def test_bad_profile_csv_names_the_line(tmp_path, body, text):
    p = write(tmp_path, "bad.csv", body)
    msg = error({"duration_s": 10, "arrival": {"kind": "profile", "path": str(p)}, **FIXED})
    assert "bad.csv" in msg and text in msg
