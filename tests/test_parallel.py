"""Tensor parallelism, collectives, memory feasibility and FP8: known answers."""

from __future__ import annotations

import csv
import dataclasses
import math
from pathlib import Path

import pytest

from sim.config.scenario import load_scenario
from sim.costmodel.latency import StepLatency
from sim.costmodel.models import load_model
from sim.costmodel.parallel import DTypeSpec, ParallelSpec, check_layout, with_dtypes
from sim.costmodel.profiles import load_profile
from sim.costmodel.runtime import load_runtime
from sim.engine.memory import memory_budget
from sim.io.specload import SpecError

ROOT = Path(__file__).resolve().parent.parent
TP_SCENARIO = ROOT / "scenarios" / "llama2_70b_tp.yaml"
GIB = 2**30


def _gemm_ms(model: str, gpu: str, tensor: int, tokens: int) -> float:
    shapes = load_model(model).shard(tensor).gemm_shapes()
    p = load_profile(gpu)
    return sum(p.gemm(tokens, *shapes[op])[0] for op in ("qkv", "o", "gate_up", "down"))


def test_tensor_parallel_halves_per_gpu_weight_bytes():
    m = load_model("llama-2-70b")
    for tp in (2, 4, 8):
        # everything but the replicated norms is split
        assert m.shard(tp).weight_bytes * tp == pytest.approx(m.weight_bytes, rel=1e-3)
    assert m.shard(2).weight_bytes == pytest.approx(m.weight_bytes / 2, rel=1e-4)


