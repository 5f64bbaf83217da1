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

Every pass over a long column reads it from disk and computes its keys, so `select`
narrows all the percentiles asked for together, each pass serving every one of them,
and `weighted_stats` folds the weights' total, the maximum, the mean's pairwise pieces
and the first level of bins (the same for every percentile) into one pass: three passes
in all for a 64-replica hour's 38 M gaps, instead of twelve.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np

from sim.io import spill
from sim.io.spill import blocks

PCTS = (50, 90, 99)
BIN_BITS = 20  # bits of the ordered keys binned per pass (the first: sign, exponent, 8 of mantissa)
TOP = 64 - BIN_BITS  # the first level's shift
# numpy sums up to 128 values in one unrolled loop, not split: a piece is never smaller
PW_BLOCKSIZE = 128


def _leaves(lo: int, m: int, piece: int) -> Iterator[tuple[int, int]]:
    """The pieces (lo, hi) numpy's pairwise sum of m values from `lo` adds up, in order."""
    if m <= piece:
        yield lo, lo + m
        return
    m2 = m // 2
    m2 -= m2 % 8
    yield from _leaves(lo, m2, piece)
    yield from _leaves(lo + m2, m - m2, piece)


def _fold(m: int, piece: int, sums: Iterator):
    """The pairwise sum of m values from their pieces' sums (`_leaves`' order)."""
    if m <= piece:
        return next(sums)
    m2 = m // 2
    m2 -= m2 % 8
    return _fold(m2, piece, sums) + _fold(m - m2, piece, sums)


def pairwise_sum(read: Callable, n: int, piece: int | None = None) -> float:
    """numpy's sum of the n float64 values `read(lo, hi)` returns, `piece` (READ_ROWS) at
    a time."""
    piece = max(piece or spill.READ_ROWS, PW_BLOCKSIZE)
    if n == 0:
        return 0.0
    return _fold(n, piece, (np.add.reduce(read(lo, hi)) for lo, hi in _leaves(0, n, piece)))


def _keys(v: np.ndarray) -> np.ndarray:
    """Unsigned keys ordered as the float64 values are (negative values reversed)."""
    u = v.view(np.uint64)
    k = u | np.uint64(1 << 63)
    neg = (u >> np.uint64(63)).astype(bool)
    if neg.any():
        k[neg] = ~u[neg]
    return k


def _top(v: np.ndarray) -> np.ndarray:
    """`_keys(v) >> TOP` (the first level's bins), from the signed bit patterns without
    the keys: h = bits >> TOP (arithmetic) is h | 2^(BIN_BITS-1) for a positive value and
    ~h for a negative one, in four passes of integer arithmetic instead of the keys' eight."""
    h = v.view(np.int64) >> TOP
    return h ^ ((h >> 63) | (1 << (BIN_BITS - 1)))


def _histogram(k: np.ndarray, w: np.ndarray, shift: int, bins: int, acc: tuple) -> None:
    """Add weight and count per bin `(k >> shift) & (bins - 1)` to `acc` (wsum, count)."""
    sub = ((k >> np.uint64(shift)) & np.uint64(bins - 1)).astype(np.intp)
    acc[0][:] += np.bincount(sub, weights=w, minlength=bins)
    acc[1][:] += np.bincount(sub, minlength=bins)


def _bins(bits: int) -> tuple[np.ndarray, np.ndarray]:
    return np.zeros(1 << bits), np.zeros(1 << bits, dtype=np.int64)


def weighted_stats(values, weights) -> dict[str, float | None]:
    """sim.engine.metrics.weighted_stats of two long columns (numpy arrays or lazy columns
    of sim/io/spill.py), read block by block; the same floats."""
    n = len(values)
    first = _first_pass(values, weights, n)
    if first is not None and first[0] <= 0:  # keep only positive weights, as in memory
        vals, wts = [], []
        for lo, w in blocks(weights):
            keep = w > 0
            vals.append(np.asarray(values[lo:lo + len(w)])[keep])
            wts.append(w[keep])
        values, weights = np.concatenate(vals), np.concatenate(wts)
        n = len(values)
        first = _first_pass(values, weights, n)
    if first is None:
        return {"mean": None, **{f"p{p}": None for p in PCTS}, "max": None}
    _, total, vmax, mean_sum, hist = first
    out: dict[str, float | None] = {"mean": float(mean_sum / float(total))}
    picks = select(values, weights, [p / 100 * float(total) for p in PCTS], vmax, hist)
    out.update({f"p{p}": x for p, x in zip(PCTS, picks, strict=True)})
    out["max"] = vmax
    return out


