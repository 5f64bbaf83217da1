"""Collectives between the GPUs of a tensor-parallel group: measured table or α–β model.

A GPU profile states its intra-node link as an `Interconnect` (profile.yaml,
`interconnect:`), with provenance. Every lookup returns `(ms, tag)` like the kernel
lookups of `sim/costmodel/profiles.py`:

- measured: when the profile names an all-reduce table (Vidur's collective
  profile format: columns `size` in bytes, `num_workers`, `devices_per_node`,
  `time_stats.all_reduce.median` in ms), the intra-node rows (devices_per_node =
  num_workers) form a grid over (bytes, GPUs), made monotone and interpolated
  log-log like every other table (`exact` / `interpolated`; `extrapolated` beyond
  its sizes, scaled by the α–β model).
- analytic: the α–β model of a ring, with the link's effective bus bandwidth B and
  per-step latency α:

      all-reduce of S bytes on n GPUs:  2(n−1)/n · S / B + 2(n−1) · α
      all-gather of S bytes in all:      (n−1)/n · S / B +  (n−1) · α

  Where the profile states published small-message all-reduce times per GPU count
  (`interconnect.all_reduce_latency`: NCCL picks ring/tree LL or NVLS there, whose
  latency grows far slower than 2(n−1) ring steps on an NVSwitch node), the latency
  term of the all-reduce is that α(n), interpolated linearly in log2(n) between the
  stated counts (held flat beyond them), instead of 2(n−1) · α.

  B is NCCL's "bus bandwidth" (algorithm bandwidth × 2(n−1)/n), which sits well
  below the datasheet link rate; each profile says which B it uses and why.

  B by message size: NCCL reaches its full bus bandwidth only on large messages (on 8
  H100/H200, NVLink SHARP: ~480 GB/s from 1 GiB, NVIDIA/nccl-tests #212; ring: ~370 GB/s).
  Where the profile states published nccl-tests bus bandwidths by size
  (`interconnect.all_reduce_bus`: bytes, GPUs, busbw, each with its source), each point
  is turned into the β-only bandwidth the α–β form needs (the published time
  t = 2(n−1)/n · S / busbw less α(n)):

      B(S) = 2(n−1)/n · S / (t − α(n))      (points where α(n) ≤ t / 2 only)

  interpolated linearly in log2(S) between the points and held flat beyond them. At a
  stated GPU count that B(S) is used from the smallest point up (`derived` inside the
  stated sizes); at another count the nearest count's curve only lifts the fitted B,
  max(B, B_curve(S)) (bus bandwidth is normalised per GPU, and the ring's large-message
  busbw is about the same at any count on an NVSwitch node: an assumption); below the
  smallest point, and on a profile without points, the one fitted B (`analytic`). The
  all-reduce is α(n) + 2(n−1)/n · S / B(S). A measured table (`all_reduce_table`) still
  wins inside its sizes.
- custom (runtime `custom_all_reduce: true`): production stacks (vLLM since PR #2192,
  TensorRT-LLM's all-reduce plugin, SGLang) reduce small messages over NVLink with
  their own one-shot / two-shot kernels, whose latency hardly grows with the GPU count,
  and fall back to NCCL above a size limit (vLLM: 8 MiB). The profile's
  `interconnect.custom_all_reduce` states it as a two-shot α–β term,

      custom all-reduce of S ≤ max_bytes on n GPUs:  α_c + 2(n−1)/n · S / B_c

  (`analytic`), used when it is faster than the NCCL estimate; stacks without it (the
  eager reference) always use NCCL.
- all-to-all (expert parallelism's dispatch and combine; analytic, no measured table): the
  busiest GPU receives S bytes, (n−1)/n of them from its n−1 peers, sent to it at once
  (one α, not one per peer: NVSwitch and the NIC carry the peers' sends concurrently, as
  DeepEP's kernels issue them). Within one NVLink domain of G GPUs (n ≤ G):

      (n−1)/n · S / B + α

  Across domains (n > G, EP over several nodes or NVL72 racks) the (G−1)/n share from its
  own domain comes over NVLink and the (n−G)/n share from other domains over the GPU's
  network NIC (`parallel.network`, gpu_profiles/links.yaml: its line rate B_net and
  latency α_net), both at once:

      max((G−1)/n · S / B, (n−G)/n · S / B_net) + α + α_net
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from sim.io.specload import ROOT, load_yaml
from sim.io.tables import ANALYTIC, DERIVED, Grid, read_table

LINKS_FILE = ROOT / "gpu_profiles" / "links.yaml"

_POSITIVE = {"gt": 0}
# Vidur's collective profile columns (size is bytes: fp16 elements x 2)
VIDUR_ALL_REDUCE = {"size": int, "num_workers": int, "devices_per_node": int,
                    "time_stats.all_reduce.median": float}


@dataclass(frozen=True)
class CustomAllReduce:
    """profile.yaml `interconnect.custom_all_reduce` — a stack's NVLink all-reduce kernel."""

    latency_us: float = field(metadata={"ge": 0})  # α_c: a small message, flat in GPU count
    bus_gbs: float = field(metadata=_POSITIVE)  # B_c of the two-shot term
    max_bytes: int = field(default=8 * 2**20, metadata=_POSITIVE)  # NCCL above this
    source: tuple[str, ...] = ()


