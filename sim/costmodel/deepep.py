"""Expert-parallel all-to-all as DeepEP runs it (DeepSeek, SGLang `--moe-a2a-backend deepep`,
vLLM's DeepEP backends): dispatch in FP8, combine in BF16, with a high-throughput ("normal")
kernel for prefill and a low-latency kernel for decode.

```yaml
parallel: {data: 8, expert: 8, all_to_all: {kernel: deepep}}            # auto: by batch
parallel: {data: 16, expert: 16, network: infiniband-ndr400,
           all_to_all: {kernel: deepep, mode: low_latency, max_dispatch_tokens: 256}}
```

Bytes. The busiest expert rank receives R rows of `hidden` per MoE layer in the dispatch
and sends them back in the combine (sim/costmodel/ranks.py: T · k · share · the busiest
factor). DeepEP's FP8 dispatch sends each row as `hidden` FP8 bytes plus one FP32 scale
per 128 channels (hidden + hidden / 32 bytes: 1.03125 bytes an element, so `hidden` must
divide by 128); the combine returns BF16 (2 bytes an element). The layer's list carries one
dispatch and one combine per MoE layer as two `all_to_all` calls of the BF16 bytes, so each
call is priced as half a dispatch plus half a combine (the same total).

Kernel. `mode: auto` (SGLang's default) runs the low-latency kernel when the busiest
attention rank's tokens fit its buffer (`max_dispatch_tokens`, SGLang's default 128;
DeepEP asks for under 256), the normal kernel otherwise (prefill and large mixed steps).

Time, from DeepEP's published figures where they exist (gpu_profiles/deepep.yaml), tagged
`derived` (a published figure scaled by a stated factor):

- normal, a row for the GPU's architecture and EP size: α + bytes / B, B the row's
  bottleneck bandwidth; an NVLink row scaled to this GPU's link (B · datasheet / the row's
  link: H800's 153 of 160 GB/s is 0.96 of the link), an RDMA row to this network's NIC
  (B · NIC / 50 GB/s, the CX7 400 Gb/s of every row); α the path's latency (the NVLink α
  inside a domain, plus the network's across);
- low-latency, a row for the architecture and EP size: α + bytes / B_ll with B_ll such
  that the published setting (128 tokens a rank, top-8, hidden 7168) takes the published
  latency exactly, B_ll = bytes_ref / (L − α), scaled to this network's NIC as above (V1's
  low-latency kernels are pure RDMA, inside a node too: the CX7 when no network is named);
  α the network's latency (10 µs), an assumption;
- elsewhere (an EP size or architecture without a row): the α–β all-to-all of
  sim/costmodel/comm.py on the FP8/BF16 bytes (`analytic`).

Refused up front (`check_deepep`): DeepEP without expert parallelism, on a GPU it does not
run on (full NVLink peer access: the `gpus` of the data file), FP8 dispatch on a GPU
without FP8, or a hidden size that is not a multiple of 128.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from sim.costmodel.profiles import ANALYTIC, DERIVED, GPUProfile
from sim.io.specload import ROOT, SpecError, build, load_yaml

FILE = ROOT / "gpu_profiles" / "deepep.yaml"
FP8_ROW = 1 + 4 / 128  # bytes an element: FP8 plus an FP32 scale per 128 channels
BF16_ROW = 2.0
SCALE_BLOCK = 128


@dataclass(frozen=True)
class AllToAllSpec:
    """`parallel.all_to_all`: how expert parallelism's dispatch and combine run."""

    kernel: Literal["alpha-beta", "deepep"] = "alpha-beta"
    mode: Literal["auto", "normal", "low_latency"] = "auto"
    dispatch: Literal["fp8", "bf16"] = "fp8"  # DeepEP's combine is always BF16
    max_dispatch_tokens: int = field(default=128, metadata={"gt": 0})  # low-latency buffer


@dataclass(frozen=True)
class NormalRow:
    arch: str
    ep: int = field(metadata={"ge": 2})
    link: Literal["nvlink", "rdma"]
    dispatch_gbs: float = field(metadata={"gt": 0})
    combine_gbs: float = field(metadata={"gt": 0})
    source: str
    link_gbs: float | None = field(default=None, metadata={"gt": 0})  # nvlink rows


@dataclass(frozen=True)
class LowLatencyRow:
    arch: str
    ep: int = field(metadata={"ge": 2})
    dispatch_us: float = field(metadata={"gt": 0})
    combine_us: float = field(metadata={"gt": 0})
    source: str


@dataclass(frozen=True)
class Reference:
    hidden: int = field(metadata={"gt": 0})
    top_k: int = field(metadata={"gt": 0})
    normal_tokens_per_rank: int = field(metadata={"gt": 0})
    low_latency_tokens_per_rank: int = field(metadata={"gt": 0})
    nic_gbs: float = field(metadata={"gt": 0})


