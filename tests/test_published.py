"""The published-measurements check (benchmarks/fidelity/published_check.py): its machinery, and
one regression guard on the figure it measured."""

from __future__ import annotations

import dataclasses
import math

import pytest

from benchmarks.fidelity import published_check as pc

pytestmark = pytest.mark.xdist_group("test_published")


@pytest.fixture(scope="module")
def rows() -> list[pc.Row]:
    return pc.read_rows()


def test_every_published_row_names_a_known_metric_gpu_model_and_runtime(rows):
    assert len(rows) >= 50
    assert len({r.id for r in rows}) == len(rows)
    for r in rows:
        assert r.metric in pc.METRICS
        assert r.value > 0 and r.batch >= 1 and r.tp >= 1
        pc.step_latency(r, r.runtime)  # loads the profile, model, dtypes and runtime


def test_a_decode_row_is_one_decode_step_at_its_context(rows):
    r = next(r for r in rows if r.metric == "decode_step_ms")
    lat = pc.step_latency(r, r.runtime)
    assert pc.simulate(r) == pytest.approx(lat.decode(r.batch, r.batch * r.context, r.context) * 1e3)


def test_static_batch_time_is_one_prefill_plus_output_minus_one_decode_steps(rows):
    r = next(r for r in rows if r.metric == "request_latency_ms")
    lat = pc.step_latency(r, r.runtime)
    want = lat.prefill([(r.input_len, 0)] * r.batch)
    want += sum(lat.decode(r.batch, r.batch * (r.input_len + k), r.input_len + k)
                for k in range(1, r.output_len))
    assert pc.simulate(r) == pytest.approx(want * 1e3)
    one = dataclasses.replace(r, output_len=1)
    assert pc.simulate(one) == pytest.approx(lat.prefill([(r.input_len, 0)] * r.batch) * 1e3)


def test_throughput_is_tokens_over_the_static_batch_time_per_gpu(rows):
    r = next(r for r in rows if r.metric == "static_throughput_tok_s_gpu" and r.tp > 1)
    latency = dataclasses.replace(r, metric="request_latency_ms")
    seconds = pc.simulate(latency) / 1e3
    assert pc.simulate(r) == pytest.approx(r.batch * r.output_len / seconds / r.tp)


def test_time_error_is_negative_when_the_simulator_is_faster_for_every_metric():
    assert pc.time_error("prefill_ms", 9.0, 10.0) == pytest.approx(-0.1)
    assert pc.time_error("static_throughput_tok_s_gpu", 125.0, 100.0) == pytest.approx(-0.2)


def test_a_row_published_at_its_simulated_value_has_zero_error(rows):
    r = rows[0]
    exact = dataclasses.replace(r, value=pc.simulate(r))
    (res,) = pc.check([exact])
    assert res.error == pytest.approx(0.0) and res.time_error == pytest.approx(0.0)


def test_rows_published_at_a_quarter_above_the_simulation_have_known_errors(rows):
    # a time published at 1.25x the simulated one: the simulator is 1 / 1.25 - 1 = -20 %
    # (faster); a throughput published at 1.25x: -20 % in tokens/s, +25 % in time (slower)
    time_row = next(r for r in rows if r.metric == "prefill_ms")
    tput_row = next(r for r in rows if r.metric == "static_throughput_tok_s_gpu")
    at = [dataclasses.replace(r, value=1.25 * pc.simulate(r)) for r in (time_row, tput_row)]
    t, tput = pc.check(at)
    assert (t.error, t.time_error) == (pytest.approx(-0.2), pytest.approx(-0.2))
    assert (tput.error, tput.time_error) == (pytest.approx(-0.2), pytest.approx(0.25))


