"""A model's forward pass as one list of operations (sim/costmodel/layer.py): known answers
for Llama-3-8B, the list against the closed-form sizes of every shipped model, and
latency and memory reading the list (drop an op: the step costs less, the KV cache grows)."""

from __future__ import annotations

import dataclasses
import math

import pytest

from sim.config.scenario import load_scenario
from sim.costmodel import layer
from sim.costmodel.latency import StepLatency
from sim.costmodel.layer import fuse_add_norms
from sim.costmodel.models import known_models, load_model
from sim.costmodel.parallel import DTypeSpec, ParallelSpec, with_dtypes
from sim.costmodel.profiles import load_profile
from sim.costmodel.runtime import load_runtime
from sim.engine.memory import memory_budget
from sim.io.specload import ROOT

KIB = 1024
LLAMA_LAYER = ["input_norm", "qkv", "rotary", "kv_write", "attention", "o",
               "attention_residual", "mlp_norm", "gate_up", "activation", "down", "mlp_residual"]


# ---- Llama-3-8B, by hand -----------------------------------------------------------------
# hidden 4096, 32 layers, 32 query heads and 8 KV heads of 128, ffn 14336, vocab 128256, untied:
# embedding 128256 x 4096 = 525,336,576; per layer qkv 4096 x (4096 + 2 x 1024) = 25,165,824,
# o 4096 x 4096 = 16,777,216, gate/up 4096 x 2 x 14336 = 117,440,512, down 14336 x 4096 =
# 58,720,256, 2 norms 8,192: 218,112,000 x 32 = 6,979,584,000; final norm 4,096; LM head
# 525,336,576. In all 8,030,261,248 (published: 8.03 B).

def test_llama3_8b_layer_runs_its_ops_in_llama_order():
    ops = load_model("llama-3-8b").ops()
    assert [op.name for op in ops.layer] == LLAMA_LAYER
    assert [op.name for op in ops.first] == ["embedding"]
    assert [op.name for op in ops.last] == ["final_norm", "lm_head"]
    assert ops.layers == 32


def test_llama3_8b_has_8_03_billion_parameters_from_its_op_list():
    ops = load_model("llama-3-8b").ops()
    assert ops.params == 8_030_261_248
    assert ops.find("qkv").params == 25_165_824
    assert ops.find("gate_up").params == 117_440_512
    assert ops.find("embedding").params == ops.find("lm_head").params == 525_336_576
    assert ops.weight_bytes(2) == 16_060_522_496


def test_llama3_8b_kv_cache_holds_128_kib_per_token_in_bf16():
    ops = load_model("llama-3-8b").ops()
    assert ops.kv_bytes_per_token(2) == 2 * 32 * 8 * 128 * 2 == 128 * KIB
    assert ops.kv_bytes_per_token(1) == 64 * KIB  # fp8 cache


def test_llama3_8b_gemm_shapes_at_tp1_and_tp4():
    m = load_model("llama-3-8b")
    assert m.ops(1).gemm_shapes() == {
        "qkv": (4096, 6144), "o": (4096, 4096), "gate_up": (4096, 28672),
        "down": (14336, 4096), "lm_head": (4096, 128256)}
    # TP 4: 8 query heads and 2 KV heads per GPU, a quarter of the MLP, vocabulary / 4
    assert m.ops(4).gemm_shapes() == {
        "qkv": (4096, 1024 + 2 * 256), "o": (1024, 4096), "gate_up": (4096, 7168),
        "down": (3584, 4096), "lm_head": (4096, 32064)}
    assert m.ops(4).find("attention").shape == (8, 2, 128)


def test_llama3_8b_splits_columns_then_rows_and_the_vocabulary():
    ops = load_model("llama-3-8b").ops()
    split = {op.name: op.split for op, _ in ops.each()}
    assert [split[n] for n in ("qkv", "gate_up", "o", "down")] == ["column", "column", "row", "row"]
    assert split["embedding"] == split["lm_head"] == "vocab"
    assert split["input_norm"] == split["mlp_norm"] == split["final_norm"] == "replicated"


