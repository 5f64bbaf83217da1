"""Expert parallelism with attention data parallelism (sim/costmodel/parallel.py, comm.py,
latency.py): all-to-all bytes and times worked by hand, a DP-attention step's attention equal
to one GPU's on its share of the batch, KV capacity per rank, layouts refused in one line."""

from __future__ import annotations

import math

import pytest

from sim.costmodel.latency import StepLatency
from sim.costmodel.models import load_model
from sim.costmodel.parallel import ParallelSpec, check_layout
from sim.costmodel.profiles import load_profile
from sim.costmodel.runtime import load_runtime
from sim.io.specload import SpecError, build

NDR400 = (50.0, 10.0)  # gpu_profiles/links.yaml infiniband-ndr400: GB/s per GPU, µs


def _lat(model: str = "deepseek-v3", gpu: str = "h200-sxm", **kw) -> StepLatency:
    return StepLatency(load_model(model), load_profile(gpu), load_runtime("cuda-graph"),
                       fp8_weights=True, **kw)


def test_dispatch_bytes_are_tokens_hidden_bytes_topk_times_ep_minus_one_over_ep():
    lat = _lat(data=8, expert=8)
    link = load_profile("h200-sxm").facts.interconnect
    op = load_model("deepseek-v3").ops(1, 8).find("experts_dispatch")
    T, h, k, ep = 512, 7168, 8, 8  # 64 tokens on each of the 8 attention ranks
    # uniform routing: the busiest rank receives T · k / ep rows of hidden, bf16
    assert T * op.shape[0] == T * k * h * 2 // ep
    per_gpu = T // 8
    on_link = per_gpu * h * 2 * (ep - 1) / ep * k  # 64 x 7168 x 2 x 7/8 x 8: 6.42 MB
    assert on_link == pytest.approx(6_422_528)
    ms, tag = lat._collective("all_to_all", T * op.shape[0])
    assert ms == pytest.approx(on_link / (link.bus_gbs * 1e6) + link.latency_us * 1e-3)
    # the step prices the busiest rank: the mean bytes times the imbalance factor
    f = lat._busiest(T)
    assert 1.0 < f < 1.1
    assert tag == "analytic"


def test_all_to_all_across_two_nodes_sends_half_over_the_nic():
    p = load_profile("h200-sxm")
    link = p.facts.interconnect
    S = 8e6
    ms, _ = p.comm.all_to_all(S, 16, NDR400)
    nvlink = 7 / 16 * S / (link.bus_gbs * 1e6)  # 7 peers in the node
    network = 8 / 16 * S / (50 * 1e6)  # 8 peers in the other node, one 400 Gb/s NIC
    assert network > nvlink
    assert ms == pytest.approx(network + link.latency_us * 1e-3 + 10e-3)
    with pytest.raises(ValueError, match="network link"):
        p.comm.all_to_all(S, 16)


def test_wide_ep_on_an_nvl72_rack_stays_on_nvlink():
    p = load_profile("gb200-nvl72")
    link = p.facts.interconnect
    ms, _ = p.comm.all_to_all(1e6, 64)
    assert ms == pytest.approx(63 / 64 * 1e6 / (link.bus_gbs * 1e6) + link.latency_us * 1e-3)


def test_dp_attention_step_attention_equals_one_gpus_on_its_share():
    dp = _lat(data=8, expert=8)
    one = _lat()  # the whole model on one GPU: the same attention, unsplit heads
    # decode: 64 sequences over 8 ranks, 8 each, mean context 2000
    assert dp.decode_attn_ms(64, 64 * 2000, 2000) == pytest.approx(
        one.decode_attn_ms(8, 8 * 2000, 2000))
    # an uneven batch: the busiest rank has ceil(65 / 8) = 9
    assert dp.decode_attn_ms(65, 65 * 2000, 2000) == pytest.approx(
        one.decode_attn_ms(9, 9 * 2000, 2000))
    # prefill of 8 equal prompts: one per rank, the step's attention is one call
    tokens, ms = dp._per_sequence([(1024, 0)] * 8, dp.prefill_attn_ms)
    assert tokens == 8192
    assert ms == pytest.approx(one.prefill_attn_ms(1024, 1024))
    # one long prompt cannot be split: the busiest rank runs it whole
    _, ms = dp._per_sequence([(4096, 0), (16, 0)], dp.prefill_attn_ms)
    assert ms == pytest.approx(one.prefill_attn_ms(4096, 4096))


