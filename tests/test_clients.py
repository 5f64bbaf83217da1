"""Closed-loop clients (`workload.clients`) against closed queueing networks, and the
runtime's per-request latency (`runtime.request`) against hand-worked timelines."""

from __future__ import annotations

import numpy as np
import pytest

from sim.config.scenario import scenario_from_dict
from sim.costmodel.latency import StepLatency
from sim.costmodel.models import load_model
from sim.costmodel.profiles import load_profile
from sim.costmodel.runtime import load_runtime
from sim.engine.runner import run
from sim.io.specload import SpecError

P, OUT = 256, 8  # fixed prompt and output lengths


def service_s() -> float:
    """One request alone on a batch-size-1 replica: a prefill, then OUT - 1 decode steps."""
    lat = StepLatency(load_model("llama-3-8b"), load_profile("h200-sxm"), load_runtime("cuda-graph"))
    return lat.prefill([(P, 0)]) + sum(lat.decode(1, P + j) for j in range(1, OUT))


def closed(clients: dict, seed: int = 3, **extra) -> dict:
    base = {
        "name": "closed", "seed": seed, "model": "llama-3-8b", "gpu": "h200-sxm",
        "runtime": "cuda-graph", "scheduler": {"max_num_seqs": 1},
        "workload": {"clients": clients, "prompt": {"kind": "fixed", "value": P},
                     "output": {"kind": "fixed", "value": OUT}, **extra},
    }
    return base


def test_c_users_without_think_time_keep_the_server_busy_and_each_waits_c_minus_1_services():
    # N users, no think time, one server of fixed service time S: a closed network whose
    # server never idles, so X = 1/S, and every request queues behind the other N - 1
    # (R = N/X). The first round (everyone at t = 0) is warm-up, not drained, so every
    # measured request finds all the others ahead of it.
    C, R = 4, 25
    S = service_s()
    out = run(scenario_from_dict(closed({"concurrency": C, "requests_per_client": R,
                                         "warmup_requests": C, "drain_warmup": False})))
    req, s = out.requests, out.summary
    measured = req[~req.warmup]
    assert len(measured) == C * R and req.warmup.sum() == C
    assert np.allclose(measured.queue_s, (C - 1) * S, rtol=1e-9)
    assert np.allclose(measured.e2e_s, C * S, rtol=1e-9)
    # window: the first measured send (S, when the first user's warm-up ended) to the last
    # finish ((C + C * R) S): vLLM's benchmark_duration, edges included
    assert s["duration_s"] == pytest.approx((C * R + C - 1) * S, rel=1e-9)
    assert s["request_throughput"] == pytest.approx(C * R / ((C * R + C - 1) * S), rel=1e-9)
    assert s["requests"]["total"] == C * R
    assert s["clients"]["measured_requests"] == C * R


def test_one_user_sends_each_request_when_the_last_ended_plus_its_think_time():
    S, Z = service_s(), 0.25
    out = run(scenario_from_dict(closed({"concurrency": 1, "requests_per_client": 5,
                                         "think": {"kind": "fixed", "mean_s": Z}})))
    req = out.requests.sort_values("arrival_s")
    assert np.allclose(req.arrival_s, np.arange(5) * (S + Z), rtol=1e-9)
    assert np.allclose(req.queue_s, 0.0, atol=1e-12)


@pytest.mark.parametrize("users", [2, 6, 16])
def test_think_time_obeys_the_interactive_response_time_law(users):
    # R = N / X - Z holds for any closed system in steady state (Denning & Buzen 1978);
    # checked on the simulated means of a long run with exponential think times
    # (a window of fixed length, so that users do not drop out one by one at the end)
    S = service_s()
    Z = 2 * S
    out = run(scenario_from_dict(closed({"concurrency": users, "requests_per_client": 2000,
                                         "warmup_requests": users, "drain_warmup": False,
                                         "think": {"kind": "exponential", "mean_s": Z}},
                                        duration_s=1200 * S)))
    s, req = out.summary, out.requests
    z_mean = s["clients"]["think_s_mean"]
    x = s["request_throughput"]
    assert s["e2e_s"]["mean"] == pytest.approx(users / x - z_mean, rel=0.03)
    assert (req.status == "finished").all()


def test_long_fixed_think_time_staggers_users_so_only_the_first_round_queues():
    # 3 users, Z = 10 S: all send at 0 and wait 0, S, 2S; from then on each comes back
    # after S + Z while the server is idle, so nobody queues again. The last finish is
    # 3 S + 199 (S + Z): throughput 600 / that, just under the N / (S + Z) asymptote's
    # N requests per cycle (the window leaves out the last think time)
    S = service_s()
    Z = 10 * S
    out = run(scenario_from_dict(closed({"concurrency": 3, "requests_per_client": 200,
                                         "think": {"kind": "fixed", "mean_s": Z}})))
    s, req = out.summary, out.requests.sort_values("arrival_s")
    assert np.allclose(req.queue_s.values[:3], [0, S, 2 * S], rtol=1e-9, atol=1e-12)
    assert np.allclose(req.queue_s.values[3:], 0.0, atol=1e-9)
    assert s["duration_s"] == pytest.approx(3 * S + 199 * (S + Z), rel=1e-9)
    assert s["request_throughput"] == pytest.approx(600 / (3 * S + 199 * (S + Z)), rel=1e-9)
    assert s["gpu_busy_fraction"] == pytest.approx(600 * S / s["duration_s"], rel=1e-6)