def test_tp4_adds_an_all_reduce_after_each_row_split_op_and_the_embedding():
    ops = load_model("llama-3-8b").ops(4)
    names = [op.name for op in ops.layer]
    assert names[names.index("o") + 1] == "o_all_reduce"
    assert names[names.index("down") + 1] == "down_all_reduce"
    assert [op.name for op in ops.first] == ["embedding", "embedding_all_reduce"]
    assert [op.name for op in ops.last] == ["final_norm", "lm_head", "lm_head_all_gather"]
    reduces = sum(t for op, t in ops.each() if op.kernel == "all_reduce")
    assert reduces == 2 * 32 + 1
    assert ops.find("o_all_reduce").shape == (4096 * 2,)  # bytes per token, bf16
    assert ops.find("lm_head_all_gather").shape == (128256 * 2,)  # the whole vocabulary
    assert not load_model("llama-3-8b").ops(1).of_kind("collective")


def test_llama3_8b_flops_per_token_are_twice_its_matmul_weights():
    ops = load_model("llama-3-8b").ops()
    matmul = 32 * (25_165_824 + 16_777_216 + 117_440_512 + 58_720_256) + 525_336_576
    assert ops.flops_per_token(0) == 2 * matmul
    assert ops.flops_per_token(1000) - ops.flops_per_token(0) == 4 * 32 * 32 * 128 * 1000


def test_llama3_8b_activations_are_residual_norm_qkv_and_gate_up_plus_fp32_logits():
    ops = load_model("llama-3-8b").ops()
    per_token = (4096 + 4096 + 6144 + 28672) * 2
    assert ops.activation_bytes(1, 0) == per_token
    assert ops.activation_bytes(8192, 256) == 8192 * per_token + 256 * 128256 * 4


def test_fused_stacks_fold_each_residual_add_into_the_norm_after_it():
    for tp in (1, 4):
        layer_ops = load_model("llama-3-8b").ops(tp).layer
        fused = fuse_add_norms(layer_ops)
        kernels = [op.kernel for op in fused]
        assert kernels.count("add_rmsnorm") == 2
        assert "residual_add" not in kernels and "rmsnorm" not in kernels
        assert len(fused) == len(layer_ops) - 2
        assert fused[0].name == "input_norm"  # the previous layer's last add, cyclically


# ---- every shipped model: the list against the closed-form sizes --------------------------

def _closed_form_params(m) -> int:
    """Parameters of a Llama-style model (or one GPU's shard), written out apart from the list."""
    q, kv = m.heads * m.head_dim, m.kv_heads * m.head_dim
    attention = m.hidden * (q + 2 * kv) + q * m.hidden + ((q + 2 * kv) if m.qkv_bias else 0)
    attention += m.heads if m.attention_sinks else 0  # a sink logit per query head (gpt-oss)
    if m.kv_lora_rank:  # latent attention: q down/norm/up, kv down/norm/up, o
        qk, r, rope = m.qk_nope_head_dim + m.qk_rope_head_dim, m.kv_lora_rank, m.qk_rope_head_dim
        ql = m.q_lora_rank
        attention = ((m.hidden * ql + ql + ql * m.heads * qk) if ql else m.hidden * m.heads * qk)
        attention += (m.hidden * (r + rope) + r + r * m.heads * (m.qk_nope_head_dim + m.v_head_dim)
                      + m.heads * m.v_head_dim * m.hidden)
    mlp = (3 if m.gated_mlp else 2) * m.hidden * m.ffn
    per_layer = attention + mlp + 2 * m.hidden
    lm_head = 0 if m.tied_embeddings else m.vocab * m.hidden
    layers = m.layers * per_layer
    if m.num_experts:  # routed + shared experts (gated, 3 matrices each) and the router
        E, dense = m.num_experts, m.first_k_dense_replace
        experts = (E + m.n_shared_experts) * 3 * m.hidden * m.moe_intermediate_size
        moe_layer = attention + experts + (m.hidden * E if E > 1 else 0) + 2 * m.hidden
        layers = dense * per_layer + (m.layers - dense) * moe_layer
    return m.vocab * m.hidden + layers + m.hidden + lm_head


def _layouts():
    for name in known_models():
        m = load_model(name)
        for tp in (1, 2, 4, 8, 16):
            if m.tensor_problem(tp) is None:
                for weights, kv in (("bf16", "bf16"), ("fp8", "bf16"), ("fp8", "fp8")):
                    yield name, tp, weights, kv


