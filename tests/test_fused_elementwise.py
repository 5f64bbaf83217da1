"""Elementwise kernel classes (sim/costmodel/fused.py): a profile says what its table timed, a runtime
which kernels its stack runs; a fused stack on the H200's unfused table gets derived
add+RMSNorm and SiLU·mul kernels, everything else is looked up as before."""

from __future__ import annotations

import shutil
from dataclasses import replace

import pytest

from sim.cli.main import main
from sim.costmodel.fused import fused_kernel
from sim.costmodel.latency import StepLatency
from sim.costmodel.models import load_model
from sim.costmodel.profiles import DERIVED, PROFILES_DIR, load_profile
from sim.costmodel.runtime import RUNTIMES_DIR, RuntimeSpec, load_runtime
from sim.io.specload import ROOT, SpecError, known_names

SHIPPED = known_names(RUNTIMES_DIR)
H = 4096  # Llama-3-8B's hidden size, the width the H200 measured its norms at


def latency(runtime: str | RuntimeSpec, gpu: str = "h200-sxm", model: str = "llama-3-8b"):
    rt = load_runtime(runtime) if isinstance(runtime, str) else runtime
    return StepLatency(load_model(model), load_profile(gpu), rt)


def test_profiles_and_runtimes_say_which_elementwise_kernels_they_mean():
    kinds = {g: load_profile(g).facts.elementwise_kernels
             for g in ("h200-sxm", "a100-80gb", "h100-sxm", "l40s")}
    # the H100 looks up the H200's eager rows (tables_from); Vidur's fused ones are its check
    assert kinds == {"h200-sxm": "unfused", "a100-80gb": "fused", "h100-sxm": "unfused", "l40s": "fused"}
    stacks = {n: load_runtime(n).elementwise for n in SHIPPED}
    assert stacks == {"vllm": "fused", "trtllm": "fused", "trtllm-python": "fused",
                      "h200-eager-reference": "unfused", "h200-eager-live": "unfused",
                      "cuda-graph": "fused", "vllm-0.2": "fused", "vllm-0.6": "fused",
                      "vllm-0.10": "fused", "sglang-0.4": "fused", "trtllm-0.18": "fused"}


def test_fused_add_rmsnorm_on_the_h200_at_one_token_is_one_kernel_at_its_floor():
    p = load_profile("h200-sxm")
    ms, tag = fused_kernel(p, "add_rmsnorm", 1, H)
    # the one-kernel residual_add floor: 4.19 us measured at 8 tokens, less the L2
    # write-back of its flushed timing (sim/costmodel/l2flush.py)
    assert ms == pytest.approx(0.00418, rel=0.005) and tag == DERIVED
    unfused = p.elementwise("rmsnorm", 1, H)[0] + p.elementwise("residual_add", 1, H)[0]
    assert unfused == pytest.approx(0.0258, rel=0.01)  # ~7 eager kernels: 6x the fused one
    assert unfused > 6 * ms


def test_fused_add_rmsnorm_on_the_h200_at_8192_tokens_streams_at_the_copy_ceiling():
    p = load_profile("h200-sxm")
    ms, tag = fused_kernel(p, "add_rmsnorm", 8192, H)
    # reads x and the residual, writes both: 8 bytes per element at the measured 4.25 TB/s
    assert ms == pytest.approx(8192 * H * 8 / 4.25e9, rel=1e-9) == pytest.approx(0.06316, rel=1e-4)
    assert tag == DERIVED
    assert p.elementwise("rmsnorm", 8192, H)[0] > 6 * ms  # the eager RMSNorm: 0.441 ms


