"""A GPU profile's facts: what profile.yaml says about the GPU (datasheet and measured
rates, memory, links) and the roofline model's fitted efficiencies. Loaded and checked
by `sim/costmodel/profiles.py`, which owns the kernel-time lookups built on them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from sim.costmodel.comm import Interconnect
from sim.costmodel.l2flush import Timing
from sim.costmodel.power import PowerSpec

MEASURED_DECODE = ("contiguous", "paged_reference", "paged_gather")  # decode impls with fitted terms
_FRACTION = {"gt": 0, "le": 1}
_POSITIVE = {"gt": 0}


@dataclass(frozen=True)
class Efficiency:
    """The roofline model's parameters; fractions are of the datasheet rates."""

    flops: float = field(metadata=_FRACTION)  # GEMM FLOP/s at large M
    mem_bw: float = field(metadata=_FRACTION)  # GEMM weights and elementwise traffic
    gemm_floor_ms: float = field(metadata={"ge": 0})  # t = floor + max(flops/rate, bytes/bw)
    attn_prefill_flops: float = field(metadata=_FRACTION)  # flash: t = floor + flops/rate
    attn_prefill_floor_ms: float = field(metadata={"ge": 0})
    naive_bytes_per_score: float = field(metadata=_POSITIVE)  # HBM bytes per QKᵀ element
    attn_decode_bw: dict[str, float]  # per decode impl: t = floor + KV bytes / bw
    attn_decode_floor_ms: dict[str, float]
    # a production paged kernel's time over the contiguous kernel's, minus 1 (`paged`)
    paged_decode_overhead: float = field(metadata={"ge": 0, "le": 1})
    elementwise_floor_ms: float = field(metadata={"ge": 0})  # smallest elementwise kernel
    source: str = ""

    def check(self) -> tuple[str, str] | None:
        impls = MEASURED_DECODE
        for name, allowed in (("attn_decode_bw", "0 < x <= 1"), ("attn_decode_floor_ms", ">= 0")):
            per_impl = getattr(self, name)
            if sorted(per_impl) != sorted(impls):
                have, need = ", ".join(per_impl), ", ".join(impls)
                return name, f"has {have} (allowed: one entry per {need})"
            for k, v in per_impl.items():
                if not (0 < v <= 1 if name == "attn_decode_bw" else v >= 0):
                    return f"{name}.{k}", f"{v} is out of range (allowed: {allowed})"
        return None


@dataclass(frozen=True)
class GPUFacts:
    """profile.yaml: what the GPU is and where its numbers come from."""

    name: str  # equals the folder's name
    description: str
    analytic: bool | Literal["partial"]  # true: no tables; partial: some tables measured
    source: tuple[str, ...]
    memory_gib: float = field(metadata=_POSITIVE)  # usable by the process
    datasheet_memory_gb: float = field(metadata=_POSITIVE)
    datasheet_mem_bw_tbs: float = field(metadata=_POSITIVE)
    datasheet_tflops: float = field(metadata=_POSITIVE)  # dense bf16
    pcie_gbs: float = field(metadata=_POSITIVE)  # host link, for KV swap
    sms: int = field(metadata=_POSITIVE)
    efficiency: Efficiency
    mem_bw_tbs: float | None = field(default=None, metadata=_POSITIVE)  # measured
    peak_tflops: float | None = field(default=None, metadata=_POSITIVE)  # measured
    tables: dict[str, str] = field(default_factory=dict)  # table -> who measured it
    notes: str = ""
    datasheet_fp8_tflops: float | None = field(default=None, metadata=_POSITIVE)  # dense; None: no FP8
    interconnect: Interconnect | None = None  # GPU-to-GPU link for tensor parallelism
    timing: Timing | None = None  # how the tables were timed; None: warm (sim/costmodel/l2flush.py)
    # what the elementwise table times: `fused`, one kernel per RMSNorm, residual add and
    # SiLU·mul (vLLM-class custom kernels; the analytic roofline) or `unfused`, RMSNorm as
    # several PyTorch ops (an eager stack's); a fused-kernel runtime derives its kernels
    # from an unfused table's single-kernel rows (sim/costmodel/fused.py)
    elementwise_kernels: Literal["fused", "unfused"] = "fused"
    power: PowerSpec | None = None  # power draw (sim/costmodel/power.py); None: energy not modelled
