"""Ranges on a plan's figures (sim/planning/uncertainty.py): the step model's band by
what a run stands on, from data/step_error_bands.yaml, and the seed-to-seed spread."""

from __future__ import annotations

import pytest

from sim.io.specload import load_yaml
from sim.planning.uncertainty import BANDS_FILE, candidate_ranges, load_bands, model_band, stands_on


def test_every_band_names_its_source_and_the_measured_band_is_the_warm_grid_error():
    raw = load_yaml(BANDS_FILE)["classes"]
    bands = load_bands()
    assert set(bands) == {"measured", "derived", "extrapolated", "analytic"}
    assert all(b["source"] for b in bands.values())
    # the README's warm-grid accuracy table: 5.7 % mean abs error over 66 steps
    assert raw["measured"]["band"] == 0.057 and "5.7 %" in raw["measured"]["source"]
    # docs/fidelity.md: median |time error| 8.4 % over the 50 published rows
    assert raw["derived"]["band"] == 0.084 and "8.4 %" in raw["derived"]["source"]


def test_band_is_the_share_weighted_mean_of_the_classes():
    b = {k: v["band"] for k, v in load_bands().items()}
    assert model_band({"exact": 0.3, "interpolated": 0.2, "derived": 0.0, "extrapolated": 0.0,
                       "analytic": 0.5}) == pytest.approx(0.5 * b["measured"] + 0.5 * b["analytic"])
    assert model_band({"exact": 1.0}) == pytest.approx(b["measured"])
    assert model_band({}) == max(b.values())  # unknown: the widest band
    assert stands_on({"exact": 0.05, "extrapolated": 0.4, "analytic": 0.55}) == \
        "measured 5% / derived 0% / extrapolated 40% / analytic 55%"


def test_ranges_follow_the_rate_bracket_widened_by_the_band():
    band = load_bands()["measured"]["band"]
    prov = {"exact": 1.0}
    r = candidate_ranges(target=24.0, rate=10.0, fail_rate=11.0, at_rate_prov=prov,
                         share_p99s={"ttft": [0.4, 0.5]}, share_prov=prov, gpus_per_replica=2,
                         usd_per_gpu_hour=3.0, usd_per_m=1.5, usd_per_hour=18.0)
    lo, hi = 10.0 * (1 - band), 11.0 * (1 + band)  # 9.43 .. 11.63 req/s a replica
    assert r["sustained_rate_range"] == pytest.approx((lo, hi))
    assert r["replicas_range"] == (3, 3)  # ceil(24 / 11.63) = ceil(24 / 9.43) = 3
    assert r["usd_per_hour_range"] == pytest.approx((18.0, 18.0))
    assert r["ttft_p99_range_s"] == pytest.approx((0.4 * (1 - band), 0.5 * (1 + band)))
    assert r["measured_share"] == 1.0
    wide = candidate_ranges(24.0, 10.0, 11.0, {"analytic": 1.0}, {"ttft": [0.4]}, None, 1, 3.0, 1.0, 9.0,
                            extra_replicas=1)
    # analytic band 25 %: 7.5 .. 13.75 req/s: ceil(24/13.75)+1 = 3 .. ceil(24/7.5)+1 = 5 replicas
    assert wide["replicas_range"] == (3, 5)
    assert wide["usd_per_m_output_tokens_range"] == pytest.approx((1.0, 5 / 3))
