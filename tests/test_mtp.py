"""Multi-token prediction (DeepSeek-V3's MTP module) as a speculative proposer
(speculative.method mtp): one MTP layer per drafted token, its weights and KV in memory,
tokens per round by the closed form at the stated acceptance."""

from __future__ import annotations

import dataclasses

import pytest

from sim import run
from sim.config.scenario import load_scenario
from sim.costmodel.latency import StepLatency
from sim.costmodel.models import load_model
from sim.costmodel.profiles import load_profile
from sim.costmodel.runtime import load_runtime
from sim.engine.memory import memory_budget
from sim.io.specload import ROOT

MTP = {"speculative.method": "mtp", "speculative.k": 1,
       "speculative.acceptance.alpha": 0.85}  # DeepSeek-V3 report §5.4.3: 85-90 %


def test_an_mtp_layer_costs_one_average_layer_its_projection_and_the_lm_head():
    m, p = load_model("llama-3-8b"), load_profile("h200-sxm")
    lat = StepLatency(m, p, load_runtime("cuda-graph"))
    n, ctx = 16, 1000
    layer = (lat.dense_ms(n) + lat.decode_attn_ms(n, n * ctx, ctx)) / 32
    proj, _ = p.gemm(n, 2 * 4096, 4096)
    assert lat.mtp_ms(n, n * ctx, ctx) == pytest.approx(layer + proj + lat.lm_head_ms(n))
    # a small fraction of a whole decode step: the whole point of a one-layer proposer
    assert lat.mtp_ms(n, n * ctx, ctx) < 0.15 * lat.decode(n, n * ctx, ctx) * 1e3


def test_mtp_holds_one_more_layer_of_weights_and_kv():
    sc = load_scenario(ROOT / "scenarios" / "qwen3_30b_a3b_vs_8b.yaml")
    m, p = load_model(sc.model), load_profile(sc.gpu)
    plain = memory_budget(sc, m, p)
    mtp = memory_budget(dataclasses.replace(
        sc, speculative=dataclasses.replace(sc.speculative, method="mtp", k=1)), m, p)
    ops = m.ops()
    layer = sum(op.params for op in ops.layer) + 2 * m.hidden ** 2
    assert mtp.weight_bytes - plain.weight_bytes == pytest.approx(layer * 2)
    assert mtp.kv_tokens < plain.kv_tokens * 48 / 48.5  # 49 layers of KV a token, not 48


def test_mtp_rounds_emit_one_plus_alpha_tokens_and_speed_decode_up():
    over = {**MTP, "workload.num_requests": 60}
    plain = run(ROOT / "scenarios" / "deepseek_r1_h200.yaml", {"workload.num_requests": 60})
    out = run(ROOT / "scenarios" / "deepseek_r1_h200.yaml", over)
    spec = out.summary["speculative"]
    # k = 1: (1 - a^2) / (1 - a) = 1 + a = 1.85 tokens a round, less rounds cut by the output end
    assert spec["tokens_per_round"] == pytest.approx(1.85, abs=0.03)
    assert 1.0 < spec["speedup_vs_decode"] < 1.85
    assert out.summary["tpot_s"]["p50"] < plain.summary["tpot_s"]["p50"]
