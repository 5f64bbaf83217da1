"""The dirty-L2 write-back of flushed kernel timings (sim/costmodel/l2flush.py) and its removal."""

from __future__ import annotations

import csv
import shutil
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.cli.main import main as cli_main
from sim.costmodel.l2flush import Timing, fit_write_back, footprint, warm_ms, write_back_ms
from sim.costmodel.profiles import ELEMENTWISE_BYTES, EXACT, PROFILES_DIR, load_profile
from sim.io.specload import SpecError

H200 = PROFILES_DIR / "h200-sxm"
FLUSHED = Timing(method="l2_flushed", dirty_l2_mb=40.0, write_back_tbs=4.0)
PEAK = 800e9  # FLOP per ms
MB = 1e6


def csv_ms(table: str, **match) -> float:
    with (H200 / f"{table}.csv").open() as f:
        return next(float(r["ms"]) for r in csv.DictReader(f)
                    if all(r[k] == str(v) for k, v in match.items()))


# ---- known answers ----------------------------------------------------------------


def test_memory_bound_kernel_larger_than_the_dirty_l2_loses_d_over_b():
    # 1 GB streamed, no FLOPs: the flush added 40 MB of write-back at 4 TB/s = 10 us
    assert write_back_ms(FLUSHED, 0.0, 1e9, 0.0, PEAK) == pytest.approx(0.010)
    assert warm_ms(FLUSHED, 0.300, 0.0, 1e9, 0.0, PEAK) == pytest.approx(0.290)


def test_memory_bound_kernel_smaller_than_the_dirty_l2_loses_its_own_bytes_over_b():
    # 8 MB: evicting its 8 MB wrote back 8 MB of dirty lines, 2 us
    assert write_back_ms(FLUSHED, 0.0, 8 * MB, 0.0, PEAK) == pytest.approx(0.002)
    assert warm_ms(FLUSHED, 0.009, 0.0, 8 * MB, 0.0, PEAK) == pytest.approx(0.007)


def test_compute_bound_kernel_hides_the_write_back():
    # 80 GFLOP = 100 us of compute; 100 MB (+40 MB) of traffic = 35 us: nothing to remove
    assert write_back_ms(FLUSHED, 80e9, 100 * MB, 0.0, PEAK) == 0.0
    assert warm_ms(FLUSHED, 0.120, 80e9, 100 * MB, 0.0, PEAK) == 0.120


def test_kernel_near_the_ridge_loses_only_the_traffic_above_its_compute_time():
    # 20 us compute, 60 MB -> 15 us alone, 25 us with the 40 MB write-back: 5 us removed
    assert write_back_ms(FLUSHED, 16e9, 60 * MB, 0.0, PEAK) == pytest.approx(0.005)


def test_kernel_whose_inputs_fill_the_l2_in_a_forward_pass_keeps_its_time():
    # a 200 MB elementwise op reading 130 MB of activations a previous kernel wrote: a
    # forward pass leaves it as much dirty data to write back as the flush did
    assert write_back_ms(FLUSHED, 0.0, 200 * MB, 130 * MB, PEAK) == 0.0
    # 20 MB of dirty inputs of its 60 MB: the flush added the other 20 MB, 5 us
    assert write_back_ms(FLUSHED, 0.0, 60 * MB, 20 * MB, PEAK) == pytest.approx(0.005)


def test_warm_timing_removes_nothing():
    warm = Timing(method="clean")
    assert write_back_ms(warm, 0.0, 1e9, 0.0, PEAK) == 0.0
    assert warm_ms(warm, 0.3, 0.0, 1e9, 0.0, PEAK) == 0.3


def test_h200_decode_gemm_loses_the_fitted_write_back_and_a_prefill_gemm_keeps_its_time():
    h200 = load_profile("h200-sxm")
    t = h200.facts.timing
    d_over_b = t.dirty_l2_mb * MB / (t.write_back_tbs * 1e9)
    assert 0.009 < d_over_b < 0.011  # ~10 us per weight-streaming GEMM
    measured = csv_ms("gemm", M=16, K=14336, N=4096)  # 117 MB of weights, memory-bound
    x_in = 16 * 14336 * 2 / (t.write_back_tbs * 1e9)  # its input activations stay dirty
    assert h200.gemm(16, 14336, 4096) == (pytest.approx(measured - d_over_b + x_in), EXACT)
    measured = csv_ms("gemm", M=8192, K=4096, N=28672)  # 1.9e12 FLOP: compute-bound
    assert h200.gemm(8192, 4096, 28672) == (measured, EXACT)


# ---- properties ---------------------------------------------------------------------

timings = st.builds(Timing, method=st.just("l2_flushed"), dirty_l2_mb=st.floats(1, 100),
                    write_back_tbs=st.floats(1, 10))