@dataclass(frozen=True)
class AllReduceLatency:
    """profile.yaml `interconnect.all_reduce_latency[i]` — α(n): a small all-reduce on n GPUs."""

    gpus: int = field(metadata={"ge": 2})
    latency_us: float = field(metadata=_POSITIVE)


@dataclass(frozen=True)
class BusBandwidth:
    """profile.yaml `interconnect.all_reduce_bus[i]` — a published all-reduce bus bandwidth
    (nccl-tests `busbw`) of a `bytes`-byte message on `gpus` GPUs of one node."""

    bytes: int = field(metadata=_POSITIVE)
    gpus: int = field(metadata={"ge": 2})
    bus_gbs: float = field(metadata=_POSITIVE)
    source: str = ""


@dataclass(frozen=True)
class Interconnect:
    """profile.yaml `interconnect:` — the GPU-to-GPU link inside one node."""

    name: str  # e.g. "NVLink 4 via NVSwitch"
    datasheet_gbs: float = field(metadata=_POSITIVE)  # per GPU, per direction
    bus_gbs: float = field(metadata=_POSITIVE)  # effective all-reduce bus bandwidth (α–β's B)
    latency_us: float = field(metadata={"ge": 0})  # α: per ring step
    gpus_per_node: int = field(default=8, metadata=_POSITIVE)  # largest tensor-parallel group
    all_reduce_table: str | None = None  # CSV in the profile folder (Vidur's columns)
    all_reduce_latency: tuple[AllReduceLatency, ...] = ()  # α(n) of the all-reduce, else 2(n−1)·α
    all_reduce_bus: tuple[BusBandwidth, ...] = ()  # published busbw by size: B(S), else bus_gbs
    custom_all_reduce: CustomAllReduce | None = None  # stacks' own kernel (runtime switch)
    source: tuple[str, ...] = ()

    def check(self) -> tuple[str, str] | None:
        """specload's hook: each GPU count of `all_reduce_latency` stated once."""
        counts = [p.gpus for p in self.all_reduce_latency]
        for i, n in enumerate(counts):
            if n in counts[:i]:
                return f"all_reduce_latency[{i}].gpus", f"{n} GPUs stated twice (allowed: each count once)"
        points = [(p.gpus, p.bytes) for p in self.all_reduce_bus]
        for i, point in enumerate(points):
            if point in points[:i]:
                return (f"all_reduce_bus[{i}].bytes", f"{point[1]} bytes on {point[0]} GPUs "
                        "stated twice (allowed: each size once per GPU count)")
        return None


def known_links() -> dict[str, tuple[float, float]]:
    """gpu_profiles/links.yaml as name -> (GB/s per GPU per direction, latency µs)."""
    return {name: (float(v["bandwidth_gbs"]), float(v["latency_us"]))
            for name, v in load_yaml(LINKS_FILE).items()}


def read_all_reduce(file: Path) -> dict[tuple[float, float], float]:
    """Intra-node all-reduce medians of a Vidur collective profile: (bytes, gpus) -> ms."""
    rows = read_table(file, VIDUR_ALL_REDUCE, ())
    return {(r["size"], r["num_workers"]): r["time_stats.all_reduce.median"]
            for r in rows if r["devices_per_node"] == r["num_workers"]}