def test_drained_warm_up_ends_before_any_measured_request_is_sent():
    out = run(scenario_from_dict(closed({"concurrency": 3, "requests_per_client": 4,
                                         "warmup_requests": 5})))
    req = out.requests
    warm, measured = req[req.warmup], req[~req.warmup]
    assert len(warm) == 5 and len(measured) == 12
    assert measured.arrival_s.min() >= warm.finish_s.max() - 1e-12
    assert out.summary["requests"]["total"] == 12
    written = set(out.request_table)
    assert "warmup" in written


def test_a_duration_closes_the_window_and_unsent_requests_leave_no_row():
    S = service_s()
    out = run(scenario_from_dict(closed({"concurrency": 2}, num_requests=1000,
                                        duration_s=10.5 * S)))
    req = out.requests
    assert 0 < len(req) < 1000
    assert req.arrival_s.max() < 10.5 * S
    assert out.summary["clients"]["not_sent"] == 1000 - len(req)


def test_multi_turn_sessions_send_turns_in_order_and_reuse_the_conversation_prefix():
    turns = 3
    sc = closed({"concurrency": 2, "requests_per_client": 6,
                 "think": {"kind": "fixed", "mean_s": 0.1}}, multi_turn={"turns": turns})
    sc["kv"] = {"prefix_caching": True}
    sc["scheduler"] = {"max_num_seqs": 4}
    out = run(scenario_from_dict(sc))
    req = out.requests.set_index("id")
    n = len(req)
    convs = n // turns
    for c in range(convs):
        rows = req.loc[list(range(c, n, convs))]
        assert (np.diff(rows.prompt_tokens) == P + OUT).all()  # each turn resends the last
        assert (rows.arrival_s.values[1:] >= rows.finish_s.values[:-1] + 0.1 - 1e-9).all()
        assert (rows.cached_tokens.values[1:] > 0).all()


def test_closed_loop_specs_refuse_what_they_cannot_mean():
    for clients, extra, where in [
        ({"concurrency": 2}, {}, "requests_per_client"),
        ({"concurrency": 2, "requests_per_client": 3}, {"num_requests": 6}, "requests_per_client"),
        ({"concurrency": 2, "requests_per_client": 3}, {"arrival": {"kind": "poisson", "rate": 1}},
         "clients"),
        ({"concurrency": 2, "requests_per_client": 3}, {"multi_turn": {"turns": 4}},
         "requests_per_client"),
        ({"concurrency": 0, "requests_per_client": 3}, {}, "concurrency"),
    ]:
        with pytest.raises(SpecError, match=where):
            scenario_from_dict(closed(clients, **extra))


# ---- per-request latency outside the step loop ---------------------------------------------

def runtime_with_request_costs(folder, **ms) -> str:
    """cuda-graph plus a `request:` block, as a runtime YAML file."""
    import yaml

    data = yaml.safe_load(open(load_runtime.__globals__["RUNTIMES_DIR"] / "cuda-graph.yaml"))
    data["request"] = {k: {"value": v, "source": "hand-picked for the test"} for k, v in ms.items()}
    f = folder / "rt.yaml"
    f.write_text(yaml.safe_dump(data))
    return str(f)


def test_request_latency_falls_on_ttft_and_e2e_and_leaves_itl_alone(tmp_path):
    rt = runtime_with_request_costs(tmp_path, receive_ms=20.0, tokenize_us_per_prompt_token=10.0,
                                    chunk_ms=3.0, finish_ms=5.0)
    base = closed({"concurrency": 1, "requests_per_client": 3})
    plain = run(scenario_from_dict(base))
    slow = run(scenario_from_dict({**base, "runtime": rt}))
    a, b = plain.requests, slow.requests
    before = 0.020 + 10e-6 * P
    assert np.allclose(b.ttft_s - a.ttft_s, before + 0.003, rtol=1e-9)
    assert np.allclose(b.e2e_s - a.e2e_s, before + 0.003 + 0.005, rtol=1e-9)
    assert np.allclose(b.queue_s - a.queue_s, before, rtol=1e-9)
    # a closed-loop user waits for the whole response before sending its next request
    cycle = a.e2e_s.iloc[0] + before + 0.003 + 0.005
    assert np.allclose(np.diff(np.sort(b.arrival_s)), cycle, rtol=1e-9)
    assert slow.summary["itl_s"]["mean"] == pytest.approx(plain.summary["itl_s"]["mean"], rel=1e-12)


def test_open_loop_requests_see_the_same_request_latency(tmp_path):
    rt = runtime_with_request_costs(tmp_path, receive_ms=7.0, chunk_ms=2.0)
    base = {"name": "open", "seed": 1, "runtime": "cuda-graph",
            "workload": {"num_requests": 5, "arrival": {"kind": "constant", "rate": 0.5},
                         "prompt": {"kind": "fixed", "value": P},
                         "output": {"kind": "fixed", "value": OUT}}}
    a = run(scenario_from_dict(base)).requests
    b = run(scenario_from_dict({**base, "runtime": rt})).requests
    assert np.allclose(b.arrival_s, a.arrival_s) and "warmup" not in b
    assert np.allclose(b.ttft_s - a.ttft_s, 0.009, rtol=1e-9)
    assert np.allclose(b.tpot_s, a.tpot_s, rtol=1e-9)


def test_a_non_zero_request_cost_needs_its_source(tmp_path):
    f = tmp_path / "rt.yaml"
    f.write_text("name: x\nrequest: {receive_ms: {value: 2.0}}\n")
    with pytest.raises(SpecError, match=r"request\.receive_ms\.source"):
        load_runtime(str(f))
