"""DeepEP-style all-to-all: FP8 dispatch, BF16 combine, normal vs low-latency kernels,
priced from DeepEP's published figures (gpu_profiles/deepep.yaml); known answers."""

from __future__ import annotations

import dataclasses

import pytest

from sim.config.scenario import load_scenario
from sim.costmodel.deepep import AllToAllSpec, DeepEP, check_deepep
from sim.costmodel.latency import StepLatency
from sim.costmodel.models import load_model
from sim.costmodel.parallel import ParallelSpec, check_layout
from sim.costmodel.profiles import load_profile
from sim.costmodel.runtime import load_runtime
from sim.io.specload import SpecError

DEEPEP = AllToAllSpec(kernel="deepep")
H = 7168  # DeepSeek-V3's hidden, the published setting


def test_low_latency_call_at_the_published_setting_takes_the_published_latency():
    # docs/legacy.md: EP 8, 128 tokens a rank, top-8, hidden 7168: dispatch 77 us, combine
    # 114 us. One all_to_all call is half a dispatch and half a combine: (77 + 114) / 2.
    a2a = DeepEP(DEEPEP, load_profile("h200-sxm"), 8, None)
    bf16_bytes = 128 * 8 * H * 2  # the rows a rank receives, as BF16
    ms, tag = a2a.call_ms(bf16_bytes, 128)
    assert ms * 1e3 == pytest.approx((77 + 114) / 2)
    assert tag == "derived"
    for ep, d_us, c_us in ((16, 118, 195), (64, 173, 314), (256, 194, 360)):
        a2a = DeepEP(DEEPEP, load_profile("h200-sxm"), ep, (50.0, 10.0))
        assert a2a.call_ms(bf16_bytes, 128)[0] * 1e3 == pytest.approx((d_us + c_us) / 2)


def test_normal_kernel_inside_a_node_runs_at_the_published_share_of_the_link():
    # docs/legacy.md: H800 (160 GB/s NVLink) EP 8: 153 GB/s dispatch, 158 GB/s combine; on
    # the H200's 450 GB/s NVLink that is 153 x 450/160 = 430.3 and 158 x 450/160 = 444.4 GB/s
    a2a = DeepEP(DEEPEP, load_profile("h200-sxm"), 8, None)
    rows = 4096 * 8
    dispatch_bytes = rows * H * (1 + 4 / 128)  # FP8 plus one FP32 scale per 128 channels
    combine_bytes = rows * H * 2
    hand_us = 3.0 + (dispatch_bytes / 430.3125e3 + combine_bytes / 444.375e3) / 2
    ms, tag = a2a.call_ms(rows * H * 2, 4096)
    assert ms * 1e3 == pytest.approx(hand_us, rel=1e-9)
    assert hand_us == pytest.approx(813.0, abs=1.0)  # 563 us dispatch, 1,057 us combine
    assert tag == "derived"


def test_fp8_dispatch_sends_about_half_the_bytes_of_bf16_where_no_row_exists():
    # EP 4 has no published row: the alpha-beta all-to-all on each half's bytes
    p = load_profile("h200-sxm")
    nbytes = 1024 * 8 * H * 2
    fp8 = DeepEP(DEEPEP, p, 4, None).call_ms(nbytes, 1024)
    bf16 = DeepEP(dataclasses.replace(DEEPEP, dispatch="bf16"), p, 4, None).call_ms(nbytes, 1024)
    alpha_beta = p.comm.all_to_all
    assert fp8 == (pytest.approx((alpha_beta(nbytes * 0.515625, 4)[0]
                                  + alpha_beta(nbytes, 4)[0]) / 2), "analytic")
    assert bf16[0] == pytest.approx(alpha_beta(nbytes, 4)[0])
    assert fp8[0] < bf16[0]


def test_auto_mode_runs_low_latency_for_small_batches_and_normal_above_the_buffer():
    a2a = DeepEP(DEEPEP, load_profile("h200-sxm"), 8, None)
    assert [a2a.mode(t) for t in (1, 128, 129, 8192)] == ["low_latency"] * 2 + ["normal"] * 2
    fixed = DeepEP(dataclasses.replace(DEEPEP, mode="normal"), load_profile("h200-sxm"), 8, None)
    assert fixed.mode(1) == "normal"


def test_deepep_replaces_the_alpha_beta_all_to_all_in_a_dp_ep_step():
    m = dataclasses.replace(load_model("deepseek-r1"), weight_dtype_bytes=1)
    p, rt = load_profile("h200-sxm"), load_runtime("cuda-graph")
    kw = {"tensor": 1, "fp8_weights": True, "expert": 8, "data": 8}
    base, dep = StepLatency(m, p, rt, **kw), StepLatency(m, p, rt, all_to_all=DEEPEP, **kw)
    T = 4096  # 512 a rank: the normal kernel
    a2a_base = [c for c in base._collectives if c[0] == "all_to_all"]
    (kernel, nbytes, n_calls, _), = a2a_base
    busiest = base._busiest(T)
    want = (dep.a2a.call_ms(T * nbytes * busiest, T // 8)[0]
            - p.comm.all_to_all(T * nbytes * busiest, 8)[0]) * n_calls
    assert dep.dense_ms(T) - base.dense_ms(T) == pytest.approx(want)
    assert n_calls == 2 * 58  # a dispatch and a combine in each of R1's 58 MoE layers


@pytest.mark.parametrize(("gpu", "message"), [
    ("l40s", "deepep does not run on l40s"),
    ("mi300x", "deepep does not run on mi300x"),
    ("a100-80gb", "deepep does not run on a100-80gb"),
])
def test_deepep_is_refused_where_it_cannot_run(gpu, message):
    with pytest.raises(SpecError, match=message):
        check_deepep(DEEPEP, 8, H, load_profile(gpu))


def test_deepep_without_expert_parallelism_or_with_unscalable_hidden_is_refused():
    p = load_profile("h200-sxm")
    with pytest.raises(SpecError, match=r"all_to_all\.kernel: deepep needs expert parallelism"):
        check_deepep(DEEPEP, 1, H, p)
    with pytest.raises(SpecError, match=r"all_to_all\.dispatch: .*hidden 7000 is not a multiple"):
        check_deepep(DEEPEP, 8, 7000, p)
    check_deepep(dataclasses.replace(DEEPEP, dispatch="bf16"), 8, 7000, p)  # bf16: fine
    with pytest.raises(SpecError, match=r"parallel\.all_to_all\.kernel: deepep needs expert"):
        check_layout(ParallelSpec(tensor=8, all_to_all=DEEPEP), load_model("deepseek-r1"), p)


def test_a_scenario_chooses_deepep_with_parallel_all_to_all(tmp_path):
    f = tmp_path / "s.yaml"
    f.write_text("name: s\nmodel: deepseek-r1\ngpu: h200-sxm\nruntime: cuda-graph\n"
                 "dtype: {weights: fp8}\n"
                 "parallel: {data: 8, expert: 8, all_to_all: {kernel: deepep, mode: low_latency,"
                 " max_dispatch_tokens: 256}}\n"
                 "workload: {num_requests: 4, arrival: {kind: poisson, rate: 1},"
                 " prompt: {kind: fixed, value: 64}, output: {kind: fixed, value: 8}}\n")
    sc = load_scenario(f)
    assert sc.parallel.all_to_all == AllToAllSpec("deepep", "low_latency", "fp8", 256)
    f.write_text(f.read_text().replace("mode: low_latency", "mode: fastest"))
    with pytest.raises(SpecError, match=r"parallel\.all_to_all\.mode"):
        load_scenario(f)