@dataclass(frozen=True)
class DeepEPTable:
    """gpu_profiles/deepep.yaml."""

    gpus: dict[str, str]
    reference: Reference
    normal: tuple[NormalRow, ...]
    low_latency: tuple[LowLatencyRow, ...]


@functools.cache
def load_table(file: Path = FILE) -> DeepEPTable:
    return build(DeepEPTable, load_yaml(file), file=file)


def check_deepep(spec: AllToAllSpec, expert: int, hidden: int, profile: GPUProfile, *,
                 file=None, path: str = "parallel.all_to_all") -> None:
    """One-line SpecErrors for layouts DeepEP cannot run."""
    if spec.kernel != "deepep":
        return
    table = load_table()
    if expert == 1:
        raise SpecError(file, f"{path}.kernel", "deepep needs expert parallelism (allowed: "
                        "alpha-beta, or deepep with parallel.expert > 1)")
    if profile.name not in table.gpus:
        raise SpecError(file, f"{path}.kernel", f"deepep does not run on {profile.name} "
                        f"(allowed: alpha-beta; deepep on {', '.join(sorted(table.gpus))})")
    if spec.dispatch == "fp8":
        if profile.facts.datasheet_fp8_tflops is None:
            raise SpecError(file, f"{path}.dispatch", f"fp8 dispatch needs FP8, which "
                            f"{profile.name} lacks (allowed: bf16)")
        if hidden % SCALE_BLOCK:
            raise SpecError(file, f"{path}.dispatch", f"fp8 dispatch scales blocks of "
                            f"{SCALE_BLOCK} channels; hidden {hidden} is not a multiple "
                            "(allowed: bf16)")


class DeepEP:
    """Prices one `all_to_all` call (half a dispatch, half a combine) of a replica."""

    def __init__(self, spec: AllToAllSpec, profile: GPUProfile, ep: int,
                 network: tuple[float, float] | None):
        self.spec, self.p, self.ep, self.network = spec, profile, ep, network
        table = load_table()
        self.ref = table.reference
        arch = table.gpus.get(profile.name)
        link = profile.facts.interconnect
        self.domain = min(ep, link.gpus_per_node) if link is not None else 1
        kind = "nvlink" if ep <= self.domain else "rdma"
        self.normal = next((r for r in table.normal
                            if r.arch == arch and r.ep == ep and r.link == kind), None)
        self.low = next((r for r in table.low_latency if r.arch == arch and r.ep == ep), None)
        self.dispatch_share = (FP8_ROW if spec.dispatch == "fp8" else BF16_ROW) / BF16_ROW

    def mode(self, tokens_per_rank: int) -> str:
        if self.spec.mode != "auto":
            return self.spec.mode
        return "low_latency" if tokens_per_rank <= self.spec.max_dispatch_tokens else "normal"

    def _nic(self) -> tuple[float, float]:
        """(GB/s, µs) of the NIC: the named network, else the table's CX7 at 10 µs."""
        return self.network if self.network is not None else (self.ref.nic_gbs, 10.0)

    def call_ms(self, bf16_bytes: float, tokens_per_rank: int) -> tuple[float, str]:
        """One `all_to_all` call: the busiest rank's `bf16_bytes` received (as BF16 rows)."""
        d_bytes, c_bytes = bf16_bytes * self.dispatch_share, bf16_bytes
        if self.mode(tokens_per_rank) == "low_latency":
            if self.low is not None:
                return self._low_latency_ms(d_bytes, c_bytes), DERIVED
        elif self.normal is not None:
            return self._normal_ms(d_bytes, c_bytes), DERIVED
        comm = self.p.comm
        d = comm.all_to_all(d_bytes, self.ep, self.network)[0]
        c = comm.all_to_all(c_bytes, self.ep, self.network)[0]
        return (d + c) / 2, ANALYTIC

    def _normal_ms(self, d_bytes: float, c_bytes: float) -> float:
        row, link = self.normal, self.p.facts.interconnect
        alpha = link.latency_us
        if row.link == "nvlink":
            scale = link.datasheet_gbs / row.link_gbs
        else:
            gbs, us = self._nic()
            scale, alpha = gbs / self.ref.nic_gbs, alpha + us
        d = d_bytes / (row.dispatch_gbs * scale * 1e6)
        c = c_bytes / (row.combine_gbs * scale * 1e6)
        return alpha * 1e-3 + (d + c) / 2

    def _low_latency_ms(self, d_bytes: float, c_bytes: float) -> float:
        row, ref = self.low, self.ref
        gbs, alpha = self._nic()
        rows = ref.low_latency_tokens_per_rank * ref.top_k
        out = 0.0
        for nbytes, us, width in ((d_bytes, row.dispatch_us, FP8_ROW),
                                  (c_bytes, row.combine_us, BF16_ROW)):
            ref_bytes = rows * ref.hidden * width
            b = ref_bytes / ((us - alpha) * 1e3) * gbs / ref.nic_gbs  # GB/s
            out += alpha * 1e-3 + nbytes / (b * 1e6)
        return out / 2
