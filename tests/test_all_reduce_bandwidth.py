"""All-reduce bus bandwidth by message size: published nccl-tests points, known answers."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from sim.costmodel.comm import Collectives, Interconnect
from sim.costmodel.profiles import load_profile
from sim.io.specload import SpecError, build

ROOT = Path(__file__).resolve().parent.parent
MIB, GIB = 2**20, 2**30


@pytest.mark.parametrize(("nbytes", "published_busbw", "hand_us"), [
    # Azure/AI-benchmarking-guide ND_H200_v5_results.md, 8 x H200, NVLS: t = 1.75 S / busbw
    (64 * MIB, 368.11, 319.02),   # 1.75 x 67,108,864 B / 368.11 GB/s
    (GIB, 467.58, 4018.67),       # 1.75 x 1,073,741,824 B / 467.58 GB/s
    (8 * GIB, 479.98, 31318.8),   # 1.75 x 8,589,934,592 B / 479.98 GB/s
])
def test_h200_8_gpu_all_reduce_takes_the_published_nccl_tests_time(nbytes, published_busbw,
                                                                   hand_us):
    comm = load_profile("h200-sxm").comm
    ms, tag = comm.all_reduce(nbytes, 8)
    assert ms * 1e3 == pytest.approx(hand_us, rel=2e-4)
    assert 1.75 * nbytes / (ms * 1e-3) / 1e9 == pytest.approx(published_busbw, rel=2e-4)
    assert tag == "derived"


def test_large_messages_reach_the_bus_bandwidth_nccl_tests_212_states():
    # NVIDIA/nccl-tests #212 (NCCL maintainer): 8 H100, NVLink SHARP, peak busbw ~480 GB/s;
    # ring ~370 GB/s. The old single fitted B (285 GB/s) under-stated both.
    for gpu in ("h100-sxm", "h200-sxm"):
        comm = load_profile(gpu).comm
        ms = comm.all_reduce(8 * GIB, 8)[0]
        assert 1.75 * 8 * GIB / (ms * 1e-3) / 1e9 == pytest.approx(480, rel=0.01)
        for n in (2, 4):  # another count: the 8-GPU curve lifts the fitted B
            ms = comm.all_reduce(GIB, n)[0]
            busbw = 2 * (n - 1) / n * GIB / (ms * 1e-3) / 1e9
            assert busbw > 370 and comm.all_reduce(GIB, n)[1] == "analytic"


def test_below_the_published_sizes_the_fitted_bandwidth_stays():
    # vLLM PR #24111, H100 TP 4 pynccl: 2 MB in 26 us, on 14 us + 1.5 S / 285 GB/s
    comm = load_profile("h100-sxm").comm
    assert comm.bus_gbs(2 * MIB, 4) == (285, False)
    assert comm.bus_gbs(512 * 1024, 8) == (285, False)  # below the first usable 8-GPU point
    assert comm.all_reduce(2 * MIB, 4)[0] * 1e3 == pytest.approx(14 + 1.5 * 2 * MIB / 285e3)


def _vidur_a100(gpus: int) -> dict[int, float]:
    f = ROOT / "gpu_profiles" / "a100-80gb" / "all_reduce_a100_dgx.csv"
    with f.open() as fh:
        return {int(r["size"]): float(r["time_stats.all_reduce.median"]) for r in csv.DictReader(fh)
                if int(r["num_workers"]) == gpus == int(r["devices_per_node"])}


def test_a100_published_curve_agrees_with_vidurs_measured_table_where_both_exist():
    """The A100 curve (Azure ND A100 v4) without the table, against Vidur's measured 8-GPU
    medians at 16-64 MiB (the sizes both cover above the curve's first usable point)."""
    profile = load_profile("a100-80gb")
    curve_only = Collectives(profile.comm.link)  # no measured table
    measured = _vidur_a100(8)
    for size in (16 * MIB, 32 * MIB, 64 * MIB):
        model = curve_only.all_reduce(size, 8)[0]
        assert model == pytest.approx(measured[size], rel=0.10), size
    # and the measured table still wins inside its sizes
    assert profile.comm.all_reduce(64 * MIB, 8) == (pytest.approx(0.675), "exact")


@pytest.mark.parametrize("gpu", ["a100-80gb", "h100-sxm", "h200-sxm", "b200", "gb200-nvl72", "l40s"])
def test_all_reduce_time_never_falls_as_the_message_grows(gpu):
    comm = load_profile(gpu).comm
    sizes = [int(2 ** (k / 4)) for k in range(40, 134)]  # 1 KiB .. 8 GiB, 4 per octave
    for n in (2, 4, 8):
        times = [comm.all_reduce(s, n)[0] for s in sizes]
        assert all(b >= a * (1 - 1e-12) for a, b in zip(times, times[1:], strict=False)), (gpu, n)


def test_a_size_stated_twice_for_one_gpu_count_is_refused():
    link = {"name": "x", "datasheet_gbs": 1, "bus_gbs": 1, "latency_us": 1,
            "all_reduce_bus": [{"bytes": 1024, "gpus": 8, "bus_gbs": 1.0},
                               {"bytes": 1024, "gpus": 4, "bus_gbs": 1.0},
                               {"bytes": 1024, "gpus": 8, "bus_gbs": 2.0}]}
    with pytest.raises(SpecError, match=r"interconnect\.all_reduce_bus\[2\]\.bytes: 1024 bytes "
                                        r"on 8 GPUs stated twice"):
        build(Interconnect, link, file="p.yaml", path="interconnect")


def test_every_published_point_names_its_source():
    for gpu in ("a100-80gb", "h100-sxm", "h200-sxm", "b200", "b300", "gb200-nvl72", "gb300-nvl72"):
        points = load_profile(gpu).comm.link.all_reduce_bus
        assert points and all(p.source for p in points), gpu
