"""Exact statistics of columns read a block at a time (spilled to disk, sim/io/spill.py):
the same numbers, bit for bit, as numpy on the whole column in memory.

* A sum replays numpy's pairwise summation: `np.add.reduce` of a contiguous float64
  array of n values splits it at n2 = n // 2 rounded down to a multiple of 8 and adds
  the halves' sums (numpy/_core/src/umath/loops_utils.h.src, `pairwise_sum`); the split
  depends on n only, so summing the halves of a long column separately, down to pieces
  that fit in memory, gives the very same float (checked in tests/test_spill.py).
* A weighted percentile (`weighted_stats`' inverted CDF: the value at the first sorted
  position whose cumulative weight reaches p/100 of the total) is the smallest value x
  with W(values <= x) >= p/100 * W; weight and rows counted per bin of the values'
  ordered bit patterns (`FirstLevel`: the top BIN_BITS bits) find the bin that holds each
  percentile, then a pass collects those bins' values (up to COLLECT_BLOCKS blocks of
  rows in all; a larger bin is narrowed by its next bits first) and selects in memory.

Every pass over a long column reads it from disk, so `select` narrows all the
percentiles asked for together, each pass serving every one of them, and reads the
mean's pairwise pieces along with its first pass. The first level needs no order: the
workers of a fleet simulated replica by replica count it for their spilled replicas
(sim/engine/split.py), and the parent reads the pooled gaps once when the percentiles'
bins fit in memory, twice when one must be narrowed (a fleet-day's median: hundreds of
millions of gaps in one bin of 1/256 of an octave); without them, one pass more.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from sim.engine.splitrule import cores
from sim.io import spill
from sim.io.spill import blocks

PCTS = (50, 90, 99)
BIN_BITS = 20  # bits of the ordered keys binned per pass (the first: sign, exponent, 8 of mantissa)
TOP = 64 - BIN_BITS  # the first level's shift
# threads a pass shares its pieces among (the day's parent reads ~18 GB of gaps; 1: none)
PASS_THREADS = 2
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


class FirstLevel:
    """What one pass over a column gives in any order: the smallest and largest weights,
    the weights' total, the largest value and the weight and count of each first-level bin (`_top`),
    sparse (`bins`: those with rows). Parts' levels add up to the whole column's exactly
    (integer weights: their float sums are exact below 2^53, in any order), so a worker
    counts its replicas' gaps as they finish and the parent reads the pooled column once
    (sim/engine/split.py, sim/engine/parallel.py `merge`)."""

    __slots__ = ("w_min", "w_max", "total", "vmax", "bins", "wsum", "count")

    def __init__(self, w_min: int, w_max: int, total: int, vmax: float, bins: np.ndarray,
                 wsum: np.ndarray, count: np.ndarray):
        self.w_min, self.w_max, self.total, self.vmax = w_min, w_max, total, vmax
        self.bins, self.wsum, self.count = bins, wsum, count

    def dense(self) -> tuple[np.ndarray, np.ndarray]:
        """(weight, count) of every first-level bin."""
        wsum, count = _bins(BIN_BITS)
        wsum[self.bins], count[self.bins] = self.wsum, self.count
        return wsum, count


def first_level(values, weights) -> FirstLevel | None:
    """A column's FirstLevel, a block at a time (None: no rows). Each block's bins are
    counted from its lowest one up (a gap column's few thousand occupied bins, not 2^20)."""
    w_min, w_max, total, vmax = None, None, 0, None
    wsum, count = _bins(BIN_BITS)  # (zero pages: only the bins touched cost memory)
    for lo, w in blocks(weights):
        v = np.asarray(values[lo:lo + len(w)])
        w_min = int(w.min()) if w_min is None else min(w_min, int(w.min()))
        w_max = int(w.max()) if w_max is None else max(w_max, int(w.max()))
        total += int(w.sum())
        vmax = float(v.max()) if vmax is None else max(vmax, float(v.max()))
        top = _top(v)
        base = int(top.min())
        top -= base
        ws, c = np.bincount(top, weights=w), np.bincount(top)
        wsum[base:base + len(ws)] += ws
        count[base:base + len(c)] += c
    if w_min is None:
        return None
    bins = np.flatnonzero(count)
    return FirstLevel(w_min, w_max, total, vmax, bins, wsum[bins], count[bins])


def merged(levels: list) -> FirstLevel | None:
    """The FirstLevel of parts end to end (None, a part without rows, skipped)."""
    levels = [lv for lv in levels if lv is not None]
    if not levels:
        return None
    bins = np.concatenate([lv.bins for lv in levels])
    wsum = np.bincount(bins, weights=np.concatenate([lv.wsum for lv in levels]))
    count = np.bincount(bins, weights=np.concatenate([lv.count for lv in levels]))
    keep = np.flatnonzero(count)
    return FirstLevel(min(lv.w_min for lv in levels), max(lv.w_max for lv in levels),
                      sum(lv.total for lv in levels),
                      max(lv.vmax for lv in levels), keep, wsum[keep],
                      count[keep].astype(np.int64))


def weighted_stats(values, weights, first: FirstLevel | None = None) -> dict[str, float | None]:
    """sim.engine.metrics.weighted_stats of two long columns (numpy arrays or lazy columns
    of sim/io/spill.py), read block by block; the same floats. `first`: the columns'
    FirstLevel if counted already (their workers'), else counted here: one pass more."""
    n = len(values)
    if first is None:
        first = first_level(values, weights)
    if first is not None and first.w_min <= 0:  # keep only positive weights, as in memory
        vals, wts = [], []
        for lo, w in blocks(weights):
            keep = w > 0
            vals.append(np.asarray(values[lo:lo + len(w)])[keep])
            wts.append(w[keep])
        values, weights = np.concatenate(vals), np.concatenate(wts)
        n = len(values)
        first = first_level(values, weights)
    if first is None:
        return {"mean": None, **{f"p{p}": None for p in PCTS}, "max": None}
    sums: dict = {}  # the mean's pairwise pieces, by first row (filled by threads, any order)

    def mean_piece(lo: int, v: np.ndarray, w: np.ndarray) -> None:
        sums[lo] = np.add.reduce(np.asarray(v, dtype=float) * w)

    targets = [p / 100 * float(first.total) for p in PCTS]
    picks = select(values, weights, targets, first.vmax, first.dense(), each=mean_piece,
                   wtype=spill.narrowest(first.w_min, first.w_max))
    mean_sum = _fold(n, max(spill.READ_ROWS, PW_BLOCKSIZE), (sums[lo] for lo in sorted(sums)))
    out: dict[str, float | None] = {"mean": float(mean_sum / float(first.total))}
    out.update({f"p{p}": x for p, x in zip(PCTS, picks, strict=True)})
    out["max"] = first.vmax
    return out


def _unkey(k: int) -> float:
    """The float64 whose `_keys` key is k."""
    u = k & ~(1 << 63) if k >> 63 else ~k & ((1 << 64) - 1)
    return float(np.array([u], dtype=np.uint64).view(np.float64)[0])


class _Target:
    """One selection's progress: the keys' top bits fixed so far (`prefix` above bit
    `pshift`), the weight of every key below that prefix and the rows inside it, and the
    answer once found."""

    __slots__ = ("target", "prefix", "pshift", "before", "rows", "collect", "value")

    def __init__(self, target: float):
        self.target, self.prefix, self.pshift, self.before = target, None, 64, 0
        self.rows, self.collect, self.value = None, False, None

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
        self.rows = int(count[b])
        if shift == 0:  # one key: one float, however many rows hold it
            self.value = _unkey(self.prefix)

    def pick(self, v: np.ndarray, w: np.ndarray, vmax: float) -> None:
        """The answer among the values of its bin (all of them, any order): narrowed in
        memory down to a block's rows, then sorted."""
        k = None
        while len(v) > spill.READ_ROWS and self.value is None:
            k = _keys(v) if k is None else k
            shift = max(0, self.pshift - BIN_BITS)
            acc = _bins(self.pshift - shift)
            _histogram(k, w, shift, 1 << (self.pshift - shift), acc)
            self.narrow(*acc, shift, vmax)
            inside = (k >> np.uint64(shift)) == np.uint64(self.prefix)
            k, v, w = k[inside], v[inside], w[inside]
        if self.value is not None:
            return
        order = np.argsort(v)
        c = np.cumsum(w[order]) + int(self.before)
        self.value = float(v[order[min(int(np.searchsorted(c, self.target)), len(v) - 1)]])


# the values of the targets' bins are collected in one pass when they come to at most
# this many blocks of rows in all (8 x READ_ROWS: 2^23 rows, 72 MB with one-byte weights),
# and selected in memory; a larger bin is narrowed by another pass first
COLLECT_BLOCKS = 8


class _Collected:
    """The values and weights of one bin's `rows` rows, filled a block at a time (the
    weights as `wtype`, one that holds them all; None: as read)."""

    __slots__ = ("v", "w", "wtype", "at")

    def __init__(self, rows: int, wtype=None):
        self.v, self.w, self.wtype, self.at = np.empty(rows), None, wtype, 0

    def add(self, v: np.ndarray, w: np.ndarray) -> None:
        if self.w is None:
            self.w = np.empty(len(self.v), dtype=self.wtype or w.dtype)
        self.v[self.at:self.at + len(v)] = v
        self.w[self.at:self.at + len(v)] = w
        self.at += len(v)


def _plan(todo: list[_Target]) -> None:
    """Which open targets' bins to collect in the next pass: the smallest first, within
    COLLECT_BLOCKS blocks of rows in all (targets at one prefix share its rows)."""
    sizes: dict = {}
    for t in todo:
        if t.value is None and t.prefix is not None:
            sizes[(t.prefix, t.pshift)] = t.rows
    room = COLLECT_BLOCKS * spill.READ_ROWS
    chosen = set()
    for s, rows in sorted(sizes.items(), key=lambda kv: kv[1]):
        if rows <= room or rows <= spill.READ_ROWS:
            chosen.add(s)
            room -= rows
    for t in todo:
        t.collect = (t.prefix, t.pshift) in chosen


def _raw(top: int) -> int:
    """`bits >> TOP` (arithmetic) of the values in first-level bin `top` (`_top` inverted)."""
    return top ^ (1 << (BIN_BITS - 1)) if top >> (BIN_BITS - 1) else ~top


class _Parts:
    """One thread's rows of a collected bin, in the order it read them."""

    __slots__ = ("v", "w")

    def __init__(self):
        self.v, self.w = [], []

    def add(self, v: np.ndarray, w: np.ndarray) -> None:
        self.v.append(v)
        self.w.append(w)


def _pass(values, weights, acc: dict, each: Callable | None, threads: int | None = None) -> None:
    """One pass over the columns, numpy's pairwise pieces (`_leaves`): `each(lo, values,
    weights)` on every piece starting at row lo, and for each state (prefix, pshift,
    collect) its rows' values and weights collected or their next bits' bins counted into
    `acc`. The pieces are shared out in runs of consecutive ones among `threads` threads
    (PASS_THREADS; numpy's reads and array arithmetic run without the GIL), each with
    bins and collections of its own, added up afterwards: bins of integer weights sum
    exactly in any order, and a collected bin's rows are selected in any order
    (`_Target.pick`)."""
    n = len(values)
    leaves = list(_leaves(0, n, max(spill.READ_ROWS, PW_BLOCKSIZE))) if n else []
    threads = max(1, min(threads or min(PASS_THREADS, cores()), len(leaves)))
    if threads == 1:
        _pass_leaves(values, weights, acc, each, leaves)
        return
    runs = [leaves[len(leaves) * t // threads:len(leaves) * (t + 1) // threads]
            for t in range(threads)]
    accs = [{s: _Parts() if isinstance(a, _Collected) else _bins(len(a[0]).bit_length() - 1)
             for s, a in acc.items()} for _ in runs]
    with ThreadPoolExecutor(max_workers=threads) as pool:
        for f in [pool.submit(_pass_leaves, values, weights, mine, each, run)
                  for mine, run in zip(accs, runs, strict=True)]:
            f.result()
    for mine in accs:  # in the runs' order
        for s, a in acc.items():
            part = mine[s]
            if isinstance(a, _Collected):
                for v, w in zip(part.v, part.w, strict=True):
                    a.add(v, w)
            else:
                a[0][:] += part[0]
                a[1][:] += part[1]


def _pass_leaves(values, weights, acc: dict, each: Callable | None, leaves: list) -> None:
    """`_pass` over the pieces `leaves` ((lo, hi) each). The rows inside the states' first-level
    bins are found by comparing `bits >> TOP` (no keys), their keys computed alone."""
    ranged = [s for s in acc if s[0] is not None]
    raws = sorted({_raw(prefix >> (TOP - pshift)) for prefix, pshift, _ in ranged})
    for lo, hi in leaves:
        v = np.asarray(values[lo:hi])
        w = np.asarray(weights[lo:hi])
        if each is not None:
            each(lo, v, w)
        if (None, 64, False) in acc:  # no first level yet: every row's key
            _histogram(_keys(v), w, TOP, 1 << BIN_BITS, acc[(None, 64, False)])
        if not ranged:
            continue
        h = v.view(np.int64) >> TOP
        at = h == raws[0]
        for r in raws[1:]:
            at |= h == r
        at = np.flatnonzero(at)
        gv, gw, h = v[at], w[at], h[at]
        for prefix, pshift, collect in ranged:
            inside = h == _raw(prefix >> (TOP - pshift))
            vv, ww = gv[inside], gw[inside]
            if pshift < TOP or not collect:
                kk = _keys(vv)
                if pshift < TOP:
                    inside = (kk >> np.uint64(pshift)) == np.uint64(prefix)
                    kk, vv, ww = kk[inside], vv[inside], ww[inside]
            a = acc[(prefix, pshift, collect)]
            if collect:
                a.add(vv, ww)
            else:
                shift = max(0, pshift - BIN_BITS)
                _histogram(kk, ww, shift, 1 << (pshift - shift), a)


def select(values, weights, targets: list[float], vmax: float,
           first: tuple | None = None, each: Callable | None = None,
           wtype=None) -> list[float]:
    """For each target, the smallest value whose cumulative weight reaches it: bins of the
    ordered keys' next BIN_BITS bits, narrowed until the bins holding the targets fit in
    memory (`_plan`), every open target served by each pass (its keys computed once), then
    selected in memory. `first`: the first level's bins (wsum, count), if counted already;
    `each(lo, values, weights)`: called on each of numpy's pairwise pieces (`_leaves`)
    during the first pass, in no set order (the mean's pieces, read along); `wtype`: an integer type that
    holds every weight, to keep the collected ones in."""
    todo = [_Target(t) for t in targets]
    if first is not None:
        for t in todo:
            t.narrow(*first, TOP, vmax)
    while each is not None or any(t.value is None for t in todo):
        _plan(todo)
        open_ = [t for t in todo if t.value is None]
        # targets at the same prefix share its bins (and its values)
        states = {(t.prefix, t.pshift, t.collect): [] for t in open_}
        for t in open_:
            states[(t.prefix, t.pshift, t.collect)].append(t)
        acc = {s: _Collected(ts[0].rows, wtype) if s[2] else _bins(s[1] - max(0, s[1] - BIN_BITS))
               for s, ts in states.items()}
        _pass(values, weights, acc, each)
        each = None
        for s, ts in states.items():
            a = acc[s]
            if s[2]:
                if a.at != len(a.v):
                    raise RuntimeError(f"a bin held {a.at} rows, counted {len(a.v)}")
                for t in ts:
                    t.pick(a.v, a.w if a.w is not None else np.zeros(0, dtype=np.int64), vmax)
            else:
                for t in ts:
                    t.narrow(*a, max(0, s[1] - BIN_BITS), vmax)
    return [t.value for t in todo]