def test_dp_attention_runs_the_ranks_own_gemms_on_its_share_and_experts_on_all_tokens():
    dp = _lat(data=8, expert=8)
    p = load_profile("h200-sxm")
    parts = dp._dense_lookup(64)
    # the first GEMM is the 3 dense layers' q_a (7168 -> 1536, fp8), on the rank's 8 rows
    ms, _ = p.gemm_fp8(8, 7168, 1536)
    assert parts[0][0] == pytest.approx(3 * ms)
    # the routed experts' grouped GEMMs see all 64 tokens' rows: grows with the batch
    assert dp.experts_ms(64) > dp.experts_ms(8)


def test_dp_attention_holds_d_times_one_gpus_kv():
    import dataclasses

    from sim.config.scenario import load_scenario
    from sim.engine.memory import memory_budget
    from sim.io.specload import ROOT
    m, p = load_model("deepseek-v3"), load_profile("h200-sxm")
    m8 = dataclasses.replace(m, weight_dtype_bytes=1)
    base = load_scenario(ROOT / "scenarios" / "quickstart.yaml")
    base = dataclasses.replace(base, kv=dataclasses.replace(base.kv, max_model_len=8192))
    dp = dataclasses.replace(base, parallel=ParallelSpec(data=8, expert=8))
    budget = memory_budget(dp, m8, p)
    per_gpu = budget.kv_bytes // m8.ops(1, 8).kv_bytes_per_token(m8.kv_dtype_bytes)
    assert budget.kv_tokens == 8 * per_gpu
    tp = memory_budget(dataclasses.replace(base, parallel=ParallelSpec(tensor=8)), m8, p)
    assert budget.kv_tokens > 4 * tp.kv_tokens  # TP replicates the latent on every GPU


def _check(gpu: str = "h200-sxm", model: str = "deepseek-v3", **par) -> None:
    check_layout(ParallelSpec(**par), load_model(model), load_profile(gpu), file="s.yaml")


def test_good_ep_layouts_pass():
    _check(data=8, expert=8)
    _check(tensor=2, data=4, expert=8)
    _check(data=16, expert=16, network="infiniband-ndr400")
    _check("gb200-nvl72", data=64, expert=64)
    _check("gb200-nvl72", data=32, expert=32)


@pytest.mark.parametrize(("gpu", "model", "par", "match"), [
    ("h200-sxm", "deepseek-v3", {"data": 16, "expert": 16},
     r"parallel\.expert: 16 exceeds the 8-GPU NVLink domain of h200-sxm and no network"),
    ("h200-sxm", "deepseek-v3", {"data": 12, "expert": 12, "network": "infiniband-ndr400"},
     r"parallel\.expert: 12 does not divide num_experts=256"),
    ("gb200-nvl72", "deepseek-v3", {"data": 128, "expert": 128, "network": "infiniband-ndr400"},
     r"parallel\.expert: 128 spans a partial 72-GPU NVLink domain"),
    ("gb200-nvl72", "deepseek-v3", {"data": 72, "expert": 72},
     r"72 does not divide num_experts=256"),
    ("h200-sxm", "mixtral-8x7b", {"data": 16, "expert": 16, "network": "infiniband-ndr400"},
     r"16 does not divide num_experts=8"),
    ("h200-sxm", "deepseek-v3", {"data": 8, "expert": 8, "network": "carrier-pigeon"},
     r"parallel\.network: unknown 'carrier-pigeon'"),
    ("h200-sxm", "llama-3-8b", {"data": 8, "expert": 8}, "has no experts"),
])
def test_bad_ep_layouts_are_refused_in_one_line(gpu, model, par, match):
    with pytest.raises(SpecError, match=match) as e:
        _check(gpu, model, **par)
    assert "\n" not in str(e.value)


def test_data_parallel_attention_without_experts_over_all_gpus_is_refused():
    with pytest.raises(SpecError, match=r"data: 8 attention ranks need the experts "
                       r"spread over all 8 GPUs"):
        build(ParallelSpec, {"data": 8}, file="s.yaml")


