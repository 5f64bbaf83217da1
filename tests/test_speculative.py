"""Speculative decoding: the tokens-per-round formula, the alpha = 0 timeline, the
batch-1 speed-up formula, KV rollback."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sim.config.scenario import scenario_from_dict
from sim.costmodel.latency import StepLatency
from sim.costmodel.models import load_model
from sim.costmodel.profiles import load_profile
from sim.costmodel.runtime import load_runtime
from sim.engine.runner import run
from tests.test_engine import ROOT, scenario


def spec_scenario(batch=1, n=16, output=256, **spec):
    return scenario(
        scheduler={"max_num_seqs": batch},
        speculative={"method": "draft_model", "draft_model": "llama-3.2-1b", "k": 4,
                     "acceptance": {"kind": "fixed", "alpha": 0.8}, **spec},
        workload={"num_requests": n, "arrival": {"kind": "constant", "rate": 100000.0},
                  "prompt": {"kind": "fixed", "value": 512}, "output": {"kind": "fixed", "value": output}},
    )


def lats():
    p, rt = load_profile("h200-sxm"), load_runtime("cuda-graph")
    return (StepLatency(load_model("llama-3-8b"), p, rt, verify_impl="paged"),
            StepLatency(load_model("llama-3.2-1b"), p, rt))


@pytest.mark.parametrize("alpha,k,expected", [(0.8, 5, 3.6893), (0.8, 4, 3.3616), (0.5, 3, 1.875)])
def test_mean_tokens_per_round_converges_to_the_geometric_formula(alpha, k, expected):
    assert (1 - alpha ** (k + 1)) / (1 - alpha) == pytest.approx(expected, abs=1e-4)
    out = run(spec_scenario(batch=32, n=64, output=4000, method="ngram", draft_model=None, k=k,
                            acceptance={"kind": "fixed", "alpha": alpha}))
    sp = out.summary["speculative"]
    assert sp["tokens_per_round"] == pytest.approx(expected, rel=0.01)
    # the share of drafted tokens accepted is E[accepted drafts] / k
    assert sp["acceptance_rate"] == pytest.approx((expected - 1) / k, rel=0.015)


def test_zero_acceptance_yields_one_token_per_round_at_the_cost_of_draft_plus_verify():
    out = run(spec_scenario(n=1, output=20, acceptance={"kind": "fixed", "alpha": 0.0}))
    sp = out.summary["speculative"]
    assert sp["tokens_per_round"] == 1.0 and sp["acceptance_rate"] == 0.0
    target, draft = lats()
    rounds = []
    for g in range(1, 20):  # before round j the sequence holds 512 + g tokens
        length = 512 + g
        d = sum(draft.decode(1, length + j, length + j) for j in range(4))
        v = target.verify_batch(1, 5, length, length, [(5, length - 1)])
        rounds.append(d + v)
    assert out.requests.tpot_s[0] == pytest.approx(sum(rounds) / 19, rel=1e-9)
    assert (out.steps.kind == "verify").sum() == 19


def test_batch_one_speedup_matches_tokens_per_round_over_draft_cost():
    target, draft = lats()
    c = draft.decode(1, 640, 640) / target.decode(1, 640, 640)
    e = (1 - 0.8**5) / (1 - 0.8)
    out = run(spec_scenario(n=8))
    sp = out.summary["speculative"]
    assert sp["speedup_vs_decode"] == pytest.approx(e / (4 * c + 1), rel=0.08)
    assert sp["speedup_vs_decode"] > 1.2
    cheap = run(spec_scenario(n=8, method="self_draft", draft_model=None, draft_cost=0.05))
    assert cheap.summary["speculative"]["speedup_vs_decode"] > 2.0


def test_speedup_shrinks_with_batch_size_and_turns_into_a_slowdown():
    ups = [run(spec_scenario(batch=b, n=max(b, 8), output=128)).summary["speculative"]["speedup_vs_decode"]
           for b in (1, 16, 64, 256)]
    assert ups == sorted(ups, reverse=True)
    assert ups[0] > 1.2 and ups[-1] < 1.0


def test_draft_model_takes_memory_from_the_kv_cache():
    plain = run(scenario(workload={"num_requests": 1}))
    spec = run(spec_scenario(n=1, output=8))
    assert spec.summary["kv"]["capacity_tokens"] < plain.summary["kv"]["capacity_tokens"]
    draft = load_model("llama-3.2-1b")
    assert spec.summary["memory_gib"]["weights_gib"] == pytest.approx(
        plain.summary["memory_gib"]["weights_gib"] + draft.weight_bytes / 2**30)


def test_per_position_acceptance_of_one_accepts_every_draft():
    out = run(spec_scenario(n=2, output=101, method="ngram", draft_model=None,
                            acceptance={"kind": "per_position", "rates": [1, 1, 1, 1]}))
    assert out.summary["speculative"]["tokens_per_round"] == 5.0  # 100 tokens after the first: 20 rounds of 5


def test_acceptance_can_come_from_a_trace_column(tmp_path):
    f = tmp_path / "t.csv"
    f.write_text("arrival_s,prompt_tokens,output_tokens,acceptance\n0,100,400,0.0\n0,100,400,1.0\n")
    out = run(scenario_from_dict({
        "model": "llama-3-8b", "gpu": "h200-sxm", "runtime": "cuda-graph",
        "scheduler": {"policy": "continuous"},
        "speculative": {"method": "ngram", "k": 3, "acceptance": {"kind": "trace"}},
        "workload": {"trace": {"path": str(f)}}}))
    req = out.requests
    # the alpha=0 request needs 399 rounds, the alpha=1 one 100 rounds of 4 tokens
    assert out.summary["requests"]["finished"] == 2
    assert req.e2e_s[0] > 3 * req.e2e_s[1]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), n=st.integers(1, 40), blocks=st.integers(60, 300),
       alpha=st.floats(0, 1), k=st.integers(1, 6), method=st.sampled_from(["ngram", "self_draft"]),
       preemption=st.sampled_from(["recompute", "swap"]))
def test_rolled_back_draft_slots_return_every_kv_block(seed, n, blocks, alpha, k, method, preemption):
    sc = scenario(
        seed=seed,
        scheduler={"max_num_seqs": 16, "preemption": preemption},
        kv={"num_blocks": blocks},
        speculative={"method": method, "k": k, "acceptance": {"kind": "fixed", "alpha": alpha}},
        workload={"num_requests": n, "arrival": {"kind": "poisson", "rate": 50.0},
                  "prompt": {"kind": "lognormal", "mean": 200, "sigma": 1.0, "max": 1500},
                  "output": {"kind": "lognormal", "mean": 80, "sigma": 1.0, "max": 400}},
    )
    out = run(sc)
    req = out.requests
    assert out.result.kv.free_blocks == out.result.kv.num_blocks
    assert set(req.status) <= {"finished", "rejected"}
    fin = req[req.status == "finished"]
    assert (fin.generated_tokens == fin.output_tokens).all()  # never past the output length
    assert (out.steps.kv_blocks_used <= blocks).all()


def test_speculative_needs_the_continuous_policy(tmp_path):
    from sim.config.scenario import load_scenario
    from sim.io.specload import SpecError

    f = tmp_path / "s.yaml"
    f.write_text((ROOT / "scenarios" / "speculative.yaml").read_text().replace(
        "policy: continuous", "policy: static"))
    with pytest.raises(SpecError, match="speculative.method: needs scheduler.policy: continuous"):
        load_scenario(f)


def test_round_after_preemption_keeps_the_lookahead_its_blocks_were_planned_at():
    # 33 requests over 8 blocks: preemptions shrink the batch from above
    # disable_above_batch (plain decode, 1 slot) to below it (k + 1 slots) mid-step
    sc = scenario(
        model="llama-3.2-1b",
        scheduler={"max_num_seqs": 16, "watermark": 0.0},
        kv={"block_size": 32, "num_blocks": 8, "max_model_len": 8192},  # within the step budget
        speculative={"method": "ngram", "k": 1, "disable_above_batch": 7},
        workload={"num_requests": 33, "arrival": {"kind": "constant", "rate": 500},
                  "prompt": {"kind": "fixed", "value": 4}, "output": {"kind": "fixed", "value": 43}})
    out = run(sc)
    assert (out.requests.status == "finished").all()
    assert out.requests.preemptions.sum() > 0
    assert out.result.kv.free_blocks == 8