def test_a_fused_kernel_is_never_faster_than_the_measured_single_kernel_of_its_bytes():
    p = load_profile("h200-sxm")
    for tokens in (1, 8, 64, 512, 2048, 8192):
        for kernel, per_element in (("add_rmsnorm", 8), ("silu_mul", 6)):
            ms = fused_kernel(p, kernel, tokens, H)[0]
            single = p.elementwise("residual_add", max(1.0, tokens * per_element / 6), H)[0]
            assert ms >= single and ms >= tokens * H * per_element / 4.25e9
        assert fused_kernel(p, "add_rmsnorm", tokens, H)[0] <= fused_kernel(p, "add_rmsnorm", 2 * tokens, H)[0]


def test_a_fused_stack_on_the_h200_runs_two_add_rmsnorm_kernels_a_layer_and_no_residual_adds():
    m, p = load_model("llama-3-8b"), load_profile("h200-sxm")
    fused = latency("vllm")
    as_measured = latency(replace(load_runtime("vllm"), elementwise="as_measured"))
    L = m.layers
    for T in (1, 64, 2048):
        add_norm, norm = fused_kernel(p, "add_rmsnorm", T, H)[0], fused_kernel(p, "rmsnorm", T, H)[0]
        silu = fused_kernel(p, "silu_mul", T, m.ffn)[0]
        eager = (2 * L + 1) * p.elementwise("rmsnorm", T, H)[0] + 2 * L * p.elementwise("residual_add", T, H)[0]
        eager += L * p.elementwise("silu_mul", T, m.ffn)[0]
        expected = eager - (2 * L * add_norm + norm + L * silu)
        assert as_measured.dense_ms(T) - fused.dense_ms(T) == pytest.approx(expected, rel=1e-9)
    assert fused.decode(1, 512) < as_measured.decode(1, 512) - 1.4e-3  # 2.2 -> 0.68 ms of elementwise
    fused.dense_ms(8)
    assert fused.provenance_seconds()[DERIVED] > 0


# pinned step times (seconds; dense: ms) of Llama-3-8B: prefill of 2,048 tokens, decode of
# 64 sequences at context 512, the dense part of 1 and 8,192 tokens: as of commit c767786
# (before fused kernels were derived), re-pinned when the roofline terms were refitted to
# the H200's tables with the flush's write-back removed (deliberate: H100 attention, every
# L40S term, the H200's GEMM floor), and again when the H100 took the H200's measured GEMM
# attention and elementwise rows (profile.yaml `tables_from`: 4-6 % slower than on Vidur's),
# and the H100's when its GEMMs became the H200's lookup x the roofline ratio at every M
# (sim/costmodel/gemm_curve.py: -0.04 % on one token's dense part, -0.01 % on the decode step)
BEFORE = {
    ("h200-sxm", "h200-eager-reference"): (0.060070355775432564, 0.0213462, 5.853895807816001, 215.24541678339685),
    ("h100-sxm", "vllm"): (0.05319915196818374, 0.009642955460927097, 6.202027145184455, 186.43558768586252),
    ("a100-80gb", "trtllm"): (None, None, 9.670658211680738, 546.9398200885917),
    ("l40s", "vllm"): (0.14004697376004402, 0.027168370772178676, 18.608878440545816, 500.69335902961325),
}


@pytest.mark.parametrize("gpu, runtime", sorted(BEFORE))
def test_unfused_stacks_and_fused_profiles_step_exactly_as_before(gpu, runtime):
    lat = latency(runtime, gpu)
    prefill, decode, dense_1, dense_8192 = BEFORE[gpu, runtime]
    got = (lat.prefill([(2048, 0)]), lat.decode(64, 64 * 512, 512), lat.dense_ms(1), lat.dense_ms(8192))
    for want, have in zip((prefill, decode, dense_1, dense_8192), got, strict=True):
        assert want is None or have == want  # byte-identical


@pytest.mark.parametrize("gpu", ["a100-80gb", "l40s"])
def test_fused_profiles_look_up_every_runtime_as_measured(gpu):
    base = latency(RuntimeSpec(name="kernels"), gpu)
    for name in SHIPPED:
        lat = latency(name, gpu)
        for T in (1, 8, 512, 8192):
            assert lat.dense_ms(T) == base.dense_ms(T), (name, T)


