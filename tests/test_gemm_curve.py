"""GEMM lookups at every shape (sim/costmodel/gemm_curve.py): the measured table as looked
up for the measured GPU's bf16 GEMM, any other kernel or GPU that lookup × the ratio of
rooflines, made never to decrease in M by an exact lower envelope; and on every shipped
profile bf16, FP8 and weight-only GEMMs that never get faster with more rows, quantised
GEMMs never slower than bf16 at the same shape."""

from __future__ import annotations

import math

import pytest

from sim.costmodel.gemm_curve import GemmCurve, GemmRoofline
from sim.costmodel.profiles import known_profiles, load_profile
from sim.io.tables import EXACT, EXTRAPOLATED, INTERPOLATED, Grid

BF16 = GemmRoofline(floor=0.005, per_row_flops=0.0004, bytes=0.02, per_row_bytes=0.00001)
ROWS, TIMES = [1, 16, 256], [0.03, 0.032, 0.11]


def test_the_measured_gpus_bf16_curve_is_its_table_as_looked_up():
    c = GemmCurve(ROWS, TIMES, BF16, BF16)
    grid = Grid({(m, 1): t for m, t in zip(ROWS, TIMES, strict=True)}, lambda m, _: BF16.at(m))
    for m in (1, 2, 16, 64, 100, 255, 256):
        assert c.at(m) == grid.lookup(m, 1)[0]
    assert [c.tag(m) for m in (16, 64, 300)] == [EXACT, INTERPOLATED, EXTRAPOLATED]
    assert c.at(1024) == pytest.approx(0.11 * BF16.at(1024) / BF16.at(256), rel=1e-12)
    assert c.at(0.5) == c.at(1)  # below the first row: the first row's time


def test_another_gpu_takes_the_lookup_times_the_roofline_ratio_and_keeps_the_order():
    faster = GemmRoofline(0.005, 0.0002, 0.015, 0.000008)  # more FLOP/s and bandwidth
    mine, theirs = GemmCurve(ROWS, TIMES, BF16, faster), GemmCurve(ROWS, TIMES, BF16, BF16)
    assert mine.at(16) == 0.032 * (faster.at(16) / BF16.at(16))
    for m in (1, 3, 16, 50, 51.3, 100, 166, 200, 256, 4000):
        assert mine.at(m) <= theirs.at(m)


@pytest.mark.parametrize("times", [[0.05, 0.0501, 0.06], [0.02, 0.2, 0.21], [0.01, 0.03, 0.09]])  # the last: a dip inside (40, 400)
def test_the_envelope_is_the_least_time_over_every_larger_row_count(times):
    # a measured GPU that turns compute-bound early, a kernel that stays bandwidth-bound:
    # their ratio falls as the measured roofline climbs, and the scaled time dips
    measured = GemmRoofline(0.001, 0.002, 0.01, 0.00001)
    kernel = GemmRoofline(0.004, 0.0001, 0.05, 0.0002)
    rows = [1, 40, 400]
    c = GemmCurve(rows, times, measured, kernel)

    def raw(m: float) -> float:  # the scaled lookup, no envelope
        i = 0 if m <= 40 else 1
        w = math.log(m / rows[i]) / math.log(rows[i + 1] / rows[i])
        t = math.exp((1 - w) * math.log(times[i]) + w * math.log(times[i + 1]))
        return t * kernel.at(m) / measured.at(m)

    grid = [1 + i * 0.25 for i in range(1597)]  # 1 .. 400
    suffix, least = [], math.inf
    for m in reversed(grid):
        least = min(least, raw(m))
        suffix.append(least)
    assert any(raw(m) > low * (1 + 1e-6)  # the envelope has something to do
               for m, low in zip(reversed(grid), suffix, strict=True))
    for m, want in zip(reversed(grid), suffix, strict=True):
        assert c.at(m) <= want * (1 + 1e-12)  # never above the least sampled
        assert c.at(m) >= want * (1 - 1e-4)  # and the sampling misses little below it
    assert all(c.at(a) <= c.at(b) for a, b in zip(grid, grid[1:], strict=False))


SHAPES = [(4096, 4096), (2048, 2048), (4096, 28672), (5000, 3000), (2880, 737280), (8192, 7168)]
MS = sorted({*range(1, 400), *(round(400 * 1.03 ** i) for i in range(130))})  # 1 .. ~19,000


@pytest.mark.parametrize("name", known_profiles())
def test_every_gemm_kernel_never_gets_faster_with_more_rows_and_quantised_is_never_slower(name):
    p = load_profile(name)
    fp8 = p.facts.datasheet_fp8_tflops is not None
    for k, n in SHAPES:
        last = (0.0, 0.0, 0.0)
        for m in MS:
            bf16 = p.gemm(m, k, n)[0]
            w4 = p.gemm_weights(m, k, n, 0.53125)[0]
            f8 = p.gemm_fp8(m, k, n)[0] if fp8 else 0.0
            assert all(a >= b * (1 - 1e-12) for a, b in zip((bf16, w4, f8), last, strict=True)), (m, k, n)
            assert w4 <= bf16 * (1 + 1e-12) and f8 <= bf16 * (1 + 1e-12), (m, k, n)
            last = (bf16, w4, f8)