def test_summary_of_known_errors():
    def result(err: float) -> pc.Result:
        row = pc.Row("x", "s", "s", "h100-sxm", "llama-2-7b", 1, "bf16", "bf16", 1, 128, 1,
                     None, "prefill_ms", 100.0, "trtllm", "")
        return pc.Result(row, 100.0 * (1 + err), 100.0 * (1 + err))

    (s,) = pc.summarise([result(e) for e in (-0.3, -0.1, 0.05, 0.2)])
    assert s.rows == 4
    assert s.median_abs == pytest.approx(0.15)
    assert s.within == pytest.approx(0.75)
    assert s.mean == pytest.approx(-0.0375)
    assert s.worst == pytest.approx(0.3)


def test_kernels_only_is_never_slower_than_the_stacks_runtime(rows):
    for res in pc.check([r for r in rows if r.metric != "static_throughput_tok_s_gpu"][:12]):
        assert res.kernels_only <= res.simulated + 1e-9


def test_a_turbomind_first_token_is_a_prefill_of_all_but_the_last_token_then_one_decode(rows):
    r = next(r for r in rows if r.metric == "first_token_after_decode_ms" and r.input_len > 1)
    lat = pc.step_latency(r, r.runtime)
    want = lat.prefill([(r.input_len - 1, 0)]) + lat.decode(1, r.input_len, r.input_len)
    assert pc.simulate(r) == pytest.approx(want * 1e3)
    as_prefill = dataclasses.replace(r, metric="prefill_ms")
    assert pc.simulate(r) > pc.simulate(as_prefill)  # one decode step more, one token less


def test_a_one_token_prompt_gets_its_first_token_from_one_decode_step(rows):
    r = next(r for r in rows if r.metric == "first_token_after_decode_ms")
    one = dataclasses.replace(r, input_len=1)
    lat = pc.step_latency(one, one.runtime)
    assert pc.simulate(one) == pytest.approx(lat.decode(1, 1, 1) * 1e3)


def test_a_row_whose_stack_ran_nccl_is_costed_without_the_custom_all_reduce(rows):
    r = next(r for r in rows if r.all_reduce == "nccl" and r.tp == 4 and r.gpu == "h100-sxm")
    assert pc.step_latency(r, r.runtime).rt.custom_all_reduce is False
    assert pc.step_latency(r, "cuda-graph").rt.custom_all_reduce is False
    custom = dataclasses.replace(r, all_reduce="custom")
    assert pc.step_latency(custom, custom.runtime).rt.custom_all_reduce is True
    assert pc.simulate(r) > pc.simulate(custom)  # NCCL is slower for these small messages
    own = dataclasses.replace(r, all_reduce="")  # empty: the runtime's own setting
    assert pc.step_latency(own, own.runtime).rt.custom_all_reduce is True  # trtllm's


def test_per_head_decode_reads_a_gqa_groups_kv_once_per_query_head():
    from sim.costmodel.profiles import DERIVED, load_profile

    p = load_profile("h100-sxm")
    mha = p.decode_attn("contiguous_per_head", 8, 8 * 1024, 32, 32, 128)
    assert mha == p.decode_attn("contiguous", 8, 8 * 1024, 32, 32, 128)  # MHA: no change
    gqa = p.decode_attn("contiguous_per_head", 8, 8 * 1024, 16, 2, 128)
    assert gqa[0] == pytest.approx(p.decode_attn("contiguous", 8, 8 * 8 * 1024, 16, 2, 128)[0])
    assert gqa[0] > p.decode_attn("contiguous", 8, 8 * 1024, 16, 2, 128)[0]
    assert gqa[1] == p.decode_attn("contiguous", 8, 8 * 8 * 1024, 16, 2, 128)[1]  # analytic here
    measured = load_profile("h200-sxm")  # its contiguous table: a measured lookup turns derived
    assert measured.decode_attn("contiguous", 8, 8 * 4096, 32, 8, 128)[1] != DERIVED
    assert measured.decode_attn("contiguous_per_head", 8, 8 * 1024, 32, 8, 128)[1] == DERIVED
    mixed = p.decode_attn("contiguous_per_head", 8, 8 * 1024, 16, 2, 128, max_ctx=2048)
    assert mixed[0] >= gqa[0]


