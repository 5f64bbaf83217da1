"""Fitting a runtime profile: known answers on the shipped H200 grid, and no search over a
per-sequence host term that no row of the grid can tell apart."""

from __future__ import annotations

import pytest

import sim.runtime_fit as runtime_fit
from sim.profiles import PROFILES_DIR

GRID = PROFILES_DIR / "h200-sxm" / "iter_grid_eager_reference.csv"
# fitted before the search skipped terms without rows (same numbers: nothing else changed);
# refitted when the H200 tables lost the L2 flush's write-back (sim/l2flush.py)
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
