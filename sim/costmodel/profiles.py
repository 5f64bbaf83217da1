"""GPU profiles (`gpu_profiles/<gpu>/`): facts, measured kernel tables, and lookups.

A folder holds `profile.yaml` (`sim/costmodel/gpu_facts.py`: `GPUFacts`, the roofline `Efficiency`) and any
subset of the four tables in `TABLES`. Every lookup returns `(ms, tag)`: `exact` on
a measured point, `interpolated` between measured points, `extrapolated` when
scaled from the nearest measured point by the ratio of roofline times, `analytic`
when no table covers the op (roofline with the efficiencies).

Tables are made monotone at load: a smaller problem can always be padded to a
larger measured one, so a measured time becomes the minimum over the points at
least as large (e.g. paged_gather's 0.197 ms at batch 1, ctx 128 becomes the 0.124
ms of ctx 512). Interpolation is linear in log time over log sizes, so lookups
never decrease with size. A GEMM kernel other than the measured bf16 one (FP8,
weight-only, another GPU's) is that lookup × its roofline / the measured bf16 roofline at
the same shape, lowered to the least over larger M (`sim/costmodel/gemm_curve.py`: why).
Cells missing from a staircase grid (large batch × long
context) are filled by roofline scaling. An unmeasured head configuration (or
elementwise width) is looked up in the nearest measured one at the equivalent
batch (or token count): batch × the ratio of per-sequence work (hq·d for prefill,
hkv·d for decode). An equivalent batch below the smallest measured one (one sequence of a
tensor-parallel shard's few heads) is looked up at that batch and the length of equal
work instead: seq × √ratio for prefill (FLOPs grow as seq²), ctx × ratio for decode (KV
bytes as ctx); held out, this predicts the measured batch-1 rows from the batch-4 flash
rows to 5 % median (worst 35 %) and from the batch-2 contiguous decode rows to 3 %
(tests/test_profiles.py). An unmeasured GEMM (K, N) takes the nearest shape's rows scaled
by K·N / (K₀·N₀), the ratio of both roofline terms at equal M, never below the launch
floor. (Scaling only the time above the floor was tried: Vidur's A100 rows run below
its fitted floor + streaming, so on larger shapes it implied more than the datasheet
bandwidth, the A100's Llama-2-70B decode at TP 4 ran 10 % faster, and the published rows'
median error went from 8.5 to 9.0 %.) The CSV reading and the grid machinery live in `sim/io/tables.py`; this
module supplies the roofline costs.

A profile costed from another GPU's measurements (`derived_from`, `tables_from`) looks
up, for GEMMs, the measured GPU's lookup at the same shape (`gemm_source`) × the ratio of
the two rooflines there, and for the other tables the measured rows scaled by that ratio
(sim/costmodel/derived_tables.py: why the two differ).

Decode is looked up at (batch, mean context = sum_ctx / batch); given the longest
context as well, it moves towards the time at that context by weights fitted at load to
the table's mixed-length rows (`sim/costmodel/mixed_decode.py`: why, and how well).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from pathlib import Path

from sim.costmodel.comm import Collectives, read_all_reduce
from sim.costmodel.derived_tables import derive_tables
from sim.costmodel.gemm_curve import GemmCurve, GemmRoofline
from sim.costmodel.gpu_facts import Efficiency, GPUFacts
from sim.costmodel.l2flush import describe, remove_write_back
from sim.costmodel.mixed_decode import blend, fit_mix_weights
from sim.costmodel.profile_sanity import cap_tables
from sim.io.filecache import FileCache, Stamp
from sim.io.specload import ROOT, SpecError, build, is_file, known_names, load_yaml, show
from sim.io.tables import (
    ANALYTIC,
    DERIVED,
    EXACT,
    EXTRAPOLATED,
    INTERPOLATED,
    Grid,
    group,
    nearest,
    read_table,
    scaled,
)

__all__ = ["ANALYTIC", "BF16", "DERIVED", "ELEMENTWISE_BYTES", "EXACT", "EXTRAPOLATED", "IMPLS",
           "INTERPOLATED", "PROFILES_DIR", "TABLES", "Efficiency", "GPUFacts", "GPUProfile",
           "known_profiles", "load_profile", "profile_sources"]

_RANK = {EXACT: 0, INTERPOLATED: 1, DERIVED: 2, EXTRAPOLATED: 3, ANALYTIC: 4}

PROFILES_DIR = ROOT / "gpu_profiles"
_CFG = {"hq": int, "hkv": int, "d": int}
TABLES: dict[str, dict[str, type]] = {  # table -> its columns
    "gemm": {"M": int, "K": int, "N": int, "ms": float},
    "attn_prefill": {"impl": str, "batch": int, "seq": int, **_CFG, "ms": float, "peak_mib": float},
    "attn_decode": {"impl": str, "batch": int, "ctx": int, "sum_ctx": int, "max_ctx": int,
                    **_CFG, "block": int, "ms": float},
    "elementwise": {"op": str, "M": int, "H": int, "ms": float},
}
# HBM bytes an elementwise op moves per (token × H) element in bf16: rmsnorm reads x and
# writes y; residual_add and silu_mul read two inputs and write one; rotary reads x and
# cos/sin, writes x; kv_write copies K and V (H = 2·hkv·d); embedding copies one row.
ELEMENTWISE_BYTES = {"rmsnorm": 4, "residual_add": 6, "silu_mul": 6, "rotary": 6,
                     "kv_write": 4, "embedding": 4}
IMPLS = {"attn_prefill": ("flash", "naive"),
         "attn_decode": ("contiguous", "paged", "paged_reference", "paged_gather",
                         "contiguous_per_head"),
         "elementwise": tuple(ELEMENTWISE_BYTES)}
# decode kernels with their own roofline terms (and possibly a table); `paged` is derived
# from `contiguous` with the profile's paged_decode_overhead (see GPUProfile);
# `contiguous_per_head`: `contiguous` reading each KV head once per query head of its GQA
# group (TensorRT-LLM <= 0.6's masked MHA kernel; no L2 reuse assumed: an upper bound)
BF16 = 2
_MEMO_MAX = 1 << 20  # cached lookups per profile before the cache is cleared
_LOOKUPS = {"gemm": ("gemm",), "elementwise": ("elementwise",),  # table -> its lookups
            "attn_prefill": ("prefill_attn", "prefill_attn_mem_bytes"),
            "attn_decode": ("decode_attn",)}


def _memoised(method: Callable) -> Callable:
    """Cache a lookup on the instance, keyed by its arguments (the simulator's hot path)."""
    name = method.__name__

    @functools.wraps(method)
    def lookup(self: GPUProfile, *args, **kw) -> tuple[float, str]:
        key = (name, *args, *kw.items()) if kw else (name, *args)
        hit = self._memo.get(key)
        if hit is None:
            if len(self._memo) >= _MEMO_MAX:
                self._memo.clear()
            hit = method(self, *args, **kw)
            if name in self._derived_lookups and _RANK[hit[1]] < _RANK[DERIVED]:  # another GPU's rows
                hit = hit[0], DERIVED
            self._memo[key] = hit
        return hit
    return lookup


class GPUProfile:
    """Kernel-time lookups for one GPU; each returns (ms, tag) and is memoised."""

    def __init__(self, facts: GPUFacts, tables: dict[str, list[dict]],
                 all_reduce: dict[tuple[float, float], float] | None = None,
                 capped: dict[str, int] | None = None, timing_note: str = "",
                 derived_tables: frozenset[str] = frozenset(),
                 gemm_source: GPUProfile | None = None):
        self.facts, self.name, self._memo, self.timing_note = facts, facts.name, {}, timing_note
        self.bound: dict[tuple, Callable] = {}  # lookups bound to a configuration (bound.py)
        # tables scaled from another GPU's (derived_from, tables_from), and their lookups
        self.derived_tables = derived_tables
        self._derived_lookups = {m for t in derived_tables for m in _LOOKUPS[t]}
        # the measured GPU whose GEMM lookups this one's are, scaled (derived_tables.py)
        self.gemm_source = gemm_source
        self.comm = Collectives(facts.interconnect, all_reduce)  # see sim/costmodel/comm.py
        self.capped = capped or {}  # rows per table raised to a ceiling (profile_sanity)
        self.rows = {t: len(tables.get(t, [])) for t in TABLES}
        if gemm_source is not None:
            self.rows["gemm"] = gemm_source.rows["gemm"]
        self._curves: dict[tuple, GemmCurve | None] = {}  # (K, N, kernel, width) -> its curve
        e = facts.efficiency
        self._gemm_rate = facts.datasheet_tflops * 1e9 * e.flops  # FLOP per ms
        self._bw = facts.datasheet_mem_bw_tbs * 1e9 * e.mem_bw  # bytes per ms
        cfg, bs = ("impl", "hq", "hkv", "d"), ("batch", "seq")
        self._gemm = {k: Grid(p, lambda m, _, k=k: self.gemm_model(m, *k))
                      for k, p in group(tables.get("gemm", []), ("K", "N"), ("M",)).items()}
        elem = group(tables.get("elementwise", []), ("op", "H"), ("M",))
        self._elem = {k: Grid(p, lambda m, _, k=k: self.elementwise_model(k[0], m, k[1]))
                      for k, p in elem.items()}
        pre = tables.get("attn_prefill", [])
        self._pre = {c: Grid(p, lambda b, s, c=c: self.prefill_model(c[0], b, s, s, *c[1:]))
                     for c, p in group(pre, cfg, bs).items()}
        self._pre_mem = {c: Grid({k: mib * 2**20 for k, mib in p.items()},
                                  lambda b, s, c=c: self.prefill_mem_model(c[0], b, s, *c[1:]),
                                  floor_below=False)
                         for c, p in group(pre, cfg, bs, "peak_mib").items()}
        dec = tables.get("attn_decode", [])
        self.mixed_decode_rows = [r for r in dec if not _uniform(r)]
        uniform = group([r for r in dec if _uniform(r)], cfg, ("batch", "ctx"))
        self._dec = {c: Grid(p, lambda b, x, c=c: self.decode_model(c[0], b, b * x, *c[1:]))
                     for c, p in uniform.items()}
        self._derived: set[tuple] = set()  # decode configs derived from another kernel's table
        slower = 1 + e.paged_decode_overhead
        for c, p in uniform.items():
            paged = ("paged", *c[1:])
            if c[0] == "contiguous" and paged not in uniform:
                self._dec[paged] = Grid({k: v * slower for k, v in p.items()},
                                        lambda b, x, c=paged: self.decode_model(c[0], b, b * x, *c[1:]))
                self._derived.add(paged)
        mixed = group(self.mixed_decode_rows, cfg, ("batch", "sum_ctx", "max_ctx"))
        self._mix = fit_mix_weights(mixed, self._dec)  # cfg -> weights (sim/costmodel/mixed_decode.py)

    # ---- roofline models (ms; bytes for memory) --------------------------------------

    def gemm_model(self, M: float, K: float, N: float) -> float:
        flops, nbytes = 2 * M * K * N, (M * K + K * N + M * N) * BF16
        return self.facts.efficiency.gemm_floor_ms + max(flops / self._gemm_rate, nbytes / self._bw)

    def elementwise_model(self, op: str, M: float, H: float) -> float:
        return self.facts.efficiency.elementwise_floor_ms + M * H * ELEMENTWISE_BYTES[op] / self._bw

    def decode_model(self, impl: str, batch: float, sum_ctx: float,
                     hq: int, hkv: int, d: int) -> float:
        """floor + KV bytes / bw; `paged` is the contiguous kernel's time × (1 + overhead);
        `paged_reference` reads K/V once per query head (it does not share a GQA group's)."""
        e = self.facts.efficiency
        if impl == "paged":
            contiguous = self.decode_model("contiguous", batch, sum_ctx, hq, hkv, d)
            return contiguous * (1 + e.paged_decode_overhead)
        heads = hq if impl == "paged_reference" else hkv
        nbytes = (sum_ctx * 2 * heads * d + batch * 2 * hq * d) * BF16  # K, V read; q in, out
        bw = self.facts.datasheet_mem_bw_tbs * 1e9 * e.attn_decode_bw[impl]
        return e.attn_decode_floor_ms[impl] + nbytes / bw

    def prefill_model(self, impl: str, batch: float, q_len: float, kv_len: float,
                      hq: int, hkv: int, d: int) -> float:
        e = self.facts.efficiency
        flops = 4 * batch * hq * d * (q_len * kv_len - q_len * q_len / 2)  # causal QKᵀ and PV
        if impl == "naive":  # materialised scores: bound by their HBM traffic
            scores = batch * hq * q_len * kv_len * e.naive_bytes_per_score / self._bw
            t = max(flops / self._gemm_rate, scores)
        else:
            t = flops / (self.facts.datasheet_tflops * 1e9 * e.attn_prefill_flops)
        read = self.decode_model("contiguous", batch, batch * kv_len, hq, hkv, d)
        return max(e.attn_prefill_floor_ms + t, read)

    def prefill_mem_model(self, impl: str, batch: float, seq: float,
                          hq: int, hkv: int, d: int) -> float:
        out = batch * seq * hq * d * BF16
        if impl == "naive":  # fp32 scores, fp32 softmax, bf16 probs (10 B); K, V expanded for GQA
            return batch * hq * seq * seq * 10 + out * (3 if hkv < hq else 1)
        return out + batch * hq * seq * 4  # output and the fp32 log-sum-exp

    # ---- lookups ---------------------------------------------------------------------

    @_memoised
    def gemm(self, M: int, K: int, N: int) -> tuple[float, str]:
        """F.linear(x[M, K], W[N, K]) in bf16: table by (K, N) (or the nearest shape's,
        scaled), log-log in M; on a profile whose GEMMs are another GPU's, that GPU's
        lookup × the roofline ratio (sim/costmodel/gemm_curve.py)."""
        if min(M, K, N) < 1:
            raise ValueError(f"gemm sizes must be >= 1, got M={M}, K={K}, N={N}")
        curve = self.gemm_curve(K, N)
        if curve is None:
            return self.gemm_model(M, K, N), ANALYTIC
        return curve.at(M), curve.tag(M)

    @_memoised
    def gemm_fp8(self, M: int, K: int, N: int) -> tuple[float, str]:
        """The measured bf16 lookup at the same shape × the roofline ratio FP8 / bf16
        (sim/costmodel/gemm_curve.py): the datasheet's dense FP8 rate at the measured bf16
        efficiency, fp8 weights and inputs (1 byte), bf16 output. Always tagged analytic
        (no FP8 GEMM measured)."""
        if self.facts.datasheet_fp8_tflops is None:
            raise ValueError(f"{self.name} has no FP8 tensor cores (datasheet_fp8_tflops)")
        return self._quantised(M, K, N, "fp8", 1.0)

    @_memoised
    def gemm_weights(self, M: int, K: int, N: int, width: float) -> tuple[float, str]:
        """A weight-only quantised GEMM (W4A16: MXFP4 experts on Hopper, and on Blackwell
        under vLLM's default MoE backends): the measured bf16 lookup at the same shape ×
        the roofline ratio with the weights read at `width` bytes each, inputs, outputs and
        the compute at bf16 (the weights are dequantised in the kernel) over bf16. Tagged
        analytic."""
        return self._quantised(M, K, N, "weights", width)

    def _quantised(self, M: int, K: int, N: int, kernel: str, width: float) -> tuple[float, str]:
        curve = self.gemm_curve(K, N, kernel, width)
        if curve is None:
            return self.gemm_roofline(K, N, kernel, width).at(M), ANALYTIC
        return curve.at(M), ANALYTIC

    def gemm_roofline(self, K: int, N: int, kernel: str = "bf16", width: float = BF16
                      ) -> GemmRoofline:
        """A GEMM kernel's roofline of weight shape (K, N) as a function of M: `bf16`
        (`gemm_model`), `fp8` (dense FP8 rate, 1-byte weights and inputs) or `weights`
        (`width`-byte weights, bf16 inputs and compute); the output is bf16."""
        e = self.facts.efficiency
        rate, x = self._gemm_rate, BF16
        if kernel == "fp8":
            rate, x = self.facts.datasheet_fp8_tflops * 1e9 * e.flops, 1
        return GemmRoofline(e.gemm_floor_ms, 2 * K * N / rate, K * N * width / self._bw,
                            (K * x + N * BF16) / self._bw)

    def gemm_curve(self, K: int, N: int, kernel: str = "bf16", width: float = BF16
                   ) -> GemmCurve | None:
        """The curve of `gemm_roofline(K, N, kernel, width)` on this GPU over the rows of
        (K, N) in the GEMM table looked up (this profile's, or `gemm_source`'s); None
        without a GEMM table. Kept per shape and kernel (a run prices a few hundred)."""
        key = (K, N, kernel, width)
        curve = self._curves.get(key, False)
        if curve is False:
            base = self.gemm_source or self
            rows = base._gemm_rows(K, N)
            curve = None if rows is None else GemmCurve(
                rows[0], rows[1], base.gemm_roofline(K, N), self.gemm_roofline(K, N, kernel, width),
                rows[2])
            if len(self._curves) >= _MEMO_MAX >> 6:
                self._curves.clear()
            self._curves[key] = curve
        return curve

    def _gemm_rows(self, K: int, N: int) -> tuple[list[float], list[float], str] | None:
        """The table's rows M and their times for (K, N), never below the launch floor, and
        the tag of a lookup on a row. An unmeasured (K, N) takes the nearest shape's, scaled
        by K·N / (K₀·N₀) (both roofline terms at equal M). None without a GEMM table."""
        floor = self.facts.efficiency.gemm_floor_ms
        grid = self._gemm.get((K, N))
        if grid is not None:
            return grid.xs, [max(v[0], floor) for v in grid.v], EXACT
        near = nearest(tuple(self._gemm), (K, N))
        if near is None:
            return None
        f = K * N / (near[0] * near[1])
        return self._gemm[near].xs, [max(v[0] * f, floor) for v in self._gemm[near].v], EXTRAPOLATED

    @_memoised
    def elementwise(self, op: str, M: int, H: int) -> tuple[float, str]:
        """rmsnorm, residual_add, silu_mul (measured) or rotary, kv_write, embedding on M×H."""
        _check(op, "elementwise", M=M, H=H)
        return (scaled(self._elem, (op, H), M, 1, lambda k: H / k[1])
                or (self.elementwise_model(op, M, H), ANALYTIC))

    @_memoised
    def prefill_attn(self, impl: str, batch: int, q_len: int, kv_len: int,
                     hq: int, hkv: int, d: int) -> tuple[float, str]:
        """Causal attention of `batch` sequences, q_len new tokens each over kv_len in all.

        kv_len > q_len is looked up at the square prefill of equal FLOPs,
        seq = sqrt(2·q·kv − q²) (so q·kv − q²/2 = seq²/2), tagged extrapolated, and
        is never below a contiguous decode over the same KV cache (reading it).
        """
        _check(impl, "attn_prefill", batch=batch, q_len=q_len, hq=hq, hkv=hkv, d=d)
        if kv_len < q_len:
            raise ValueError(f"need kv_len >= q_len, got q_len={q_len}, kv_len={kv_len}")
        seq = math.sqrt(2 * q_len * kv_len - q_len * q_len)
        hit = (_other_head_dim(self._pre, (impl, hq, hkv, d), batch, seq,
                               lambda c: math.sqrt(d / c[3]))  # equal FLOPs: seq² · d
               or scaled(self._pre, (impl, hq, hkv, d), batch, seq,  # equal FLOPs: batch · hq·d · seq²
                         lambda c: hq * d / (c[1] * c[3]), y_power=2))
        if hit is None:
            return self.prefill_model(impl, batch, q_len, kv_len, hq, hkv, d), ANALYTIC
        if kv_len == q_len:
            return hit
        read = self.decode_attn("contiguous", batch, batch * kv_len, hq, hkv, d)[0]
        return max(hit[0], read), EXTRAPOLATED

    @_memoised
    def prefill_attn_mem_bytes(self, impl: str, batch: int, seq: int,
                               hq: int, hkv: int, d: int) -> tuple[float, str]:
        """Extra GPU memory of a prefill call: naive O(batch·hq·seq²), flash O(batch·seq)."""
        _check(impl, "attn_prefill", batch=batch, seq=seq, hq=hq, hkv=hkv, d=d)
        per_seq = (lambda c: hq / c[1]) if impl == "naive" else (lambda c: hq * d / (c[1] * c[3]))
        cfg = (impl, hq, hkv, d)
        per_token = (lambda c: 1.0) if impl == "naive" else (lambda c: (2 * d + 4) / (2 * c[3] + 4))
        return (_other_head_dim(self._pre_mem, cfg, batch, seq, per_token)
                or scaled(self._pre_mem, cfg, batch, seq, per_seq)
                or (self.prefill_mem_model(impl, batch, seq, hq, hkv, d), ANALYTIC))

    @_memoised
    def decode_attn(self, impl: str, batch: int, sum_ctx: int, hq: int, hkv: int, d: int,
                    max_ctx: int | None = None) -> tuple[float, str]:
        """One decode step of attention: `batch` sequences, sum_ctx cached tokens in all.

        Looked up at (batch, sum_ctx / batch). With `max_ctx` (the longest context)
        above that mean, moved towards the time at (batch, max_ctx) by the weight
        fitted to the mixed-length rows (sim/costmodel/mixed_decode.py); a profile without
        mixed rows ignores `max_ctx`.
        """
        _check(impl, "attn_decode", batch=batch, hq=hq, hkv=hkv, d=d)
        if sum_ctx < batch or (max_ctx is not None and not sum_ctx / batch <= max_ctx <= sum_ctx):
            raise ValueError(f"need batch <= sum_ctx and mean <= max_ctx <= sum_ctx, got "
                             f"batch={batch}, sum_ctx={sum_ctx}, max_ctx={max_ctx}")
        if impl == "contiguous_per_head":  # KV bytes x group size (see IMPLS)
            g = hq // hkv
            ms, tag = self.decode_attn("contiguous", batch, sum_ctx * g, hq, hkv, d,
                                       None if max_ctx is None else max_ctx * g)
            return ms, (_derived(tag) if g > 1 else tag)
        if max_ctx is not None and max_ctx * batch != sum_ctx:  # the mean's time, memoised
            lo = self.decode_attn(impl, batch, sum_ctx, hq, hkv, d)
            return self._towards_longest(lo, impl, batch, max_ctx, hq, hkv, d)
        cfg = (impl, hq, hkv, d)
        lo = (_other_head_dim(self._dec, cfg, batch, sum_ctx / batch,
                              lambda c: d / c[3])  # equal KV bytes: ctx · d
              or scaled(self._dec, cfg, batch, sum_ctx / batch,  # equal KV bytes: batch · hkv·d · ctx
                     lambda c: hkv * d / (c[2] * c[3]), y_power=1))
        if lo is None:
            return self.decode_model(impl, batch, sum_ctx, hq, hkv, d), ANALYTIC
        if cfg in self._derived or nearest(tuple(self._dec), cfg) in self._derived:
            lo = lo[0], _derived(lo[1])
        return lo

    def _towards_longest(self, lo: tuple[float, str], impl: str, batch: int, max_ctx: int,
                         hq: int, hkv: int, d: int) -> tuple[float, str]:
        """`decode_attn` of a batch whose mean context's time is `lo`, the longest `max_ctx`
        (above the mean): `lo` moved towards the time at max_ctx by the fitted weight.
        (`lo` may carry the derived-table tag already: the call's tag gets it anyway.)"""
        if lo[1] == ANALYTIC:  # no decode table of this impl: the roofline alone
            return lo
        cfg = (impl, hq, hkv, d)
        # a derived `paged` kernel mixes lengths as the measured split-K paged kernel does
        mix_cfg = ("paged_reference", *cfg[1:]) if impl == "paged" else cfg
        near = mix_cfg if mix_cfg in self._mix else nearest(tuple(self._mix), mix_cfg)
        if near is None:
            return lo
        hi = self.decode_attn(impl, batch, max_ctx * batch, hq, hkv, d)
        own = INTERPOLATED if near == cfg else DERIVED if near == mix_cfg else EXTRAPOLATED
        tag = max(lo[1], hi[1], own, key=_RANK.__getitem__)
        return blend(lo[0], hi[0], self._mix[near].at(batch)), tag

    def summary(self) -> dict:
        """Name, analytic flag, table rows, measured points lowered by the envelope, rows
        capped at a ceiling per table, the decode configs derived from another table, and
        the timing correction applied at load (sim/costmodel/l2flush.py; "" when none)."""
        grids = [*self._gemm.values(), *self._elem.values(), *self._pre.values(),
                 *(g for c, g in self._dec.items() if c not in self._derived)]
        return {"name": self.name, "analytic": self.facts.analytic, "tables": dict(self.rows),
                "envelope_adjusted": sum(g.adjusted for g in grids),
                "capped": dict(self.capped), "derived_decode": sorted(self._derived),
                "mixed_decode_rows": len(self.mixed_decode_rows), "timing": self.timing_note,
                "derived_tables": sorted(self.derived_tables)}


def _derived(tag: str) -> str:
    """A lookup in a derived table: `derived` unless it was extrapolated beyond it."""
    return DERIVED if _RANK[tag] < _RANK[DERIVED] else tag


def _other_head_dim(grids: dict[tuple, Grid], cfg: tuple, x: float, y: float,
                    y_scale: Callable[[tuple], float]) -> tuple[float, str] | None:
    """A config measured only at another head dim (same impl and heads): that table at
    the same batch and the length of equal work, y · y_scale(measured cfg) (decode: equal
    KV bytes; prefill: equal FLOPs), tagged derived. Monotone as the table is; None
    when cfg is measured or no table differs from it in head dim alone."""
    if cfg in grids:
        return None
    same = [c for c in grids if c[:-1] == cfg[:-1]]
    if not same:
        return None
    near = min(same, key=lambda c: abs(math.log(c[-1] / cfg[-1])))
    t, tag = grids[near].lookup(x, y * y_scale(near))
    return t, _derived(tag)


def _uniform(row: dict) -> bool:
    """A decode row whose sequences all have the same context (a grid point)."""
    return row["max_ctx"] == row["ctx"] and row["sum_ctx"] == row["batch"] * row["ctx"]


def _check(impl: str, table: str, **sizes: int) -> None:
    """A ValueError for an unknown impl (or op) or a size below 1."""
    if impl not in IMPLS[table]:
        raise ValueError(f"unknown {table} impl {impl!r} (known: {', '.join(IMPLS[table])})")
    for k, v in sizes.items():
        if v < 1:
            raise ValueError(f"{k} must be >= 1, got {v}")


# ---- loading ------------------------------------------------------------------------


def known_profiles() -> list[str]:
    """Names of the profile folders in ROOT/gpu_profiles/, sorted."""
    names = known_names(PROFILES_DIR, "")
    return [n for n in names if (PROFILES_DIR / n / "profile.yaml").is_file()]


_LOADED: FileCache[GPUProfile] = FileCache()  # by folder, while its files are unchanged


def load_profile(name: str, *, file: str | Path | None = None, path: str = "gpu") -> GPUProfile:
    """The profile for a name (ROOT/gpu_profiles/NAME/) or a path to a profile folder.

    Errors inside the profile name its profile.yaml or CSV file. A folder is read again
    only when one of the files it was loaded from (profile.yaml, the tables, the
    all-reduce table) has changed, appeared or gone; otherwise every caller shares one
    `GPUProfile` (and its memoised lookups)."""
    folder = profile_folder(name, file=file, path=path)
    return _LOADED.get(folder, lambda watch: _read_profile(folder, watch))


def profile_sources(profile: GPUProfile) -> dict[Path, Stamp] | None:
    """The files `profile` was read from, each with its stamp when read (None: absent),
    or None for a profile not loaded by `load_profile` or replaced since (its files changed)."""
    return _LOADED.sources(profile)


def profile_folder(name: str, *, file: str | Path | None = None, path: str = "gpu") -> Path:
    """The resolved folder of a profile name or path; `file` and `path` are the caller's,
    where an unknown name is reported (a relative folder is taken from `file`'s folder)."""
    known = known_profiles()
    folder = PROFILES_DIR / name if name in known else Path(name)
    if name not in known and not folder.is_absolute() and file is not None:
        folder = Path(file).parent / folder
    if not is_file(folder / "profile.yaml"):
        raise SpecError(file, path, f"unknown {show(name)} (known: {', '.join(known)})")
    return folder.resolve()


def _read_profile(folder: Path, watch: Callable[[Path], Path]) -> GPUProfile:
    yaml_file = watch(folder / "profile.yaml")
    facts = build(GPUFacts, load_yaml(yaml_file), file=yaml_file)
    if facts.name != folder.name:
        raise SpecError(yaml_file, "name", f"{facts.name!r} differs from the folder name "
                        f"(allowed: {folder.name!r})")
    if facts.derived_from is not None:
        return _derived_profile(folder, facts, yaml_file, watch)
    tables, lowered, capped = _tables(folder, facts, watch)
    gemm_source = _tables_from(folder, facts, yaml_file, tables, watch)
    derived = frozenset(facts.tables_from)
    capped = {t: 0 if t in derived else n for t, n in capped.items()}
    link, all_reduce = facts.interconnect, None
    if link is not None and link.all_reduce_table:
        if not is_file(watch(folder / link.all_reduce_table)):
            raise SpecError(yaml_file, "interconnect.all_reduce_table",
                            f"file not found: {show(link.all_reduce_table)}")
        all_reduce = read_all_reduce(folder / link.all_reduce_table)
    return GPUProfile(facts, tables, all_reduce, capped, describe(facts.timing, lowered),
                      derived_tables=derived, gemm_source=gemm_source)


def _measured_base(name: str, yaml_file: Path, path: str, watch: Callable[[Path], Path]
                   ) -> tuple[Path, GPUFacts]:
    """The folder and facts of the measured profile `name` that a profile derives from."""
    base = profile_folder(name, file=yaml_file, path=path)
    base_yaml = watch(base / "profile.yaml")
    base_facts = build(GPUFacts, load_yaml(base_yaml), file=base_yaml)
    if base_facts.derived_from is not None or base_facts.analytic is True or base_facts.tables_from:
        raise SpecError(yaml_file, path, f"{name!r} has no measured tables of its own "
                        "(allowed: a measured profile)")
    return base, base_facts


def _tables_from(folder: Path, facts: GPUFacts, yaml_file: Path, tables: dict[str, list[dict]],
                 watch: Callable[[Path], Path]) -> GPUProfile | None:
    """Put in `tables` each `tables_from` table but the GEMMs: the named measured profile's
    rows scaled by the roofline ratio; return the measured GPU whose GEMM lookups stand
    in for this one's (scaled per lookup), if `gemm` is one of them (both:
    sim/costmodel/derived_tables.py). A table of the folder's own that this replaces is not
    looked up: it stays what the profile's roofline terms are fitted to, and a check of
    the derivation (its rows capped at load no longer count)."""
    gemm_source = None
    for table, name in sorted(facts.tables_from.items()):
        path = f"tables_from.{table}"
        base, base_facts = _measured_base(name, yaml_file, path, watch)
        if table == "elementwise" and base_facts.elementwise_kernels != facts.elementwise_kernels:
            raise SpecError(yaml_file, path, f"{name}'s elementwise table is "
                            f"{base_facts.elementwise_kernels} (allowed: {facts.elementwise_kernels})")
        rows = _tables(base, base_facts, watch)[0].get(table)
        if not rows:
            raise SpecError(yaml_file, path, f"{name} has no {table} table (allowed: a "
                            "profile that measured it)")
        derived, source = _derive({table: rows}, base_facts, facts)
        if source is None:
            tables[table] = derived[table]
        else:  # a GEMM table of the folder's own is not looked up
            tables.pop(table, None)
            gemm_source = source
    return gemm_source


def _derived_profile(folder: Path, facts: GPUFacts, yaml_file: Path,
                     watch: Callable[[Path], Path]) -> GPUProfile:
    """A profile whose tables are a measured profile's, scaled (sim/costmodel/derived_tables.py)."""
    base, base_facts = _measured_base(facts.derived_from, yaml_file, "derived_from", watch)
    if base_facts.elementwise_kernels != facts.elementwise_kernels:
        raise SpecError(yaml_file, "elementwise_kernels", f"{facts.elementwise_kernels!r} differs "
                        f"from {facts.derived_from}'s tables (allowed: "
                        f"{base_facts.elementwise_kernels!r})")
    if link := facts.interconnect:
        if link.all_reduce_table:
            raise SpecError(yaml_file, "interconnect.all_reduce_table",
                            "a derived profile has no tables of its own (allowed: none)")
    base_tables = _tables(base, base_facts, watch)[0]
    tables, gemm_source = _derive(base_tables, base_facts, facts)
    note = (f"tables derived: {facts.derived_from}'s measured rows x this GPU's roofline / "
            f"{facts.derived_from}'s, per shape")
    return GPUProfile(facts, tables, None, {}, note, derived_tables=frozenset(base_tables),
                      gemm_source=gemm_source)


def _derive(tables: dict[str, list[dict]], measured: GPUFacts, target: GPUFacts
            ) -> tuple[dict[str, list[dict]], GPUProfile | None]:
    """A measured GPU's tables (`tables`, as its lookups see them) as the target GPU's
    (sim/costmodel/derived_tables.py): each table but the GEMMs as rows scaled by the
    roofline ratio, and the measured GPU's profile of its GEMM table alone, whose lookups
    the target's scale (None without a GEMM table)."""
    rows = {t: r for t, r in tables.items() if t != "gemm"}
    source = GPUProfile(measured, {"gemm": tables["gemm"]}) if tables.get("gemm") else None
    return derive_tables(rows, GPUProfile(measured, {}), GPUProfile(target, {})), source


def _tables(folder: Path, facts: GPUFacts, watch: Callable[[Path], Path]
            ) -> tuple[dict[str, list[dict]], dict[str, int], dict[str, int]]:
    """The folder's tables, the flush's write-back removed (sim/costmodel/l2flush.py), then rates
    above the GPU's ceilings capped (sim/costmodel/profile_sanity.py); rows lowered, rows capped."""
    tables = {t: read_table(folder / f"{t}.csv", cols, IMPLS.get(t, ()))
              for t, cols in TABLES.items() if watch(folder / f"{t}.csv").is_file()}
    ceiling = facts.peak_tflops or facts.datasheet_tflops
    lowered = remove_write_back(tables, facts.timing, ceiling, ELEMENTWISE_BYTES)  # before the caps
    capped = cap_tables(tables, ceiling, facts.datasheet_mem_bw_tbs, ELEMENTWISE_BYTES)
    return tables, lowered, capped


def tables_as_used(name: str) -> tuple[GPUFacts, dict[str, list[dict]]]:
    """A profile's facts and tables as lookups see them, before the grids are made
    monotone: what its roofline efficiencies are fitted to (sim/fit/profile_convert.py)."""
    facts = load_profile(name).facts
    return facts, _tables(profile_folder(name), facts, lambda p: p)[0]