sizes = st.floats(1e3, 1e11)
flop_counts = st.one_of(st.just(0.0), st.floats(1e3, 1e14))


def flushed_model(t: Timing, floor_ms: float, flops: float, nbytes: float) -> float:
    """What a flushed timing of an ideal roofline kernel with fixed latency measures."""
    w = min(nbytes, t.dirty_l2_mb * MB)
    return floor_ms + max(flops / PEAK, (nbytes + w) / (t.write_back_tbs * 1e9))


@settings(max_examples=300, deadline=None)
@given(timings, st.floats(0, 0.05), flop_counts, sizes, st.floats(0, 1))
def test_correction_recovers_the_forward_pass_roofline_and_stays_above_its_floor(
        t, c, flops, nbytes, share):
    dirty_in = share * nbytes  # activations read: a share of the bytes moved
    measured = flushed_model(t, c, flops, nbytes)
    warm = warm_ms(t, measured, flops, nbytes, dirty_in, PEAK)
    forward = nbytes + min(dirty_in, t.dirty_l2_mb * MB)
    floor = max(flops / PEAK, forward / (t.write_back_tbs * 1e9))
    assert warm == pytest.approx(c + floor, rel=1e-9, abs=1e-12)
    assert floor * (1 - 1e-9) <= warm <= measured


@settings(max_examples=300, deadline=None)
@given(timings, st.floats(0, 0.05), flop_counts, sizes, st.floats(0, 1), st.floats(1.0, 10.0))
def test_corrected_time_grows_with_the_kernel(t, c, flops, nbytes, share, grow):
    def corrected(k: float) -> float:
        return warm_ms(t, flushed_model(t, c, flops * k, nbytes * k), flops * k, nbytes * k,
                       share * nbytes * k, PEAK)
    assert corrected(grow) >= corrected(1.0) * (1 - 1e-9)


def forward_floor(t: Timing, flops: float, nbytes: float, dirty_in: float) -> float:
    """max(C, (X + W') / B), W' = min(A, X, D): written out here, not taken from sim."""
    w_forward = min(dirty_in, nbytes, t.dirty_l2_mb * MB)
    return max(flops / PEAK, (nbytes + w_forward) / (t.write_back_tbs * 1e9))


def flushed_roofline(t: Timing, flops: float, nbytes: float) -> float:
    """max(C, (X + W) / B), W = min(X, D)."""
    return flushed_model(t, 0.0, flops, nbytes)


# measured times as multiples of the kernel's flushed roofline: below the forward-pass
# floor, between the two rooflines (where the correction changes form) and above both
MULTIPLES = np.linspace(0.3, 3.0, 1001)


@settings(max_examples=300, deadline=None)
@given(timings, flop_counts, sizes, st.floats(0, 1.5))
def test_correction_never_raises_a_time_nor_goes_below_the_floor(t, flops, nbytes, share):
    dirty_in = share * nbytes  # may exceed the bytes moved: W' is capped at X
    floor = forward_floor(t, flops, nbytes, dirty_in)
    for ms in MULTIPLES * flushed_roofline(t, flops, nbytes):
        warm = warm_ms(t, ms, flops, nbytes, dirty_in, PEAK)
        assert min(ms, floor) * (1 - 1e-12) <= warm <= ms


@settings(max_examples=300, deadline=None)
@given(timings, flop_counts, sizes, st.floats(0, 1))
def test_correction_is_monotone_in_the_measured_time(t, flops, nbytes, share):
    warm = [warm_ms(t, ms, flops, nbytes, share * nbytes, PEAK)
            for ms in MULTIPLES * flushed_roofline(t, flops, nbytes)]
    assert (np.diff(warm) >= 0).all()


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 16384), st.integers(1, 16384))
def test_corrected_h200_lookups_stay_monotone_in_size(m1, m2):
    h200 = load_profile("h200-sxm")
    lo, hi = sorted((m1, m2))
    rounding = 1 + 1e-12  # equal corrected rows interpolate to within float rounding
    assert h200.gemm(lo, 4096, 6144)[0] <= h200.gemm(hi, 4096, 6144)[0] * rounding
    assert h200.decode_attn("contiguous", 1, lo, 32, 8, 128)[0] <= \
        h200.decode_attn("contiguous", 1, hi, 32, 8, 128)[0] * rounding


# ---- profiles without the flag --------------------------------------------------------


