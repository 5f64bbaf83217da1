"""Measured tables: typed CSV rows, and grids of values interpolated between them.

Knows nothing of GPUs: a table is columns of positive numbers and names, a grid holds
one value per (x, y) point and a cost model `cost(x, y)` of the same quantity, used to
fill cells missing from the grid and to scale values outside it.

A grid is made monotone when built (a measured value becomes the minimum over the
points at least as large), interpolates linearly in log value over log sizes, and
tags each lookup `exact`, `interpolated` or `extrapolated`; `analytic` is the tag of a
value no table covers (the caller's cost model alone), `derived` of a measured value
scaled by a stated factor (the callers' business).
"""

from __future__ import annotations

import csv
import functools
import math
from bisect import bisect_right
from collections.abc import Callable
from pathlib import Path

from sim.io.specload import SpecError

EXACT = "exact"
INTERPOLATED = "interpolated"
EXTRAPOLATED = "extrapolated"
ANALYTIC = "analytic"
DERIVED = "derived"  # a measured table scaled by a stated factor (published or by bytes/FLOPs)


def read_table(file: Path, columns: dict[str, type], names: tuple[str, ...]) -> list[dict]:
    """Typed rows of a CSV; a missing column or a bad value is a one-line SpecError."""
    with file.open(newline="") as f:
        reader = csv.DictReader(f)
        for c in columns:
            if c not in (reader.fieldnames or []):
                raise SpecError(file, "", f"missing column {c!r} (needed: {', '.join(columns)})")
        rows = []
        for line, raw in enumerate(reader, start=2):
            row: dict = {}
            for c, tp in columns.items():
                text, where = (raw.get(c) or "").strip(), f"line {line}, column {c!r}"
                if tp is str:
                    if text not in names:
                        allowed = ", ".join(names)
                        raise SpecError(file, where, f"not a known name (allowed: {allowed})")
                    row[c] = text
                    continue
                try:
                    v = float(text)
                except ValueError:
                    v = math.nan
                if not (math.isfinite(v) and v > 0) or (tp is int and not v.is_integer()):
                    kind = "a positive integer" if tp is int else "a positive number"
                    raise SpecError(file, where, f"expected {kind}")
                row[c] = int(v) if tp is int else v
            rows.append(row)
    return rows


def group(rows: list[dict], keys: tuple[str, ...], axes: tuple[str, ...],
          value: str = "ms") -> dict[tuple, dict[tuple, float]]:
    """rows -> {key: {point: value}}; a one-axis point gets y = 1."""
    out: dict[tuple, dict[tuple, float]] = {}
    for r in rows:
        point = tuple(r[a] for a in axes) + ((1,) if len(axes) == 1 else ())
        out.setdefault(tuple(r[k] for k in keys), {})[point] = r[value]
    return out


def bracket(xs: list[float], logs: list[float], x: float) -> tuple[int, float]:
    """i and the log-linear weight w of x between xs[i] and xs[i+1] (x within range)."""
    if len(xs) == 1:
        return 0, 0.0
    i = min(bisect_right(xs, x) - 1, len(xs) - 2)
    return i, (math.log(x) - logs[i]) / (logs[i + 1] - logs[i])


