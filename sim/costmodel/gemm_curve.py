"""A GEMM kernel's time as a function of its rows M, from a measured GEMM table.

A measured table gives, for one weight shape (K, N), times tᵢ at rows Mᵢ (made monotone
at load, sim/io/tables.py `Grid`). Its residual at a row, ρᵢ = tᵢ / rᵢ, is the time over
the measured GPU's bf16 roofline time there (rᵢ; profiles.py `gemm_model`): how far from
its roofline that GPU runs the shape. Between rows ρ is interpolated linearly in log ρ
over log M, and held beyond the last row. A kernel's time at M is ρ(M) × its own roofline
at M: the bf16 GEMM's, an FP8 or a weight-only quantised GEMM's, on the GPU measured or
on one whose GEMMs are derived from it (sim/costmodel/derived_tables.py). Every kernel
on every GPU costed from one table then runs at the same fraction of its roofline at
every shape, so a GPU at least as fast on every datasheet figure is never costed slower,
for any kernel and any M. The time is lowered to the least over every M' ≥ M (a problem
can be padded to a larger one): never decreasing in M. Below the first row it is the
first row's.

Why the residual and not the time (as the attention and elementwise tables interpolate):
a roofline bends where the GEMM turns from bandwidth- to compute-bound, at an M of its
own per GPU and per kernel. Times interpolated between rows bend nowhere, so a time
scaled from them by a roofline ratio reached a different fraction of its roofline than
the rows around it, by up to 20 % next to the measured GPU's bend: an MI325X costed more
than an MI300X on gpt-oss-120b's MXFP4 experts, an H100 a weight-only GEMM 18 % faster
than the H200, and FP8 GEMMs that got faster with more rows.

A roofline here is floor + max(F·M, B₀ + B₁·M) (compute; bytes), affine on each side of
its bend. On a piece between rows and bends the time is A·M^b·(p + q·M), whose least
value on an interval is at an end or at M* = −b·p / ((1 + b)·q): the envelope is exact.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from dataclasses import dataclass

from sim.io.tables import EXACT, EXTRAPOLATED, INTERPOLATED


@dataclass(frozen=True)
class GemmRoofline:
    """floor + max(per_row_flops · M, bytes + per_row_bytes · M), in ms."""

    floor: float
    per_row_flops: float  # ms of compute per row
    bytes: float  # ms to stream the weights
    per_row_bytes: float  # ms to stream a row's input and output

    def at(self, m: float) -> float:
        return self.floor + max(self.per_row_flops * m, self.bytes + self.per_row_bytes * m)

    def bend(self) -> float:
        """The M where compute overtakes bytes (inf: never)."""
        gap = self.per_row_flops - self.per_row_bytes
        return self.bytes / gap if gap > 0 else math.inf

    def piece(self, m: float) -> tuple[float, float]:
        """(p, q) with at(m) = p + q·m on m's side of the bend."""
        if self.per_row_flops * m >= self.bytes + self.per_row_bytes * m:
            return self.floor, self.per_row_flops
        return self.floor + self.bytes, self.per_row_bytes


class GemmCurve:
    """One kernel's time at M on one GPU, from a table's rows (`rows`, ascending, with
    their monotone times `times`), the measured GPU's bf16 roofline of that shape
    (`measured`) and the kernel's roofline on the GPU costed (`kernel`); `tag` is the
    tag of a lookup on a row (exact, or extrapolated for rows scaled from another shape)."""

    def __init__(self, rows: list[float], times: list[float], measured: GemmRoofline,
                 kernel: GemmRoofline, tag: str = EXACT):
        self.rows, self.kernel, self.on_row = rows, kernel, tag
        self.logm = [math.log(m) for m in rows]
        # a row's time: the measured time x the roofline ratio (exactly it where they are one)
        self.at_row = [t * (kernel.at(m) / measured.at(m)) for m, t in zip(rows, times, strict=True)]
        self.logr = [math.log(t / measured.at(m)) for m, t in zip(rows, times, strict=True)]
        bend = kernel.bend()
        self.points = sorted({*rows, *([bend] if rows[0] < bend < rows[-1] else [])})
        # per piece [points[j], points[j+1]]: its row interval, where inside it the time
        # dips below both ends (inf: nowhere) and the time there
        self.row_of = [bisect_right(rows, a) - 1 for a in self.points[:-1]]
        self.dip_at = [self._dip(j) for j in range(len(self.points) - 1)]
        self.dip = [self._time(d, i) if d < math.inf else math.inf
                    for d, i in zip(self.dip_at, self.row_of, strict=True)]
        least = [0.0] * len(self.points)  # the least time over [point, inf)
        least[-1] = self.at_row[-1]
        for j in range(len(self.points) - 2, -1, -1):
            least[j] = min(self._time(self.points[j], self.row_of[j]), self.dip[j], least[j + 1])
        self.least = least

    def _time(self, m: float, i: int) -> float:
        """ρ(m) × the kernel's roofline, rows[i] <= m <= rows[i + 1]."""
        if self.rows[i] == m:
            return self.at_row[i]
        logm, logr = self.logm, self.logr
        w = (math.log(m) - logm[i]) / (logm[i + 1] - logm[i])
        return math.exp((1 - w) * logr[i] + w * logr[i + 1]) * self.kernel.at(m)

    def _dip(self, j: int) -> float:
        """Where the time on piece j, A·M^b·(p + q·M), has its least value strictly inside
        the piece (d/dM = 0 at M* = −b·p / ((1 + b)·q)); inf where it has none there."""
        a, z, i = self.points[j], self.points[j + 1], self.row_of[j]
        b = (self.logr[i + 1] - self.logr[i]) / (self.logm[i + 1] - self.logm[i])
        p, q = self.kernel.piece((a + z) / 2)
        if not -1 < b < 0 or p <= 0:
            return math.inf
        low = -b * p / ((1 + b) * q)
        return low if a < low < z else math.inf

    def at(self, m: float) -> float:
        """The least time over [m, inf)."""
        rows, points = self.rows, self.points
        if m <= rows[0]:
            return self.least[0]
        if m >= rows[-1]:  # the last row's residual, held
            return self.at_row[-1] * (self.kernel.at(m) / self.kernel.at(rows[-1]))
        j = bisect_right(points, m) - 1
        t = self._time(m, self.row_of[j])
        if m < self.dip_at[j] and self.dip[j] < t:
            t = self.dip[j]
        return min(t, self.least[j + 1])

    def tag(self, m: float) -> str:
        """`exact` on a row of the shape's own table, `interpolated` between its rows,
        `extrapolated` beyond them or on another shape's rows (as `Grid.lookup` tags)."""
        rows = self.rows
        if m < rows[0] or m > rows[-1]:
            return EXTRAPOLATED
        if self.on_row != EXACT or rows[bisect_right(rows, m) - 1] == m:
            return self.on_row
        return INTERPOLATED
