"""The 2026 GPU profiles (B200, B300, GB200/GB300 NVL72, H20, MI300X, MI325X, MI355X):
datasheet figures as known answers, every profile loads with its sources and provenance,
kernel tables derived from the H200's measured ones, and a B200 costed faster than an
H200 on every step of Llama-3-8B."""

from __future__ import annotations

import shutil

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.costmodel.gpu_facts import PROVENANCE
from sim.costmodel.latency import StepLatency
from sim.costmodel.models import load_model
from sim.costmodel.profiles import DERIVED, EXACT, INTERPOLATED, PROFILES_DIR, load_profile
from sim.costmodel.runtime import RUNTIMES_DIR, load_runtime
from sim.io.specload import SpecError, load_yaml

NEW = ["b200", "b300", "gb200-nvl72", "gb300-nvl72", "h20", "mi300x", "mi325x", "mi355x"]
FUSED_RUNTIMES = sorted(p.stem for p in RUNTIMES_DIR.glob("*.yaml")
                        if load_runtime(p.stem).elementwise == "fused")

# (gpu, profile.yaml field, datasheet value): vendor figures, dense (no sparsity)
KNOWN = [
    ("mi300x", "datasheet_mem_bw_tbs", 5.3), ("mi300x", "datasheet_memory_gb", 192),
    ("mi300x", "datasheet_tflops", 1307.4), ("mi300x", "datasheet_fp8_tflops", 2614.9),
    ("mi325x", "datasheet_mem_bw_tbs", 6.0), ("mi325x", "datasheet_memory_gb", 256),
    ("mi355x", "datasheet_mem_bw_tbs", 8.0), ("mi355x", "datasheet_memory_gb", 288),
    ("mi355x", "datasheet_fp8_tflops", 5000), ("mi355x", "datasheet_fp4_tflops", 10000),
    ("b200", "datasheet_tflops", 2250), ("b200", "datasheet_fp8_tflops", 4500),
    ("b200", "datasheet_fp4_tflops", 9000), ("b200", "datasheet_memory_gb", 180),
    ("b300", "datasheet_memory_gb", 288), ("b300", "datasheet_fp4_tflops", 14000),
    ("gb200-nvl72", "datasheet_mem_bw_tbs", 576 / 72), ("gb200-nvl72", "datasheet_tflops", 360e3 / 72 / 2),
    ("gb300-nvl72", "datasheet_fp4_tflops", 1080e3 / 72), ("gb300-nvl72", "datasheet_fp8_tflops", 360e3 / 72),
    ("h20", "datasheet_mem_bw_tbs", 4.0), ("h20", "datasheet_tflops", 148),
    ("h20", "datasheet_fp8_tflops", 296), ("h20", "datasheet_memory_gb", 96),
]


def facts(gpu: str):
    return load_profile(gpu).facts


@pytest.mark.parametrize(("gpu", "name", "value"), KNOWN)
def test_profiles_state_the_datasheet_figures(gpu, name, value):
    assert getattr(facts(gpu), name) == pytest.approx(value)


def test_datasheets_order_b200_over_h200_over_h100_on_bandwidth_and_compute():
    for key in ("datasheet_mem_bw_tbs", "datasheet_tflops", "datasheet_fp8_tflops"):
        b200, h200, h100 = (getattr(facts(g), key) for g in ("b200", "h200-sxm", "h100-sxm"))
        assert b200 > h200 >= h100, key
    assert facts("h200-sxm").datasheet_mem_bw_tbs > facts("h100-sxm").datasheet_mem_bw_tbs
    # Blackwell Ultra: more memory and FP4 than Blackwell; MI325X: MI300X with more, faster HBM
    assert facts("b300").datasheet_memory_gb > facts("b200").datasheet_memory_gb
    assert facts("b300").datasheet_fp4_tflops > facts("b200").datasheet_fp4_tflops
    assert facts("mi325x").datasheet_mem_bw_tbs > facts("mi300x").datasheet_mem_bw_tbs
    assert facts("mi325x").datasheet_tflops == facts("mi300x").datasheet_tflops


def test_the_nvl72_racks_are_one_72_gpu_nvlink_domain_and_hgx_nodes_hold_8():
    for gpu in NEW:
        link = facts(gpu).interconnect
        assert link.gpus_per_node == (72 if gpu.endswith("nvl72") else 8), gpu
        if "NVLink 5" in link.name:
            assert link.datasheet_gbs == 900  # 1.8 TB/s per GPU, bidirectional


@pytest.mark.parametrize("gpu", NEW)
def test_every_new_profile_loads_with_sources_provenance_and_a_known_network(gpu):
    f = facts(gpu)
    assert f.analytic is True and f.derived_from == "h200-sxm" and len(f.source) >= 3
    assert set(f.provenance.values()) <= set(PROVENANCE)
    for key in ("datasheet_mem_bw_tbs", "datasheet_tflops", "datasheet_memory_gb",
                "interconnect.datasheet_gbs", "interconnect.bus_gbs"):
        assert key in f.provenance, key  # every figure the cost model uses says where it is from
    assert f.network in load_yaml(PROFILES_DIR / "links.yaml")
    assert (f.datasheet_fp4_tflops is None) == (not f.fp4_formats)
    # the README's Collectives rule: B = 0.63 x the datasheet rate per direction
    assert f.interconnect.bus_gbs == pytest.approx(0.63 * f.interconnect.datasheet_gbs, abs=2)  # H100: 285


