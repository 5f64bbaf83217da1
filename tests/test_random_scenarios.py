"""Random valid scenarios over every policy x KV manager x prefix caching (with a host
tier) x speculative decoding x tight memory x preemption mode x clusters (a fleet behind
a router, or prefill and decode pools with their own limits): each runs to the end and
keeps the engine's invariants on every replica (requests and KV blocks conserved, batch
places and step budgets, timing order).

    LLMSIM_FUZZ_EXAMPLES=5000 python -m pytest tests/test_random_scenarios.py -q

runs more examples, freshly drawn, than the default (the same quick pass over the space
in each test run).
"""

from __future__ import annotations

import math
import os

import numpy as np
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from sim.config.scenario import scenario_from_dict
from sim.engine.runner import run
from sim.io.specload import SpecError
from sim.policies.batch import FINISHED, REJECTED

EXAMPLES = int(os.environ.get("LLMSIM_FUZZ_EXAMPLES", "300"))
EPS = 1e-9


@st.composite
def scenarios(draw) -> dict:
    layout = draw(st.sampled_from(["one", "one", "fleet", "disaggregated"]))
    # prefill and decode pools need paged KV and continuous or chunked batching
    policy = draw(st.sampled_from(["continuous", "chunked"] if layout == "disaggregated"
                                  else ["continuous", "static", "chunked"]))
    # chunked prefill needs paged KV (the loader refuses the rest; fewer draws wasted)
    manager = ("paged" if policy == "chunked" or layout == "disaggregated"
               else draw(st.sampled_from(["paged", "contiguous"])))
    block_size = draw(st.sampled_from([1, 2, 4, 8, 16, 32, 48]))
    max_model_len = draw(st.sampled_from([64, 256, 1024, None]))
    kv = {
        "manager": manager,
        "block_size": block_size,
        "num_blocks": draw(st.integers(4, 400 if manager == "paged" else 6000)),
        "max_model_len": max_model_len,
        "reserve": draw(st.sampled_from(["max_model_len", "max_tokens"])),
        "swap_space_gib": draw(st.sampled_from([0.0, 0.0005, 4.0])),
        "prefix_caching": manager == "paged" and policy != "static" and draw(st.booleans()),
        "prefix_cache_host_gib": draw(st.sampled_from([0.0, 0.001, 0.01, 0.05])),
    }
    scheduler = {
        "policy": policy,
        "max_num_seqs": draw(st.integers(1, 32)),
        "max_num_batched_tokens": draw(st.sampled_from([8, 32, 100, 512, 2048])),
        "watermark": draw(st.sampled_from([0.0, 0.01, 0.1, 0.3])),
        "preemption": draw(st.sampled_from(["recompute", "swap"])),
        "max_batch_size": draw(st.integers(1, 8)),
        "max_wait_s": draw(st.sampled_from([0.0, 0.01, 0.5])),
    }
    arrival = {"kind": draw(st.sampled_from(["poisson", "constant", "gamma"])),
               "rate": draw(st.sampled_from([1.0, 50.0, 1000.0]))}
    if arrival["kind"] == "gamma":
        arrival["cv"] = draw(st.sampled_from([0.5, 4.0]))
    workload = {
        "num_requests": draw(st.integers(1, 24)),
        "arrival": arrival,
        "prompt": draw(st.sampled_from([
            {"kind": "uniform", "low": draw(st.integers(1, 64)), "high": draw(st.integers(64, 400))},
            {"kind": "lognormal", "median": 100, "sigma": 1.0, "max": 2000},
        ])),
        "output": {"kind": "uniform", "low": 1, "high": draw(st.integers(1, 80))},
    }
    if draw(st.booleans()):
        workload["max_output_tokens"] = draw(st.integers(1, 100))
    prefixes = draw(st.sampled_from(["none", "shared", "multi"]))
    if prefixes == "shared":
        workload["shared_prefix"] = {"tokens": draw(st.sampled_from([16, 40, 64, 160, 256])),
                                     "fraction": draw(st.sampled_from([0.5, 1.0])),
                                     "groups": draw(st.integers(1, 3))}
    elif prefixes == "multi":
        workload["multi_turn"] = {"turns": draw(st.integers(2, 4))}
    method = "none"
    if policy == "continuous":
        method = draw(st.sampled_from(["none", "ngram", "draft_model", "self_draft"]))
    speculative = {"method": method}
    if method != "none":
        speculative["k"] = draw(st.integers(1, 5))
        speculative["disable_above_batch"] = draw(st.sampled_from([None, 1, 3, 7]))
        speculative["acceptance"] = draw(st.sampled_from([
            {"kind": "fixed", "alpha": 0.0}, {"kind": "fixed", "alpha": 0.8},
            {"kind": "fixed", "alpha": 1.0}, {"kind": "per_request", "mean": 0.6, "std": 0.2}]))
        if method == "draft_model":
            speculative["draft_model"] = "llama-3.2-1b"
    if policy == "continuous":  # as vLLM without chunked prefill: budget >= context window
        kv["max_model_len"] = min(kv["max_model_len"] or 8192, scheduler["max_num_batched_tokens"])
    out = {
        "name": "fuzz", "seed": draw(st.integers(0, 2**16)), "model": "llama-3-8b",
        "kv": {k: v for k, v in kv.items() if v is not None}, "scheduler": scheduler,
        "workload": workload, "speculative": speculative,
    }
    if layout != "one":
        out["cluster"] = draw(clusters(layout))
    return out


