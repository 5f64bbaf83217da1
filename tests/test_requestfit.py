"""Request-level and aggregate serving outputs (sim/fit/requestlogs.py) and what fit-log fits
to them (sim/fit/requestfit.py). Fixtures in tests/fixtures/requestlogs/ are hand-written in
each tool's format; the expected numbers below are worked by hand from them."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest

from sim.cli.main import main
from sim.costmodel.latency import StepLatency
from sim.costmodel.models import load_model
from sim.costmodel.profiles import load_profile
from sim.costmodel.runtime import load_runtime
from sim.fit.requestfit import fit_request_logs
from sim.fit.requestlogs import read, read_prometheus_series
from sim.io.specload import SpecError

FIX = Path(__file__).resolve().parent / "fixtures" / "requestlogs"


def test_vllm_bench_result_gives_a_token_weighted_itl_at_its_concurrency():
    log = read(FIX / "vllm_bench_c2.json")
    assert log.format == "vllm-bench" and len(log.requests) == 2  # the errored request dropped
    (p,) = log.points
    assert p.batch == 2  # max_concurrency: no start times to rebuild the batch from
    assert p.step_ms == pytest.approx((2 * 20 + 4 * 10) / 6)  # itls weighted by tokens
    assert p.ctx == pytest.approx(((100 + 1.5) + (200 + 2.5)) / 2)


def test_aiperf_records_rebuild_the_batch_from_request_times():
    log = read(FIX / "aiperf_profile_export.jsonl")
    assert log.format == "aiperf" and len(log.requests) == 2
    (p,) = log.points
    # decoding spans [1.04, 2] and [1.06, 2] s: 0.02 s alone, 0.94 s both
    assert p.batch == pytest.approx((0.02 + 2 * 0.94) / 0.96)
    assert p.step_ms == pytest.approx((10 * 20 + 30 * 30) / 40)


def test_genai_perf_summary_is_one_point_at_its_concurrency():
    (p,) = read(FIX / "genai_perf_summary.json").points
    assert (p.batch, p.ctx, p.step_ms) == (16, 700, 25)


def test_prometheus_scrapes_give_interval_means():
    first, second = read_prometheus_series([FIX / "metrics_t0.prom", FIX / "metrics_t1.prom"])
    (a,), (b,) = first.points, second.points
    assert (a.batch, a.ctx, a.step_ms) == pytest.approx((8, 500 + 200 / 2, 2.0 / 100 * 1e3))
    # deltas: ITL 1.0 s over 40 tokens; running averaged over the two scrapes
    assert (b.batch, b.ctx, b.step_ms) == pytest.approx((10, 400 + 200 / 2, 25.0))


def test_server_logs_give_running_over_generation_throughput():
    sg = read(FIX / "sglang_server.log").points
    assert [(p.batch, p.ctx, p.step_ms) for p in sg] == [(20, 1000, 25.0), (40, 750, 40.0)]
    (v,) = read(FIX / "vllm_server.log").points  # the idle line (0 tokens/s) is skipped
    assert v.batch == 10 and v.step_ms == 25.0 and math.isnan(v.ctx)


@pytest.mark.parametrize("name, body, message", [
    ("a.json", "{not json", "line 1: not JSON"),
    ("b.json", json.dumps({"ttfts": [0.1], "itls": [[0.01]], "input_lens": [5]}),
     "output_lens: missing or not a list (save the result with --save-result --save-detailed"),
    ("c.json", json.dumps({"ttfts": [0.1, 0.2], "itls": [[0.01]], "input_lens": [5, 5],
                           "output_lens": [2, 2]}), "itls: 1 entries, ttfts has 2"),
    ("d.json", json.dumps({"ttfts": [-1], "itls": [[0.01]], "input_lens": [5], "output_lens": [2]}),
     "ttfts[0]: -1 is not a finite number >= 0"),
    ("e.prom", "vllm:num_requests_running 3\nvllm:time_per_output_token_seconds_count abc\n",
     "line 2: vllm:time_per_output_token_seconds_count: value 'abc' is not a number"),
    ("f.log", "Decode batch. nothing here\n", "not a known serving-output format"),
    ("g.jsonl", '{"metrics": {"time_to_first_token": {"value": 1, "unit": "ms"}}}\n',
     "line 1: metrics.input_sequence_length: missing"),
])
def test_bad_input_is_a_one_line_error_naming_file_and_place(tmp_path, name, body, message):
    p = tmp_path / name
    p.write_text(body)
    with pytest.raises(SpecError) as e:
        read_prometheus_series([p]) if name.endswith(".prom") else read(p)
    assert message in str(e.value) and "\n" not in str(e.value) and name in str(e.value)


def _synthetic_bench(folder: Path, terms: dict, receive_ms: float) -> list[Path]:
    """vLLM bench results at concurrency 1..32 whose ITL is the simulator's decode step
    under known terms, and whose TTFT at concurrency 1 is prefill + receive_ms."""
    model, gpu = load_model("llama-3-8b"), load_profile("h200-sxm")
    rt = replace(load_runtime("h200-eager-reference"), **terms)
    lat = StepLatency(model, gpu, rt, "flash", "paged_reference")
    paths = []
    for c in (1, 2, 4, 8, 16, 32):
        prompts, out = [200 + 97 * i for i in range(6)], 101  # ctx per seq ~ prompt + 50
        ctx = round(sum(prompts) / len(prompts) + out / 2)
        step = lat.decode(c, c * ctx, ctx)
        body = {"max_concurrency": c, "input_lens": prompts, "output_lens": [out] * 6,
                "ttfts": [lat.prefill([(q, 0)]) + receive_ms / 1e3 for q in prompts],
                "itls": [[step] * (out - 1)] * 6, "errors": [""] * 6}
        paths.append(folder / f"c{c}.json")
        paths[-1].write_text(json.dumps(body))
    return paths


def test_fit_recovers_decode_terms_and_request_latency_of_a_synthetic_stack(tmp_path):
    terms = dict(serial_ms_per_step=3.0, gpu_scale_decode=1.3)
    paths = _synthetic_bench(tmp_path, terms, receive_ms=40.0)
    base = load_runtime("h200-eager-reference")
    fit = fit_request_logs([read(p) for p in paths], load_model("llama-3-8b"),
                           load_profile("h200-sxm"), base, "x")
    assert abs(fit.in_sample).max() < 0.01
    # held out: interpolation is close; the largest batch, extrapolated from the five below
    # it with the reduced (per-step + GPU scale) fit, less so
    assert abs(fit.held_out[:-1]).max() < 0.03 and abs(fit.held_out[-1]) < 0.2
    assert abs(fit.base_error).mean() > 0.1  # the base runtime was off
    r = fit.runtime.request
    assert r.receive_ms.value == pytest.approx(40.0, abs=1.0)
    assert r.tokenize_us_per_prompt_token.value == pytest.approx(0.0, abs=2.0)
    assert fit.ttft_requests == 6  # only the concurrency-1 run is low load


def test_fit_log_cli_takes_request_level_outputs_and_writes_a_runtime(tmp_path, capsys):
    paths = _synthetic_bench(tmp_path, dict(serial_ms_per_step=3.0), receive_ms=40.0)
    out = tmp_path / "fitted.yaml"
    assert main(["fit-log", *map(str, paths), "--model", "llama-3-8b", "--gpu", "h200-sxm",
                 "--base-runtime", "h200-eager-reference", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "leave-one-point-out" in text and "not fittable from request-level data" in text
    rt = load_runtime(str(out))
    assert rt.request is not None and rt.request.receive_ms.value > 30


def test_fit_log_cli_with_server_log_without_context_is_a_one_line_error(tmp_path, capsys):
    code = main(["fit-log", str(FIX / "vllm_server.log"), "--model", "llama-3-8b", "--gpu",
                 "h200-sxm", "--base-runtime", "h200-eager-reference",
                 "--out", str(tmp_path / "x.yaml")])
    err = capsys.readouterr().err
    assert code == 2 and "pass --context" in err and len(err.strip().splitlines()) == 1