def test_tensorrt_llm_rows_use_nccl_and_the_70b_throughput_rows_ran_xqa(rows):
    """performance.md's reproduction steps for the v0.6.1 figures export TRTLLM_ENABLE_XQA=1
    for Llama-2-70B ("we have enabled GQA where our tests displayed performance benefits"):
    a GQA-aware decode kernel; the pre-XQA per-head kernel stays a sensitivity."""
    for r in rows:
        if r.source.startswith("trtllm-perf"):
            assert r.all_reduce == "nccl"
    xqa = [r for r in rows if r.id.startswith("trt061-tput-h100-l70b")]
    assert len(xqa) == 4 and all(r.decode == "contiguous" for r in xqa)
    r = next(r for r in xqa if r.id == "trt061-tput-h100-l70b-64-2048-2048")
    assert pc.simulate(r, decode="contiguous_per_head") < pc.simulate(r)  # per head: fewer tokens/s


def test_nemo_rows_cost_the_engine_nemos_late_2023_exporter_built(rows):
    """NeMo's exporter built a contiguous KV cache and NCCL all-reduce under the Python
    GenerationSession (data/published/README.md): each row says so, and at TP 8 the
    NCCL all-reduce makes the row slower than the runtime's own custom kernel would (never
    faster at any TP: the custom kernel is only taken where it is the faster one)."""
    nemo = [r for r in rows if r.source == "nemo-llama2-inference"]
    assert len(nemo) == 16
    for r in nemo:
        assert (r.runtime, r.decode, r.all_reduce) == ("trtllm-python", "contiguous_per_head", "nccl")
        assert r.metric == "request_latency_ms" and (r.input_len, r.output_len) == (128, 20)
    for r in (r for r in nemo if r.tp > 1):
        custom = pc.simulate(dataclasses.replace(r, all_reduce="custom"))
        assert pc.simulate(r) > custom if r.tp == 8 else pc.simulate(r) >= custom
    one = next(r for r in nemo if r.tp == 1)
    assert pc.simulate(one) == pytest.approx(pc.simulate(dataclasses.replace(one, all_reduce="custom")))


@pytest.mark.parametrize("field, value, message", [
    (",nccl,", ",ring,", "unknown all_reduce 'ring'"),
    ("prefill_ms", "joules", "unknown metric 'joules'"),
])
def test_an_unknown_all_reduce_or_metric_is_refused(tmp_path, field, value, message):
    text = pc.DATA.read_text().splitlines()
    bad = text[1].replace(field, value)
    assert bad != text[1]  # the first row holds what is replaced
    f = tmp_path / "bad.csv"
    f.write_text("\n".join([text[0], bad]) + "\n")
    with pytest.raises(ValueError, match=message):
        pc.read_rows(f)


def test_regression_guard_median_error_against_published_rows(rows):
    """Measured when the check was built (2026-12, main at 091be18): 50 rows, median
    |time error| 16.6 %, 74 % within 25 %; with each row's stack mapped from its source
    (all-reduce, decode kernel, TurboMind's first token; data/published/README.md):
    7.7 %, 96 % (48 of 50); with the NeMo rows re-read as well (NCCL, contiguous KV):
    7.2 %, 94 % (47 of 50); with the v0.6.1 Llama-2-70B rows on XQA (as performance.md's
    reproduction steps say) and the A100 custom all-reduce refitted: 7.8 %, 90 % (45 of 50).
    The guard sits a little above, so a change that makes the step
    model worse against real stacks fails here; tighten it as the model improves (issue
    9's target is a median of 5 % with every row within 25 %)."""
    results = pc.check(rows)
    assert all(math.isfinite(r.simulated) and r.simulated > 0 for r in results)
    (s,) = pc.summarise(results)
    assert s.median_abs < 0.09
    assert s.within >= 0.88


def test_the_script_prints_a_table_and_summaries(capsys):
    assert pc.main(["--rows", "lmd-a100-l7b-ftl-128,nemo-h100-l7b-tp8-b1", "--markdown"]) == 0
    out = capsys.readouterr().out
    assert "| lmd-a100-l7b-ftl-128 |" in out and "median |time error|" in out