@st.composite
def clusters(draw, layout: str) -> dict:
    """A fleet of one group behind a router, or a prefill pool and a decode pool whose
    batch places and KV blocks are drawn apart from the scenario's (small, to make the
    decode replica preempt while KV transfers arrive)."""
    router = {"policy": draw(st.sampled_from(["round_robin", "least_outstanding", "least_kv",
                                              "affinity"])),
              "staleness_s": draw(st.sampled_from([0.0, 0.05]))}
    if layout == "fleet":
        return {"router": router, "groups": [{"name": "g", "count": draw(st.integers(2, 3))}]}
    decode = {"name": "d", "count": draw(st.integers(1, 2)), "role": "decode",
              "scheduler": {"max_num_seqs": draw(st.integers(1, 8))},
              "kv": {"num_blocks": draw(st.integers(8, 80))}}
    return {"router": router, "groups": [
        {"name": "p", "count": draw(st.integers(1, 2)), "role": "prefill"}, decode],
        "kv_transfer": {"link": draw(st.sampled_from(["nvlink4", "infiniband-ndr400"]))}}


def replica_limits(data: dict, name: str) -> tuple[int, int | None]:
    """(most sequences a step may compute, most tokens a prefilling step may compute) of
    the replica called `name`, from the drawn scenario and its group's overrides."""
    sched = dict(data["scheduler"])
    for g in (data.get("cluster") or {}).get("groups", []):
        if name.startswith(f"{g['name']}-"):
            sched.update(g.get("scheduler", {}))
    if sched["policy"] == "static":
        return sched["max_batch_size"], None
    return sched["max_num_seqs"], sched["max_num_batched_tokens"]


def check_invariants(data: dict, out) -> None:
    seqs = out.result.seqs
    # every request ends finished, or rejected with a reason
    assert all(s.state in (FINISHED, REJECTED) for s in seqs)
    assert all(s.reject_reason for s in seqs if s.state == REJECTED)
    for r in out.result.replicas:
        kv = r.kv
        # KV blocks conserved (over-allocation raises during the run)
        assert kv.free_blocks == kv.num_blocks, r.name
        steps = out.steps[out.steps.replica == r.name]
        assert (steps.kv_blocks_used <= kv.num_blocks).all(), r.name
        # batch places and step budgets
        max_seqs, budget = replica_limits(data, r.name)
        assert (steps.num_seqs <= max_seqs).all(), (r.name, steps.num_seqs.max(), max_seqs)
        if budget is not None:
            prefill = steps[steps.kind.isin(["prefill", "mixed"])]
            assert (prefill.num_tokens <= budget).all(), (r.name, prefill.num_tokens.max())
        # steps in order and not overlapping
        t0, t1 = steps.t_start.to_numpy(), steps.t_end.to_numpy()
        assert (t1 >= t0).all()
        assert (t0[1:] >= t1[:-1] - EPS).all(), r.name
    # per request: arrival <= scheduled <= first token <= finish, finite times
    for s in seqs:
        if s.sched_t >= 0:
            assert s.arrival <= s.sched_t + EPS
        if s.first_token_t >= 0:
            assert s.sched_t >= 0 and s.sched_t <= s.first_token_t + EPS
        if s.state == FINISHED:
            assert s.first_token_t >= 0 and s.first_token_t <= s.finish_t + EPS
            assert math.isfinite(s.finish_t - s.arrival)
    fin = out.requests[out.requests.status == "finished"]
    assert np.isfinite(fin.ttft_s).all() and np.isfinite(fin.e2e_s).all()


@settings(max_examples=EXAMPLES, deadline=None, derandomize="LLMSIM_FUZZ_EXAMPLES" not in os.environ,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(data=scenarios())
def test_random_valid_scenarios_run_to_the_end_and_keep_the_engine_invariants(data):
    try:
        sc = scenario_from_dict(data)
    except SpecError:
        assume(False)  # a combination the loader refuses
    out = run(sc)
    check_invariants(data, out)
