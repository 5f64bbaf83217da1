"""A GPU profile's lookups bound to one configuration: what pricing a new step shape calls.

A step's price is one lookup per kernel in the GPU profile (sim/costmodel/profiles.py),
and each lookup first works out where its configuration's times come from (its own
measured table, another kernel's table, another head dim's, the nearest shape's), checks
its arguments and memoises on them, and only then interpolates a grid. A replica's
configuration (model shard, kernels, heads) is fixed, so everything but the grid's
interpolation can be worked out once, when the replica is built; pricing the first step
of each new shape (every shape of a run without the step-time cache,
sim/costmodel/stepcache.py) then pays for the interpolation alone.

A bound lookup is made only where the configuration's own table is measured (or derived
from another GPU's: profiles.py `derived_tables`), or where an elementwise kernel has no
table at all (the roofline alone); it runs the same floating-point operations on the same
grid values as the profile's lookup, in the same order, so it gives the same bytes and
tags (tests/test_bound_lookups.py compares them on random shapes, and a latency model's
whole memo priced either way). Any other configuration, and arguments the profile would
refuse (so that its errors are raised), go to the profile's own lookup. Bound lookups
live on their profile (`GPUProfile.bound`), as its memo does, and are shared by the
latency models using it; they remember what repeats across a run's new shapes (a batch's
or a length's place in a grid, a decode batch's time at its mean context), not each
shape's value: a latency model memoises those itself.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from sim.costmodel.gemm_curve import GemmCurve
from sim.costmodel.mixed_decode import MixWeights, blend
from sim.costmodel.profiles import _RANK, IMPLS, GPUProfile, _derived
from sim.io.tables import (
    ANALYTIC,
    DERIVED,
    EXTRAPOLATED,
    INTERPOLATED,
    Grid,
    bracket,
    nearest,
)

_MEMO_MAX = 1 << 20  # values a bound lookup remembers before it forgets them all
Sized = Callable[[int], tuple[float, str]]  # rows (tokens) -> (ms, tag)
ELEMENTWISE_OPS = IMPLS["elementwise"]


def bound_gemm(p: GPUProfile, k: int, n: int) -> Sized:
    """`p.gemm(M, k, n)` as a function of M."""
    key = ("gemm", k, n)
    f = p.bound.get(key)
    if f is None:
        def plain(m: int) -> tuple[float, str]:
            return p.gemm(m, k, n)
        curve = p.gemm_curve(k, n) if min(k, n) >= 1 else None
        f = p.bound[key] = (plain if curve is None else
                            _Curve(curve, plain, "gemm" in p._derived_lookups))
    return f


class _Curve:
    """`GPUProfile.gemm` of a shape with a table (its own, the nearest shape's, or the
    measured GPU's of a derived profile): the curve's time and tag at M."""

    def __init__(self, curve: GemmCurve, plain: Sized, derived: bool):
        self.curve, self.plain, self.derived = curve, plain, derived

    def __call__(self, m: int) -> tuple[float, str]:
        if m < 1:  # the profile's error
            return self.plain(m)
        tag = self.curve.tag(m)
        if self.derived and _RANK[tag] < _RANK[DERIVED]:
            tag = DERIVED
        return self.curve.at(m), tag


def bound_elementwise(p: GPUProfile, op: str, width: int) -> Sized:
    """`p.elementwise(op, M, width)` as a function of M: its own table's, else the roofline's
    where no table of `op` is measured."""
    key = ("elementwise", op, width)
    f = p.bound.get(key)
    if f is None:
        def plain(m: int) -> tuple[float, str]:
            return p.elementwise(op, m, width)
        grid = p._elem.get((op, width))
        if op not in ELEMENTWISE_OPS or width < 1:
            f = plain
        elif grid is not None:
            f = _Rows(p, grid, plain, "elementwise" in p._derived_lookups)
        elif nearest(tuple(p._elem), (op, width)) is None:  # profiles.py: the roofline alone
            f = _Rows(p, None, plain, False, lambda m: (p.elementwise_model(op, m, width), ANALYTIC))
        else:
            f = plain
        p.bound[key] = f
    return f


class _Rows:
    """An elementwise table's lookup by (op, width) at M rows: `Grid.lookup(M, 1)`; or
    `model(M)` where no table is looked up. M's bracket is remembered, shared by the grids
    measured at the same sizes (a step's elementwise kernels: one bracket for several)."""

    def __init__(self, p: GPUProfile, grid: Grid | None, plain: Sized, derived: bool,
                 model: Sized | None = None):
        self.grid, self.plain, self.derived, self.model = grid, plain, derived, model
        self.one_axis = grid is not None and grid.ys == [1]
        self.brackets: dict[int, tuple[float, tuple[int, float]]] = (  # M -> clamped, bracket
            p.bound.setdefault(("brackets", tuple(grid.xs)), {}) if self.one_axis else {})

    def __call__(self, m: int) -> tuple[float, str]:
        if m < 1:  # the profile's error
            return self.plain(m)
        grid = self.grid
        if grid is None:
            hit = self.model(m)
        elif self.one_axis:
            b = self.brackets.get(m)
            if b is None:
                xs = grid.xs
                xc = xs[0] if m < xs[0] else xs[-1] if m > xs[-1] else m
                if len(self.brackets) >= _MEMO_MAX:
                    self.brackets.clear()
                b = self.brackets[m] = xc, bracket(xs, grid.lx, xc)
            hit = grid.along_x(m, b[0], 1, b[1])
        else:
            hit = grid.lookup(m, 1)
        if self.derived and _RANK[hit[1]] < _RANK[DERIVED]:
            hit = hit[0], DERIVED
        return hit


def bound_decode_attn(p: GPUProfile, impl: str, hq: int, hkv: int, d: int
                      ) -> Callable[[int, int, int | None], tuple[float, str]]:
    """`p.decode_attn(impl, batch, sum_ctx, hq, hkv, d, max_ctx=...)` as a function of
    (batch, sum_ctx, max_ctx)."""
    key = ("decode_attn", impl, hq, hkv, d)
    f = p.bound.get(key)
    if f is None:
        cfg = (impl, hq, hkv, d)
        if cfg in p._dec and impl != "contiguous_per_head" and min(hq, hkv, d) >= 1:
            f = _DecodeAttn(p, cfg)
        else:
            def f(batch: int, sum_ctx: int, max_ctx: int | None = None) -> tuple[float, str]:
                return p.decode_attn(impl, batch, sum_ctx, hq, hkv, d, max_ctx=max_ctx)
        p.bound[key] = f
    return f


class _DecodeAttn:
    """`GPUProfile.decode_attn` of a configuration with its own uniform table: the time at
    the mean context (`_mean`, memoised: batches of one mean and several longest share it),
    moved towards the longest's by the fitted weight (profiles.py `_towards_longest`)."""

    def __init__(self, p: GPUProfile, cfg: tuple):
        self.p, self.cfg, self.grid = p, cfg, p._dec[cfg]
        self.derived = cfg in p._derived  # `paged` from the contiguous table
        self.derived_gpu = "decode_attn" in p._derived_lookups  # another GPU's rows
        mix_cfg = ("paged_reference", *cfg[1:]) if cfg[0] == "paged" else cfg
        near = mix_cfg if mix_cfg in p._mix else nearest(tuple(p._mix), mix_cfg)
        self.mix: MixWeights | None = None if near is None else p._mix[near]
        self.own = INTERPOLATED if near == cfg else DERIVED if near == mix_cfg else EXTRAPOLATED
        self.means: dict[tuple[int, int], tuple[float, str]] = {}
        self.xb: dict[int, tuple[float, tuple[int, float]]] = {}  # batch -> clamped, bracket
        self.yb: dict[float, tuple[float, tuple[int, float]]] = {}  # context -> the same

    def __call__(self, batch: int, sum_ctx: int, max_ctx: int | None = None) -> tuple[float, str]:
        if batch < 1 or sum_ctx < batch or (
                max_ctx is not None and not sum_ctx / batch <= max_ctx <= sum_ctx):
            impl, hq, hkv, d = self.cfg  # the profile's error
            return self.p.decode_attn(impl, batch, sum_ctx, hq, hkv, d, max_ctx=max_ctx)
        if max_ctx is None or max_ctx * batch == sum_ctx or self.mix is None:
            return self._mean(batch, sum_ctx)
        lo, hi = self._mean(batch, sum_ctx), self._mean(batch, max_ctx * batch)
        tag = lo[1]  # the least exact of lo's, hi's and the weights' own
        if _RANK[hi[1]] > _RANK[tag]:
            tag = hi[1]
        if _RANK[self.own] > _RANK[tag]:
            tag = self.own
        if self.derived_gpu and _RANK[tag] < _RANK[DERIVED]:
            tag = DERIVED
        return blend(lo[0], hi[0], self.mix.at(batch)), tag

    def _mean(self, batch: int, sum_ctx: int) -> tuple[float, str]:
        """The time at (batch, sum_ctx / batch), tagged as the profile tags it: `Grid.lookup`
        with the brackets of batch and context remembered (a run's batches and quantised
        contexts take a few hundred values each; their pairs many more)."""
        hit = self.means.get((batch, sum_ctx))
        if hit is None:
            grid, y = self.grid, sum_ctx / batch
            if len(grid.ys) == 1:
                hit = grid.lookup(batch, y)
            else:
                bx, by = self.xb.get(batch), self.yb.get(y)
                if bx is None:
                    xs = grid.xs
                    xc = xs[0] if batch < xs[0] else xs[-1] if batch > xs[-1] else batch
                    bx = self.xb[batch] = xc, bracket(xs, grid.lx, xc)
                if by is None:
                    ys = grid.ys
                    yc = ys[0] if y < ys[0] else ys[-1] if y > ys[-1] else y
                    if len(self.yb) >= _MEMO_MAX:
                        self.yb.clear()
                    by = self.yb[y] = yc, bracket(ys, grid.ly, yc)
                hit = grid.corners(batch, y, bx[0], by[0], bx[1], by[1])
            if self.derived:
                hit = hit[0], _derived(hit[1])
            if self.derived_gpu and _RANK[hit[1]] < _RANK[DERIVED]:
                hit = hit[0], DERIVED
            if len(self.means) >= _MEMO_MAX:
                self.means.clear()
            self.means[(batch, sum_ctx)] = hit
        return hit


def bound_prefill_attn(p: GPUProfile, impl: str, hq: int, hkv: int, d: int
                       ) -> Callable[[int, int, int], tuple[float, str]]:
    """`p.prefill_attn(impl, batch, q_len, kv_len, hq, hkv, d)` as a function of
    (batch, q_len, kv_len)."""
    key = ("prefill_attn", impl, hq, hkv, d)
    f = p.bound.get(key)
    if f is None:
        def plain(batch: int, q_len: int, kv_len: int) -> tuple[float, str]:
            return p.prefill_attn(impl, batch, q_len, kv_len, hq, hkv, d)
        cfg = (impl, hq, hkv, d)
        f = p.bound[key] = (_PrefillAttn(p, cfg, plain) if cfg in p._pre
                            and impl in IMPLS["attn_prefill"] and min(hq, hkv, d) >= 1 else plain)
    return f


class _PrefillAttn:
    """`GPUProfile.prefill_attn` of a configuration with its own table: the square prefill
    of equal FLOPs, and with cached context at least the contiguous decode kernel reading
    it (tagged extrapolated)."""

    def __init__(self, p: GPUProfile, cfg: tuple, plain: Callable[[int, int, int], tuple[float, str]]):
        self.grid, self.plain = p._pre[cfg], plain
        self.read = bound_decode_attn(p, "contiguous", *cfg[1:])
        self.derived_gpu = "prefill_attn" in p._derived_lookups

    def __call__(self, batch: int, q_len: int, kv_len: int) -> tuple[float, str]:
        if batch < 1 or q_len < 1 or kv_len < q_len:  # the profile's error
            return self.plain(batch, q_len, kv_len)
        hit = self.grid.lookup(batch, math.sqrt(2 * q_len * kv_len - q_len * q_len))
        if kv_len != q_len:
            hit = max(hit[0], self.read(batch, batch * kv_len)[0]), EXTRAPOLATED
        if self.derived_gpu and _RANK[hit[1]] < _RANK[DERIVED]:
            hit = hit[0], DERIVED
        return hit