def test_a_bad_elementwise_value_is_a_one_line_error(tmp_path):
    f = tmp_path / "rt.yaml"
    f.write_text("name: rt\nelementwise: fusd\n")
    with pytest.raises(SpecError) as e:
        load_runtime(str(f))
    assert str(e.value) == f"{f}: elementwise: unknown 'fusd' (allowed: fused, unfused, as_measured)"


def test_a_bad_elementwise_value_exits_2_with_one_line_and_writes_nothing(tmp_path, monkeypatch, capsys):
    (tmp_path / "rt.yaml").write_text("name: rt\nelementwise: fused_please\n")
    (tmp_path / "b.yaml").write_text(
        "name: b\nruntime: rt.yaml\nworkload:\n  num_requests: 5\n  arrival: {kind: poisson, rate: 5}\n"
        "  prompt: {kind: fixed, value: 100}\n  output: {kind: fixed, value: 20}\n")
    monkeypatch.chdir(tmp_path)
    code = main(["run", "b.yaml", "--out", "out", "--no-plots"])
    lines = capsys.readouterr().err.splitlines()
    assert code == 2 and len(lines) == 1
    assert lines[0].startswith("llmsim: error: ") and "elementwise: unknown 'fused_please'" in lines[0]
    assert "(allowed: fused, unfused, as_measured)" in lines[0]
    assert not (tmp_path / "out").exists()


def test_a_bad_elementwise_kernels_value_in_a_profile_is_a_one_line_error(tmp_path):
    folder = tmp_path / "l40s"
    shutil.copytree(PROFILES_DIR / "l40s", folder)
    yaml = folder / "profile.yaml"
    yaml.write_text(yaml.read_text().replace("elementwise_kernels: fused", "elementwise_kernels: some"))
    with pytest.raises(SpecError) as e:
        load_profile(str(folder))
    assert str(e.value) == f"{yaml}: elementwise_kernels: unknown 'some' (allowed: fused, unfused)"



def test_a_scenario_that_names_its_elementwise_kernels_keeps_them_under_another_runtime():
    """The reference scenarios say `elementwise: unfused` (as they say paged_reference), so
    replaying them kernels-only (`--runtime cuda-graph`) keeps the reference stack's ops,
    while cuda-graph alone means fused, production-class kernels."""
    from sim.config.scenario import load_scenario, replace_scenario
    from sim.engine.build import replica_configs

    sc = load_scenario(ROOT / "scenarios" / "azure_conv_reference.yaml")
    graph = load_runtime("cuda-graph")
    (named,) = replica_configs(sc, runtime=graph)
    assert named.runtime.elementwise == "unfused"
    (plain,) = replica_configs(replace_scenario(sc, elementwise=None), runtime=graph)
    assert plain.runtime.elementwise == "fused"
    assert named.latency.decode(8, 8 * 1024) > plain.latency.decode(8, 8 * 1024)


def test_a_cluster_group_can_name_its_own_elementwise_kernels(tmp_path):
    from sim.config.scenario import load_scenario
    from sim.engine.build import replica_configs

    f = tmp_path / "mixed.yaml"
    f.write_text(
        "name: mixed\nmodel: llama-3-8b\nruntime: vllm\nelementwise: fused\n"
        "cluster:\n  router: {policy: round_robin}\n  groups:\n"
        "    - {name: prod, count: 1}\n"
        "    - {name: ref, count: 1, runtime: h200-eager-reference, elementwise: unfused}\n"
        "workload: {num_requests: 4, arrival: {kind: poisson, rate: 1}, "
        f"lengths: {{path: {ROOT / 'data/traces/sharegpt_lengths.csv'}}}}}\n")
    kinds = {c.group: c.runtime.elementwise for c in replica_configs(load_scenario(f))}
    assert kinds == {"prod": "fused", "ref": "unfused"}
