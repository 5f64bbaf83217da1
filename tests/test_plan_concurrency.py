"""Plans that size by concurrency: users per replica, replicas for N closed-loop users."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.io.specload import SpecError
from sim.planning.capacity import SLO
from sim.planning.concurrency import (
    is_concurrency_plan,
    load_concurrency_plan,
    max_users,
    replicas_for_users,
    run_concurrency_plan,
)
from sim.planning.planspec import SearchSpec

ROOT = Path(__file__).resolve().parent.parent
SLO_ = SLO(ttft_p99_s=1.0)


def fake_run_at(limit: int):
    """A replica whose p99 TTFT is 0.5 s up to `limit` users and 2 s past it."""
    def run_at(users, seed):
        t = 0.5 if users <= limit else 2.0
        return {"ttft_s": {"p99": t}, "tpot_s": {"p99": 0.01}, "e2e_s": {"p99": 1.0},
                "requests": {"rejected": 0}, "goodput": None}
    return run_at


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 3000), st.integers(1, 64))
def test_the_user_search_finds_the_largest_passing_count_within_its_tolerance(limit, start):
    s = SearchSpec(rate_start=start, rel_tol=0.01, max_probes=40, rate_max=8192)
    lo, hi, probes = max_users(fake_run_at(limit), SLO_, [1], s)
    assert lo <= limit < hi  # lo passed and hi failed, by construction of the fake
    assert hi - lo <= max(1, int(lo * 0.01))
    assert all(float(p.rate).is_integer() for p in probes)


def test_one_user_that_breaks_the_slos_means_none_sustained():
    lo, hi, _ = max_users(fake_run_at(0), SLO_, [1], SearchSpec(rate_start=8))
    assert (lo, hi) == (0, 1)


def test_replicas_for_users_apply_the_margin_and_n_plus_1():
    # hand-worked: 512 users x 1.1 = 563.2 users / 100 a replica -> 6 (5.632 rounded up)
    assert replicas_for_users(512, 100, SearchSpec()) == 6
    assert replicas_for_users(512, 100, SearchSpec(redundancy="n+1")) == 7
    assert replicas_for_users(10, 100, SearchSpec(min_replicas=2)) == 2
    assert replicas_for_users(500, 110, SearchSpec(margin=0.1)) == 5  # 550 / 110 = 5 exactly


def _plan(tmp_path, **over) -> Path:
    scen = tmp_path / "s.yaml"
    scen.write_text(yaml.safe_dump({
        "name": "s", "seed": 3, "model": "llama-3-8b", "gpu": "h200-sxm", "runtime": "cuda-graph",
        "scheduler": {"policy": "continuous", "max_num_seqs": 64},
        "workload": {"clients": {"concurrency": 4, "requests_per_client": 4,
                                 "think": {"kind": "fixed", "mean_s": 1.0}},
                     "prompt": {"kind": "fixed", "value": 256}, "output": {"kind": "fixed", "value": 32}}}))
    data = {"name": "u", "scenario": str(scen), "target_users": 24, "slo": {"ttft_p99_s": 0.2, "tpot_p99_s": 0.03},
            "search": {"seeds": 1, "fleet_traffic_s": 20, "rate_start": 8, "rel_tol": 0.3, "fleet_checks": 1},
            "probe_s": 15, "candidates": {"gpu": ["a100-80gb"]}}
    data.update(over)
    p = tmp_path / "plan.yaml"
    p.write_text(yaml.safe_dump(data))
    return p


def test_a_concurrency_plan_sizes_by_users_and_checks_the_fleet_with_them(tmp_path):
    p = _plan(tmp_path)
    assert is_concurrency_plan(p)
    r = run_concurrency_plan(load_concurrency_plan(p), workers=1)
    row = r["candidates"][0]
    assert row["status"] == "ok" and row["users_per_replica"] >= 1
    assert row["replicas"] == replicas_for_users(24, row["users_per_replica"], SearchSpec())
    check = r["fleet_checks"][0]
    assert check["users"] == 27  # ceil(24 x 1.1)
    assert check["traffic_s"] == 20
    rec = r["recommended"]
    assert rec is not None and rec["holds"]
    at = next(c for c in check["checks"] if c["replicas"] == rec["replicas"])
    assert at["passed"] and at["ttft_p99_s"] <= 0.2
    if rec["replicas"] > 1:  # the check moved down to a count whose one fewer breaks
        assert not next(c for c in check["checks"] if c["replicas"] == rec["replicas"] - 1)["passed"]
    # a closed loop's throughput obeys the response-time law: X <= N / Z (Z = 1 s think)
    assert at["request_throughput"] <= 27 / 1.0
    # users vs latency (the report's plot): every probe, fewest users first; the most users
    # that passed is the count one replica sustains, the fewest that failed the first failing
    curve = [c for c in r["probe_curves"] if c["candidate"] == row["candidate"]]
    assert len(curve) == row["probes"] and [c["users"] for c in curve] == sorted(c["users"] for c in curve)
    assert max(c["users"] for c in curve if c["passed"]) == row["users_per_replica"]
    if row["fail_users"] is not None:
        assert min(c["users"] for c in curve if not c["passed"]) == row["fail_users"]
    assert "probe_curve" not in row  # kept out of candidates.csv


def test_a_plan_with_both_target_users_and_target_rate_is_refused_in_one_line(tmp_path):
    p = _plan(tmp_path, target_rate=4)
    with pytest.raises(SpecError, match="target_rate"):
        load_concurrency_plan(p)
    out = subprocess.run([sys.executable, "-m", "sim", "plan", str(p), "--out", str(tmp_path / "o")],
                         capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("plan", [p for p in sorted((ROOT / "plans").glob("*.yaml")) if is_concurrency_plan(p)],
                         ids=lambda p: p.name)
def test_every_shipped_concurrency_plan_loads_and_its_candidates_check(plan):
    from sim.planning.candidates import check_candidates
    from sim.planning.planspec import plan_scenario

    spec = load_concurrency_plan(plan)
    check_candidates(spec.file, spec.candidates, plan_scenario(spec), {"slo": spec.slo.as_scenario_slo()})
    assert spec.target_users >= 1