def test_fp4_is_recorded_on_blackwell_and_cdna4_only():
    with_fp4 = {g for g in NEW if facts(g).fp4_formats}
    assert with_fp4 == {"b200", "b300", "gb200-nvl72", "gb300-nvl72", "mi355x"}
    assert facts("mi355x").fp4_formats == ("MXFP4",)
    assert set(facts("b200").fp4_formats) == {"NVFP4", "MXFP4"}


def test_derived_lookups_are_tagged_derived_and_scale_by_the_bandwidth_ratio_when_bound_by_it():
    b200, h200 = load_profile("b200"), load_profile("h200-sxm")
    args = ("contiguous", 64, 64 * 8192, 32, 8, 128)  # 8.6 GB of KV: bandwidth-bound
    (tb, tag_b), (th, tag_h) = b200.decode_attn(*args), h200.decode_attn(*args)
    assert tag_h in (EXACT, INTERPOLATED)  # the H200 measured this shape
    assert tag_b == DERIVED
    # the roofline's bandwidth term dominates: time ratio -> 4.8 / 7.7 (datasheets)
    assert tb / th == pytest.approx(4.8 / 7.7, rel=0.02)
    assert b200.gemm(1, 4096, 4096)[1] == DERIVED


def test_a_profile_cannot_derive_from_an_unmeasured_one(tmp_path):
    folder = tmp_path / "b200"
    shutil.copytree(PROFILES_DIR / "b200", folder)
    text = (folder / "profile.yaml").read_text()
    (folder / "profile.yaml").write_text(text.replace("derived_from: h200-sxm", "derived_from: l40s"))
    with pytest.raises(SpecError, match="derived_from: 'l40s' has no measured tables"):
        load_profile(str(folder))
    (folder / "profile.yaml").write_text(text.replace("fp4_formats: [NVFP4, MXFP4]",
                                                      "fp4_formats: [FP4E2M1]"))
    with pytest.raises(SpecError, match=r"fp4_formats\[0\]: 'FP4E2M1' is unknown"):
        load_profile(str(folder))


@st.composite
def steps(draw):
    kind = draw(st.sampled_from(["prefill", "decode", "mixed"]))
    n = draw(st.integers(1, 256))
    ctx = draw(st.integers(16, 16384))
    chunks = draw(st.lists(st.tuples(st.integers(1, 8192), st.integers(0, 8192)),
                           min_size=1, max_size=4))
    return kind, n, n * ctx, ctx, chunks


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(FUSED_RUNTIMES), st.sampled_from([1, 2, 4, 8]),
       st.sampled_from(["paged", "contiguous"]), st.booleans(), steps())
def test_a_step_of_llama3_8b_costs_the_b200_less_than_the_h200(runtime, tensor, decode, fp8, step):
    m, rt = load_model("llama-3-8b"), load_runtime(runtime)
    kind, n, sum_ctx, ctx, chunks = step
    t, gpu = {}, {}
    for g in ("b200", "h200-sxm"):
        s = StepLatency(m, load_profile(g), rt, "flash", decode, tensor=tensor, fp8_weights=fp8)
        t[g] = (s.prefill(chunks) if kind == "prefill" else s.decode(n, sum_ctx, ctx)
                if kind == "decode" else s.mixed(n, sum_ctx, ctx, chunks))
        gpu[g] = s.kernel_s
    # the kernels always cost the B200 less; the step, less or the same where the stack's
    # overlapped host work outlasts both GPUs' kernels (vllm-0.2's eager launches,
    # sglang-0.4's overlapped scheduler at small steps)
    assert gpu["b200"] < gpu["h200-sxm"], gpu
    assert t["b200"] <= t["h200-sxm"], t


def test_quickstart_runs_on_a_b200(tmp_path, llmsim):
    r = llmsim("run", "scenarios/quickstart.yaml", "--set", "gpu=b200", "--out", str(tmp_path / "b"))
    assert r.returncode == 0, r.stderr
    assert "derived" in r.stdout or "step time" in r.stdout


def test_llmsim_gpus_lists_every_profile_with_how_its_kernel_times_were_obtained(llmsim):
    r = llmsim("gpus")
    assert r.returncode == 0, r.stderr
    rows = {line.split()[0]: line for line in r.stdout.splitlines()[1:] if line[:1].strip()}
    assert set(NEW) <= set(rows)
    assert rows["h200-sxm"].endswith("measured")
    assert rows["b200"].endswith("derived from h200-sxm's measured tables")
    assert rows["l40s"].endswith("analytic")
    assert "numbers: datasheet" in r.stdout and "FP4 NVFP4/MXFP4 recorded, not used" in r.stdout