class Grid:
    """Values on an x × y grid: monotone, log-log bilinear inside, cost-scaled outside.

    `cost(x, y)` is the roofline model of the same quantity; outside the grid the
    value at the clamped point is scaled by cost(x, y) / cost(clamped), never below
    1 when `floor_below` (a kernel smaller than the smallest measured is no faster).
    """

    def __init__(self, points: dict[tuple[float, float], float],
                 cost: Callable[[float, float], float], floor_below: bool = True):
        self.xs, self.ys = sorted({p[0] for p in points}), sorted({p[1] for p in points})
        self.lx, self.ly = [math.log(x) for x in self.xs], [math.log(y) for y in self.ys]
        self.cost, self.floor_below = cost, floor_below
        v = [[points.get((x, y)) for y in self.ys] for x in self.xs]
        self.measured = [[t is not None for t in row] for row in v]
        before = [row[:] for row in v]
        lines = [[(i, j) for j in range(len(self.ys))] for i in range(len(self.xs))]
        lines += [[(i, j) for i in range(len(self.xs))] for j in range(len(self.ys))]
        changed = True
        while changed:  # suffix minimum along both axes over the measured cells
            changed = False
            for line in lines:
                low = math.inf
                for i, j in reversed(line):
                    if v[i][j] is not None:
                        changed |= v[i][j] > low
                        low = v[i][j] = min(v[i][j], low)
        self.adjusted = sum(a != b for ra, rb in zip(v, before, strict=True)
                            for a, b in zip(ra, rb, strict=True))
        self._fill(v)
        self.v, self.logv = v, [[math.log(t) for t in row] for row in v]

    def _fill(self, v: list[list[float | None]]) -> None:
        """A missing cell: the smallest roofline scaling of the nearest measured cells in
        its row or column, raised to its smaller neighbours."""
        xs, ys, cost = self.xs, self.ys, self.cost
        known = [(i, j) for i in range(len(xs)) for j in range(len(ys)) if self.measured[i][j]]
        for i in range(len(xs)):
            for j in range(len(ys)):
                if v[i][j] is None:
                    same = [(a, b) for a, b in known if a == i or b == j] or known
                    near = min(abs(a - i) + abs(b - j) for a, b in same)
                    v[i][j] = min(v[a][b] * cost(xs[i], ys[j]) / cost(xs[a], ys[b])
                                  for a, b in same if abs(a - i) + abs(b - j) == near)
                lower = ([v[i - 1][j]] if i else []) + ([v[i][j - 1]] if j else [])
                v[i][j] = max([v[i][j], *lower])

    def lookup(self, x: float, y: float) -> tuple[float, str]:
        xs, ys = self.xs, self.ys
        xc = xs[0] if x < xs[0] else xs[-1] if x > xs[-1] else x  # clamped into the grid
        if len(ys) == 1 and y == ys[0]:  # a table of one axis (GEMMs, elementwise)
            return self.along_x(x, xc, y, bracket(xs, self.lx, xc))
        yc = ys[0] if y < ys[0] else ys[-1] if y > ys[-1] else y
        return self.corners(x, y, xc, yc, bracket(xs, self.lx, xc), bracket(ys, self.ly, yc))

    def corners(self, x: float, y: float, xc: float, yc: float, bx: tuple[int, float],
                by: tuple[int, float]) -> tuple[float, str]:
        """`lookup` of a grid of more than one y, given (x, y) clamped into the grid and their
        brackets (`bracket`; sim/costmodel/bound.py reuses them across lookups)."""
        (i, wx), (j, wy) = bx, by
        logv, corners, measured, last = 0.0, 0, True, 0.0
        # the corners (i, j), (i, j+1), (i+1, j), (i+1, j+1) of positive weight, in order
        for di, a in ((0, 1 - wx), (1, wx)):
            if a:  # a zero weight: neither corner of that row counts
                lv, known, v = self.logv[i + di], self.measured[i + di], self.v[i + di]
                for dj, b in ((0, 1 - wy), (1, wy)):
                    if a * b > 0:
                        logv += a * b * lv[j + dj]
                        measured &= known[j + dj]
                        corners, last = corners + 1, v[j + dj]
        tag = (EXACT if corners == 1 else INTERPOLATED) if measured else EXTRAPOLATED
        t = last if corners == 1 else math.exp(logv)  # a grid value exactly
        if (xc, yc) != (x, y):
            ratio = self.cost(x, y) / self.cost(xc, yc)
            t, tag = t * (max(1.0, ratio) if self.floor_below else ratio), EXTRAPOLATED
        return t, tag

    def along_x(self, x: float, xc: float, y: float, bx: tuple[int, float]) -> tuple[float, str]:
        """`lookup` on a grid of one y, at that y (its weight 1, the other corners' 0):
        the same operations on the two corners along x (xc's bracket `bx`)."""
        i, wx = bx
        logv, corners, measured, last = 0.0, 0, True, 0.0
        a = 1 - wx
        if a > 0:
            logv += a * self.logv[i][0]
            measured &= self.measured[i][0]
            corners, last = 1, self.v[i][0]
        if wx > 0:
            logv += wx * self.logv[i + 1][0]
            measured &= self.measured[i + 1][0]
            corners, last = corners + 1, self.v[i + 1][0]
        tag = (EXACT if corners == 1 else INTERPOLATED) if measured else EXTRAPOLATED
        t = last if corners == 1 else math.exp(logv)  # a grid value exactly
        if xc != x:
            ratio = self.cost(x, y) / self.cost(xc, y)
            t, tag = t * (max(1.0, ratio) if self.floor_below else ratio), EXTRAPOLATED
        return t, tag


@functools.lru_cache(maxsize=4096)
def nearest(keys: tuple[tuple, ...], key: tuple) -> tuple | None:
    """The key with the same name (str) fields closest in summed |log| of the numeric ones."""
    p = sum(isinstance(f, str) for f in key)
    same = [k for k in keys if k[:p] == key[:p]]

    def distance(k: tuple) -> float:
        return sum(abs(math.log(a / b)) for a, b in zip(k[p:], key[p:], strict=True))
    return min(same, key=distance, default=None)


def scaled(grids: dict[tuple, Grid], key: tuple, x: float, y: float,
           scale: Callable[[tuple], float], y_power: float = 0.0) -> tuple[float, str] | None:
    """The grid of `key` at (x, y), else the nearest grid's, extrapolated: at the equivalent
    size (x · scale(nearest), y) (x is a batch or token count, and the work is
    proportional to x times the config's cost).

    An equivalent size below the grid's smallest x₀ is clamped there (a smaller kernel is
    no faster) unless the work also grows as y^`y_power` (prefill FLOPs as seq², decode
    KV bytes as ctx): then what x₀ cannot absorb goes into y, at the length of equal
    work, (x₀, y · (x · f / x₀)^(1 / y_power)). So one sequence of fewer heads than any
    measured (attention at tensor parallelism) costs less, as its work does."""
    if key in grids:
        return grids[key].lookup(x, y)
    near = nearest(tuple(grids), key)
    if near is None:
        return None
    f, g = scale(near), grids[near]
    x0 = g.xs[0]
    if y_power and x * f < x0:
        return g.lookup(x0, y * (x * f / x0) ** (1 / y_power))[0], EXTRAPOLATED
    return g.lookup(x * f, y)[0], EXTRAPOLATED
