"""Pricing a step shape for the first time takes shortcuts (sim/costmodel/latency.py
`StepLatency._head`, profiles.py `decode_attn`'s memoised mean-context time, io/tables.py
`Grid.lookup`) that must give the bytes the plain formulas give: checked against those
formulas, written out here, on shapes in any order."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from sim.costmodel.latency import StepLatency
from sim.costmodel.mixed_decode import blend
from sim.costmodel.models import load_model
from sim.costmodel.profiles import ANALYTIC, DERIVED, load_profile
from sim.costmodel.ranks import _TAG_INDEX, TAGS
from sim.costmodel.runtime import load_runtime
from sim.io.tables import EXACT, EXTRAPOLATED, INTERPOLATED, bracket

H200 = load_profile("h200-sxm")
RT = load_runtime("h200-eager-live")
LAYOUTS = {  # the reference scenario's replica, tensor parallel (an LM-head gather), D = 2
    "tp1": dict(tensor=1),
    "tp2": dict(tensor=2),
    "dp2": dict(tensor=1, data=2),
}


def latency(layout: str, model: str = "llama-3-8b") -> StepLatency:
    return StepLatency(load_model(model), H200, RT, "flash", "paged_reference",
                       **LAYOUTS[layout])


def summed(parts: list[tuple[float, str]]) -> tuple[float, list[float]]:
    """_piece's sums of a list of parts, left to right."""
    ms, br = 0.0, [0.0] * len(TAGS)
    for t, tag in parts:
        ms += t
        br[_TAG_INDEX[tag]] += t
    return ms, br


decode_shapes = st.lists(st.tuples(st.integers(1, 300), st.integers(1, 9000),
                                   st.integers(0, 40000)), min_size=1, max_size=12)


@settings(max_examples=25, deadline=None)
@given(shapes=decode_shapes, layout=st.sampled_from(sorted(LAYOUTS)))
def test_a_first_decode_step_sums_its_parts_in_the_plain_order(shapes, layout):
    lat, plain = latency(layout), latency(layout)
    for n, mean, longest in shapes:
        sum_ctx, max_ctx = n * mean, mean + longest
        lat.decode(n, sum_ctx, max_ctx)
        ctx_q, max_q = lat._ctx_keys(n, sum_ctx, max_ctx)
        e = lat._memo[("decode", n, ctx_q, max_q)]
        parts = (plain._dense_lookup(n) + plain._lm_parts(n)
                 + plain._decode_attn_parts(n, ctx_q, max_q))
        ms, br = summed(parts)
        assert (e[0], e[1]) == (ms, br)
        assert e[3] == plain._combine(ms, decode_seqs=n, decode=True)
        assert e[4] == plain.kernel_s


def test_a_verify_step_of_the_decode_kernel_sums_its_parts_in_the_plain_order():
    lat = StepLatency(load_model("llama-3-8b"), H200, RT, "flash", "paged_reference",
                      verify_impl="paged")
    plain = StepLatency(load_model("llama-3-8b"), H200, RT, "flash", "paged_reference",
                        verify_impl="paged")
    n, q, sum_ctx, max_ctx = 12, 4, 12 * 1500, 4000
    lat.decode(n * q, n * q * 700, 900)  # the head of n·q rows priced first, by a decode step
    secs = lat.verify_batch(n, q, sum_ctx, max_ctx, [])
    ctx_q, max_q = lat._ctx_keys(n, sum_ctx, max_ctx)
    e = lat._memo[("verify", n, q, ctx_q, max_q)]
    mx = min(max_q, ctx_q * n)
    ms, tag = H200.decode_attn("paged_reference", n * q, ctx_q * n * q, plain.d_heads,
                               plain.d_kv_heads, plain.d_head_dim,
                               max_ctx=mx if mx > ctx_q else None)
    [(window, calls)] = plain.attn_windows  # full attention in every layer
    parts = plain._dense_lookup(n * q) + plain._lm_parts(n * q) + [(calls * ms, tag)]
    assert (e[0], e[1]) == summed(parts) and secs == e[3]


@settings(max_examples=40, deadline=None)
@given(batch=st.integers(2, 512), mean=st.integers(16, 20000), extra=st.integers(1, 60000),
       mean_first=st.booleans(), impl=st.sampled_from(["paged_reference", "paged",
                                                         "paged_gather", "contiguous"]))
def test_decode_attention_of_mixed_lengths_blends_the_mean_and_longest_times(
        batch, mean, extra, mean_first, impl):
    """In either order of lookups (the mean's time memoised first or not): the time at the
    mean context moved towards the longest's by the fitted weight, the least exact tag."""
    p = load_profile("h200-sxm")
    p._memo.clear()
    heads = (32, 8, 128)
    longest = mean + 1 + extra % ((batch - 1) * mean)  # above the mean, within the sum
    if mean_first:
        p.decode_attn(impl, batch, batch * mean, *heads)
    got = p.decode_attn(impl, batch, batch * mean, *heads, max_ctx=longest)
    p._memo.clear()
    hi = p.decode_attn(impl, batch, batch * longest, *heads)
    p._memo.clear()
    lo = p.decode_attn(impl, batch, batch * mean, *heads)
    cfg = (impl, *heads)
    mix = ("paged_reference", *heads) if impl == "paged" else cfg
    if mix not in p._mix:
        assert got == lo
        return
    rank = [EXACT, INTERPOLATED, DERIVED, EXTRAPOLATED, ANALYTIC]
    own = INTERPOLATED if mix == cfg else DERIVED
    tag = max(lo[1], hi[1], own, key=rank.index)
    assert got == (blend(lo[0], hi[0], p._mix[mix].at(batch)), tag)


def plain_lookup(g, x: float, y: float) -> tuple[float, str]:
    """Grid.lookup as first written: every corner of positive weight, in order."""
    xs, ys = g.xs, g.ys
    xc, yc = min(max(x, xs[0]), xs[-1]), min(max(y, ys[0]), ys[-1])
    (i, wx), (j, wy) = bracket(xs, g.lx, xc), bracket(ys, g.ly, yc)
    logv, corners, measured, last = 0.0, 0, True, 0.0
    for di, a in ((0, 1 - wx), (1, wx)):
        for dj, b in ((0, 1 - wy), (1, wy)):
            if a * b > 0:
                logv += a * b * g.logv[i + di][j + dj]
                measured &= g.measured[i + di][j + dj]
                corners, last = corners + 1, g.v[i + di][j + dj]
    tag = (EXACT if corners == 1 else INTERPOLATED) if measured else EXTRAPOLATED
    t = last if corners == 1 else math.exp(logv)
    if (xc, yc) != (x, y):
        ratio = g.cost(x, y) / g.cost(xc, yc)
        t, tag = t * (max(1.0, ratio) if g.floor_below else ratio), EXTRAPOLATED
    return t, tag


GRIDS = [*H200._gemm.values(), *H200._elem.values(), *H200._pre.values(),
         *H200._dec.values()]


@settings(max_examples=200, deadline=None)
@given(g=st.sampled_from(GRIDS), x=st.one_of(st.integers(1, 40000), st.floats(0.5, 40000.0)),
       y=st.one_of(st.integers(1, 200000), st.floats(0.5, 200000.0)), on_grid=st.booleans())
def test_a_grid_lookup_gives_the_plain_loops_bytes(g, x, y, on_grid):
    if on_grid:  # measured points and their neighbours exactly
        x, y = g.xs[int(x) % len(g.xs)], g.ys[int(y) % len(g.ys)]
    assert g.lookup(x, y) == plain_lookup(g, x, y)