def _first_pass(values, weights, n: int):
    """One pass over numpy's pairwise pieces of the columns: (the smallest weight, the
    weights' total, the largest value, the pairwise sum of value x weight, the first
    level's bins of the keys), or None for no rows."""
    if n == 0:
        return None
    piece = max(spill.READ_ROWS, PW_BLOCKSIZE)
    w_min, total, vmax = None, 0, None
    hist = _bins(BIN_BITS)
    sums = []
    for lo, hi in _leaves(0, n, piece):
        v = np.asarray(values[lo:hi])
        w = np.asarray(weights[lo:hi])
        w_min = int(w.min()) if w_min is None else min(w_min, int(w.min()))
        total += int(w.sum())
        vmax = float(v.max()) if vmax is None else max(vmax, float(v.max()))
        sums.append(np.add.reduce(np.asarray(v, dtype=float) * w))
        top = _top(v)
        hist[0][:] += np.bincount(top, weights=w, minlength=1 << BIN_BITS)
        hist[1][:] += np.bincount(top, minlength=1 << BIN_BITS)
    return w_min, total, vmax, _fold(n, piece, iter(sums)), hist


class _Target:
    """One selection's progress: the keys' top bits fixed so far (`prefix` above bit
    `pshift`), the weight of every key below that prefix, and the answer once found."""

    __slots__ = ("target", "prefix", "pshift", "before", "collect", "value")

    def __init__(self, target: float):
        self.target, self.prefix, self.pshift, self.before = target, None, 64, 0
        self.collect, self.value = False, None

    def narrow(self, wsum: np.ndarray, count: np.ndarray, shift: int, vmax: float) -> None:
        """Fix the next bits: the bin where the cumulative weight reaches the target."""
        cum = np.cumsum(wsum) + self.before
        b = int(np.searchsorted(cum, self.target))
        if b >= len(cum):
            self.value = vmax
            return
        self.before = float(cum[b - 1]) if b else self.before
        self.prefix = b if self.prefix is None else (self.prefix << (self.pshift - shift)) | b
        self.pshift = shift
        self.collect = bool(count[b] <= spill.READ_ROWS or shift == 0)

    def pick(self, v: np.ndarray, w: np.ndarray) -> None:
        """The answer among the values of its final bin (all of them, any order)."""
        order = np.argsort(v)
        c = np.cumsum(w[order]) + int(self.before)
        self.value = float(v[order[min(int(np.searchsorted(c, self.target)), len(v) - 1)]])


def select(values, weights, targets: list[float], vmax: float,
           first: tuple | None = None) -> list[float]:
    """For each target, the smallest value whose cumulative weight reaches it: bins of the
    ordered keys' next BIN_BITS bits, narrowed until the bin holding it fits in a block,
    every open target served by each pass (its keys computed once). `first`: the first
    level's bins (wsum, count), if counted already."""
    todo = [_Target(t) for t in targets]
    if first is not None:
        for t in todo:
            t.narrow(*first, TOP, vmax)
    while any(t.value is None for t in todo):
        open_ = [t for t in todo if t.value is None]
        # targets at the same prefix share its bins (and its values)
        states = {(t.prefix, t.pshift, t.collect): [] for t in open_}
        for t in open_:
            states[(t.prefix, t.pshift, t.collect)].append(t)
        acc = {s: ([], []) if s[2] else _bins(s[1] - max(0, s[1] - BIN_BITS)) for s in states}
        for lo, w in blocks(weights):
            v = np.asarray(values[lo:lo + len(w)])
            top = _top(v)  # every row's first-level bin; full keys only for those inside one
            for (prefix, pshift, collect), a in acc.items():
                if prefix is None:
                    kk, vv, ww = _keys(v), v, w
                else:
                    inside = top == (prefix >> (TOP - pshift))
                    vv, ww = v[inside], w[inside]
                    kk = _keys(vv)
                    if pshift < TOP:
                        inside = (kk >> np.uint64(pshift)) == np.uint64(prefix)
                        kk, vv, ww = kk[inside], vv[inside], ww[inside]
                if collect:
                    a[0].append(vv)
                    a[1].append(ww)
                else:
                    shift = max(0, pshift - BIN_BITS)
                    _histogram(kk, ww, shift, 1 << (pshift - shift), a)
        for s, ts in states.items():
            a = acc[s]
            if s[2]:
                v, w = np.concatenate(a[0]), np.concatenate(a[1])
                for t in ts:
                    t.pick(v, w)
            else:
                for t in ts:
                    t.narrow(*a, max(0, s[1] - BIN_BITS), vmax)
    return [t.value for t in todo]