class Collectives:
    """All-reduce and all-gather times for one GPU type's intra-node link."""

    def __init__(self, link: Interconnect | None,
                 all_reduce: dict[tuple[float, float], float] | None = None):
        self.link = link
        self._curves = self._bus_curves(link) if link is not None else {}
        self._table = Grid(all_reduce, self.ring_all_reduce) if all_reduce else None

    def _bus_curves(self, link: Interconnect) -> dict[int, tuple[list[float], list[float]]]:
        """GPU count -> (log2 bytes, β-only GB/s) of the published points (module text)."""
        by_count: dict[int, list[tuple[float, float]]] = {}
        for p in link.all_reduce_bus:
            share = 2 * (p.gpus - 1) / p.gpus * p.bytes  # bytes on the bus per GPU
            t_us = share / (p.bus_gbs * 1e3)
            alpha = self.all_reduce_latency_us(p.gpus)
            if alpha <= t_us / 2:
                by_count.setdefault(p.gpus, []).append(
                    (math.log2(p.bytes), share / ((t_us - alpha) * 1e3)))
        return {n: ([x for x, _ in sorted(pts)], [b for _, b in sorted(pts)])
                for n, pts in by_count.items()}

    def bus_gbs(self, nbytes: float, gpus: float) -> tuple[float, bool]:
        """B(S) for an all-reduce of `nbytes` on `gpus` GPUs, GB/s, and whether it stands on
        published points at this count and inside their sizes (module text)."""
        link = self._link()
        if not self._curves:
            return link.bus_gbs, False
        n = min(self._curves, key=lambda c: (abs(math.log2(c) - math.log2(gpus)), c))
        xs, bs = self._curves[n]
        x = math.log2(max(nbytes, 1.0))
        if x < xs[0]:  # below the published sizes: the fitted B
            return link.bus_gbs, False
        b = float(np.interp(x, xs, bs))
        if n != gpus:  # another count's curve only lifts the fitted B for large messages
            return max(b, link.bus_gbs), False
        return b, x <= xs[-1]

    def _link(self) -> Interconnect:
        if self.link is None:
            raise ValueError("this GPU profile states no interconnect (profile.yaml: interconnect)")
        return self.link

    def ring_all_reduce(self, nbytes: float, gpus: float) -> float:
        """α–β ring all-reduce, ms: α(n) + 2(n−1)/n · S / B(S)."""
        return (2 * (gpus - 1) / gpus * nbytes / (self.bus_gbs(nbytes, gpus)[0] * 1e6)
                + self.all_reduce_latency_us(gpus) * 1e-3)

    def all_reduce_latency_us(self, gpus: float) -> float:
        """The all-reduce's latency term α(n), µs: the profile's published points
        (log2-linear between them, flat beyond) or 2(n−1) ring steps of α."""
        link = self._link()
        points = sorted((p.gpus, p.latency_us) for p in link.all_reduce_latency)
        if not points:
            return 2 * (gpus - 1) * link.latency_us
        return float(np.interp(math.log2(gpus), [math.log2(n) for n, _ in points],
                               [t for _, t in points]))

    def ring_all_gather(self, nbytes: float, gpus: float) -> float:
        """α–β ring all-gather of `nbytes` in all (each GPU contributes nbytes / gpus), ms."""
        link = self._link()
        return ((gpus - 1) / gpus * nbytes / (link.bus_gbs * 1e6)
                + (gpus - 1) * link.latency_us * 1e-3)

    def all_reduce(self, nbytes: int, gpus: int, custom: bool = False) -> tuple[float, str]:
        """An all-reduce of `nbytes` (each GPU's buffer) over `gpus` GPUs of one node;
        `custom`: the stack's own small-message kernel where the link states one."""
        if gpus == 1:
            return 0.0, ANALYTIC
        if self._table is not None:
            ms, tag = self._table.lookup(nbytes, gpus)
        else:
            ms = self.ring_all_reduce(nbytes, gpus)
            tag = DERIVED if self.bus_gbs(nbytes, gpus)[1] else ANALYTIC
        if custom:
            fast = self.custom_all_reduce(nbytes, gpus)
            if fast is not None and fast < ms:
                return fast, ANALYTIC
        return ms, tag

    def custom_all_reduce(self, nbytes: float, gpus: float) -> float | None:
        """The stack's own all-reduce kernel, ms; None above its size limit or where the
        link states none (PCIe without peer access: NCCL)."""
        kernel = self._link().custom_all_reduce
        if kernel is None or nbytes > kernel.max_bytes:
            return None
        return (kernel.latency_us * 1e-3
                + 2 * (gpus - 1) / gpus * nbytes / (kernel.bus_gbs * 1e6))

    def all_to_all(self, nbytes: float, gpus: int,
                   network: tuple[float, float] | None = None) -> tuple[float, str]:
        """An all-to-all in which the busiest GPU receives `nbytes` from `gpus` GPUs (α–β,
        peers at once; see the module text); `network`: (GB/s, µs) of the link between
        NVLink domains, used when `gpus` exceeds one. Analytic; no measured table."""
        if gpus == 1:
            return 0.0, ANALYTIC
        link = self._link()
        domain = min(gpus, link.gpus_per_node)
        ms = (domain - 1) / gpus * nbytes / (link.bus_gbs * 1e6)
        if gpus > domain:
            if network is None:
                raise ValueError(f"an all-to-all over {gpus} GPUs crosses the "
                                 f"{link.gpus_per_node}-GPU NVLink domain: name a network link")
            gbs, us = network
            ms = max(ms, (gpus - domain) / gpus * nbytes / (gbs * 1e6)) + us * 1e-3
        return ms + link.latency_us * 1e-3, ANALYTIC

    def all_gather(self, nbytes: int, gpus: int) -> tuple[float, str]:
        """An all-gather producing `nbytes` on every GPU (α–β; no measured table)."""
        if gpus == 1:
            return 0.0, ANALYTIC
        return self.ring_all_gather(nbytes, gpus), ANALYTIC
