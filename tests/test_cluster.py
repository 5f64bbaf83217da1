"""Fleets: routing, per-replica results, disaggregated prefill/decode, conservation."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sim.config.cluster import KVTransferSpec
from sim.config.scenario import scenario_from_dict
from sim.costmodel.latency import StepLatency
from sim.costmodel.models import load_model
from sim.costmodel.profiles import load_profile
from sim.costmodel.runtime import load_runtime
from sim.engine.build import load_link
from sim.engine.runner import run

ROOT = Path(__file__).resolve().parent.parent


def scenario(cluster=None, **over):
    base = {
        "name": "t",
        "seed": 5,
        "model": "llama-3-8b",
        "gpu": "h200-sxm",
        "runtime": "cuda-graph",
        "workload": {
            "num_requests": 60,
            "arrival": {"kind": "poisson", "rate": 20},
            "prompt": {"kind": "uniform", "low": 64, "high": 1024},
            "output": {"kind": "uniform", "low": 1, "high": 64},
        },
    }
    base.update(over)
    if cluster is not None:
        base["cluster"] = cluster
    return scenario_from_dict(base)


def assert_conserved(out, n):
    req = out.requests
    assert len(req) == n and req.id.is_unique
    assert set(req.status) <= {"finished", "rejected"}
    assert (req[req.status == "rejected"].reject_reason != "").all()
    for r in out.result.replicas:
        assert r.kv.free_blocks == r.kv.num_blocks, f"{r.name} leaked KV blocks"
    fin = req[req.status == "finished"]
    assert (fin.first_token_s >= fin.arrival_s).all() and (fin.finish_s >= fin.first_token_s).all()


@pytest.mark.parametrize("runtime", ["cuda-graph", "h200-eager-live"])
def test_a_one_replica_cluster_reproduces_the_single_replica_run_exactly(runtime):
    plain = run(scenario(runtime=runtime))
    fleet = run(scenario({"groups": [{"name": "only", "count": 1}]}, runtime=runtime))
    cols = [c for c in plain.requests.columns if c != "replica"]
    assert plain.requests[cols].equals(fleet.requests[cols])
    assert plain.steps.drop(columns="replica").equals(fleet.steps.drop(columns="replica"))
    for key in ("ttft_s", "tpot_s", "e2e_s", "itl_s", "request_throughput", "kv"):
        assert plain.summary[key] == fleet.summary[key]


def test_each_replica_of_a_live_fleet_pays_its_own_first_sight_of_a_prefill_shape(tmp_path):
    # the live runtime without its jitter, so that step times are exact
    live = ROOT / "gpu_profiles" / "runtimes" / "h200-eager-live.yaml"
    fields = {k: v for k, v in yaml.safe_load(live.read_text()).items() if k != "jitter"}
    rt_file = tmp_path / "live-no-jitter.yaml"
    rt_file.write_text(yaml.safe_dump(fields))
    stall = fields["serial_ms_per_new_prefill_shape"] * 1e-3
    assert stall > 0
    wl = {"num_requests": 4, "arrival": {"kind": "constant", "rate": 1},
          "prompt": {"kind": "fixed", "value": 500}, "output": {"kind": "fixed", "value": 1}}
    out = run(scenario({"groups": [{"name": "g", "count": 2}], "router": {"policy": "round_robin"}},
                       runtime=str(rt_file), workload=wl))
    assert out.requests.replica.tolist() == ["g-0", "g-1", "g-0", "g-1"]
    steps = out.steps.sort_values("t_start")
    assert (steps.kind == "prefill").all() and len(steps) == 4  # one lone prefill per request
    secs = (steps.t_end - steps.t_start).tolist()
    # requests 0 and 1 meet the 500-token shape first on their replica; 2 and 3 again
    assert secs[0] == pytest.approx(secs[1], rel=1e-12)
    assert secs[2] == pytest.approx(secs[3], rel=1e-12)
    assert secs[0] - secs[2] == pytest.approx(stall, rel=1e-9)


def test_round_robin_over_identical_replicas_splits_requests_evenly():
    out = run(scenario({"groups": [{"count": 4}], "router": {"policy": "round_robin"}}))
    counts = out.requests.replica.value_counts()
    assert sorted(counts.tolist()) == [15, 15, 15, 15]
    # request i went to replica i mod 4
    assert (out.requests.replica == [f"g0-{i % 4}" for i in range(60)]).all()
    assert_conserved(out, 60)
    assert [r["requests"] for r in out.summary["per_replica"]] == [15, 15, 15, 15]


def test_a_router_with_stale_reports_cannot_see_load_it_was_not_told_about():
    def routed(policy, staleness):
        out = run(scenario({"groups": [{"count": 3}],
                            "router": {"policy": policy, "staleness_s": staleness}}))
        return out.requests.replica.tolist()

    # reports from t=0 show every replica's KV empty, so least_kv falls back on what the
    # router always knows (its own outstanding count): it routes as least_outstanding does
    assert routed("least_kv", 3600) == routed("least_outstanding", 3600)
    assert routed("least_kv", 0) != routed("least_kv", 3600)


@pytest.mark.parametrize("policy", ["random", "least_outstanding", "least_kv", "power_of_two",
                                    "affinity"])
def test_every_router_accounts_for_every_request_and_uses_every_replica(policy):
    out = run(scenario({"groups": [{"count": 2}, {"count": 1, "gpu": "a100-80gb"}],
                        "router": {"policy": policy}},
                       workload={"num_requests": 120, "arrival": {"kind": "poisson", "rate": 40},
                                 "prompt": {"kind": "uniform", "low": 64, "high": 1024},
                                 "output": {"kind": "uniform", "low": 1, "high": 64}}))
    assert_conserved(out, 120)
    assert out.requests.replica.nunique() == 3
    assert {r["gpu"] for r in out.summary["per_replica"]} == {"h200-sxm", "a100-80gb"}


def test_least_outstanding_beats_round_robin_on_a_fleet_of_unequal_gpus():
    groups = [{"name": "fast", "count": 1}, {"name": "slow", "count": 1, "gpu": "l40s"}]
    wl = {"num_requests": 400, "arrival": {"kind": "poisson", "rate": 6},
          "prompt": {"kind": "fixed", "value": 1024}, "output": {"kind": "fixed", "value": 128}}
    rr = run(scenario({"groups": groups, "router": {"policy": "round_robin"}}, workload=wl))
    lo = run(scenario({"groups": groups, "router": {"policy": "least_outstanding"}}, workload=wl))
    assert lo.summary["e2e_s"]["p99"] < rr.summary["e2e_s"]["p99"]
    share = lo.requests.replica.value_counts(normalize=True)
    assert share["fast-0"] > 0.5


def test_affinity_keeps_a_conversation_on_the_replica_that_caches_its_prefix():
    wl = {"num_requests": 120, "arrival": {"kind": "poisson", "rate": 10},
          "prompt": {"kind": "fixed", "value": 200}, "output": {"kind": "fixed", "value": 20},
          "multi_turn": {"turns": 4}}
    kv = {"prefix_caching": True}
    aff = run(scenario({"groups": [{"count": 4}], "router": {"policy": "affinity",
                                                             "affinity_slack": 1000}},
                       workload=wl, kv=kv))
    rr = run(scenario({"groups": [{"count": 4}], "router": {"policy": "round_robin"}},
                      workload=wl, kv=kv))
    conv = np.arange(120) % 30  # request i is a turn of conversation i % 30
    per_conv = aff.requests.assign(conv=conv).groupby("conv").replica.nunique()
    assert (per_conv == 1).all()
    assert aff.summary["prefix_cache"]["hit_rate"] > rr.summary["prefix_cache"]["hit_rate"]


def test_a_kv_transfer_takes_bytes_over_bandwidth_plus_latency():
    cluster = {"groups": [{"name": "p", "role": "prefill"}, {"name": "d", "role": "decode"}],
               "kv_transfer": {"link": "infiniband-ndr400", "bandwidth_gbs": 10, "latency_us": 500}}
    sc = scenario(cluster, workload={"num_requests": 1, "arrival": {"kind": "constant", "rate": 1},
                                     "prompt": {"kind": "fixed", "value": 1000},
                                     "output": {"kind": "fixed", "value": 8}})
    out = run(sc)
    model = load_model("llama-3-8b")
    lat = StepLatency(model, load_profile("h200-sxm"), load_runtime("cuda-graph"))
    transfer = 1000 * model.kv_bytes_per_token / 10e9 + 500e-6
    (ttft,) = out.requests.ttft_s
    assert ttft == pytest.approx(lat.prefill([(1000, 0)]) + transfer, rel=1e-9)
    assert out.requests.replica[0] == "d-0" and out.requests.prefill_replica[0] == "p-0"
    assert out.summary["kv"]["transfer_gib"] == pytest.approx(1000 * model.kv_bytes_per_token / 2**30)
    assert_conserved(out, 1)


def test_a_full_decode_replica_holds_prefills_back_until_it_has_room():
    cluster = {"groups": [{"name": "p", "count": 2, "role": "prefill"},
                          {"name": "d", "role": "decode", "kv": {"num_blocks": 200}}]}
    out = run(scenario(cluster, workload={
        "num_requests": 80, "arrival": {"kind": "poisson", "rate": 50},
        "prompt": {"kind": "uniform", "low": 200, "high": 900},
        "output": {"kind": "uniform", "low": 16, "high": 200}}))
    assert_conserved(out, 80)
    steps = out.steps
    dec = steps[steps.replica == "d-0"]
    assert dec.kv_blocks_used.max() <= 200
    # the prefill pool ran ahead and waited: some requests' first token left long after
    # their prefill could have, because the decode replica had no room
    assert out.requests.ttft_s.max() > 5 * out.requests.ttft_s.min()


def test_disaggregated_and_colocated_serve_the_same_requests_on_equal_gpus():
    wl = {"num_requests": 200, "arrival": {"kind": "poisson", "rate": 8},
          "prompt": {"kind": "uniform", "low": 256, "high": 2048},
          "output": {"kind": "uniform", "low": 16, "high": 256}}
    dis = run(scenario({"groups": [{"name": "p", "role": "prefill"},
                                   {"name": "d", "role": "decode"}]}, workload=wl))
    col = run(scenario({"groups": [{"count": 2}]}, workload=wl))
    assert_conserved(dis, 200)
    assert_conserved(col, 200)
    # decode steps on the decode replica never wait behind a prefill: its ITL tail is flat
    assert dis.summary["itl_s"]["p99"] < col.summary["itl_s"]["p99"]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    groups=st.lists(st.tuples(st.integers(1, 3), st.sampled_from(["h200-sxm", "a100-80gb"]),
                              st.sampled_from(["continuous", "chunked"]),
                              st.sampled_from([None, 300, 2000])), min_size=1, max_size=3),
    router=st.sampled_from(["round_robin", "random", "least_outstanding", "least_kv",
                            "power_of_two", "affinity"]),
    staleness=st.sampled_from([0.0, 0.5]),
    disaggregate=st.booleans(),
    seed=st.integers(0, 1000),
)
def test_random_fleets_route_every_request_once_and_conserve_blocks(groups, router, staleness,
                                                                    disaggregate, seed):
    spec = []
    for i, (count, gpu, policy, blocks) in enumerate(groups):
        g = {"name": f"g{i}", "count": count, "gpu": gpu, "scheduler": {"policy": policy}}
        if blocks is not None:
            g["kv"] = {"num_blocks": blocks}
        spec.append(g)
    if disaggregate:
        spec[0]["role"] = "prefill"
        spec.append({"name": "dec", "count": 1, "role": "decode", "kv": {"num_blocks": 400}})
    out = run(scenario({"groups": spec, "router": {"policy": router, "staleness_s": staleness}},
                       seed=seed, workload={
                           "num_requests": 50, "arrival": {"kind": "poisson", "rate": 30},
                           "prompt": {"kind": "uniform", "low": 16, "high": 3000},
                           "output": {"kind": "uniform", "low": 1, "high": 300}}))
    assert_conserved(out, 50)
    steps = out.steps
    for name, part in steps.groupby("replica"):
        t0, t1 = part.t_start.to_numpy(), part.t_end.to_numpy()
        assert (t1 >= t0).all() and (t0[1:] >= t1[:-1] - 1e-12).all(), name


def test_named_links_load_and_an_unknown_one_is_refused_with_the_known_names():
    link = load_link(KVTransferSpec(link="nvlink4"))
    assert link.seconds(450e9) == pytest.approx(1.0 + 3e-6)
    from sim.io.specload import SpecError
    with pytest.raises(SpecError, match="cluster.kv_transfer.link: unknown 'carrier-pigeon'"):
        load_link(KVTransferSpec(link="carrier-pigeon"))


@pytest.mark.parametrize("cluster, message", [
    ({"groups": [{"count": 2}, {"count": 1, "gpu": "h10"}]}, "cluster.groups[1].gpu: unknown 'h10'"),
    ({"groups": [{"scheduler": {"policy": "fifo"}}]}, "cluster.groups[0].scheduler.policy: unknown 'fifo'"),
    ({"router": {"policy": "nearest"}}, "cluster.router.policy: unknown 'nearest'"),
    ({"groups": [{"role": "prefill"}]}, "cluster.groups: a 'prefill' group needs a 'decode' group"),
    ({"groups": [{"role": "prefill"}, {"role": "decode", "kv": {"manager": "contiguous"}}]},
     "needs kv.manager: paged"),
    ({"groups": [{"role": "prefill"}, {"role": "decode"}], "kv_transfer": {"link": "x"}},
     "cluster.kv_transfer.link: unknown 'x'"),
])
def test_bad_cluster_sections_are_one_line_and_exit_2(tmp_path, cluster, message, llmsim):
    f = tmp_path / "c.yaml"
    f.write_text(json.dumps({"name": "c", "cluster": cluster, "workload": {
        "num_requests": 2, "arrival": {"kind": "constant", "rate": 1},
        "prompt": {"kind": "fixed", "value": 10}, "output": {"kind": "fixed", "value": 2}}}))
    r = llmsim("run", str(f), "--out", str(tmp_path / "o"))
    assert r.returncode == 2, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and message in r.stderr, r.stderr
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("module", ["sim.policies.scheduler", "sim.policies.chunked", "sim.policies.kv", "sim.policies.batch",
                                    "sim.engine.replica", "sim.engine.handoff", "sim.engine.metrics", "sim.policies.router",
                                    "sim.engine.build", "sim.policies.speculative", "sim.policies.prefix", "sim.costmodel.latency"])
def test_simpy_stays_in_the_engine_and_calibration_stays_out_of_the_core(module):
    code = (f"import sys, {module}; "
            "bad = [m for m in ('simpy', 'sim.engine.processes', 'sim.calibrate', 'torch') if m in sys.modules]; "
            "print(','.join(bad))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "", f"{module} imports {r.stdout.strip()}"


def test_a_prompt_no_decode_replica_can_hold_is_rejected_at_hand_off_and_counts_settle():
    from sim.engine.build import build_fleet
    from sim.engine.processes import simulate
    from sim.engine.runner import prepare

    sc = scenario({"groups": [{"name": "p", "role": "prefill"},
                              {"name": "d", "role": "decode", "kv": {"num_blocks": 40}}]},
                  workload={"num_requests": 30, "arrival": {"kind": "poisson", "rate": 20},
                            "prompt": {"kind": "uniform", "low": 100, "high": 1200},
                            "output": {"kind": "fixed", "value": 8}})
    configs, wl, rng = prepare(sc)
    fleet = build_fleet(sc, configs, rng)
    res = simulate(wl, fleet.replicas, fleet.router, decode_router=fleet.decode_router,
                   link=fleet.link)
    too_big = [s for s in res.seqs if -(-s.prompt // 16) > 40]
    assert too_big and all(s.state == "rejected" and "larger than any decode replica" in s.reject_reason
                           for s in too_big)
    assert all(s.state == "finished" for s in res.seqs if s not in too_big)
    for rep in fleet.replicas:  # the router's outstanding counts come back to zero
        assert rep.port.load.outstanding == 0, rep.name
        assert rep.st.kv.free_blocks == rep.st.kv.num_blocks


def test_a_decode_replica_never_runs_more_sequences_than_max_num_seqs_with_transfers_in_flight():
    # issue 18: a decode replica preempts (16 blocks for prompts up to 200 tokens and
    # outputs up to 200) and re-admitted its victim while a KV transfer held the last
    # batch place: 3 sequences ran against max_num_seqs 2. Admission, re-prefill and
    # incoming transfers share one count of batch places.
    out = run(scenario({"groups": [
        {"name": "p", "count": 2, "role": "prefill"},
        {"name": "d", "role": "decode", "scheduler": {"max_num_seqs": 2},
         "kv": {"num_blocks": 16}}]}, seed=0, workload={
        "num_requests": 40, "arrival": {"kind": "poisson", "rate": 50},
        "prompt": {"kind": "uniform", "low": 16, "high": 200},
        "output": {"kind": "uniform", "low": 20, "high": 200}}))
    assert_conserved(out, 40)
    dec = out.steps[out.steps.replica == "d-0"]
    assert out.requests.preemptions.sum() > 0  # the case the bug needs
    assert dec.num_seqs.max() == 2