def test_sharded_gemm_shapes_split_n_of_column_and_k_of_row_parallel_layers():
    full, shard = load_model("llama-2-70b").gemm_shapes(), load_model("llama-2-70b").shard(4).gemm_shapes()
    assert shard["qkv"] == (8192, (64 + 2 * 8) * 128 // 4)
    assert shard["gate_up"] == (full["gate_up"][0], full["gate_up"][1] // 4)
    assert shard["o"] == (full["o"][0] // 4, full["o"][1])
    assert shard["down"] == (full["down"][0] // 4, full["down"][1])
    assert shard["lm_head"] == (8192, 8000)


def test_kv_heads_are_replicated_when_tensor_exceeds_them():
    m = load_model("llama-2-70b")  # 8 KV heads
    assert (m.shard(8).heads, m.shard(8).kv_heads) == (8, 1)
    assert (m.shard(16).heads, m.shard(16).kv_heads) == (4, 1)  # replicated, not split
    assert m.shard(16).kv_bytes_per_token == m.shard(8).kv_bytes_per_token


def test_llama2_70b_tp4_gemms_on_h200_are_exact_hits():
    p, shapes = load_profile("h200-sxm"), load_model("llama-2-70b").shard(4).gemm_shapes()
    for op in ("qkv", "o", "gate_up", "down"):
        for tokens in (1, 64, 1024, 16384):
            assert p.gemm(tokens, *shapes[op])[1] == "exact", (op, tokens)


def test_tp_roughly_halves_large_m_gemm_time():
    for gpu in ("h200-sxm", "h100-sxm", "a100-80gb"):
        ratio = _gemm_ms("llama-2-70b", gpu, 4, 8192) / _gemm_ms("llama-2-70b", gpu, 2, 8192)
        assert 0.45 < ratio < 0.6, (gpu, ratio)


def test_kv_capacity_grows_more_than_linearly_with_tp():
    sc, m, p = load_scenario(TP_SCENARIO), load_model("llama-2-70b"), load_profile("h100-sxm")
    tokens = {tp: memory_budget(dataclasses.replace(sc, parallel=ParallelSpec(tensor=tp)), m, p).kv_tokens
              for tp in (2, 4, 8)}
    # per GPU: fewer weights and a quarter of the KV heads per token at TP 4 vs 1
    assert tokens[2] < tokens[4] < tokens[8]
    assert tokens[4] > 2 * tokens[2]
    budget = memory_budget(sc, m, p)
    per_token = 80 * 2 * (8 // 4) * 128 * 2  # layers x K,V x local KV heads x head_dim x bf16
    assert budget.kv_tokens == int(budget.kv_bytes // per_token)
    assert budget.weight_bytes == pytest.approx(m.weight_bytes / 4, rel=1e-4)


def test_ring_all_reduce_matches_the_alpha_beta_formula():
    comm = load_profile("l40s").comm  # states no all_reduce_latency: 2(n-1) ring steps of alpha
    link = comm.link
    assert not link.all_reduce_latency
    nbytes, n = 64 * 2**20, 4
    expected_ms = 2 * (n - 1) / n * nbytes / (link.bus_gbs * 1e9) * 1e3 + 2 * (n - 1) * link.latency_us * 1e-3
    ms, tag = comm.all_reduce(nbytes, n)
    assert (ms, tag) == (pytest.approx(expected_ms, rel=1e-12), "analytic")
    assert comm.all_reduce(nbytes, 1) == (0.0, "analytic")


@pytest.mark.parametrize("gpu", ["h100-sxm", "h200-sxm"])
def test_hopper_nccl_all_reduce_matches_the_published_h100_figures(gpu):
    # alpha(n) = 6 / 14 / 22 us at 2 / 4 / 8 GPUs (NVIDIA/nccl #1259, vLLM PR #24111, XLA sm_90
    # table, marin #6736) plus 2(n-1)/n S / 285 GB/s; the H200 shares the HGX NVLink 4 fabric
    comm = load_profile(gpu).comm
    us = {n: comm.all_reduce(8192, n)[0] * 1e3 for n in (2, 4, 8)}
    assert us == {2: pytest.approx(6.0 + 8192 / 285e3), 4: pytest.approx(14.0 + 1.5 * 8192 / 285e3),
                  8: pytest.approx(22.0 + 1.75 * 8192 / 285e3)}
    assert comm.all_reduce(8192, 8)[1] == "analytic"
    # vLLM PR #24111, H100 TP 4 pynccl, 0.5-4 MB (printed to 1 us): within 1.5 us
    for mib, published_us in ((0.5, 17), (1, 19), (1.5, 22), (2, 26), (3, 31), (4, 37)):
        assert comm.all_reduce(int(mib * 2**20), 4)[0] * 1e3 == pytest.approx(published_us, abs=1.5)
    # 6 GPUs: log2-linear between 4 and 8; the ring's 2(n-1) x 3 us would be 42 us at 8
    assert comm.all_reduce_latency_us(6) == pytest.approx(14.0 + 8.0 * math.log2(1.5))
    assert comm.all_reduce_latency_us(8) < 2 * 7 * comm.link.latency_us


def test_all_reduce_latency_grows_with_gpu_count_and_is_flat_beyond_the_stated_counts():
    comm = load_profile("h100-sxm").comm
    alphas = [comm.all_reduce_latency_us(n) for n in range(2, 9)]
    assert alphas == sorted(alphas) and len(set(alphas)) == len(alphas)
    assert comm.all_reduce_latency_us(16) == comm.all_reduce_latency_us(8)
    assert comm.all_reduce_latency_us(1.5) == comm.all_reduce_latency_us(2)


def test_all_reduce_latency_rejects_a_gpu_count_stated_twice():
    from sim.costmodel.comm import Interconnect
    from sim.io.specload import build
    link = {"name": "x", "datasheet_gbs": 1, "bus_gbs": 1, "latency_us": 1,
            "all_reduce_latency": [{"gpus": 2, "latency_us": 6}, {"gpus": 2, "latency_us": 7}]}
    with pytest.raises(SpecError, match=r"interconnect\.all_reduce_latency\[1\]\.gpus: 2 GPUs stated twice"):
        build(Interconnect, link, file="p.yaml", path="interconnect")


def _measured_a100(gpus: int) -> dict[int, float]:
    f = ROOT / "gpu_profiles" / "a100-80gb" / "all_reduce_a100_dgx.csv"
    with f.open() as fh:
        return {int(r["size"]): float(r["time_stats.all_reduce.median"]) for r in csv.DictReader(fh)
                if int(r["num_workers"]) == gpus == int(r["devices_per_node"])}


def test_a100_all_reduce_lookups_hit_the_measured_table():
    comm = load_profile("a100-80gb").comm
    for gpus in (2, 4, 8):
        table = _measured_a100(gpus)
        sizes = sorted(table)
        big = sizes[-1]
        ms, tag = comm.all_reduce(big, gpus)
        assert tag == "exact" and ms <= table[big]  # the monotone envelope never raises a point
        mid = (sizes[500] + sizes[501]) // 2
        ms, tag = comm.all_reduce(mid, gpus)
        assert tag == "interpolated"
        low, high = comm.all_reduce(sizes[500], gpus)[0], comm.all_reduce(sizes[501], gpus)[0]
        assert low * (1 - 1e-9) <= ms <= high * (1 + 1e-9)
    assert comm.all_reduce(2 * big, 8)[1] == "extrapolated"


def test_custom_all_reduce_is_flat_in_gpu_count_for_small_messages_and_nccl_above_its_limit():
    for gpu in ("a100-80gb", "h100-sxm", "h200-sxm"):
        comm = load_profile(gpu).comm
        kernel = comm.link.custom_all_reduce
        small = 8 * 4096 * 2  # a batch-8 decode step of a 4096-wide model
        times = [comm.all_reduce(small, n, custom=True)[0] for n in (2, 4, 8)]
        assert max(times) - min(times) < 0.2 * kernel.latency_us * 1e-3
        assert times[-1] == pytest.approx(kernel.latency_us * 1e-3 + 2 * 7 / 8 * small / (kernel.bus_gbs * 1e6))
        for n in (2, 4, 8):  # never slower than NCCL: the stack picks the faster
            assert comm.all_reduce(small, n, custom=True)[0] <= comm.all_reduce(small, n)[0]
        above = kernel.max_bytes + 2
        assert comm.all_reduce(above, 8, custom=True) == comm.all_reduce(above, 8)
    # NCCL's 8-GPU small all-reduce (22 us) is ~3x vLLM's custom kernel (7 us + the two-shot term)
    ring = load_profile("h100-sxm").comm.all_reduce(small, 8)[0]
    assert ring > 2.5 * load_profile("h100-sxm").comm.all_reduce(small, 8, custom=True)[0]


def test_a_link_without_a_custom_kernel_always_uses_nccl():
    comm = load_profile("l40s").comm
    assert comm.link.custom_all_reduce is None
    assert comm.all_reduce(65536, 4, custom=True) == comm.all_reduce(65536, 4)


def test_only_runtimes_that_say_so_use_the_custom_all_reduce():
    m, p = load_model("llama-2-7b"), load_profile("h100-sxm")
    flags = {name: load_runtime(name).custom_all_reduce
             for name in ("vllm", "trtllm", "trtllm-python", "cuda-graph", "h200-eager-reference")}
    assert flags == {"vllm": True, "trtllm": True, "trtllm-python": True, "cuda-graph": True,
                     "h200-eager-reference": False}
    fast = StepLatency(m, p, load_runtime("cuda-graph"), tensor=8).dense_ms(1)
    nccl = dataclasses.replace(load_runtime("cuda-graph"), custom_all_reduce=False)
    slow = StepLatency(m, p, nccl, tensor=8).dense_ms(1)
    ar_fast = p.comm.all_reduce(m.hidden * 2, 8, custom=True)[0]
    ar_slow = p.comm.all_reduce(m.hidden * 2, 8)[0]
    assert slow - fast == pytest.approx((2 * m.layers + 1) * (ar_slow - ar_fast))


def test_small_batch_decode_gets_faster_from_tp4_to_tp8_with_custom_all_reduce():
    """NeMo's published Llama-2-7B figures on H100 get faster from TP 4 to TP 8 at batch 1
    and 8; with NCCL-ring all-reduces (2(n-1) latency steps) the step model got slower."""
    m, p, rt = load_model("llama-2-7b"), load_profile("h100-sxm"), load_runtime("trtllm")
    for batch in (1, 8):
        tp4, tp8 = (StepLatency(m, p, rt, tensor=t).decode(batch, batch * 160, 160) for t in (4, 8))
        assert tp8 < tp4


def test_tp_step_pays_two_all_reduces_per_layer_plus_the_embeddings():
    m, p, rt = load_model("llama-2-70b"), load_profile("a100-80gb"), load_runtime("cuda-graph")
    lat = StepLatency(m, p, rt, tensor=4)
    tokens = 512
    comm_part = lat._dense_lookup(tokens)[-1]
    ms, tag = p.comm.all_reduce(tokens * m.hidden * 2, 4, custom=rt.custom_all_reduce)
    assert comm_part == ((2 * m.layers + 1) * ms, tag)
    assert len(StepLatency(m.shard(1), p, rt)._dense_lookup(tokens)) == len(lat._dense_lookup(tokens)) - 1


def test_decode_step_is_faster_at_higher_tensor_degree():
    m, p, rt = load_model("llama-2-70b"), load_profile("h100-sxm"), load_runtime("cuda-graph")
    steps = [StepLatency(m, p, rt, tensor=tp).decode(16, 16 * 1000, 1000) for tp in (2, 4, 8)]
    assert steps[0] > steps[1] > steps[2]
    assert steps[1] > steps[0] / 2  # communication keeps TP from scaling perfectly


def test_70b_at_tp1_on_one_a100_exits_2_with_a_gib_shortfall_line(tmp_path, llmsim):
    r = llmsim("run", str(TP_SCENARIO), "--set", "gpu=a100-80gb", "--set", "parallel.tensor=1",
               "--out", str(tmp_path / "out"))
    assert r.returncode == 2
    (line,) = r.stderr.strip().splitlines()
    assert line.startswith(f"llmsim: error: {TP_SCENARIO}: model: does not fit: weights 128.5 GiB")
    assert "> 71.3 GiB usable per GPU" in line and "GiB short" in line
    assert "parallel.tensor >= 2" in line
    assert not (tmp_path / "out").exists()


def test_a_layout_that_cannot_hold_one_sequence_names_max_model_len():
    m, p = load_model("llama-2-70b"), load_profile("h100-sxm")
    sc = load_scenario(TP_SCENARIO, {"parallel.tensor": 2})
    b = memory_budget(sc, m, p)
    half_a_sequence = 4096 * m.shard(2).kv_bytes_per_token / 2  # room for half of one sequence
    util = (b.weight_bytes + b.activation_bytes + b.attention_scratch_bytes + half_a_sequence) / b.gpu_bytes
    tight = load_scenario(TP_SCENARIO, {"parallel.tensor": 2, "kv.gpu_memory_utilization": util})
    with pytest.raises(SpecError, match=r"kv.max_model_len: does not fit: .* KV for one max_model_len"
                                        r" sequence 0.6 GiB > .* 0.3 GiB short"):
        memory_budget(tight, m, p)


@pytest.mark.parametrize("tensor, pipeline, expected", [
    (3, 1, "parallel.tensor: 3 does not divide heads=64 of llama-2-70b (allowed: 1, 2, 4, 8)"),
    (16, 1, "parallel.tensor: 16 exceeds the 8 GPUs of one h100-sxm node"),
    (1, 81, "parallel.pipeline: 81 stages for the 80 layers of llama-2-70b (allowed: <= 80)"),
])
def test_bad_layouts_get_one_line(tensor, pipeline, expected):
    with pytest.raises(SpecError) as e:
        sc = load_scenario(TP_SCENARIO, {"parallel.tensor": tensor, "parallel.pipeline": pipeline})
        check_layout(sc.parallel, load_model(sc.model), load_profile(sc.gpu), file=sc.file)
    assert expected in str(e.value)


def test_fp8_kv_halves_kv_bytes_and_about_doubles_capacity():
    p, m = load_profile("h100-sxm"), load_model("llama-2-70b")
    fp8 = with_dtypes(m, DTypeSpec(kv_cache="fp8"), p)
    assert fp8.kv_bytes_per_token * 2 == m.kv_bytes_per_token
    assert fp8.weight_bytes == m.weight_bytes
    sc = load_scenario(TP_SCENARIO)
    bf16_tokens, fp8_tokens = memory_budget(sc, m, p).kv_tokens, memory_budget(sc, fp8, p).kv_tokens
    assert fp8_tokens == pytest.approx(2 * bf16_tokens, abs=1)


def test_fp8_kv_decode_reads_half_the_bytes():
    p, m, rt = load_profile("h100-sxm"), load_model("llama-2-70b"), load_runtime("cuda-graph")
    fp8 = with_dtypes(m, DTypeSpec(kv_cache="fp8"), p)
    bf16_attn = StepLatency(m, p, rt, tensor=4).decode_attn_ms(64, 64 * 4096, 4096)
    fp8_attn = StepLatency(fp8, p, rt, tensor=4).decode_attn_ms(64, 64 * 4096, 4096)
    assert fp8_attn == pytest.approx(StepLatency(m, p, rt, tensor=4).decode_attn_ms(64, 64 * 2048, 2048))
    assert fp8_attn < 0.6 * bf16_attn


def test_fp8_weights_halve_weight_bytes_and_speed_up_gemms():
    p, m = load_profile("h200-sxm"), load_model("llama-2-70b")
    fp8 = with_dtypes(m, DTypeSpec(weights="fp8"), p)
    assert fp8.weight_bytes * 2 == m.weight_bytes
    k, n = m.shard(4).gemm_shapes()["gate_up"]
    for tokens, low, high in ((1, 0.45, 0.75), (8192, 0.45, 0.55)):  # bytes-bound, FLOP-bound
        ms, tag = p.gemm_fp8(tokens, k, n)
        assert tag == "analytic"
        assert low < ms / p.gemm(tokens, k, n)[0] < high


def test_fp8_is_refused_on_a100():
    with pytest.raises(SpecError, match=r"dtype.weights: fp8 needs FP8 tensor cores, which a100-80gb lacks"):
        with_dtypes(load_model("llama-2-70b"), DTypeSpec(weights="fp8"), load_profile("a100-80gb"))


def test_tensor_1_is_the_unsharded_model():
    m = load_model("llama-3-8b")
    assert m.shard(1) is m
    p, rt = load_profile("h200-sxm"), load_runtime("cuda-graph")
    a, b = StepLatency(m, p, rt), StepLatency(m, p, rt, tensor=1)
    assert a.decode(8, 8000, 1500) == b.decode(8, 8000, 1500)
    assert a.prefill([(512, 0), (100, 0)]) == b.prefill([(512, 0), (100, 0)])
