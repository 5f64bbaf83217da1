"""Elementwise kernels as a serving stack runs them: fused, or as the profile measured them.

A profile's elementwise table times either `fused` kernels (one kernel per RMSNorm,
residual add and SiLU·mul: Vidur's A100/H100 rows, from Sarathi-Serve's custom CUDA
kernels; the analytic roofline) or `unfused` ones (the H200's: RMSNorm as about six
PyTorch ops, SiLU·mul as two by its times, what the eager reference stack runs). A
runtime says which class its stack runs (`RuntimeSpec.elementwise`). Production stacks
run residual add + RMSNorm as one kernel that reads x and the residual and writes both
(vLLM's `fused_add_rms_norm`, csrc/layernorm_kernels.cu; TensorRT-LLM's PyTorch backend
and SGLang through FlashInfer's `fused_add_rmsnorm`) and SiLU·mul as one kernel (vLLM's
`silu_and_mul`, csrc/activation_kernels.cu).

A fused-class runtime on an `unfused` profile gets its kernels derived from that
profile's own rows, tagged `derived`: each fused kernel takes the longer of

* the measured single-kernel table (`residual_add`, one `a + b` kernel) looked up at
  equal HBM bytes: its floor at small sizes and its rise towards streaming, and
* its bytes at the profile's measured streaming rate (`mem_bw_tbs`, the copy ceiling;
  the datasheet rate × `efficiency.mem_bw` where none was measured),

and the per-layer residual adds disappear into the fused norms. A `fused` profile (or a
runtime that keeps what the profile measured) is looked up as measured; no table measures
the unfused ops on a fused profile, so an `unfused` runtime there keeps the fused rows.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from sim.costmodel.layer import Op, fuse_add_norms
from sim.io.tables import DERIVED, EXACT, INTERPOLATED

if TYPE_CHECKING:
    from sim.costmodel.profiles import GPUProfile

Lookup = Callable[[str, int, int], tuple[float, str]]  # (op, tokens, width) -> (ms, tag)

# HBM bytes per (token × width) element, bf16: add+RMSNorm reads x and the residual and
# writes both; RMSNorm alone (the first layer's input norm) reads x, writes y; SiLU·mul
# reads gate and up and writes one output; the measured single kernel, residual_add, 6
FUSED_BYTES = {"add_rmsnorm": 8, "rmsnorm": 4, "silu_mul": 6}
SINGLE_KERNEL, SINGLE_KERNEL_BYTES = "residual_add", 6


def derives_fused(profile: GPUProfile, runtime_elementwise: str) -> bool:
    """Whether a runtime of this elementwise class needs fused kernels derived on `profile`."""
    return runtime_elementwise == "fused" and profile.facts.elementwise_kernels == "unfused"


def streaming_bytes_per_ms(profile: GPUProfile) -> float:
    """The profile's measured streaming rate (copy ceiling), else its roofline's."""
    f = profile.facts
    if f.mem_bw_tbs is not None:
        return f.mem_bw_tbs * 1e9
    return f.datasheet_mem_bw_tbs * 1e9 * f.efficiency.mem_bw


def fused_kernel(profile: GPUProfile, kernel: str, tokens: int, width: int) -> tuple[float, str]:
    """ms and tag of one fused `kernel` (add_rmsnorm, rmsnorm, silu_mul) on tokens × width."""
    per_element = FUSED_BYTES[kernel]
    equal_bytes = max(1.0, tokens * per_element / SINGLE_KERNEL_BYTES)  # no faster below one token
    ms, tag = profile.elementwise(SINGLE_KERNEL, equal_bytes, width)
    stream = tokens * width * per_element / streaming_bytes_per_ms(profile)
    if stream >= ms:
        return stream, DERIVED
    return ms, DERIVED if tag in (EXACT, INTERPOLATED) else tag


def stack_elementwise(profile: GPUProfile, runtime_elementwise: str, layer: tuple[Op, ...]
                      ) -> tuple[Lookup, tuple[Op, ...]]:
    """The elementwise lookup a step uses and the layer as the stack runs it: as measured,
    its RMSNorms and residual adds apart; derived fused, each residual add folded into
    the RMSNorm after it (`fuse_add_norms`: 2 add+RMSNorm per layer; the first layer's
    input norm has no residual yet: the step's one plain RMSNorm, counted as its final
    norm)."""
    if not derives_fused(profile, runtime_elementwise):
        return profile.elementwise, layer

    def lookup(op: str, tokens: int, width: int) -> tuple[float, str]:
        if op in FUSED_BYTES:
            return fused_kernel(profile, op, tokens, width)
        return profile.elementwise(op, tokens, width)
    return lookup, fuse_add_norms(layer)
