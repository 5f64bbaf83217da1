"""Sliding-window attention, attention sinks and MXFP4 experts (gpt-oss): KV bytes worked by
hand, a window at least as long as the context equal to full attention, attention time
that stops growing beyond the window, the gpt-oss model files against the model card, and
`models import` of gpt-oss configs (round trip and refusals)."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from sim.config.scenario import load_scenario
from sim.costmodel.hf_config import model_fields
from sim.costmodel.latency import StepLatency
from sim.costmodel.layer import attended_keys
from sim.costmodel.models import load_model
from sim.costmodel.profiles import load_profile
from sim.costmodel.runtime import load_runtime
from sim.engine.build import build_replica, replica_configs
from sim.engine.memory import memory_budget
from sim.io.specload import ROOT, SpecError, build
from tests.test_models_import import GPT_OSS_120B, write

GPT_OSS_CONFIG = {  # openai/gpt-oss-120b config.json: the keys GPT_OSS_120B leaves out
    **GPT_OSS_120B, "hidden_act": "silu", "initial_context_length": 4096,
    "quantization_config": {"modules_to_not_convert": [
        "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens",
        "lm_head"], "quant_method": "mxfp4"},
    "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0,
                     "original_max_position_embeddings": 4096, "rope_type": "yarn",
                     "truncate": False},
    "rope_theta": 150000, "swiglu_limit": 7.0,
}
PER_LAYER = 2 * 8 * 64 * 2  # K and V, 8 KV heads of 64, bf16: 2,048 bytes a token a layer


def _windowed(name: str, window: int, every: bool = False):
    """`name` with every other layer (or every layer) over a `window`-token window."""
    m = load_model(name)
    types = None if every else ("sliding_attention", "full_attention") * (m.layers // 2)
    return dataclasses.replace(m, sliding_window=window, layer_types=types)


# ---- KV bytes ------------------------------------------------------------------------------

def test_gpt_oss_kv_bytes_per_token_by_hand():
    m = load_model("gpt-oss-120b")
    ops = m.ops()
    assert m.kv_bytes_per_token == 36 * PER_LAYER == 73_728  # a token inside every window
    assert ops.kv_bytes(100, 2) == 100 * 36 * PER_LAYER  # shorter than the window: all layers
    # 10,000 tokens: the 18 full layers hold them all, the 18 sliding ones the last 128
    assert ops.kv_bytes(10_000, 2) == 18 * PER_LAYER * 10_000 + 18 * PER_LAYER * 128
    # vLLM's hybrid manager: a token beyond the window, the full layers' 36,864 bytes; the
    # sliding layers hold ⌈127 / 16⌉ + 1 = 9 blocks of 16 tokens of a sequence
    assert ops.kv_split(2, 131_072, 16) == (18 * PER_LAYER, 18 * PER_LAYER * 9 * 16)
    assert ops.kv_split(2, 128, 16) == (36 * PER_LAYER, 0)  # a window covering the context


def test_kv_tokens_count_the_full_layers_and_each_sequence_takes_its_windows_blocks():
    sc = load_scenario(ROOT / "scenarios" / "gpt_oss_120b_h200.yaml")
    m, p = load_model(sc.model), load_profile(sc.gpu)
    b = memory_budget(sc, m, p)
    assert b.kv_tokens == int(b.kv_bytes // (18 * PER_LAYER))  # blocks at the full layers' bytes
    full = dataclasses.replace(m, sliding_window=0, layer_types=None)
    assert memory_budget(sc, full, p).kv_tokens == int(b.kv_bytes // (36 * PER_LAYER))
    cfg = replica_configs(sc)[0]
    # the sliding layers' 9 blocks of 16 tokens: as many bytes as 9 blocks of the full layers'
    assert cfg.window_blocks == 9
    kv = build_replica(cfg, np.random.default_rng(0)).st.kv
    assert (kv.blocks_for(0), kv.blocks_for(1), kv.blocks_for(4000)) == (0, 1 + 9, 250 + 9)
    assert replica_configs(load_scenario(ROOT / "scenarios" / "quickstart.yaml"))[0].window_blocks == 0


SHORT = {"scheduler.policy": "continuous", "kv.max_model_len": 8192,
         "scheduler.max_num_batched_tokens": 8192, "workload.prompt.max": 6000,
         "workload.output.max": 1000}


@pytest.mark.parametrize("over", [
    {},  # chunked prefill
    {"scheduler.preemption": "swap"},
    {"kv.manager": "contiguous", "attention.decode": "contiguous", "kv.num_blocks": 40_000,
     **SHORT},
    {**SHORT, "speculative.method": "ngram", "speculative.k": 3,
     "speculative.acceptance.kind": "fixed", "speculative.acceptance.alpha": 0.6},
])
def test_a_window_model_under_kv_pressure_returns_every_block(over):
    from sim import run
    s = run(ROOT / "scenarios" / "gpt_oss_120b_h200.yaml",
            {"workload.num_requests": 60, "kv.num_blocks": 3000, **over}).summary
    # every request done, and the engine's end-of-run check found every KV block free again
    assert s["requests"]["finished"] == 60
    if over.get("kv.manager") != "contiguous":
        assert s["preemptions"] > 0  # 3,000 blocks: sequences of ~4,000 tokens + 9 collide


def test_a_window_as_long_as_the_context_is_full_attention():
    sc = load_scenario(ROOT / "scenarios" / "quickstart.yaml")
    full = load_model(sc.model)
    context = sc.kv.max_model_len or full.max_len
    wide = _windowed(sc.model, context)
    p, rt = load_profile(sc.gpu), load_runtime("cuda-graph")
    assert memory_budget(sc, wide, p) == memory_budget(sc, full, p)
    a, b = StepLatency(full, p, rt), StepLatency(wide, p, rt)
    for n, ctx in ((1, 100), (8, 2000), (64, context)):
        assert b.decode(n, n * ctx, ctx) == pytest.approx(a.decode(n, n * ctx, ctx), rel=1e-12)
    assert b.prefill([(512, 1000)]) == pytest.approx(a.prefill([(512, 1000)]), rel=1e-12)
    assert wide.flops_per_token(context) == full.flops_per_token(context)


# ---- attention time ---------------------------------------------------------------------------

@pytest.mark.parametrize(("q", "kv", "w"), [(1, 1, 4), (5, 5, 3), (7, 20, 4), (3, 10, 8),
                                            (10, 12, 5), (100, 100, 128), (64, 4096, 128)])
def test_attended_keys_count_each_querys_keys(q, kv, w):
    positions = range(kv - q + 1, kv + 1)
    assert attended_keys(q, kv) == sum(positions)
    assert attended_keys(q, kv, w) == sum(min(p, w) for p in positions)


def test_decode_attention_of_sliding_layers_stops_growing_beyond_the_window():
    p, rt = load_profile("h200-sxm"), load_runtime("cuda-graph")
    every = StepLatency(_windowed("llama-3.1-8b", 512, every=True), p, rt)
    for ctx in (1024, 4096, 16_384):  # every layer sliding: the same as at the window
        assert every.decode_attn_ms(8, 8 * ctx, ctx) == every.decode_attn_ms(8, 8 * 512, 512)
    assert every.decode_attn_ms(8, 8 * 256, 256) < every.decode_attn_ms(8, 8 * 512, 512)
    half, full = (StepLatency(_windowed("llama-3.1-8b", 512), p, rt),
                  StepLatency(load_model("llama-3.1-8b"), p, rt))
    # half the layers sliding: beyond the window only the full half grows
    grow_half = half.decode_attn_ms(8, 8 * 16_384, 16_384) - half.decode_attn_ms(8, 8 * 4096, 4096)
    grow_full = full.decode_attn_ms(8, 8 * 16_384, 16_384) - full.decode_attn_ms(8, 8 * 4096, 4096)
    assert grow_half == pytest.approx(grow_full / 2, rel=1e-9)


def test_prefill_of_sliding_layers_scales_by_the_pairs_their_window_keeps():
    p, rt = load_profile("h200-sxm"), load_runtime("cuda-graph")
    every = StepLatency(_windowed("llama-3.1-8b", 512, every=True), p, rt)
    full = StepLatency(load_model("llama-3.1-8b"), p, rt)
    share = attended_keys(256, 8192, 512) / attended_keys(256, 8192)
    assert every.prefill_attn_ms(256, 8192) == pytest.approx(full.prefill_attn_ms(256, 8192) * share)
    assert every.prefill_attn_ms(256, 512) == full.prefill_attn_ms(256, 512)  # inside the window


def test_flops_per_token_count_the_window_in_sliding_layers():
    m = load_model("gpt-oss-120b")
    dense = m.flops_per_token(0)
    assert m.flops_per_token(10_000) - dense == 4 * 64 * 64 * (18 * 10_000 + 18 * 128)


# ---- gpt-oss model files, sinks, MXFP4 ---------------------------------------------------------

def test_gpt_oss_files_have_the_model_cards_sizes():
    big, small = load_model("gpt-oss-120b"), load_model("gpt-oss-20b")
    # model card: 116.83 B and 20.91 B with the o, router and expert biases this file leaves out
    assert round(big.params / 1e9, 1) == 116.8 and round(small.params / 1e9, 2) == 20.91
    # by hand: attention h x (64 + 2 x 8) x 64 + 4096 x h with q/k/v biases and 64 sinks,
    # 128 experts of 3 x h x h, the router h x 128, 2 norms; embeddings 2 x V x h; final norm
    h, V = 2880, 201088
    per_layer = (h * 5120 + 5120 + 64 + 4096 * h + 128 * 3 * h * h + h * 128 + 2 * h)
    assert big.params == 36 * per_layer + 2 * V * h + h
    experts = 36 * 128 * 3 * h * h
    assert big.weight_bytes == round((big.params - experts) * 2 + experts * 0.53125)
    assert round(big.weight_bytes / 2**30, 1) == 60.7  # card: checkpoint 60.8 GiB
    assert round(small.weight_bytes / 2**30, 1) == 12.8  # card: 12.8 GiB


def test_sinks_add_a_parameter_per_head_and_no_time():
    m = load_model("gpt-oss-20b")
    plain = dataclasses.replace(m, attention_sinks=False)
    assert m.params - plain.params == 24 * 64
    p, rt = load_profile("h200-sxm"), load_runtime("cuda-graph")
    assert StepLatency(m, p, rt).decode(4, 4000, 1000) == StepLatency(plain, p, rt).decode(4, 4000, 1000)


def test_mxfp4_experts_read_fewer_bytes_at_the_bf16_rate():
    p = load_profile("h200-sxm")
    w4, bf16 = p.gemm_weights(1, 2880, 5760, 0.53125)[0], p.gemm(1, 2880, 5760)[0]
    assert w4 < bf16  # a one-row GEMM reads its weights: about a quarter of the bytes
    big = 8192  # compute-bound: the same bf16 rate, the same time up to the weights' bytes
    assert p.gemm_weights(big, 2880, 5760, 0.53125)[0] == pytest.approx(p.gemm(big, 2880, 5760)[0],
                                                                        rel=0.02)


@pytest.mark.parametrize(("field", "value", "needle"), [
    ("layer_types", ["full_attention"] * 3, "3 entries (allowed: one per layer"),
    ("layer_types", ["local"] * 24, "'local'"),
    ("sliding_window", 0, "sliding_window: 0 with sliding_attention layers"),
])
def test_bad_window_fields_are_one_line(field, value, needle):
    data = dataclasses.asdict(load_model("gpt-oss-20b"))
    data[field] = value
    with pytest.raises(SpecError) as e:
        build(type(load_model("gpt-oss-20b")), data, file="m.yaml")
    assert needle in str(e.value) and "\n" not in str(e.value)


# ---- models import ------------------------------------------------------------------------------

@pytest.mark.parametrize(("layers", "experts", "shipped"), [(36, 128, "gpt-oss-120b"),
                                                            (24, 32, "gpt-oss-20b")])
def test_gpt_oss_configs_import_to_the_shipped_files(tmp_path, llmsim, layers, experts, shipped):
    cfg = {**GPT_OSS_CONFIG, "num_hidden_layers": layers, "num_local_experts": experts,
           "layer_types": ["sliding_attention", "full_attention"] * (layers // 2)}
    out = tmp_path / f"{shipped}.yaml"
    r = llmsim("models", "import", str(write(tmp_path, cfg)), "--out", str(out))
    assert r.returncode == 0, r.stderr
    m, ship = load_model(str(out)), load_model(shipped)
    for f in ("layers", "hidden", "heads", "kv_heads", "head_dim", "vocab", "num_experts",
              "num_experts_per_tok", "moe_intermediate_size", "max_len", "sliding_window",
              "layer_types", "attention_sinks", "expert_dtype_bytes", "qkv_bias"):
        assert getattr(m, f) == getattr(ship, f), f
    assert (m.params, m.weight_bytes, m.kv_bytes_per_token) == (
        ship.params, ship.weight_bytes, ship.kv_bytes_per_token)
    assert "rope_scaling" in out.read_text()  # YaRN: said, not used


def test_a_mistral_style_window_applies_to_every_layer():
    cfg = {"model_type": "mistral", "hidden_size": 4096, "intermediate_size": 14336,
           "max_position_embeddings": 32768, "num_attention_heads": 32,
           "num_hidden_layers": 32, "num_key_value_heads": 8, "vocab_size": 32000,
           "sliding_window": 4096}  # mistralai/Mistral-7B-v0.1
    f, _ = model_fields(cfg, "m")
    assert f["sliding_window"] == 4096 and "layer_types" not in f
    f, notes = model_fields({**cfg, "model_type": "qwen2", "use_sliding_window": False}, "q")
    assert "sliding_window" not in f and "use_sliding_window false" in " ".join(notes)


@pytest.mark.parametrize(("extra", "needle"), [
    ({"layer_types": ["chunked_attention", "full_attention"] * 18},
     "layer_types: 'chunked_attention': only full and sliding-window attention"),
    ({"use_sliding_window": True}, "use_sliding_window: true: sliding layers chosen by"),
    ({"layer_types": None, "sliding_window_pattern": 6}, "sliding_window_pattern: without"),
])
def test_what_windows_cannot_express_is_refused_in_one_line(tmp_path, refused, extra, needle):
    cfg = {k: v for k, v in {**GPT_OSS_CONFIG, **extra}.items() if v is not None}
    refused(["models", "import", str(write(tmp_path, json.dumps(cfg))), "--out",
             str(tmp_path / "m.yaml")], tmp_path, "allowed:", needle)
