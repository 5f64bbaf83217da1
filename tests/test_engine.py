"""Engine behaviour: known timelines, queueing theory, invariants over random workloads."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sim.config.scenario import scenario_from_dict
from sim.costmodel.latency import StepLatency
from sim.costmodel.models import load_model
from sim.costmodel.profiles import load_profile
from sim.costmodel.runtime import load_runtime
from sim.engine.runner import run

ROOT = __import__("pathlib").Path(__file__).resolve().parent.parent


def scenario(**over):
    base = {
        "name": "t",
        "seed": 3,
        "model": "llama-3-8b",
        "gpu": "h200-sxm",
        "runtime": "cuda-graph",
        # these tests are about the prefill-first scheduler (vLLM v0), named since the
        # default became chunked prefill (vLLM V1); a test of another policy names its own
        "scheduler": {"policy": "continuous"},
        "workload": {
            "num_requests": 20,
            "arrival": {"kind": "constant", "rate": 0.05},
            "prompt": {"kind": "fixed", "value": 512},
            "output": {"kind": "fixed", "value": 64},
        },
    }
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(base.get(k), dict):
            old = dict(base[k])
            if "lengths" in v:
                old.pop("prompt"), old.pop("output")
            base[k] = {**old, **v}
        else:
            base[k] = v
    return scenario_from_dict(base)


def latency_model(runtime="cuda-graph"):
    return StepLatency(load_model("llama-3-8b"), load_profile("h200-sxm"), load_runtime(runtime))


def test_lightly_loaded_request_takes_one_prefill_then_one_decode_step_per_token():
    out = run(scenario())
    lat = latency_model()
    req = out.requests
    prefill = lat.prefill([(512, 0)])
    decodes = [lat.decode(1, 512 + j) for j in range(1, 64)]
    assert (req.status == "finished").all()
    assert np.allclose(req.ttft_s, prefill, rtol=1e-9)
    assert np.allclose(req.tpot_s, sum(decodes) / 63, rtol=1e-9)
    assert np.allclose(req.e2e_s, prefill + sum(decodes), rtol=1e-9)
    assert (req.queue_s == 0).all()


def test_eager_runtime_floors_small_steps_at_the_host_launch_time():
    out = run(scenario(runtime="h200-eager-reference"))
    rt = load_runtime("h200-eager-reference")
    host = (rt.host_ms_per_step + (rt.host_ms_per_layer + rt.host_ms_per_layer_decode_extra) * 32) / 1e3
    assert out.requests.tpot_s.median() == pytest.approx(host, rel=1e-6)


def test_batch_of_one_with_constant_service_matches_md1_mean_wait():
    # max_num_seqs=1 and one output token: each request is one prefill step of fixed
    # length, so the replica is an M/D/1 queue (Pollaczek-Khinchine mean wait).
    lat = latency_model()
    service = lat.prefill([(256, 0)])
    lam = 0.7 / service
    out = run(scenario(
        seed=11,
        scheduler={"max_num_seqs": 1},
        workload={"num_requests": 20000, "arrival": {"kind": "poisson", "rate": lam},
                  "prompt": {"kind": "fixed", "value": 256}, "output": {"kind": "fixed", "value": 1}},
    ))
    rho = lam * service
    wq = lam * service**2 / (2 * (1 - rho))
    assert out.requests.queue_s.mean() == pytest.approx(wq, rel=0.08)
    assert out.summary["gpu_busy_fraction"] == pytest.approx(rho, rel=0.03)


@pytest.mark.parametrize("runtime", ["cuda-graph", "h200-eager-reference", "h200-eager-live"])
def test_gpu_kernel_time_is_the_busy_time_less_the_host_work(runtime):
    # kernels only: a step is its kernels; an eager stack's busy steps also hold host work
    # (jitter, fitted to whole steps, scales busy time only), so the kernels take less
    out = run(scenario(runtime=runtime, workload={"num_requests": 40,
                                                  "arrival": {"kind": "poisson", "rate": 4.0}}))
    s = out.summary
    busy, kernels = s["gpu_busy_fraction"], s["gpu_kernel_fraction"]
    if runtime == "cuda-graph":
        assert kernels == pytest.approx(busy, rel=1e-9)
    else:
        assert 0 < kernels < 0.9 * busy
    (replica,) = s["per_replica"] if "per_replica" in s else [s]
    assert replica["gpu_kernel_fraction"] == pytest.approx(kernels)


def test_same_seed_gives_identical_requests_csv(tmp_path):
    sc = scenario(workload={"num_requests": 200, "arrival": {"kind": "poisson", "rate": 20.0},
                            "prompt": {"kind": "lognormal", "mean": 600, "sigma": 0.8, "max": 4000},
                            "output": {"kind": "lognormal", "mean": 150, "sigma": 0.8, "max": 1000}})
    a = run(sc).write(tmp_path / "a", plots=False)
    b = run(sc).write(tmp_path / "b", plots=False)
    assert (a / "requests.csv").read_bytes() == (b / "requests.csv").read_bytes()
    assert (a / "steps.csv").read_bytes() == (b / "steps.csv").read_bytes()


def test_preempted_request_resumes_when_blocks_free():
    sc = scenario(
        kv={"num_blocks": 200},
        workload={"num_requests": 30, "arrival": {"kind": "constant", "rate": 100.0},
                  "prompt": {"kind": "fixed", "value": 300}, "output": {"kind": "fixed", "value": 200}},
    )
    out = run(sc)
    req = out.requests
    assert out.summary["preemptions"] > 0
    assert (req.status == "finished").all()
    assert out.result.kv.free_blocks == out.result.kv.num_blocks
    # a resumed request gets one long gap: its E2E exceeds an unpreempted twin's
    pre = req[req.preemptions > 0]
    assert pre.e2e_s.min() > req[req.preemptions == 0].e2e_s.min()


def test_swap_preemption_moves_kv_over_pcie_instead_of_recomputing():
    sc = scenario(
        kv={"num_blocks": 200},
        scheduler={"preemption": "swap"},
        workload={"num_requests": 30, "arrival": {"kind": "constant", "rate": 100.0},
                  "prompt": {"kind": "fixed", "value": 300}, "output": {"kind": "fixed", "value": 200}},
    )
    out = run(sc)
    assert out.summary["preemptions"] > 0
    assert out.summary["kv"]["swap_gib"] > 0
    assert (out.requests.status == "finished").all()
    # swapping never re-prefills: one prefill per request
    assert out.summary["iterations"]["prefill"] <= 30


def test_static_batch_prefills_together_and_decodes_until_its_longest_request_ends():
    sc = scenario(
        scheduler={"policy": "static", "max_batch_size": 4, "max_wait_s": 10.0},
        kv={"manager": "contiguous"},
        workload={"num_requests": 4, "arrival": {"kind": "constant", "rate": 1000.0},
                  "prompt": {"kind": "fixed", "value": 100},
                  "output": {"kind": "uniform", "low": 5, "high": 60}},
    )
    out = run(sc)
    req, steps = out.requests, out.steps
    assert req.first_token_s.nunique() == 1  # one prefill step for the batch
    longest = int(req.output_tokens.max())
    assert (steps.kind == "prefill").sum() == 1
    assert (steps.kind == "decode").sum() == longest - 1
    assert (steps.num_seqs[steps.kind == "decode"] == 4).all()  # finished rows stay as padding
    # the batch waited for its fourth request, not max_wait_s
    assert req.queue_s.max() < 0.01


def test_static_batch_waits_at_most_max_wait_after_the_first_request():
    sc = scenario(
        scheduler={"policy": "static", "max_batch_size": 8, "max_wait_s": 0.5},
        workload={"num_requests": 2, "arrival": {"kind": "constant", "rate": 10.0}},
    )
    out = run(sc)
    assert out.requests.queue_s.iloc[0] == pytest.approx(0.5)
    assert out.requests.queue_s.iloc[1] == pytest.approx(0.4)


def test_contiguous_kv_wastes_most_of_its_reservation_and_paged_almost_none():
    wl = {"num_requests": 300, "arrival": {"kind": "poisson", "rate": 30.0},
          "lengths": {"path": "data/traces/sharegpt_lengths.csv"}}
    paged = run(scenario(workload=wl))
    contig = run(scenario(workload=wl, kv={"manager": "contiguous"}))
    assert paged.summary["kv"]["reserved_unused_share"] < 0.04
    assert contig.summary["kv"]["reserved_unused_share"] > 0.5


def test_prompt_longer_than_the_context_window_is_rejected_and_reported():
    sc = scenario(scheduler={"max_num_batched_tokens": 1000}, kv={"max_model_len": 1000},
                  workload={"num_requests": 3, "prompt": {"kind": "fixed", "value": 2000}})
    out = run(sc)
    assert (out.requests.status == "rejected").all()
    assert (out.requests.reject_reason
            == "prompt of 2000 tokens exceeds max_model_len 1000 (the context window)").all()
    assert out.summary["requests"]["rejected"] == 3


def test_itl_gaps_count_every_token_after_the_first():
    out = run(scenario(workload={"num_requests": 200, "arrival": {"kind": "poisson", "rate": 40.0},
                                 "lengths": {"path": "data/traces/sharegpt_lengths.csv"}},
                       kv={"num_blocks": 3000}))
    fin = out.requests[out.requests.status == "finished"]
    assert out.itl["count"].sum() == (fin.output_tokens - 1).sum()
    # TPOT is the mean of a request's gaps, so the pooled gap mean equals the token-weighted TPOT
    multi = fin[fin.output_tokens > 1]
    weighted_tpot = (multi.tpot_s * (multi.output_tokens - 1)).sum() / (multi.output_tokens - 1).sum()
    assert out.summary["itl_s"]["mean"] == pytest.approx(weighted_tpot, rel=1e-9)


policies = st.sampled_from([
    {"policy": "continuous", "preemption": "recompute"},
    {"policy": "continuous", "preemption": "swap"},
    {"policy": "static", "max_batch_size": 4, "max_wait_s": 0.2},
])


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 10_000),
    n=st.integers(1, 60),
    rate=st.floats(0.5, 200.0),
    blocks=st.integers(40, 400),
    policy=policies,
    manager=st.sampled_from(["paged", "contiguous"]),
    max_seqs=st.integers(1, 64),
)
def test_every_request_is_accounted_for_and_every_kv_block_returns(seed, n, rate, blocks, policy,
                                                                   manager, max_seqs):
    bs = 16 if manager == "paged" else 1
    sc = scenario(
        seed=seed,
        scheduler={**policy, "max_num_seqs": max_seqs, "max_num_batched_tokens": 2048},
        kv={"manager": manager, "num_blocks": blocks * (16 // bs), "block_size": 16,
            "max_model_len": 2048},
        workload={"num_requests": n, "arrival": {"kind": "poisson", "rate": rate},
                  "prompt": {"kind": "lognormal", "mean": 300, "sigma": 1.0, "max": 3000},
                  "output": {"kind": "lognormal", "mean": 80, "sigma": 1.0, "max": 400}},
    )
    out = run(sc)
    req = out.requests
    kv = out.result.kv
    assert len(req) == n
    assert set(req.status) <= {"finished", "rejected"}
    assert kv.free_blocks == kv.num_blocks
    fin = req[req.status == "finished"]
    assert (fin.first_token_s >= fin.arrival_s).all()
    assert (fin.finish_s >= fin.first_token_s).all()
    started = req[req.generated_tokens > 0]
    assert out.itl["count"].sum() == (started.generated_tokens - 1).sum()
    assert (fin.generated_tokens == fin.output_tokens).all()
    steps = out.steps
    assert (steps.kv_blocks_used <= kv.num_blocks).all()
    assert (steps.t_end > steps.t_start).all()
    assert (steps.t_start.iloc[1:].to_numpy() >= steps.t_end.iloc[:-1].to_numpy() - 1e-12).all()
    assert 0 <= out.summary["gpu_busy_fraction"] <= 1
    assert not math.isnan(out.summary["duration_s"])


def test_generation_stops_at_the_context_window():
    out = run(scenario(kv={"max_model_len": 600},
                       workload={"num_requests": 2, "prompt": {"kind": "fixed", "value": 500},
                                 "output": {"kind": "fixed", "value": 300}}))
    assert list(out.requests.output_tokens) == [100, 100]
    assert (out.requests.generated_tokens == 100).all()


def test_static_contiguous_batch_whose_rows_all_end_at_prefill_gives_its_slots_back():
    # every row produces its one token at the prefill: the batch never decodes, and its
    # contiguous reservations must still be freed when it ends
    out = run(scenario(scheduler={"policy": "static"}, kv={"manager": "contiguous"},
                       workload={"num_requests": 40, "arrival": {"kind": "constant", "rate": 100},
                                 "output": {"kind": "fixed", "value": 1}}))
    kv = out.result.kv
    assert (out.requests.status == "finished").all()
    assert kv.free_blocks == kv.num_blocks


def test_request_whose_re_prefill_no_longer_fits_after_preemption_is_rejected_as_preempted():
    # a 100-token prompt fits the 8 blocks of 16 tokens (128 tokens); growing past 128
    # tokens it does not, so it is preempted after 28 output tokens, and its re-prefill of
    # 129 tokens needs 9 blocks, more than the whole cache
    out = run(scenario(
        scheduler={"watermark": 0.0},
        kv={"num_blocks": 8, "block_size": 16},
        workload={"num_requests": 1, "prompt": {"kind": "fixed", "value": 100},
                  "output": {"kind": "fixed", "value": 50}}))
    req = out.requests
    assert list(req.status) == ["rejected"]
    dropped = req.iloc[0]
    assert dropped.preemptions == 1 and dropped.first_token_s > 0
    assert dropped.reject_reason == (
        "preempted after 29 output tokens, and its re-prefill of 129 tokens no longer fits: "
        "needs 9 KV slots/blocks, more than the 8 the whole (empty) KV cache offers above "
        "its watermark")
    assert out.result.kv.free_blocks == 8


def test_rejections_from_a_long_queue_keep_the_rest_in_arrival_order():
    # prompts alternate between too long and fine, all queued at once: the fine ones are
    # served first come, first served, the long ones each rejected once
    out = run(scenario(
        scheduler={"max_num_batched_tokens": 1000, "max_num_seqs": 4}, kv={"max_model_len": 1000},
        workload={"num_requests": 40, "arrival": {"kind": "constant", "rate": 1e6},
                  "prompt": {"kind": "uniform", "low": 500, "high": 1500}}))
    req = out.requests
    too_long = req.prompt_tokens > 1000
    assert (req.status[too_long] == "rejected").all()
    assert (req.status[~too_long] == "finished").all()
    served = req[~too_long]
    assert served.sort_values("queue_s").id.tolist() == served.id.tolist()
