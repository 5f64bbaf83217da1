"""Mixture-of-Experts (sim/costmodel/moe.py, layer.moe_layer): distinct experts by the
closed form and by simulation of routing, published model sizes, a one-expert MoE equal to
its dense model, decode time following the distinct experts hit, expert parallelism."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from sim.config.scenario import load_scenario
from sim.costmodel.latency import StepLatency
from sim.costmodel.models import load_model
from sim.costmodel.moe import Routing, local_routing, pick_probabilities
from sim.costmodel.parallel import ParallelSpec, check_layout
from sim.costmodel.profiles import load_profile
from sim.costmodel.runtime import load_runtime
from sim.engine.memory import memory_budget
from sim.io.specload import ROOT, SpecError, build


def _uniform(E: int, k: int) -> Routing:
    return Routing(k, pick_probabilities(E, k))


# ---- distinct experts --------------------------------------------------------------------

def test_uniform_distinct_experts_follow_e_times_one_minus_survival():
    r = _uniform(8, 2)  # Mixtral: 8 experts, top-2
    assert r.distinct(1) == pytest.approx(2.0)  # one token: its k experts
    assert r.distinct(3) == pytest.approx(8 * (1 - 0.75 ** 3))  # 4.625 by hand
    assert r.distinct(3) == pytest.approx(4.625)
    assert r.distinct(10_000) == pytest.approx(8.0)  # a large batch hits them all
    q = _uniform(128, 8)  # Qwen3-30B-A3B
    assert q.distinct(1) == pytest.approx(8.0)
    assert q.distinct(16) == pytest.approx(128 * (1 - (1 - 8 / 128) ** 16))  # 80.3


@pytest.mark.parametrize(("E", "k", "T"), [(8, 2, 4), (128, 8, 16), (64, 6, 3)])
def test_distinct_experts_match_a_simulated_top_k_routing(E, k, T):
    rng = np.random.default_rng(7)
    trials = 4000
    counts = [len({int(e) for _ in range(T) for e in rng.choice(E, size=k, replace=False)})
              for _ in range(trials)]
    mean, sem = np.mean(counts), np.std(counts) / math.sqrt(trials)
    assert abs(_uniform(E, k).distinct(T) - mean) < 4 * sem + 1e-9


def test_skewed_routing_hits_fewer_experts_than_uniform_and_keeps_k_per_token():
    zipf = Routing(2, pick_probabilities(8, 2, zipf_s=1.2))
    assert math.fsum(zipf.picks) == pytest.approx(2.0)
    assert all(0 < q <= 1 for q in zipf.picks)
    assert zipf.distinct(1) == pytest.approx(2.0)
    for T in (2, 4, 16, 64):  # 1 − (1 − q)^T is concave in q: spreading evenly hits most
        assert zipf.distinct(T) < _uniform(8, 2).distinct(T)


def test_a_measured_histogram_sets_each_experts_share():
    flat = pick_probabilities(4, 1, load=(5, 5, 5, 5))
    assert flat == pytest.approx((0.25,) * 4)
    q = pick_probabilities(4, 2, load=(10, 30, 40, 20))  # shares .1 .3 .4 .2, most popular first
    assert q == pytest.approx((0.8, 0.6, 0.4, 0.2))
    capped = pick_probabilities(3, 2, load=(8, 1, 1))  # 2 x 0.8 > 1: every token picks it
    assert capped == pytest.approx((1.0, 0.5, 0.5))


def test_one_expert_takes_every_token():
    r = _uniform(1, 1)
    assert r.groups(37) == ((1.0, 37.0),)


def test_expected_rows_over_hit_experts_sum_to_the_tokens_choices():
    for r in (_uniform(8, 2), Routing(8, pick_probabilities(128, 8, zipf_s=0.8))):
        for T in (1, 5, 64, 1000):
            rows = sum(hit * m for hit, m in r.groups(T))
            assert rows == pytest.approx(T * r.top_k)


# ---- model files: published sizes ---------------------------------------------------------

def test_mixtral_8x7b_has_46_7_b_parameters_12_9_b_active():
    m = load_model("mixtral-8x7b")  # Mistral AI: 46.7 B total, 12.9 B active per token
    assert round(m.params / 1e9, 1) == 46.7
    assert round(m.active_params / 1e9, 1) == 12.9
    # by hand: per layer attention 4096 x 6144 + 4096 x 4096, 8 experts x 3 x 4096 x 14336,
    # router 4096 x 8, 2 norms; embedding and LM head 32000 x 4096 each, final norm
    per_layer = 4096 * 6144 + 4096 * 4096 + 8 * 3 * 4096 * 14336 + 4096 * 8 + 2 * 4096
    assert m.params == 32 * per_layer + 2 * 32000 * 4096 + 4096


def test_qwen3_30b_a3b_has_30_5_b_parameters_3_3_b_active():
    m = load_model("qwen3-30b-a3b")  # Qwen: 30.5 B total, 3.3 B active
    assert round(m.params / 1e9, 1) == 30.5
    assert 3.3 <= m.active_params / 1e9 < 3.4  # 3.35 B: the published figure truncates
    assert m.kv_bytes_per_token == 2 * 48 * 4 * 128 * 2  # 96 KiB


def test_moe_flops_count_only_the_k_experts_a_token_uses():
    m = load_model("mixtral-8x7b")
    # 2 per weight multiplied: attention, 2 of 8 experts, the router; the LM head
    per_layer = 4096 * 6144 + 4096 * 4096 + 2 * 3 * 4096 * 14336 + 4096 * 8
    assert m.flops_per_token(0) == 2 * (32 * per_layer + 4096 * 32000)


# ---- a one-expert MoE is its dense model ----------------------------------------------------

def _one_expert(name: str):
    m = load_model(name)
    return dataclasses.replace(m, num_experts=1, num_experts_per_tok=1,
                               moe_intermediate_size=m.ffn)


@pytest.mark.parametrize("tp", [1, 2, 4])
@pytest.mark.parametrize("runtime", ["cuda-graph", "vllm"])
def test_a_one_expert_moe_gives_the_dense_answer_exactly(tp, runtime):
    dense, moe = load_model("llama-3-8b"), _one_expert("llama-3-8b")
    assert moe.params == dense.params and moe.weight_bytes == dense.weight_bytes
    p, rt = load_profile("h200-sxm"), load_runtime(runtime)
    a, b = StepLatency(dense, p, rt, tensor=tp), StepLatency(moe, p, rt, tensor=tp)
    for n, ctx in ((1, 100), (8, 3000), (64, 1000), (256, 700)):
        assert b.decode(n, n * ctx, ctx) == a.decode(n, n * ctx, ctx)
    assert b.prefill([(2048, 0), (300, 100)]) == a.prefill([(2048, 0), (300, 100)])
    assert b.mixed(16, 16 * 500, 500, [(512, 0)]) == a.mixed(16, 16 * 500, 500, [(512, 0)])
    assert b.provenance_seconds() == a.provenance_seconds()


def test_a_one_expert_moe_leaves_the_same_memory():
    sc = load_scenario(ROOT / "scenarios" / "llama2_70b_tp.yaml")
    p = load_profile(sc.gpu)
    dense, moe = load_model(sc.model), _one_expert(sc.model)
    assert memory_budget(sc, moe, p) == memory_budget(sc, dense, p)


# ---- decode follows the distinct experts ---------------------------------------------------

def test_moe_decode_time_grows_with_batch_as_distinct_experts_grow():
    m, p = load_model("mixtral-8x7b"), load_profile("h200-sxm")
    lat = StepLatency(m, p, load_runtime("cuda-graph"), tensor=2)
    r = _uniform(8, 2)
    steps = [lat.decode(n, n * 16, 16) for n in (1, 2, 4, 8, 16)]
    assert steps == sorted(steps) and len(set(steps)) == 5
    # small batches are weight-bound: the experts' time scales as the experts hit
    one = lat.experts_ms(1)
    for n in (2, 3, 4, 8):
        assert lat.experts_ms(n) / one == pytest.approx(r.distinct(n) / r.distinct(1), rel=0.1)
    # every expert hit: from there on the experts' time barely grows
    assert lat.experts_ms(64) / lat.experts_ms(32) < 1.1


def test_qwen3_moe_decode_reads_far_fewer_bytes_than_its_size_suggests():
    p, rt = load_profile("h200-sxm"), load_runtime("cuda-graph")
    moe = StepLatency(load_model("qwen3-30b-a3b"), p, rt)
    # one token: 8 of 128 experts; 3.3 B active of 30.5 B total
    bw = p.facts.datasheet_mem_bw_tbs * 1e9  # bytes per ms at the datasheet rate
    all_experts_ms = 48 * 128 * 3 * 2048 * 768 * 2 / bw
    assert moe.experts_ms(1) < 0.2 * all_experts_ms


# ---- expert parallelism ---------------------------------------------------------------------

def _check(expert: int, tensor: int, model: str = "mixtral-8x7b") -> None:
    check_layout(ParallelSpec(tensor=tensor, expert=expert), load_model(model),
                 load_profile("h200-sxm"), file="s.yaml")


def test_expert_parallel_layouts_are_refused_in_one_line():
    _check(2, 2)
    _check(8, 8)
    with pytest.raises(SpecError, match=r"parallel\.expert: 4 differs from the replica's 2 GPUs"):
        _check(4, 2)
    with pytest.raises(SpecError, match="has no experts"):
        _check(2, 2, "llama-3-8b")
    with pytest.raises(SpecError, match="3 does not divide num_experts=8"):
        check_layout(ParallelSpec(tensor=3, expert=3),
                     dataclasses.replace(load_model("mixtral-8x7b"), heads=24, kv_heads=3,
                                         moe_intermediate_size=14337 * 3),
                     load_profile("h200-sxm"), file="s.yaml")


def test_expert_parallelism_holds_whole_experts_a_share_each():
    m = load_model("mixtral-8x7b")
    tp, ep = m.ops(2), m.ops(2, 2)
    assert tp.find("experts_gate_up").shape == (4096, 14336)  # split 2 ways
    assert ep.find("experts_gate_up").shape == (4096, 2 * 14336)  # whole
    assert ep.find("experts_gate_up").params == 4 * 4096 * 2 * 14336  # 4 of 8 experts
    assert tp.find("experts_gate_up").params == ep.find("experts_gate_up").params
    names = [op.name for op in ep.layer]
    assert "experts_dispatch" in names and "experts_combine_all_to_all" in names
    assert "experts_down_all_reduce" not in names


def test_all_to_all_follows_alpha_beta_over_the_nodes_link():
    p = load_profile("h200-sxm")
    link = p.facts.interconnect
    S = 2 * 1024 * 1024
    ms, tag = p.comm.all_to_all(S, 4)  # peers send at once: one α
    assert ms == pytest.approx(3 / 4 * S / (link.bus_gbs * 1e6) + link.latency_us * 1e-3)
    assert tag == "analytic"


def test_skewed_routing_loads_the_first_ep_rank_most():
    hot = local_routing(8, 2, zipf_s=1.0, ep=2)
    cold = local_routing(8, 2, zipf_s=1.0, ep=2, rank=1)
    even = local_routing(8, 2, ep=2)
    assert sum(even.picks) == pytest.approx(1.0)  # k / ep of each token's choices
    assert sum(hot.picks) > 1.0 > sum(cold.picks)
    assert sum(hot.picks) + sum(cold.picks) == pytest.approx(2.0)
    m = dataclasses.replace(load_model("mixtral-8x7b"), router_zipf_s=1.0)
    p, rt = load_profile("h200-sxm"), load_runtime("cuda-graph")
    assert (StepLatency(m, p, rt, tensor=2, expert=2).prefill([(4096, 0)])
            > StepLatency(load_model("mixtral-8x7b"), p, rt, tensor=2, expert=2).prefill([(4096, 0)]))


# ---- model files refuse what they cannot express --------------------------------------------

@pytest.mark.parametrize(("change", "field"), [
    ({"num_experts_per_tok": 9}, "num_experts_per_tok"),
    ({"moe_intermediate_size": 0}, "moe_intermediate_size"),
    ({"expert_load": [1, 2, 3]}, "expert_load"),
    ({"expert_load": [1] * 8, "router_zipf_s": 1.0}, "expert_load"),
    ({"first_k_dense_replace": 32}, "first_k_dense_replace"),
])
def test_bad_moe_fields_are_refused_naming_the_field(change, field):
    from sim.costmodel.models import ModelSpec
    from sim.io.specload import load_yaml
    data = {**load_yaml(ROOT / "models" / "mixtral-8x7b.yaml"), **change}
    with pytest.raises(SpecError, match=field):
        build(ModelSpec, data, file="m.yaml")


# ---- latent attention (DeepSeek-V3) --------------------------------------------------------

def test_deepseek_v3_has_671_b_parameters_37_b_active():
    m = load_model("deepseek-v3")  # DeepSeek: 671 B main model, 37 B activated per token
    assert round(m.params / 1e9) == 671
    assert round(m.active_params / 1e9) in (37, 38)  # 37.55 B: the figure truncates
    # by hand, one MLA layer: q_a 7168 x 1536, its norm, q_b 1536 x 128 x 192, kv_a
    # 7168 x 576, its norm (512), kv_b 512 x 128 x 256, o 128 x 128 x 7168
    mla = (7168 * 1536 + 1536 + 1536 * 128 * 192 + 7168 * 576 + 512 + 512 * 128 * 256
           + 128 * 128 * 7168)
    assert m.ops().find("o").params + m.ops().find("kv_b").params == 128 * 128 * 7168 + 512 * 32768
    assert sum(op.params for op in m.ops().layer[:12]) == mla + 7168  # with the input norm


def test_latent_attention_caches_576_elements_per_token_and_layer_on_every_gpu():
    m = load_model("deepseek-v3")
    assert m.kv_bytes_per_token == 61 * (512 + 64) * 2  # 68.6 KiB; as MHA: 61 x 2 x 128 x 128 x 2
    assert m.shard(8).kv_bytes_per_token == m.kv_bytes_per_token  # the latent is not split
    assert m.kv_bytes_per_token * 56 < 61 * 2 * 128 * 128 * 2  # 57x fewer bytes than MHA


def test_latent_attention_decodes_absorbed_and_prefills_expanded():
    m, p, rt = load_model("deepseek-v3"), load_profile("h200-sxm"), load_runtime("cuda-graph")
    att = m.ops(8).find("attention")
    assert att.shape == (16, 16, 192)  # prefill: 16 heads a GPU of nope + rope
    assert att.decode_shape == (16, 1, 288)  # decode: one latent head (K and V: 576)
    lat = StepLatency(m, p, rt, tensor=8)
    short, long = lat.decode(32, 32 * 1000, 1000), lat.decode(32, 32 * 8000, 8000)
    assert long > short
    # decode attention reads the latent: 8x the context costs far less than 8x the step
    assert long < 2 * short


def test_a_measured_expert_load_file_beside_the_model_sets_its_routing(tmp_path):
    from sim.io.specload import load_yaml
    data = {**load_yaml(ROOT / "models" / "mixtral-8x7b.yaml"), "name": "skewed",
            "expert_load_file": "load.txt"}
    import yaml
    (tmp_path / "skewed.yaml").write_text(yaml.safe_dump(data))
    (tmp_path / "load.txt").write_text("# routed tokens per expert\n40\n10\n10\n10\n10\n10\n5\n5\n")
    m = load_model(str(tmp_path / "skewed.yaml"))
    assert m.expert_load == (40, 10, 10, 10, 10, 10, 5, 5)
    # top-2: the hottest expert is picked by 2 x 40 % = 80 % of tokens
    assert m.ops().find("experts_gate_up").routing.picks[0] == pytest.approx(0.8)
    (tmp_path / "load.txt").write_text("40\nmany\n")
    with pytest.raises(SpecError, match="line 2"):
        load_model(str(tmp_path / "skewed.yaml"))