@pytest.mark.parametrize(("name", "tp", "weights", "kv"), list(_layouts()))
def test_op_list_weight_and_kv_bytes_equal_the_models_for_every_layout(name, tp, weights, kv):
    m = with_dtypes(load_model(name), DTypeSpec(weights=weights, kv_cache=kv), load_profile("h200-sxm"))
    shard, ops = m.shard(tp), m.ops(tp)
    per_op = sum(op.weight_bytes(m.expert_width if op.kind == "grouped_gemm" else
                                 m.weight_dtype_bytes) * t for op, t in ops.each())
    # the routed experts at their own width (MXFP4: 0.53125 bytes), the rest at the model's
    routed = ((m.layers - m.first_k_dense_replace) * m.num_experts * 3 * m.hidden
              * shard.moe_intermediate_size)
    closed = ((_closed_form_params(shard) - routed) * m.weight_dtype_bytes
              + routed * m.expert_width)
    assert round(per_op) == shard.weight_bytes == round(closed)
    width = {"bf16": 2, "fp8": 1}
    per_layer = ((m.kv_lora_rank + m.qk_rope_head_dim) if m.kv_lora_rank  # one latent, every GPU
                 else 2 * shard.kv_heads * m.head_dim)
    assert shard.kv_bytes_per_token == m.layers * per_layer * width[kv]
    assert ops.kv_bytes_per_token(m.kv_dtype_bytes) == shard.kv_bytes_per_token


@pytest.mark.parametrize("name", known_models())
def test_each_op_splits_as_its_label_says(name):
    m = load_model(name)
    full = {op.name: op for op, _ in m.ops(1).each()}
    for tp in (2, 4, 8, 16):  # 16: Llama-2-70B's 8 KV heads replicated, one per GPU
        if m.tensor_problem(tp):
            continue
        for op, _ in m.ops(tp).each():
            if op.kind == "collective":
                continue
            whole = full[op.name]
            if op.split == "replicated":
                assert op.shape == whole.shape and op.params == whole.params, op.name
            elif op.kind in ("gemm", "grouped_gemm", "lm_head"):
                (k, n), (k1, n1) = op.shape, whole.shape
                if op.split == "row":
                    assert (k * tp, n) == (k1, n1), op.name
                else:  # column, vocab: N split (rounded up; KV heads may be replicated)
                    assert k == k1 and math.ceil(n1 / tp) <= n < n1, op.name
            elif op.kind == "embedding":
                assert op.params == math.ceil(m.vocab / tp) * m.hidden


# ---- latency and memory read the list ---------------------------------------------------

def _without(monkeypatch, name: str) -> None:
    """Models whose layer lacks the op `name` (a test model: Llama less one operation)."""
    build = layer.decoder_layer
    monkeypatch.setattr(layer, "decoder_layer",
                        lambda m: tuple(op for op in build(m) if op.name != name))


@pytest.mark.parametrize("elementwise", ["fused", "as_measured"])
@pytest.mark.parametrize("tp", [1, 4])
@pytest.mark.parametrize("dropped", ["gate_up", "activation", "mlp_norm", "o", "attention_residual"])
def test_a_layer_without_an_op_costs_less_per_step(monkeypatch, dropped, tp, elementwise):
    m, p = load_model("llama-3-8b"), load_profile("h200-sxm")
    rt = load_runtime("cuda-graph")  # kernels only: no host time to hide a saving
    rt = dataclasses.replace(rt, elementwise=elementwise)
    full = StepLatency(m, p, rt, tensor=tp)
    steps = (full.decode(32, 32 * 1000, 1000), full.prefill([(2048, 0)]))
    _without(monkeypatch, dropped)
    less = StepLatency(m, p, rt, tensor=tp)
    assert less.decode(32, 32 * 1000, 1000) < steps[0]
    assert less.prefill([(2048, 0)]) < steps[1]


def test_a_layer_without_its_mlp_leaves_more_memory_for_the_kv_cache(monkeypatch):
    sc = load_scenario(ROOT / "scenarios" / "llama2_70b_tp.yaml")
    sc = dataclasses.replace(sc, parallel=ParallelSpec(tensor=4))
    m, p = load_model(sc.model), load_profile(sc.gpu)
    full = memory_budget(sc, m, p)
    _without(monkeypatch, "gate_up")
    less = memory_budget(sc, m, p)
    f = m.ffn // 4  # one GPU's quarter of the MLP
    assert full.weight_bytes - less.weight_bytes == m.layers * m.hidden * 2 * f * 2
    step = sc.scheduler.max_num_batched_tokens
    assert full.activation_bytes - less.activation_bytes == step * 2 * f * 2
    assert less.kv_tokens > full.kv_tokens
