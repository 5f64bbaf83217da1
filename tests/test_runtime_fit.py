"""Fitting a runtime profile: known answers on the shipped H200 grid, and no search over a
per-sequence host term that no row of the grid can tell apart."""

from __future__ import annotations

import pytest

import sim.fit.runtime_fit as runtime_fit
from sim.costmodel.profiles import PROFILES_DIR

GRID = PROFILES_DIR / "h200-sxm" / "iter_grid_eager_reference.csv"
# fitted before the search skipped terms without rows (same numbers: nothing else changed);
# refitted when the H200 tables lost the L2 flush's write-back (sim/costmodel/l2flush.py)
EXPECTED = {
    ("prefill", "decode", "verify"): dict(
        host_ms_per_step=1.9062, host_ms_per_layer=0.55, host_ms_per_layer_decode_extra=0.0575,
        host_ms_per_prefill_seq_layer=0.03984, host_ms_per_verify_seq_layer=0.22188,
        gpu_scale=0.9812, gpu_scale_decode=1.1625),
    ("prefill", "decode"): dict(
        host_ms_per_step=1.7812, host_ms_per_layer=0.55, host_ms_per_layer_decode_extra=0.06313,
        host_ms_per_prefill_seq_layer=0.04219, host_ms_per_verify_seq_layer=0.0,
        gpu_scale=0.9812, gpu_scale_decode=1.1625),
    ("decode",): dict(
        host_ms_per_step=0.9688, host_ms_per_layer=0.65, host_ms_per_layer_decode_extra=0.00109,
        host_ms_per_prefill_seq_layer=0.0, host_ms_per_verify_seq_layer=0.0,
        gpu_scale=1.1562, gpu_scale_decode=1.1562),
}
SEARCHED = {("prefill", "decode", "verify"): 5, ("prefill", "decode"): 4, ("decode",): 3}


@pytest.mark.parametrize("kinds", sorted(EXPECTED), ids="-".join)
def test_shipped_grid_fits_the_known_runtime_searching_only_terms_with_rows(kinds, monkeypatch):
    dims = []
    search = runtime_fit._search

    def counting(model, ranges, rounds=5):
        dims.append(len(ranges))
        return search(model, ranges, rounds)
    monkeypatch.setattr(runtime_fit, "_search", counting)
    spec, table = runtime_fit.fit(runtime_fit.read_grid(GRID), "h200-sxm", "x", kinds=kinds)
    assert {k: getattr(spec, k) for k in EXPECTED[kinds]} == EXPECTED[kinds]
    assert dims[0] == SEARCHED[kinds]  # the shared host terms; then decode's own two
    assert len(table) == sum(r["kind"] in kinds for r in runtime_fit.read_grid(GRID))


# the host terms a synthetic grid is made with (RuntimeSpec's names in the comments)
TRUE = {"a": 1.5,    # host_ms_per_step
        "b": 0.5,    # host_ms_per_layer
        "c": 0.04,   # host_ms_per_prefill_seq_layer
        "d": 0.2,    # host_ms_per_verify_seq_layer
        "s": 1.1,    # gpu_scale
        "e": 0.05,   # host_ms_per_layer_decode_extra
        "sd": 1.2}   # gpu_scale_decode


def test_fit_recovers_the_host_terms_a_synthetic_grid_was_made_with():
    """The shipped grid's step shapes, timed by the docstring's formula written out here:
    max(a + b L + e L [decode] + (c P + d V) L, scale x kernel time); on the 1B (16 layers)
    and 8B (32 layers) models the host side binds on 50 of the 66 rows."""
    from sim.costmodel.models import load_model

    rows = runtime_fit.read_grid(GRID)
    kernel_ms = runtime_fit.gpu_times(rows, "h200-sxm")
    t = TRUE
    synthetic = []
    for r, g in zip(rows, kernel_ms, strict=True):
        layers = load_model(r["model"]).layers
        decode = r["kind"] == "decode"
        p = r["batch"] if r["kind"] == "prefill" else 0
        v = r["batch"] if r["kind"] == "verify" else 0
        host = t["a"] + t["b"] * layers + t["e"] * layers * decode + (t["c"] * p + t["d"] * v) * layers
        synthetic.append({**r, "ms": max(host, (t["sd"] if decode else t["s"]) * g)})
    spec, table = runtime_fit.fit(synthetic, "h200-sxm", "x")
    assert spec.host_ms_per_step == pytest.approx(1.5, abs=0.02)
    assert spec.host_ms_per_layer == pytest.approx(0.5, abs=0.005)
    assert spec.host_ms_per_layer_decode_extra == pytest.approx(0.05, abs=0.002)
    assert spec.host_ms_per_prefill_seq_layer == pytest.approx(0.04, abs=0.001)
    assert spec.host_ms_per_verify_seq_layer == pytest.approx(0.2, abs=0.002)
    assert spec.gpu_scale == pytest.approx(1.1, abs=0.01)
    assert spec.gpu_scale_decode == pytest.approx(1.2, abs=0.01)
    assert max(abs(row["err"]) for row in table) < 0.01
