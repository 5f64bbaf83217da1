"""Exact statistics of columns read a block at a time (spilled to disk, sim/io/spill.py):
the same numbers, bit for bit, as numpy on the whole column in memory.

* A sum replays numpy's pairwise summation: `np.add.reduce` of a contiguous float64
  array of n values splits it at n2 = n // 2 rounded down to a multiple of 8 and adds
  the halves' sums (numpy/_core/src/umath/loops_utils.h.src, `pairwise_sum`); the split
  depends on n only, so summing the halves of a long column separately, down to pieces
  that fit in memory, gives the very same float (checked in tests/test_spill.py).
* A weighted percentile (`weighted_stats`' inverted CDF: the value at the first sorted
  position whose cumulative weight reaches p/100 of the total) is the smallest value x
  with W(values <= x) >= p/100 * W; one pass counts weight per bin of the values' ordered
  bit patterns, a second keeps the values of the one bin that holds each percentile and
  selects it exactly (memory: the bins and the largest such bin).
"""

from __future__ import annotations

import numpy as np

from sim.io import spill
from sim.io.spill import blocks

PCTS = (50, 90, 99)
BIN_BITS = 20  # bits of the ordered keys binned per pass (the first: sign, exponent, 8 of mantissa)


def pairwise_sum(read, n: int, piece: int | None = None) -> float:
    """numpy's sum of the n float64 values `read(lo, hi)` returns, `piece` (READ_ROWS) at
    a time."""
    piece = piece or spill.READ_ROWS
    if n <= piece:
        return np.add.reduce(read(0, n)) if n else 0.0

    def part(lo: int, m: int):
        if m <= piece:
            return np.add.reduce(read(lo, lo + m))
        m2 = m // 2
        m2 -= m2 % 8
        return part(lo, m2) + part(lo + m2, m - m2)

    return part(0, n)


def _keys(v: np.ndarray) -> np.ndarray:
    """Unsigned keys ordered as the float64 values are (negative values reversed)."""
    u = v.view(np.uint64)
    return np.where(u >> np.uint64(63), ~u, u | np.uint64(1 << 63))


def weighted_stats(values, weights) -> dict[str, float | None]:
    """sim.engine.metrics.weighted_stats of two long columns (numpy arrays or lazy columns
    of sim/io/spill.py), read block by block; the same floats."""
    n = len(values)
    w_min, total, vmax = None, 0, None
    for _, w in blocks(weights):
        if len(w):
            w_min = int(w.min()) if w_min is None else min(w_min, int(w.min()))
    if n and w_min is not None and w_min <= 0:  # keep only positive weights, as in memory
        vals, wts = [], []
        for lo, w in blocks(weights):
            keep = w > 0
            vals.append(np.asarray(values[lo:lo + len(w)])[keep])
            wts.append(w[keep])
        values, weights = np.concatenate(vals), np.concatenate(wts)
        n = len(values)
    if n == 0:
        return {"mean": None, **{f"p{p}": None for p in PCTS}, "max": None}
    for lo, w in blocks(weights):
        v = np.asarray(values[lo:lo + len(w)])
        total += int(w.sum())
        vmax = float(v.max()) if vmax is None else max(vmax, float(v.max()))

    def products(lo: int, hi: int) -> np.ndarray:
        return np.asarray(values[lo:hi], dtype=float) * np.asarray(weights[lo:hi])

    out: dict[str, float | None] = {"mean": float(pairwise_sum(products, n) / float(total))}
    for p in PCTS:
        out[f"p{p}"] = _select(values, weights, p / 100 * float(total), vmax)
    out["max"] = vmax
    return out


def _select(values, weights, target: float, vmax: float) -> float:
    """The smallest value whose cumulative weight reaches `target`: bins of the ordered
    keys' next BIN_BITS bits, narrowed until the bin holding it fits in a block."""
    prefix, pshift, before = None, 64, 0
    while True:
        shift = max(0, pshift - BIN_BITS)
        mask = np.uint64((1 << (pshift - shift)) - 1)
        wsum = np.zeros(1 << (pshift - shift))
        count = np.zeros(1 << (pshift - shift), dtype=np.int64)
        for lo, w in blocks(weights):
            k = _keys(np.asarray(values[lo:lo + len(w)]))
            if prefix is not None:
                inside = (k >> np.uint64(pshift)) == np.uint64(prefix)
                k, w = k[inside], w[inside]
            sub = ((k >> np.uint64(shift)) & mask).astype(np.intp)
            wsum += np.bincount(sub, weights=w, minlength=len(wsum))
            count += np.bincount(sub, minlength=len(count))
        cum = np.cumsum(wsum) + before
        b = int(np.searchsorted(cum, target))
        if b >= len(cum):
            return vmax
        before = float(cum[b - 1]) if b else before
        prefix = b if prefix is None else (prefix << (pshift - shift)) | b
        pshift = shift
        if count[b] <= spill.READ_ROWS or shift == 0:
            break
    vs, ws = [], []
    for lo, w in blocks(weights):
        v = np.asarray(values[lo:lo + len(w)])
        inside = (_keys(v) >> np.uint64(pshift)) == np.uint64(prefix)
        vs.append(v[inside])
        ws.append(w[inside])
    v, w = np.concatenate(vs), np.concatenate(ws)
    order = np.argsort(v)
    c = np.cumsum(w[order]) + int(before)
    return float(v[order[min(int(np.searchsorted(c, target)), len(v) - 1)]])