@pytest.mark.parametrize("name", ["a100-80gb", "h100-sxm", "l40s"])
def test_profiles_not_timed_flushed_serve_their_tables_unchanged(name):
    """Vidur's tables (A100, H100) were not timed with a flushed L2: a lookup at a
    measured GEMM point is the table's monotone envelope, capped at the GPU's peak."""
    p = load_profile(name)
    assert p.facts.timing is None and p.timing_note == "" and p.summary()["timing"] == ""
    folder = PROFILES_DIR / name
    if not (folder / "gemm.csv").is_file() or "gemm" in p.derived_tables:
        return  # the H100 looks up the H200's rows (tables_from): tests/test_profiles.py
    with (folder / "gemm.csv").open() as f:
        rows = [{k: float(v) for k, v in r.items()} for r in csv.DictReader(f)]
    flop_per_ms = (p.facts.peak_tflops or p.facts.datasheet_tflops) * 1e9
    byte_per_ms = p.facts.datasheet_mem_bw_tbs * 1e9
    least = {id(r): max(flops / flop_per_ms, nbytes / byte_per_ms)
             for r in rows for flops, nbytes, _ in [footprint("gemm", {})(r)]}
    for r in rows[::7]:
        same = [max(s["ms"], least[id(s)]) for s in rows
                if (s["K"], s["N"]) == (r["K"], r["N"]) and s["M"] >= r["M"]]
        assert p.gemm(int(r["M"]), int(r["K"]), int(r["N"]))[0] == pytest.approx(min(same), rel=1e-12)


def test_h200_tables_marked_clean_are_served_as_measured(tmp_path):
    folder = tmp_path / "h200-sxm"
    shutil.copytree(H200, folder)
    yaml_file = folder / "profile.yaml"
    yaml_file.write_text(yaml_file.read_text().replace("method: l2_flushed", "method: clean"))
    p = load_profile(str(folder))
    assert p.timing_note == ""
    assert p.gemm(16, 14336, 4096)[0] == csv_ms("gemm", M=16, K=14336, N=4096)
    assert p.decode_attn("contiguous", 1, 16384, 32, 8, 128)[0] == \
        csv_ms("attn_decode", impl="contiguous", batch=1, ctx=16384, hkv=8)


def test_a_flushed_timing_without_dirty_bytes_is_a_one_line_error(tmp_path):
    folder = tmp_path / "h200-sxm"
    shutil.copytree(H200, folder)
    yaml_file = folder / "profile.yaml"
    text = yaml_file.read_text()
    yaml_file.write_text(text.replace("dirty_l2_mb: 45.6", "dirty_l2_mb: 0"))
    with pytest.raises(SpecError, match=r"profile.yaml: timing.dirty_l2_mb: must be > 0"):
        load_profile(str(folder))
    yaml_file.write_text(text.replace("method: l2_flushed", "method: flushed"))
    with pytest.raises(SpecError, match=r"profile.yaml: timing.method: .*l2_flushed"):
        load_profile(str(folder))


def test_gpus_lists_the_timing_correction(capsys):
    assert cli_main(["gpus"]) == 0
    out = capsys.readouterr().out
    assert "timed with the L2 flushed" in out and out.count("timed with the L2 flushed") == 1


# ---- the fit ---------------------------------------------------------------------------


def test_shipped_write_back_parameters_are_the_fit_to_the_h200_tables():
    fit = fit_write_back(H200)
    t = load_profile("h200-sxm").facts.timing
    assert fit["fit"]["dirty_l2_mb"] == t.dirty_l2_mb
    assert round(fit["fit"]["write_back_tbs"], 2) == t.write_back_tbs
    assert fit["fit"]["rms"] < fit["no_write_back"]["rms"] - 0.02  # 8.2 % against 11.1 %
    assert 40 <= t.dirty_l2_mb <= 52.4  # most of the 50 MiB L2


def test_fit_recovers_known_write_back_from_synthetic_tables(tmp_path):
    truth = Timing(method="l2_flushed", dirty_l2_mb=30.0, write_back_tbs=4.0)
    dec = [{"impl": "contiguous", "batch": b, "ctx": c, "sum_ctx": b * c, "max_ctx": c,
            "hq": 32, "hkv": 8, "d": 128, "block": 16} for b in (1, 4, 16) for c in (256, 1024, 4096, 16384)]
    gemm = [{"M": m, "K": k, "N": n} for m in (1, 2, 4) for k, n in ((2048, 2048), (4096, 6144), (4096, 28672))]
    for table, rows, floor in (("attn_decode", dec, 0.007), ("gemm", gemm, 0.005)):
        for r in rows:
            flops, nbytes, _ = footprint(table, ELEMENTWISE_BYTES)(r)
            r["ms"] = flushed_model(truth, floor, 0.0, nbytes)
        with (tmp_path / f"{table}.csv").open("w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
    fit = fit_write_back(Path(tmp_path))["fit"]
    assert fit["dirty_l2_mb"] == pytest.approx(30.0, abs=0.1)
    assert fit["write_back_tbs"] == pytest.approx(4.0, rel=1e-3)
    assert fit["floor_us"]["decode"] == pytest.approx(7.0, rel=1e-2)
    assert fit["rms"] < 1e-3
