"""A GPU profile's facts: what profile.yaml says about the GPU (datasheet and measured
rates, memory, links) and the roofline model's fitted efficiencies. Loaded and checked
by `sim/costmodel/profiles.py`, which owns the kernel-time lookups built on them."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Literal

from sim.costmodel.comm import Interconnect
from sim.costmodel.l2flush import Timing
from sim.costmodel.power import PowerSpec

MEASURED_DECODE = ("contiguous", "paged_reference", "paged_gather")  # decode impls with fitted terms
# how a profile's number was obtained (`provenance:`): read off a datasheet or a vendor's
# platform figure, measured, derived from such numbers by a stated rule, or assumed
PROVENANCE = ("datasheet", "measured", "derived", "assumed")
FP4_FORMATS = ("NVFP4", "MXFP4")
TABLE_NAMES = ("gemm", "attn_prefill", "attn_decode", "elementwise")  # the kernel tables (profiles.TABLES)
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
    # dense FP4 tensor rate and its formats: recorded facts; the cost model does not use FP4
    # yet (weights and KV are bf16 or fp8, sim/costmodel/parallel.py `with_dtypes`)
    datasheet_fp4_tflops: float | None = field(default=None, metadata=_POSITIVE)
    fp4_formats: tuple[str, ...] = ()
    # a measured profile whose tables, scaled by the roofline ratio, stand in for this GPU's
    # (sim/costmodel/derived_tables.py); None: its own tables, or the roofline alone
    derived_from: str | None = None
    # per table, a measured profile whose rows (scaled by the roofline ratio, as for
    # `derived_from`) stand in for this GPU's own or analytic table: e.g. an H100 with its
    # own GEMMs measured but no attention measured takes the H200's attention rows
    tables_from: dict[str, str] = field(default_factory=dict)
    network: str | None = None  # the scale-out NIC per GPU: an entry of gpu_profiles/links.yaml
    provenance: dict[str, str] = field(default_factory=dict)  # field (or a.b) -> one of PROVENANCE
    power: PowerSpec | None = None  # power draw (sim/costmodel/power.py); None: energy not modelled

    def check(self) -> tuple[str, str] | None:
        """specload's hook: FP4 formats and provenance tags from their lists."""
        for i, f in enumerate(self.fp4_formats):
            if f not in FP4_FORMATS:
                return f"fp4_formats[{i}]", f"{f!r} is unknown (allowed: {', '.join(FP4_FORMATS)})"
        if self.fp4_formats and self.datasheet_fp4_tflops is None:
            return "datasheet_fp4_tflops", "missing while fp4_formats are stated (allowed: dense FP4 TFLOP/s)"
        for table, base in self.tables_from.items():
            if table not in TABLE_NAMES:
                return f"tables_from.{table}", f"unknown table (allowed: {', '.join(TABLE_NAMES)})"
            if self.derived_from is not None:
                return f"tables_from.{table}", "given with derived_from, which derives every table (allowed: one of the two)"
            if base == self.name:
                return f"tables_from.{table}", "names this profile itself (allowed: another, measured profile)"
        names = {f.name for f in fields(self)}
        for key, tag in self.provenance.items():
            if key.split(".")[0] not in names:
                return f"provenance.{key}", "names no field of the profile (allowed: a field, or field.subfield)"
            if tag not in PROVENANCE:
                return f"provenance.{key}", f"{tag!r} is unknown (allowed: {', '.join(PROVENANCE)})"
        return None

    def provenance_counts(self) -> dict[str, int]:
        """How many of its numbers are datasheet, measured, derived and assumed."""
        return {t: n for t in PROVENANCE if (n := sum(v == t for v in self.provenance.values()))}
