"""The accuracy suite (benchmarks/fidelity/accuracy.py) at a small size: medians stay under
their stated limits, and the 90 % prediction intervals cover what they claim."""

from __future__ import annotations

import csv
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.fidelity import accuracy  # noqa: E402
from sim.planning.uncertainty import interval_band, load_bands, prediction_interval  # noqa: E402


@pytest.fixture(scope="module")
def errs():
    return accuracy.collect(folds=5)  # the live log in 5 blocked folds, as measured


def test_every_dataset_median_error_stays_under_its_limit(errs):
    s = accuracy.summary(errs)
    assert set(s) == set(accuracy.LIMITS)  # every dataset the project uses is scored
    assert accuracy.failures(errs) == []


def test_the_published_rows_are_all_scored(errs):
    from benchmarks.fidelity.published_check import read_rows
    ids = {e.id for e in errs if e.dataset == "published"}
    assert ids == {r.id for r in read_rows()}


FLAGS = {"up_to", "other_batch", "other_shapes", "other_setting"}


def test_the_published_ratio_rows_are_all_scored_each_with_its_source_and_caveat(errs):
    rows = accuracy.read_ratios()
    assert {e.id for e in errs if e.dataset == "published-ratios"} == {r["id"] for r in rows}
    for r in rows:
        assert r["source"] and r["compared"] and r["scenario"] and r["overrides"], r["id"]
        assert r["flag"] in FLAGS and r["flag_note"], r["id"]  # every row says how it differs
        assert r["kind"] in {"ratio", "absolute"} and float(r["published"]) > 0


def test_a_published_ratio_error_is_simulated_over_published_minus_one(errs, tmp_path):
    """Doubling every published figure halves simulated / published: 1 + e becomes (1 + e) / 2."""
    rows = accuracy.read_ratios()
    doubled = tmp_path / "ratios.csv"
    with doubled.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows({**r, "published": str(2 * float(r["published"]))} for r in rows)
    before = {e.id: e.error for e in errs if e.dataset == "published-ratios"}
    after = {e.id: e.error for e in accuracy.ratio_errors(doubled)}
    assert after == pytest.approx({k: (1 + v) / 2 - 1 for k, v in before.items()})


def test_90_percent_intervals_cover_about_90_percent_of_held_out_data(errs):
    s = accuracy.summary(errs)
    # measured at 1412c97 + this change (5 folds): published 94 %, live held out 97 %,
    # grid held out by model 79 %, all calibration datasets 88 % (load extrapolation 95 %)
    assert s["published"]["all"]["coverage"] >= 0.85
    assert s["live-heldout"]["all"]["coverage"] >= 0.85
    assert s["grid-heldout"]["all"]["coverage"] >= 0.70
    calibrated = [e for e in errs if e.dataset in accuracy.CALIBRATION]
    assert accuracy.stats(calibrated)["coverage"] >= 0.85


def test_interval90_in_the_bands_file_is_not_narrower_than_the_data_gives(errs):
    """Each class with enough rows has a shipped interval90 at least 80 % of the suite's
    measured 90th percentile (a stale, too-narrow file fails here; a re-costing that moves
    rows between classes, e.g. H100/A100 attention derived from the H200 tables, moves
    these by a few points and should be followed by `accuracy.py --intervals` and a new
    file, which this test does not force)."""
    bands = load_bands()
    for cls, r in accuracy.fit_intervals(errs).items():
        if r["rows"] >= 10:
            assert bands[cls]["interval90"] >= 0.8 * r["interval90"], (cls, r)


def test_prediction_interval_is_seed_spread_widened_by_the_class_interval():
    measured_only = {"exact": 0.6, "interpolated": 0.4}
    b = load_bands()["measured"]["interval90"]
    assert interval_band(measured_only) == pytest.approx(b)
    lo, hi = prediction_interval(1.0, measured_only, [0.9, 1.1, 1.0])
    assert (lo, hi) == pytest.approx((0.9 * (1 - b), 1.1 * (1 + b)))
    half = {"exact": 0.5, "analytic": 0.5}
    assert interval_band(half) == pytest.approx((b + load_bands()["analytic"]["interval90"]) / 2)
    assert interval_band(None) == max(v["interval90"] for v in load_bands().values())


def test_run_intervals_widen_latencies_and_throughput_by_the_band_each_way():
    from sim.planning.uncertainty import run_intervals
    prov = {"exact": 1.0}
    b = load_bands()["measured"]["interval90"]
    one = {"lookup_provenance": prov, "ttft_s": {"p50": 0.1, "p99": 0.4},
           "tpot_s": {"p50": 0.02, "p99": 0.03}, "e2e_s": {"p50": 2.0},
           "output_token_throughput": 1000.0}
    two = {**one, "ttft_s": {"p50": 0.12, "p99": 0.5}, "output_token_throughput": 900.0}
    r = run_intervals([one, two])
    assert r["TTFT p50 (s)"] == pytest.approx((0.1, 0.1 * (1 - b), 0.12 * (1 + b)))
    assert r["output tok/s"] == pytest.approx((1000, 900 / (1 + b), 1000 / (1 - b)))
    assert r["E2E p50 (s)"] == pytest.approx((2.0, 2.0 * (1 - b), 2.0 * (1 + b)))


def test_run_cli_prints_intervals_on_request(tmp_path, capsys):
    from sim.cli.main import main
    assert main(["run", str(ROOT / "scenarios" / "quickstart.yaml"), "--out", str(tmp_path / "r"),
                 "--no-progress", "--interval", "--set", "workload.num_requests=40"]) == 0
    text = capsys.readouterr().out
    assert "90 % prediction intervals" in text and "TPOT p50 (s)" in text
