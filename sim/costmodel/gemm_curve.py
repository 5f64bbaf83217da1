"""A GEMM kernel's time as a function of its rows M, from a measured GEMM table.

A measured table gives, for one weight shape (K, N), times at rows Mᵢ, made monotone at
load and interpolated linearly in log time over log M between them (sim/io/tables.py
`Grid`; held at the first row below it, grown as the roofline beyond the last). Any GEMM
kernel on any GPU costed from that table takes, at every M, that time × the ratio of its
own roofline to the measured GPU's bf16 roofline at M: the bf16 GEMM's, an FP8 or a
weight-only quantised GEMM's, on the GPU measured or on one whose GEMMs are derived from
it (sim/costmodel/derived_tables.py). So every such kernel runs at the fraction of its
roofline that the measured bf16 GEMM reaches at that very shape: two GPUs costed from one
table keep their rooflines' order for every kernel and every M, and a quantised GEMM
(less work on every roofline term) never costs more than the bf16 one.

A roofline bends where the GEMM turns from bandwidth- to compute-bound, at an M of its
own per GPU and per kernel; the ratio of two rooflines rises and falls between their
bends, and the scaled time can fall with M there (a GPU still bandwidth-bound where the
measured one is compute-bound and gaining efficiency). The time is therefore lowered to
the least over every M' ≥ M (a problem can be padded to a larger one), which never
decreases in M; the measured GPU's own bf16 GEMM is its table as looked up (monotone
already). Between rows and bends the time is A·M^b·(p + q·M) / (r + s·M), whose
derivative vanishes at the roots of a quadratic: the envelope is exact.

Before, a derived GPU's table was its rows scaled by the roofline ratio, and FP8 and
weight-only GEMMs the bf16 lookup × their roofline / the bf16 one: interpolating scaled
rows let the fraction of the roofline differ between GPUs between rows, by up to 18 %
next to a bend. An MI325X cost more than an MI300X on weight-only GEMMs (up to 7.5 %;
2 % on gpt-oss-120b's MXFP4 experts, where tests/test_gpu_ordering.py found it), the H200
18 % more than the H100, and FP8 GEMMs got up to 6 % faster with more rows (the H200's).
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
        self.rows, self.measured, self.kernel, self.on_row = rows, measured, kernel, tag
        self.times, self.logm = times, [math.log(m) for m in rows]
        self.logt = [math.log(t) for t in times]
        # the measured GPU's own bf16 GEMM: its table as looked up, monotone already
        self.enveloped = kernel != measured
        bends = [b for b in (kernel.bend(), measured.bend()) if rows[0] < b < rows[-1]]
        self.points = sorted({*rows, *bends})
        # per piece [points[j], points[j+1]]: its row interval, the least time strictly
        # inside it where that is below both ends (inf: none) and where
        self.row_of = [bisect_right(rows, a) - 1 for a in self.points[:-1]]
        dips = [self._dip(j) for j in range(len(self.points) - 1)]
        self.dip_at, self.dip = [d[0] for d in dips], [d[1] for d in dips]
        least = [0.0] * len(self.points)  # the least time over [point, inf)
        least[-1] = self._time(rows[-1], len(rows) - 1)
        for j in range(len(self.points) - 2, -1, -1):
            least[j] = min(self._time(self.points[j], self.row_of[j]), self.dip[j], least[j + 1])
        self.least = least

    def _time(self, m: float, i: int) -> float:
        """The measured time at m (interpolated as `Grid.lookup` does) × the kernel's
        roofline / the measured bf16 roofline at m; rows[i] <= m <= rows[i + 1]."""
        if self.rows[i] == m:
            t = self.times[i]
        else:
            logm, logt = self.logm, self.logt
            w = (math.log(m) - logm[i]) / (logm[i + 1] - logm[i])
            t = math.exp((1 - w) * logt[i] + w * logt[i + 1])
        return t * (self.kernel.at(m) / self.measured.at(m))

    def _dip(self, j: int) -> tuple[float, float]:
        """Where and how low the time on piece j, A·M^b·(p + q·M) / (r + s·M), is least
        strictly inside the piece, below both its ends: a root of the derivative, a
        quadratic in M; (inf, inf) where there is none."""
        a, z, i = self.points[j], self.points[j + 1], self.row_of[j]
        if not self.enveloped:
            return math.inf, math.inf
        b = (self.logt[i + 1] - self.logt[i]) / (self.logm[i + 1] - self.logm[i])
        (p, q), (r, s) = self.kernel.piece((a + z) / 2), self.measured.piece((a + z) / 2)
        # d/dM log time = b/M + q/(p + qM) - s/(r + sM) = 0, times M(p + qM)(r + sM):
        c2, c1, c0 = b * q * s, b * (p * s + q * r) + q * r - s * p, b * p * r
        if c2 != 0:
            disc = c1 * c1 - 4 * c2 * c0
            roots = [] if disc < 0 else [(-c1 + e * math.sqrt(disc)) / (2 * c2) for e in (1, -1)]
        else:
            roots = [-c0 / c1] if c1 != 0 else []
        best = math.inf, math.inf
        for m in roots:
            if a < m < z and (t := self._time(m, i)) < best[1]:
                best = m, t
        return best

    def at(self, m: float) -> float:
        """The least time over [m, inf)."""
        rows, points = self.rows, self.points
        if m <= rows[0]:
            return self.least[0] if self.enveloped else self.times[0]
        if m >= rows[-1]:  # the last row's time x the kernel's roofline growth
            return self._time(rows[-1], len(rows) - 1) * (self.kernel.at(m) / self.kernel.at(rows[-1]))
        j = bisect_right(points, m) - 1
        t = self._time(m, self.row_of[j])
        if not self.enveloped:
            return t
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
