"""The length-aware router of mixed fleets: pools by request length, each pool's own router."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.config.scenario import scenario_from_dict
from sim.engine.runner import run
from sim.io.specload import SpecError
from sim.policies.router import ReplicaLoad, RouterSpec, make_router

ROOT = Path(__file__).resolve().parent.parent


def scenario(router, groups=None, n=200):
    return scenario_from_dict({
        "name": "t", "seed": 3, "model": "llama-3-8b", "gpu": "h200-sxm", "runtime": "cuda-graph",
        "cluster": {"router": router, "groups": groups or [
            {"name": "short", "count": 2, "gpu": "a100-80gb"}, {"name": "long", "count": 1}]},
        "workload": {"num_requests": n, "arrival": {"kind": "poisson", "rate": 30},
                     "prompt": {"kind": "uniform", "low": 16, "high": 4096},
                     "output": {"kind": "uniform", "low": 1, "high": 256}}})


def group(replica: str) -> str:
    return replica.rsplit("-", 1)[0]


def test_a_threshold_sends_exactly_the_requests_above_it_to_the_long_pool():
    out = run(scenario({"policy": "length", "length_thresholds": [1000]}))
    req = out.requests
    assert len(req) == 200 and (req.status == "finished").all()
    long_ = req.replica.map(group) == "long"
    assert (long_ == (req.prompt_tokens > 1000)).all()
    assert 0 < long_.sum() < 200
    # within the short pool, the pool's own router (least outstanding) uses both replicas
    assert set(req[~long_].replica) == {"short-0", "short-1"}


def test_by_total_length_the_output_counts_too():
    out = run(scenario({"policy": "length", "length_thresholds": [1000], "length_by": "total"}))
    req = out.requests
    total = req.prompt_tokens + req.output_tokens
    assert ((req.replica.map(group) == "long") == (total > 1000)).all()
    # some request is long by total but short by prompt alone, so the two rules differ here
    assert ((total > 1000) & (req.prompt_tokens <= 1000)).any()


def test_length_groups_name_the_pools_in_threshold_order():
    out = run(scenario({"policy": "length", "length_thresholds": [1000],
                        "length_groups": ["long", "short"]}))
    req = out.requests
    assert ((req.replica.map(group) == "long") == (req.prompt_tokens <= 1000)).all()


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 10_000), min_size=1, max_size=4, unique=True),
       st.integers(1, 20_000), st.integers(0, 5_000))
def test_a_request_goes_to_the_first_pool_whose_threshold_holds_its_length(ts, prompt, output):
    ts = sorted(ts)
    spec = RouterSpec(policy="length", length_thresholds=tuple(ts))
    r = make_router(spec, np.random.default_rng(0), [f"p{i}" for i in range(len(ts) + 1)])
    want = sum(prompt > t for t in ts)  # thresholds below the length, by counting
    assert r.pool(prompt, output) == want
    loads = [ReplicaLoad() for _ in range(len(ts) + 1)]
    assert r.choose_request(None, loads, prompt, output) == want  # one replica a pool


@pytest.mark.parametrize("router,where", [
    ({"policy": "length"}, "length_thresholds"),
    ({"policy": "length", "length_thresholds": [2048, 1024]}, "length_thresholds"),
    ({"policy": "length", "length_thresholds": [0]}, "length_thresholds"),
    ({"policy": "length", "length_thresholds": [512, 2048]}, "length_thresholds"),  # 3 pools, 2 groups
    ({"policy": "length", "length_thresholds": [512], "length_groups": ["short"]}, "length_groups"),
    ({"policy": "length", "length_thresholds": [512], "length_groups": ["short", "docs"]}, "length_groups"),
    ({"policy": "length", "length_thresholds": [512], "length_groups": ["short", "short"]}, "length_groups"),
    ({"policy": "least_outstanding", "length_thresholds": [512]}, "length_thresholds"),
    ({"policy": "length", "length_thresholds": [512], "within": "length"}, "within"),
])
def test_a_wrong_length_router_is_refused_naming_the_field(router, where):
    with pytest.raises(SpecError, match=where):
        scenario(router)


def test_the_cli_refuses_a_wrong_length_router_in_one_line_with_exit_2(tmp_path):
    p = subprocess.run([sys.executable, "-m", "sim", "run", str(ROOT / "scenarios/mixed_fleet.yaml"),
                        "--set", "cluster.router.length_thresholds=[4096,1024]", "--out", str(tmp_path / "o")],
                       capture_output=True, text=True, cwd=ROOT)
    assert p.returncode == 2
    assert len(p.stderr.strip().splitlines()) == 1 and "length_thresholds" in p.stderr
    assert not (tmp_path / "o").exists()


def test_a_disaggregated_fleet_routes_prefills_by_length_and_decodes_by_the_pool_router():
    sc = scenario({"policy": "length", "length_thresholds": [1000]}, groups=[
        {"name": "pshort", "count": 1, "role": "prefill", "gpu": "a100-80gb"},
        {"name": "plong", "count": 1, "role": "prefill"},
        {"name": "dec", "count": 2, "role": "decode"}], n=120)
    req = run(sc).requests
    assert (req.status == "finished").all()
    # a request done at its first token never leaves its prefill replica (no prefill_replica)
    prefilled = req.prefill_replica.where(req.prefill_replica.astype(bool), req.replica)
    assert ((prefilled.map(group) == "plong") == (req.prompt_tokens > 1000)).all()
    moved = req.prefill_replica.astype(bool)
    assert moved.sum() > 100 and set(req.replica[moved].map(group)) == {"dec"}


def test_a_length_router_is_named_with_its_thresholds():
    from sim.planning.fleet import router_label

    spec = RouterSpec(policy="length", length_thresholds=(1024, 4096), within="random")
    assert router_label(spec) == "length router (thresholds 1024, 4096 prompt tokens, random within a pool)"
