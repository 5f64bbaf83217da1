"""Fitting runtimes to serving logs (sim/fit/logfit.py), replaying logs (sim/fit/replay.py), and
step-time jitter (sim/costmodel/jitter.py)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from sim import run
from sim.cli.main import main
from sim.costmodel.jitter import (
    BLOCK,
    BatchLevel,
    FactorStream,
    JitteredLatency,
    JitterSpec,
    Persistence,
    decode_levels,
    fit_persistence,
    jittered,
    sample,
)
from sim.costmodel.latency import StepLatency
from sim.costmodel.models import load_model
from sim.costmodel.profiles import load_profile
from sim.costmodel.runtime import RuntimeSpec, load_runtime
from sim.fit.logfit import fit_log
from sim.fit.replay import replay
from sim.fit.servinglog import (
    decode_max_ctx,
    kv_blocks,
    prefill_lengths,
    read_requests_log,
    read_steps_log,
)
from sim.io.specload import SpecError

ROOT = Path(__file__).resolve().parent.parent
LIVE = ROOT / "data" / "live"
STEPS, REQUESTS = LIVE / "cb_r16_steps.csv", LIVE / "cb_r16_requests.csv"
SCENARIO = ROOT / "scenarios" / "azure_conv_reference.yaml"

# the host terms and jitter the synthetic log is generated with
TRUE = dict(serial_ms_per_step=2.0, serial_ms_per_new_prefill_shape=40.0, host_ms_per_prefill_seq=0.5,
            gpu_scale=1.0, gpu_scale_decode=1.2)
TRUE_SIGMA = 0.05  # lognormal jitter of every step


WARM_AT = (40, 200, 440)  # prefill steps whose new lengths were met before logging (no stall)


def _synthetic_log(folder: Path, seed: int = 3) -> None:
    """A serving log written by the simulator's own StepLatency with known terms:
    decode steps of random shapes, prefill steps whose prompt lengths repeat now and then,
    and a few one-sequence prefill steps of a new length that ran warm."""
    rng = np.random.default_rng(seed)
    base = load_runtime("h200-eager-reference")
    lat = StepLatency(load_model("llama-3-8b"), load_profile("h200-sxm"), replace(base, **TRUE),
                      decode_impl="paged_reference")  # the eager stack's measured Triton kernel
    steps, reqs, t = [], [], 0.0
    seen: set = set()  # the logged server's prefill shapes so far
    pool = rng.integers(64, 3000, 60)  # lengths drawn from a small pool: some repeat
    for i in range(900):
        if i % 8 == 0:
            if i in WARM_AT:  # a short length not in the pool, met before logging
                lens = [int(rng.integers(20, 60))]
                seen.add((lens[0], 0))
            else:
                lens = [int(x) for x in rng.choice(pool, int(rng.integers(1, 6)))]
            dur = lat.prefill([(q, 0) for q in lens], seen)
            for q in lens:
                reqs.append((len(reqs), t, q, 10, t, t + dur, t + dur + 1, dur, dur + 1, 0.1, 0))
            row = ("prefill", len(lens), sum(lens), 0)
        else:
            n = int(rng.integers(1, 257))
            ctx = int(n * rng.integers(100, 2000))
            dur = lat.decode(n, ctx)
            row = ("decode", n, n, ctx)
        dur *= float(np.exp(rng.normal(0.0, TRUE_SIGMA)))
        steps.append((t, t + dur, *row, 10000))
        t += dur
    cols = ["t_start", "t_end", "kind", "num_seqs", "num_tokens", "sum_ctx", "free_blocks"]
    pd.DataFrame(steps, columns=cols).to_csv(folder / "steps.csv", index=False, float_format="%.9f")
    rcols = ["id", "arrival_s", "prompt_tokens", "output_tokens", "admitted_s", "first_token_s",
             "finish_s", "ttft_s", "e2e_s", "tpot_s", "preemptions"]
    pd.DataFrame(reqs, columns=rcols).to_csv(folder / "requests.csv", index=False, float_format="%.9f")


def test_fit_recovers_the_host_terms_and_jitter_of_a_synthetic_log(tmp_path):
    _synthetic_log(tmp_path)
    fit = fit_log(tmp_path / "steps.csv", tmp_path / "requests.csv", load_model("llama-3-8b"),
                  load_profile("h200-sxm"), load_runtime("h200-eager-reference"), "synthetic")
    rt = fit.runtime
    assert fit.warm_shapes == len(WARM_AT)  # counted as seen, not as jitter
    assert rt.jitter.prefill[0] > 0.8  # so no whole-step factor of ~0.3 in the table
    assert rt.serial_ms_per_new_prefill_shape == pytest.approx(40.0, rel=0.1)
    assert rt.gpu_scale_decode == pytest.approx(1.2, rel=0.05)
    assert rt.gpu_scale == pytest.approx(1.0, rel=0.08)
    # serial per step and per-sequence terms trade off a little; the step times they give do not
    assert rt.serial_ms_per_step == pytest.approx(2.0, abs=0.8)
    for kind in ("prefill", "decode"):
        assert abs(fit.errors[kind]["bias"]) < 0.02
        assert fit.errors[kind]["median_abs"] < 0.05  # lognormal(0.05): median |e| is 3.4 %
        table = np.asarray(getattr(rt.jitter, kind))
        mid = table[len(table) // 2]
        assert mid == pytest.approx(1.0, abs=0.02)
        # the fitted table's spread is the generator's: p90/p10 = exp(2 * 1.2816 * 0.05)
        p10, p90 = table[4], table[36]
        assert p90 / p10 == pytest.approx(np.exp(2 * 1.2816 * TRUE_SIGMA), rel=0.05)
    # independent draws: no persistence, and decode levels near 1 (no batch-size structure)
    assert rt.jitter.decode_persistence == Persistence() == rt.jitter.prefill_persistence
    assert all(abs(b.factor - 1) < 0.03 for b in rt.jitter.decode_levels)


def test_prefill_lengths_come_from_the_requests_log_and_the_kv_pool_from_the_first_step():
    steps, reqs = read_steps_log(STEPS), read_requests_log(REQUESTS)
    lengths = prefill_lengths(steps, reqs)
    prefill = steps.kind == "prefill"
    assert all(sum(q) == t for q, t, p in zip(lengths, steps.num_tokens, prefill, strict=True) if p)
    assert lengths[1] == [669, 1944]
    assert kv_blocks(steps, lengths) == 20480  # what the log's README says
    equal = prefill_lengths(steps, None)  # no requests log: equal splits
    assert equal[1] == [1306, 1307]


def test_fit_on_the_live_log_models_new_prefill_shapes_and_beats_the_warm_grid_runtime():
    fit = fit_log(STEPS, REQUESTS, load_model("llama-3-8b"), load_profile("h200-sxm"),
                  load_runtime("h200-eager-reference"), "live")
    assert fit.base_errors["prefill"]["bias"] < -0.5  # the warm grid: live prefill 2-3x slower
    assert 30 < fit.runtime.serial_ms_per_new_prefill_shape < 50
    assert fit.warm_shapes == 4  # four one- or two-sequence steps whose new length ran warm
    assert fit.errors["prefill"]["median_abs"] < 0.05 and fit.errors["prefill"]["mean_abs"] < 0.08
    assert fit.errors["decode"]["median_abs"] < 0.05
    assert fit.level_errors["decode"]["mean_abs"] < fit.errors["decode"]["mean_abs"] - 0.015
    assert all(abs(b) < 0.03 for b in fit.jittered_mean_bias.values())
    jit = fit.runtime.jitter
    level = {b.max_seqs: b.factor for b in jit.decode_levels}
    assert level[8] - level[16] > 0.08  # decode steps of <= 8 sequences: ~2.9 ms slower
    assert jit.decode_persistence.share > 0.5 and 0.7 < jit.decode_persistence.stay < 0.97
    assert jit.prefill_persistence == Persistence()  # 93 prefill steps: too few to tell


def test_decode_batches_are_rebuilt_from_the_requests_log():
    steps, reqs = read_steps_log(STEPS), read_requests_log(REQUESTS)
    longest = decode_max_ctx(steps, reqs)
    decode = (steps.kind == "decode").to_numpy()
    assert (longest[decode] > 0).all() and (longest[~decode] == 0).all()  # every batch matched
    assert (longest[decode] >= steps.sum_ctx[decode] / steps.num_seqs[decode]).all()
    assert not decode_max_ctx(steps, None).any()


# A hand-made log: A (prompt 100) decodes alone, then B (300) and C (50) join after one
# two-sequence prefill; A finishes at 0.24 s, B at 0.26 s, C at 0.28 s. A request decodes in
# every decode step from its first token to its finish, at prompt + k after its k-th one:
#   step 1 [0.10, 0.12]  A 101                 -> 1 seq, sum 101, longest 101
#   step 3 [0.20, 0.22]  A 102, B 301, C 51    -> 3 seqs, sum 454, longest 301 (B)
#   step 4 [0.22, 0.24]  A 103, B 302, C 52    -> 3 seqs, sum 457, longest 302 (B)
#   step 5 [0.24, 0.26]  B 303, C 53           -> 2 seqs, sum 356, longest 303 (B)
#   step 6 [0.26, 0.28]  C 54                  -> 1 seq,  sum  54, longest  54 (C)
HAND_STEPS = """t_start,t_end,kind,num_seqs,num_tokens,sum_ctx,free_blocks
0.00,0.10,prefill,1,100,0,100
0.10,0.12,decode,1,1,101,100
0.12,0.20,prefill,2,350,0,80
0.20,0.22,decode,3,3,454,80
0.22,0.24,decode,3,3,457,80
0.24,0.26,decode,2,2,{sum5},85
0.26,0.28,decode,1,1,54,90
"""
HAND_REQUESTS = """id,arrival_s,prompt_tokens,output_tokens,admitted_s,first_token_s,finish_s,ttft_s,e2e_s,tpot_s,preemptions
0,0.00,100,4,0.00,0.10,0.24,0.10,0.24,0.0467,0
1,0.11,300,4,0.12,0.20,0.26,0.09,0.15,0.02,{preempted}
2,0.115,50,5,0.12,0.20,0.28,0.085,0.165,0.02,0
"""


def _hand_log(folder: Path, sum5: int = 356, preempted: int = 0):
    (folder / "steps.csv").write_text(HAND_STEPS.format(sum5=sum5))
    (folder / "requests.csv").write_text(HAND_REQUESTS.format(preempted=preempted))
    return read_steps_log(folder / "steps.csv"), read_requests_log(folder / "requests.csv")


def test_decode_batches_of_a_hand_made_log_have_their_known_longest_context(tmp_path):
    steps, reqs = _hand_log(tmp_path)
    assert decode_max_ctx(steps, reqs).tolist() == [0, 101, 0, 301, 302, 303, 54]
    assert prefill_lengths(steps, reqs) == [[100], [], [50, 300], [], [], [], []]


def test_a_decode_step_whose_rebuilt_batch_differs_from_its_row_is_left_unknown(tmp_path):
    steps, reqs = _hand_log(tmp_path, sum5=357)  # step 5 logs one token more than B + C
    assert decode_max_ctx(steps, reqs).tolist() == [0, 101, 0, 301, 302, 0, 54]
    steps, reqs = _hand_log(tmp_path, preempted=1)  # a preemption: contexts not rebuilt
    assert decode_max_ctx(steps, reqs).tolist() == [0] * 7


def test_decode_levels_are_band_medians_over_the_batch_sizes_seen():
    seqs = np.array([3] * 40 + [12] * 40 + [20] * 10 + [100] * 40)
    ratio = np.where(seqs <= 4, 1.1, np.where(seqs <= 32, 0.9, 1.0))
    levels = decode_levels(seqs, ratio)
    # below 3: the model's own value; (2, 4]; (4, 16]; (16, 100] (the 10 steps of (16, 32]
    # merged with the next bands: their median is the 40 steps' at 100)
    assert levels == (BatchLevel(2, 1.0), BatchLevel(4, 1.1), BatchLevel(16, 0.9),
                      BatchLevel(100, 1.0))
    spec = JitterSpec(decode_levels=levels)
    table = spec.level_by_seqs()
    assert table[1] == 1.0 and table[3] == 1.1 and table[16] == 0.9 and table[-1] == 1.0
    assert len(table) == 102  # index n up to 100, then 1.0 for larger batches


def test_fit_log_cli_writes_a_runtime_that_loads_and_runs(tmp_path, capsys):
    out = tmp_path / "live.yaml"
    assert main(["fit-log", str(STEPS), "--requests", str(REQUESTS), "--model", "llama-3-8b",
                 "--gpu", "h200-sxm", "--base-runtime", "h200-eager-reference", "--out", str(out)]) == 0
    assert "per new prefill shape" in capsys.readouterr().out
    rt = load_runtime(str(out))
    assert rt.name == "live" and rt.jitter is not None and len(rt.jitter.decode) == 41
    assert out.read_text().startswith("# Runtime fitted by llmsim fit-log")


def test_fit_log_bad_log_is_one_line_error(tmp_path, capsys):
    bad = tmp_path / "steps.csv"
    bad.write_text("t_start,t_end,kind\n0,1,decode\n")
    out = tmp_path / "x.yaml"
    assert main(["fit-log", str(bad), "--model", "llama-3-8b", "--gpu", "h200-sxm",
                 "--base-runtime", "h200-eager-reference", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("llmsim: error: ") and "missing columns num_seqs" in err
    assert len(err.splitlines()) == 1 and not out.exists()


REPLAY_BOUNDS = {"TTFT p50 (ms)": 0.2, "TPOT p50 (ms)": 0.06, "E2E p50 (s)": 0.04,
                 "E2E p99 (s)": 0.04, "requests/s": 0.03, "mean batch size": 0.04}


def test_replay_of_the_live_log_is_within_stated_bounds(tmp_path, capsys):
    """In-sample for the step model (the runtime was fitted to this log's steps); the
    request-level metrics are what the replay checks, over seeds 0-4 (the jitter draws).
    Bounds as stated in the README (worst seed: TTFT p50 +13 %, TPOT p50 +3.4 %)."""
    assert main(["validate", str(SCENARIO), "--replay", str(STEPS), str(REQUESTS),
                 "--out", str(tmp_path / "r")]) == 0
    assert (tmp_path / "r" / "replay.csv").is_file() and (tmp_path / "r" / "replay.md").is_file()
    for seed in range(5):
        rows = {m["metric"]: m for m in replay(SCENARIO, STEPS, REQUESTS,
                                               overrides={"seed": seed})["metrics"]}
        assert rows["TTFT p50 (ms)"]["logged"] == pytest.approx(677.5, rel=1e-3)
        for metric, bound in REPLAY_BOUNDS.items():
            assert abs(rows[metric]["error"]) < bound, (seed, metric, rows[metric])
    parts = {m["metric"]: m["logged"] for m in replay(SCENARIO, STEPS, REQUESTS)["metrics"]}
    assert parts["TTFT queue wait mean (ms)"] + parts["TTFT after admission mean (ms)"] == \
        pytest.approx(1e3 * read_requests_log(REQUESTS).ttft_s.mean())
    warm = {m["metric"]: m for m in replay(SCENARIO, STEPS, REQUESTS,
                                           runtime="h200-eager-reference")["metrics"]}
    assert warm["E2E p50 (s)"]["error"] < -0.4  # the warm-grid runtime is far optimistic


def _small(seed: int = 0, runtime: str = "h200-eager-live") -> dict:
    return {"seed": seed, "runtime": runtime, "workload": {
        "arrival": {"kind": "poisson", "rate": 4}, "prompt": {"kind": "fixed", "value": 300},
        "output": {"kind": "fixed", "value": 50}, "num_requests": 60}}


def test_jitter_is_deterministic_per_seed_and_leaves_the_workload_stream_alone():
    a, b, c = run(SCENARIO, _small()), run(SCENARIO, _small()), run(SCENARIO, _small(seed=5))
    assert a.steps.equals(b.steps) and a.requests.equals(b.requests)
    assert not a.steps.t_end.equals(c.steps.t_end)
    decode = a.steps[a.steps.kind == "decode"]
    assert (decode.t_end - decode.t_start).round(9).nunique() > 10  # equal shapes, varied times
    plain = run(SCENARIO, _small(runtime="h200-eager-reference"))
    assert plain.requests.arrival_s.equals(a.requests.arrival_s)  # the same workload stream


def test_jitter_is_off_for_runtimes_without_a_table():
    lat = StepLatency(load_model("llama-3-8b"), load_profile("h200-sxm"), load_runtime("cuda-graph"))
    assert jittered(lat, 0) is lat
    assert load_runtime("h200-eager-reference").jitter is None


def test_jitter_factors_follow_the_quantile_table():
    spec = JitterSpec(decode=(0.9, 1.0, 1.3), prefill=(1.0, 2.0))
    f = sample(spec, "decode", 20000, seed=1)
    assert f.min() >= 0.9 and f.max() <= 1.3
    assert np.median(f) == pytest.approx(1.0, abs=0.01)
    assert f.mean() == pytest.approx((0.95 + 1.15) / 2, abs=0.01)  # mean of the linear pieces
    assert np.array_equal(f, sample(spec, "decode", 20000, seed=1))
    lat = StepLatency(load_model("llama-3-8b"), load_profile("h200-sxm"),
                      RuntimeSpec(name="j", jitter=spec))
    j = jittered(lat, 0)
    assert isinstance(j, JitteredLatency)
    plain = lat.prefill([(512, 0)])
    assert plain <= j.prefill([(512, 0)]) <= 2 * plain


@pytest.mark.parametrize("body, message", [
    ("{decode: [1.1, 0.9]}", "jitter.decode: quantiles must be non-decreasing"),
    ("{decode_levels: [{max_seqs: 8, factor: 1}, {max_seqs: 8, factor: 1}]}",
     "jitter.decode_levels: max_seqs must increase"),
    ("{decode_levels: [{max_seqs: 8, factor: 0}]}", r"jitter.decode_levels\[0\].factor: 0.0 is out of range \(allowed: > 0\)"),
    ("{decode_persistence: {stay: 1.0, share: 0.5}}",
     r"jitter.decode_persistence.stay: 1.0 is out of range \(allowed: < 1\)"),
    ("{prefill_persistence: {stay: 0.5, shares: 0.5}}", "jitter.prefill_persistence.shares: unknown key"),
])
def test_a_bad_jitter_model_is_a_one_line_spec_error(tmp_path, body, message):
    f = tmp_path / "rt.yaml"
    f.write_text(f"name: x\njitter: {body}\n")
    with pytest.raises(SpecError, match=message) as e:
        load_runtime(str(f))
    assert "\n" not in str(e.value)


def test_a_jitter_table_without_persistence_draws_as_before():
    """Old runtime files (quantile tables only) load and draw independent factors from
    the seed's stream, as they always did."""
    spec = JitterSpec(decode=(0.9, 1.0, 1.3))
    expected = np.interp(np.random.default_rng([7, 1]).random(BLOCK), [0, 0.5, 1], [0.9, 1.0, 1.3])
    assert np.array_equal(sample(spec, "decode", BLOCK, seed=7), expected)


@pytest.mark.parametrize("stay, share", [(0.9, 0.8), (0.5, 1.0), (0.97, 0.5)])
def test_persistent_factors_keep_the_marginal_and_correlate_as_fitted(stay, share):
    spec = JitterSpec(decode=(0.5, 1.0, 2.0), decode_persistence=Persistence(stay, share))
    f = sample(spec, "decode", 3 * BLOCK + 17, seed=2)  # several blocks: the state carries over
    assert np.median(f) == pytest.approx(1.0, abs=0.05)
    assert np.quantile(f, 0.25) == pytest.approx(0.75, abs=0.04)  # the table's own quartile
    u = np.argsort(np.argsort(f))
    for k in (1, 3, 10):
        assert np.corrcoef(u[:-k], u[k:])[0, 1] == pytest.approx(share**2 * stay**k, abs=0.06)
    fitted = fit_persistence(f)
    assert fitted.stay == pytest.approx(stay, abs=0.06)
    assert fitted.share == pytest.approx(share, abs=0.1)
    assert fit_persistence(sample(JitterSpec(decode=(0.5, 1.0, 2.0)), "decode", 5000, 2)) == Persistence()


def test_decode_levels_multiply_decode_and_mixed_steps_by_their_batch_band():
    spec = JitterSpec(decode_levels=(BatchLevel(8, 1.2), BatchLevel(64, 0.9)))
    lat = StepLatency(load_model("llama-3-8b"), load_profile("h200-sxm"), RuntimeSpec(name="j"))
    j = JitteredLatency(lat, spec, seed=0)
    assert j.decode(4, 4000) == pytest.approx(1.2 * lat.decode(4, 4000))
    assert j.decode(9, 9000) == pytest.approx(0.9 * lat.decode(9, 9000))
    assert j.decode(200, 200000) == pytest.approx(lat.decode(200, 200000))  # beyond: the model's
    assert j.mixed(4, 4000, 1000, [(256, 0)]) == pytest.approx(1.2 * lat.mixed(4, 4000, 1000, [(256, 0)]))
    assert j.prefill([(512, 0)]) == pytest.approx(lat.prefill([(512, 0)]))


def test_factor_streams_are_deterministic_per_seed():
    keep = Persistence(0.8, 0.7)
    a = FactorStream((0.9, 1.1), np.random.default_rng(5), keep)
    b = FactorStream((0.9, 1.1), np.random.default_rng(5), keep)
    assert [a.next() for _ in range(5000)] == [b.next() for _ in range(5000)]


def test_new_prefill_shapes_pay_once_per_server():
    rt = RuntimeSpec(name="x", serial_ms_per_new_prefill_shape=40.0)
    lat = StepLatency(load_model("llama-3-8b"), load_profile("h200-sxm"), rt)
    one, other = set(), set()
    first, again = lat.prefill([(300, 0), (500, 0)], one), lat.prefill([(300, 0), (500, 0)], one)
    assert first - again == pytest.approx(0.080)
    assert lat.prefill([(300, 0), (700, 0)], one) - again == pytest.approx(0.040, abs=0.005)
    assert lat.prefill([(300, 0), (500, 0)], other) == first  # another server pays again
    assert lat.prefill([(300, 0), (500, 0)]) == again  # no server's history: no stall
    assert lat.mixed(0, 0, 0, [(900, 0)], other) - lat.prefill([(900, 0)]) == pytest.approx(0.040)


def test_a_run_written_as_a_serving_log_reads_back_with_its_kv_pool(tmp_path):
    from sim.fit.servinglog import write_serving_log

    out = run(SCENARIO, {**_small(runtime="h200-eager-reference"), "kv.num_blocks": 3000})
    write_serving_log(tmp_path, out.requests, out.steps, [0] * len(out.steps), 3000)
    steps = read_steps_log(tmp_path / "serving_steps.csv")
    reqs = read_requests_log(tmp_path / "serving_requests.csv")
    assert len(reqs) == 60 and list(steps.kind.unique()) == ["prefill", "decode"]
    assert kv_blocks(steps, prefill_lengths(steps, reqs)) == 3000
