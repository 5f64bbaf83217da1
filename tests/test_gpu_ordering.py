"""A GPU at least as fast as another on every datasheet figure is never costed slower.

The figures are each profile.yaml's own: dense bf16 (and FP8) TFLOP/s, memory bandwidth,
NVLink bandwidth and memory size. Among the shipped profiles the H200 dominates the H100,
the A100 and the L40S, the H100 the A100 and the L40S; the L40S and the A100 are not
ordered (the L40S has more TFLOP/s, the A100 more bandwidth). The property runs over
models x tensor degree x step shapes x runtimes x kernels.

What the tolerance stands for (a statement about the data, not about the model): the
faster GPU may cost a step up to SOURCES more where the two GPUs' figures come from
different sources:

* the H200's GEMM tables and the H100's / A100's (Vidur's) were measured by different
  people with different timing methods (Llama-2-70B projections that neither measured,
  each scaled from its own nearest shape: up to 4 % on a fixed grid of 5,544 steps);
* the H100's and A100's attention is a roofline fitted to the H200's tables, not those
  tables: where the H200's measured flash kernel runs slower than its own fit (21 % at
  1k tokens; the fit's median error is 17 %), a prefill-heavy step costs the H200 more
  (Llama-3.2-1B at TP 2, a 772-token chunk over a 3k-token cache: 5.2 %, the worst of
  5,500 random examples).

Before the tensor-parallel head-scaling fix the worst was 2.6x (H200 decode at TP 2-8:
one sequence of a shard's few heads clamped to a full sequence of 32). Kernels measured on
the H200 only (naive prefill, paged_gather and paged_reference decode) are compared
against the other GPUs' roofline fits of those same tables, whose residuals run to 2x
(profile.yaml: "paged_reference 20 %" median); they are left out here, and so are
runtimes of eager unfused elementwise kernels (the H200's table) where the other GPUs
have only fused ones (Vidur's). The remedy for both: an analytic GPU that borrows the
H200's attention efficiencies borrows its tables instead, scaled by the roofline ratio.

The AMD profiles' small-message collective latency is a stated assumption (2(n−1) ring steps
of 3 µs, no RCCL measurement used), above the NVSwitch parts' published α(n), and latency is
no datasheet figure: pairs with an AMD GPU are compared at tensor degree 1 only.
"""

from __future__ import annotations

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from sim.costmodel.latency import StepLatency
from sim.costmodel.models import known_models, load_model
from sim.costmodel.profiles import PROFILES_DIR, known_profiles, load_profile
from sim.costmodel.runtime import RUNTIMES_DIR, load_runtime
from sim.io.specload import load_yaml

SOURCES = 0.10  # see the module docstring


def datasheet(name: str) -> dict[str, float]:
    """The profile.yaml figures a buyer compares, read from the file itself."""
    y = load_yaml(PROFILES_DIR / name / "profile.yaml")
    link = y.get("interconnect") or {}
    return {"tflops": y["datasheet_tflops"], "fp8_tflops": y.get("datasheet_fp8_tflops") or 0,
            "mem_bw": y["datasheet_mem_bw_tbs"], "nvlink": link.get("datasheet_gbs", 0),
            "memory": y["datasheet_memory_gb"]}


def dominated_pairs() -> list[tuple[str, str]]:
    """(faster, slower): the first at least as fast on every figure, faster on one."""
    gpus = known_profiles()
    sheets = {g: datasheet(g) for g in gpus}
    return [(a, b) for a in gpus for b in gpus if a != b
            and all(sheets[a][k] >= sheets[b][k] for k in sheets[a])
            and any(sheets[a][k] > sheets[b][k] for k in sheets[a])]


PAIRS = dominated_pairs()
AMD = {g for g in known_profiles() if (load_yaml(PROFILES_DIR / g / "profile.yaml").get("interconnect")
                                       or {}).get("name", "").startswith("AMD")}
FUSED_RUNTIMES = sorted(p.stem for p in RUNTIMES_DIR.glob("*.yaml")
                        if load_runtime(p.stem).elementwise == "fused")
MODELS = [m for m in known_models() if m != "tiny-llama"]


def test_the_datasheets_order_h200_over_h100_over_a100_and_l40s():
    first = {"h200-sxm", "h100-sxm", "a100-80gb", "l40s"}  # the profiles measured or sourced first
    assert {p for p in PAIRS if set(p) <= first} == {("h200-sxm", "h100-sxm"), ("h200-sxm", "a100-80gb"),
                          ("h100-sxm", "a100-80gb"), ("h200-sxm", "l40s"), ("h100-sxm", "l40s")}
    assert FUSED_RUNTIMES and "cuda-graph" in FUSED_RUNTIMES and "vllm" in FUSED_RUNTIMES


@st.composite
def steps(draw):
    kind = draw(st.sampled_from(["prefill", "decode", "mixed"]))
    n = draw(st.integers(1, 256))
    ctx = draw(st.integers(16, 16384))
    longest = draw(st.integers(ctx, 4 * ctx)) if n > 1 else ctx
    chunks = draw(st.lists(st.tuples(st.integers(1, 8192), st.integers(0, 8192)),
                           min_size=1, max_size=4))
    return kind, n, n * ctx if n == 1 else (n - 1) * ctx + longest, longest, chunks


def cost(s: StepLatency, step) -> float:
    kind, n, sum_ctx, longest, chunks = step
    if kind == "prefill":
        return s.prefill(chunks)
    if kind == "decode":
        return s.decode(n, sum_ctx, longest)
    return s.mixed(n, sum_ctx, longest, chunks)


@settings(max_examples=400, deadline=None)
@given(st.sampled_from(PAIRS), st.sampled_from(MODELS), st.sampled_from([1, 2, 4, 8]),
       st.sampled_from(FUSED_RUNTIMES), st.sampled_from(["paged", "contiguous"]),
       st.booleans(), steps())
def test_a_gpu_at_least_as_fast_on_every_datasheet_figure_is_never_costed_slower(
        pair, model, tensor, runtime, decode, fp8, step):
    fast, slow = pair
    assume(tensor == 1 or not AMD & set(pair))
    m, rt = load_model(model), load_runtime(runtime)
    fp8 &= datasheet(slow)["fp8_tflops"] > 0
    a, b = (StepLatency(m, load_profile(g), rt, "flash", decode, tensor=tensor, fp8_weights=fp8)
            for g in pair)
    t_fast, t_slow = cost(a, step), cost(b, step)
    assert t_fast <= t_slow * (1 + SOURCES), (fast, slow, t_fast, t_slow)


@pytest.mark.parametrize("tensor", [1, 2, 4, 8])
def test_an_8k_prefill_of_llama3_8b_costs_the_h200_less_than_the_h100_at_every_tp(tensor):
    m, rt = load_model("llama-3-8b"), load_runtime("cuda-graph")
    t = {g: StepLatency(m, load_profile(g), rt, tensor=tensor).prefill([(8192, 0)])
         for g in ("h200-sxm", "h100-sxm")}
    assert t["h200-sxm"] < t["h100-sxm"]
