"""GEMM lookups through the measured fraction of the roofline (sim/costmodel/gemm_curve.py):
the measured time on a row, the residual log-linear between rows, an exact lower envelope,
and on every shipped profile bf16, FP8 and weight-only GEMMs that never get faster with
more rows and quantised GEMMs never slower than bf16 at the same shape."""

from __future__ import annotations

import math

import pytest

from sim.costmodel.gemm_curve import GemmCurve, GemmRoofline
from sim.costmodel.profiles import known_profiles, load_profile
from sim.io.tables import EXACT, EXTRAPOLATED, INTERPOLATED

BF16 = GemmRoofline(floor=0.005, per_row_flops=0.0004, bytes=0.02, per_row_bytes=0.00001)


def test_on_a_row_the_curve_is_the_measured_time_and_between_rows_the_residual_is_log_linear():
    c = GemmCurve([1, 16, 256], [0.03, 0.032, 0.14], BF16, BF16)  # residual 1.20, 1.27, 1.30
    assert [c.at(m) for m in (1, 16, 256)] == [0.03, 0.032, 0.14]
    assert [c.tag(m) for m in (16, 64, 300)] == [EXACT, INTERPOLATED, EXTRAPOLATED]
    rho = [t / BF16.at(m) for m, t in ((16, 0.032), (256, 0.14))]
    assert c.at(64) == pytest.approx(math.sqrt(rho[0] * rho[1]) * BF16.at(64), rel=1e-12)
    # beyond the last row the last row's residual is held: the roofline's growth
    assert c.at(1024) == pytest.approx(0.14 * BF16.at(1024) / BF16.at(256), rel=1e-12)
    assert c.at(0.5) == c.at(1)  # below the first row: the first row's time


def test_another_kernel_or_gpu_gets_the_same_fraction_of_its_own_roofline():
    faster = GemmRoofline(0.005, 0.0002, 0.015, 0.000008)  # more FLOP/s and bandwidth
    rows, times = [1, 16, 256], [0.03, 0.032, 0.14]
    mine, theirs = GemmCurve(rows, times, BF16, faster), GemmCurve(rows, times, BF16, BF16)
    for m in (1, 3, 16, 100, 166, 200, 256, 4000):
        assert mine.at(m) <= theirs.at(m)
    assert mine.at(16) == 0.032 * (faster.at(16) / BF16.at(16))


@pytest.mark.parametrize("times", [[0.05, 0.0501, 0.06], [0.02, 0.2, 0.21], [0.01, 0.03, 0.031]])
def test_the_envelope_is_the_least_time_over_every_larger_row_count(times):
    # a measured GPU that turns compute-bound early, a kernel that stays bandwidth-bound:
    # the residual falls faster than the kernel's roofline grows, and the time dips
    measured = GemmRoofline(0.001, 0.002, 0.01, 0.00001)
    kernel = GemmRoofline(0.004, 0.0001, 0.05, 0.0002)
    c = GemmCurve([1, 40, 400], times, measured, kernel)

    def raw(m: float) -> float:  # ρ(m) x the kernel's roofline, no envelope
        i = 0 if m <= 40 else 1
        xs, ts = (1, 40, 400), times
        w = math.log(m / xs[i]) / math.log(xs[i + 1] / xs[i])
        lo, hi = ts[i] / measured.at(xs[i]), ts[i + 1] / measured.at(xs[i + 1])
        return lo ** (1 - w) * hi ** w * kernel.at(m)

    grid = [1 + i * 0.25 for i in range(1597)]  # 1 .. 400
    suffix, least = [], math.inf
    for m in reversed(grid):
        least = min(least, raw(m))
        suffix.append(least)
    for m, want in zip(reversed(grid), suffix, strict=True):
        assert c.at(m) <= want * (1 + 1e-12)  # never above the least sampled
        assert c.at(m) >= want * (1 - 1e-4)  # and the sampling misses little below it
    assert all(c.at(a) <= c.at(b) for a, b in zip(grid, grid[1:], strict=False))


SHAPES = [(4096, 4096), (2048, 2048), (4096, 28672), (5000, 3000), (2880, 737280), (8192, 7168)]
ROWS = sorted({*range(1, 400), *(round(400 * 1.03 ** i) for i in range(130))})  # 1 .. ~19,000


@pytest.mark.parametrize("name", known_profiles())
def test_every_gemm_kernel_never_gets_faster_with_more_rows_and_quantised_is_never_slower(name):
    p = load_profile(name)
    fp8 = p.facts.datasheet_fp8_tflops is not None
    for k, n in SHAPES:
        last = (0.0, 0.0, 0.0)
        for m in ROWS:
            bf16 = p.gemm(m, k, n)[0]
            w4 = p.gemm_weights(m, k, n, 0.53125)[0]
            f8 = p.gemm_fp8(m, k, n)[0] if fp8 else 0.0
            assert all(a >= b * (1 - 1e-12) for a, b in zip((bf16, w4, f8), last, strict=True)), (m, k, n)
            assert w4 <= bf16 * (1 + 1e-12) and f8 <= bf16 * (1 + 1e-12), (m, k, n)
            last = (bf16, w4, f8)