def test_imbalanced_routing_slows_the_dp_step_by_the_busiest_expert_rank():
    import dataclasses
    m, p, rt = load_model("deepseek-v3"), load_profile("h200-sxm"), load_runtime("cuda-graph")
    skew = dataclasses.replace(m, router_zipf_s=0.6)
    even = StepLatency(m, p, rt, data=8, expert=8).decode(256, 256 * 1000, 1000)
    hot = StepLatency(skew, p, rt, data=8, expert=8).decode(256, 256 * 1000, 1000)
    assert hot > even
    assert math.isfinite(hot)


def test_plans_search_ep_layouts_and_skip_refused_combinations_with_the_reason():
    from sim.io.specload import ROOT
    from sim.planning.candidates import candidate_grid, is_typo, label, resolve
    grid = candidate_grid({"tensor": [1, 8], "data": [1, 8], "expert": [1, 8]})
    assert len(grid) == 8
    scenario = ROOT / "scenarios" / "deepseek_r1_h200.yaml"
    ok, refused = [], []
    for cand in grid:
        r = resolve(scenario, cand)
        (refused if isinstance(r, SpecError) else ok).append((label(cand), r))
    assert sorted(name for name, _ in ok) == ["tp1 dp8 ep8", "tp8 dp1 ep1", "tp8 dp1 ep8"]
    assert all(not is_typo(e) for _, e in refused)  # listed as skipped, the plan goes on
    reasons = dict(refused)
    assert "does not fit" in reasons["tp1 dp1 ep1"].message  # 671 B on one GPU
    assert "need the experts spread over all 64 GPUs" in reasons["tp8 dp8 ep8"].message


def test_busiest_ep_rank_factor_by_hand():
    from sim.costmodel.moe import local_routing
    r = local_routing(256, 8, ep=8)  # DeepSeek: 256 experts, top-8, EP 8
    # 512 tokens: 4096 picks, 512 a rank on average, sd sqrt(4096 x 1/8 x 7/8) = 21.17;
    # the largest of 8 normals is on average 1.434 sd above the mean (Blom, Φ⁻¹(7.625/8.25))
    assert r.busiest_factor(512) == pytest.approx(1 + 1.434 * 21.166 / 512, rel=2e-4)
    assert local_routing(256, 8).busiest_factor(512) == 1.0  # no expert parallelism
    assert r.busiest_factor(10**7) == pytest.approx(1.0, abs=1e-3)  # large batches even out
    assert local_routing(256, 8, ep=32).busiest_factor(512) > r.busiest_factor(512)


@pytest.mark.parametrize(("E", "k", "R", "T"), [(256, 8, 8, 512), (256, 8, 32, 256),
                                                (128, 8, 8, 64)])
def test_busiest_ep_rank_factor_matches_simulated_top_k_routing(E, k, R, T):
    import numpy as np

    from sim.costmodel.moe import local_routing
    rng = np.random.default_rng(0)
    ratios = []
    for _ in range(400):
        picks = np.argsort(rng.random((T, E)), axis=1)[:, :k]  # k distinct experts a token
        loads = np.bincount(picks.ravel() // (E // R), minlength=R)  # contiguous E/R a rank
        ratios.append(loads.max() / loads.mean())
    assert local_routing(E, k, ep=R).busiest_factor(T) == pytest.approx(np.mean(ratios), rel=0.02)


def test_dispatch_bytes_follow_the_busiest_rank():
    lat = _lat(data=8, expert=8)
    op = load_model("deepseek-v3").ops(1, 8).find("experts_dispatch")
    f = lat._busiest(512)
    assert f > 1.0
    parts = lat._lookup(512, 64, own=False)
    a2a, _ = lat._collective("all_to_all", 512 * op.shape[0] * f)
    assert sum(ms for ms, _ in parts) > 2 * 58 * a2a * 0.999  # dispatch + combine, 58 layers


def test_a_draft_model_with_dp_attention_is_refused_in_one_line():
    with pytest.raises(SpecError, match=r"parallel\.data: a draft model with attention data "
                       r"parallelism is not modelled \(allowed: 1, or speculative\.method mtp\)"):
        check_layout(ParallelSpec(data=8, expert=8), load_model("deepseek-v3"),
                     load_profile("h200-sxm"), file="s.yaml", draft=load_model("llama-3.2-1b"))
