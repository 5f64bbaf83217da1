"""Pipeline parallelism: layer split, stage costs, memory per stage, the micro-batches in
flight, and refusals — known answers worked by hand from the model files and from the
pipeline's own arithmetic (one micro-batch's latency is the sum of its stage times and
transfers; P micro-batches in flight complete P batches per cycle)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from sim.config.scenario import load_scenario
from sim.costmodel.latency import StepLatency
from sim.costmodel.models import load_model
from sim.costmodel.pipeline import StageLatency, stage_layers, stage_ops
from sim.costmodel.profiles import load_profile
from sim.costmodel.runtime import load_runtime
from sim.engine.build import replica_configs
from sim.engine.memory import memory_budget, stage_budgets
from sim.engine.runner import run
from sim.io.specload import SpecError

ROOT = Path(__file__).resolve().parent.parent
PP_SCENARIO = ROOT / "scenarios" / "llama405b_tp8_pp2.yaml"
TP_SCENARIO = ROOT / "scenarios" / "llama2_70b_tp.yaml"
GIB = 2**30


def _small(pp: int = 2, **extra) -> dict:
    """Llama-3.1-8B on H200, TP 1 x PP `pp` in one node (NVLink between stages)."""
    return {"model": "llama-3.1-8b", "gpu": "h200-sxm", "parallel.tensor": 1,
            "parallel.pipeline": pp, "kv.max_model_len": 4096, **extra}


@pytest.mark.parametrize("layers, stages, expected", [
    (126, 2, (63, 63)),
    (126, 4, (31, 32, 32, 31)),  # the remainder to the stages before the last, last first
    (61, 4, (15, 15, 16, 15)),  # vLLM's documentation example
    (61, 2, (31, 30)),
    (80, 3, (27, 27, 26)),
    (32, 1, (32,)),
    (7, 4, (2, 2, 2, 1)),
])
def test_layers_split_as_vllm_get_pp_indices(layers, stages, expected):
    assert stage_layers(layers, stages) == expected


@pytest.mark.parametrize("layers", [1, 5, 32, 61, 126])
@pytest.mark.parametrize("stages", [1, 2, 3, 4, 8])
def test_every_layer_lands_on_one_stage_and_stages_differ_by_at_most_one(layers, stages):
    if stages > layers:
        return
    parts = stage_layers(layers, stages)
    assert sum(parts) == layers and max(parts) - min(parts) <= 1 and parts[-1] == min(parts)


def test_one_stage_costs_exactly_what_the_whole_model_costs():
    m, p, rt = load_model("llama-3.1-8b"), load_profile("h200-sxm"), load_runtime("vllm")
    whole = StepLatency(m, p, rt)
    stage = StageLatency(m, p, rt, stage=0, stages=1)
    for n, ctx in ((1, 100), (32, 32 * 900), (200, 200 * 3000)):
        assert stage.decode(n, ctx, ctx) == whole.decode(n, ctx, ctx)
    for chunks in ([(512, 0)], [(100, 0), (2000, 300)]):
        assert stage.prefill(chunks) == whole.prefill(chunks)
    assert stage.mixed(8, 8000, 1500, [(256, 0)]) == whole.mixed(8, 8000, 1500, [(256, 0)])


@pytest.mark.parametrize("model, tensor, stages", [("llama-3.1-8b", 1, 2), ("llama-3.1-8b", 1, 3),
                                                   ("llama-3.1-405b", 8, 2)])
def test_stage_kernel_times_add_up_to_the_whole_models(model, tensor, stages):
    """Without host terms (cuda-graph) the stages' GPU times sum to the unsplit model's:
    every layer, the embedding, the LM head and every collective priced exactly once."""
    m, p, rt = load_model(model), load_profile("h200-sxm"), load_runtime("cuda-graph")
    whole = StepLatency(m, p, rt, tensor=tensor)
    parts = [StageLatency(m, p, rt, tensor=tensor, stage=s, stages=stages) for s in range(stages)]
    for n, ctx in ((1, 500), (64, 64 * 1000)):
        assert sum(st.decode(n, ctx, ctx) for st in parts) == pytest.approx(
            whole.decode(n, ctx, ctx), rel=1e-12)
    assert sum(st.prefill([(1024, 0)]) for st in parts) == pytest.approx(
        whole.prefill([(1024, 0)]), rel=1e-12)
    assert [st.layers for st in parts] == list(stage_layers(m.layers, stages))


def test_405b_tp8_pp2_memory_per_stage_from_the_model_file():
    """Llama-3.1-405B (hidden 16384, 126 layers, 128 heads, 8 KV heads of 128, ffn 53248,
    vocab 128256, untied), bf16, TP 8: per GPU and layer qkv 16384 x 18432/8, o 2048 x
    16384, gate_up 16384 x 13312, down 6656 x 16384, two norms of 16384; the vocabulary's
    16032 rows per GPU for the embedding (stage 0) and LM head (stage 1, with the final norm)."""
    h = 16384
    layer = h * 18432 // 8 + 2048 * h + h * 2 * 53248 // 8 + 53248 // 8 * h + 2 * h
    vocab_rows = 128256 // 8
    stage0 = (63 * layer + vocab_rows * h) * 2
    stage1 = (63 * layer + h + vocab_rows * h) * 2
    sc = load_scenario(PP_SCENARIO)
    m, p = load_model("llama-3.1-405b"), load_profile("h200-sxm")
    b = stage_budgets(sc, m, p)
    assert [x.weight_bytes for x in b] == [stage0, stage1]
    kv_per_token = 63 * 2 * 1 * 128 * 2  # 63 layers, K and V, 1 KV head per GPU, 128 dims, bf16
    assert [int(x.kv_bytes // kv_per_token) for x in b] == [x.kv_tokens for x in b]
    assert memory_budget(sc, m, p).kv_tokens == min(x.kv_tokens for x in b)
    assert replica_configs(sc)[0].kv_bytes_per_token == kv_per_token


def test_kv_capacity_per_replica_more_than_doubles_with_two_stages():
    """70B on H100 at TP 4: two stages hold half the weights and half the layers' KV per
    GPU, so (usable - W/8) / (K/8) > 2 (usable - W/4) / (K/4) tokens."""
    m, p = load_model("llama-2-70b"), load_profile("h100-sxm")
    one = memory_budget(load_scenario(TP_SCENARIO), m, p).kv_tokens
    two = memory_budget(load_scenario(TP_SCENARIO, {"parallel.pipeline": 2}), m, p).kv_tokens
    assert two > 2 * one


def test_tied_embeddings_put_a_copy_of_the_lm_head_on_the_last_stage():
    m = load_model("llama-3.2-1b")
    assert m.tied_embeddings
    ops = m.ops()
    last = stage_ops(ops, 1, 2)
    assert last.find("lm_head").params == m.vocab * m.hidden
    assert stage_ops(ops, 0, 2).params + last.params == ops.params + m.vocab * m.hidden


def test_activation_transfer_across_nodes_hand_computed():
    """One decode token of 405B at TP 8 across two nodes: hidden states and residual,
    2 x 16384 x 2 bytes = 65536 B, each rank sends 1/8 over its 400 Gb/s NIC (50 GB/s,
    10 us), then the receiving group all-gathers the 65536 B over NVLink (7/8 S / 285 GB/s
    + 7 x 3 us)."""
    lat = replica_configs(load_scenario(PP_SCENARIO))[0].latency
    expected = 10e-6 + 8192 / 50e9 + (7 / 8 * 65536 / 285e9 + 7 * 3e-6)
    assert lat.transfer_s(1) == pytest.approx(expected, rel=1e-12)
    assert lat.link.across_nodes
    inside = replica_configs(load_scenario(PP_SCENARIO, {"parallel.tensor": 4}))[0].latency
    assert not inside.link.across_nodes  # 4 x 2 GPUs: one node, NVLink 450 GB/s, 3 us
    assert inside.transfer_s(1) == pytest.approx(
        3e-6 + 16384 / 450e9 + (3 / 4 * 65536 / 285e9 + 3 * 3e-6), rel=1e-12)


def _single(prompt: int, output: int, **extra):
    over = _small(**extra, **{"runtime": "cuda-graph", "workload.num_requests": 1,
                              "workload.prompt": {"kind": "fixed", "value": prompt},
                              "workload.output": {"kind": "fixed", "value": output}})
    return run(load_scenario(TP_SCENARIO, over))


def test_one_request_waits_the_sum_of_stage_times_and_transfers_and_leaves_a_bubble():
    """A lone prefill on 2 stages: TTFT = t0 + x + t1; each stage idles while the other
    works, bubble_s = 1 - t_s / (t0 + x + t1), about (P-1)/P = 1/2 for near-equal stages."""
    out = _single(1000, 1)
    lat = replica_configs(out.scenario)[0].latency
    t = [st.prefill([(1000, 0)]) for st in lat.stages]
    x = lat.transfer_s(1000)
    assert out.requests.ttft_s.iloc[0] == pytest.approx(t[0] + x + t[1], rel=1e-12)
    per = out.summary["pipeline"]["per_stage"]
    for s in (0, 1):
        assert per[s]["busy_s"] == pytest.approx(t[s], rel=1e-12)
        assert per[s]["bubble_share"] == pytest.approx(1 - t[s] / (t[0] + x + t[1]), rel=1e-9)
        assert per[s]["bubble_share"] == pytest.approx(1 / 2, abs=0.05)


def test_four_stages_leave_three_quarters_of_each_stage_idle_for_one_request():
    per = _single(1000, 20, pp=4).summary["pipeline"]["per_stage"]
    assert [s["layers"] for s in per] == [8, 8, 8, 8]
    for s in per:
        assert s["bubble_share"] == pytest.approx(3 / 4, abs=0.06)


def test_a_full_pipeline_completes_p_batches_per_cycle_of_stage_times():
    """2 stages, 2 x 32 equal requests at once: once both virtual engines hold 32 decodes,
    each engine's micro-batch takes t0 + x + t1 through the pipeline, so P = 2 batches of
    B = 32 complete per cycle, B · P / (t0 + x + t1), unless one stage cannot keep up with
    P batches per cycle (P · t_s > the cycle): then that stage paces it, B / t_s. The 8B
    model's last stage also runs the LM head (0.5 B of its 8 B weights), t1 ≈ 1.1 t0, so
    stage 1 paces the pipeline and stage 0 idles 1 - t0 / t1 of the time."""
    n, prompt, b = 64, 256, 32
    over = _small(**{"runtime": "cuda-graph", "scheduler.max_num_seqs": b,
                     "workload.num_requests": n,
                     "workload.arrival": {"kind": "constant", "rate": 1e6},
                     "workload.prompt": {"kind": "fixed", "value": prompt},
                     "workload.output": {"kind": "fixed", "value": 200}})
    out = run(load_scenario(TP_SCENARIO, over))
    steps = out.steps
    full = steps[(steps.kind == "decode") & (steps.num_seqs == b)]
    assert len(full) > 200
    window = full.iloc[50:-50]
    tokens_per_s = window.num_tokens.sum() / (window.t_end.iloc[-1] - window.t_end.iloc[0])
    lat = replica_configs(out.scenario)[0].latency
    ctx = int(window.kv_tokens.median() / n)  # each request's context, mid-window
    t = [st.decode(b, b * ctx, ctx) for st in lat.stages]
    cycle = sum(t) + lat.transfer_s(b)
    assert t[1] > t[0] and 2 * t[1] > cycle  # the last stage paces this pipeline
    assert tokens_per_s == pytest.approx(b / max(max(t), cycle / 2), rel=0.01)
    assert tokens_per_s > 1.8 * b / cycle  # near twice one engine's B / cycle
    bubble = [s["bubble_share"] for s in out.summary["pipeline"]["per_stage"]]
    # over the whole run (ramp-up and drain included): the pacing stage idles least
    assert bubble[1] < 0.1 and bubble[0] == pytest.approx(1 - t[0] / t[1], abs=0.05)


def test_equal_stages_run_p_batches_per_sum_of_stage_times():
    """Four stages of 8 layers whose LM head is a small share (3 x 8 equal middle-ish
    stages; the cycle, not one stage, paces them): throughput B · P / (Σ t_s + 3 x)."""
    n, prompt, b = 128, 256, 32
    over = _small(pp=4, **{"runtime": "cuda-graph", "scheduler.max_num_seqs": b,
                           "workload.num_requests": n,
                           "workload.arrival": {"kind": "constant", "rate": 1e6},
                           "workload.prompt": {"kind": "fixed", "value": prompt},
                           "workload.output": {"kind": "fixed", "value": 200}})
    out = run(load_scenario(TP_SCENARIO, over))
    steps = out.steps
    full = steps[(steps.kind == "decode") & (steps.num_seqs == b)].iloc[50:-50]
    tokens_per_s = full.num_tokens.sum() / (full.t_end.iloc[-1] - full.t_end.iloc[0])
    lat = replica_configs(out.scenario)[0].latency
    ctx = int(full.kv_tokens.median() / n)
    t = [st.decode(b, b * ctx, ctx) for st in lat.stages]
    cycle = sum(t) + 3 * lat.transfer_s(b)
    assert tokens_per_s == pytest.approx(b / max(max(t), cycle / 4), rel=0.01)


def test_pipeline_one_runs_the_plain_replica_exactly():
    plain = run(load_scenario(TP_SCENARIO, {"workload.num_requests": 60}))
    one = run(load_scenario(TP_SCENARIO, {"workload.num_requests": 60, "parallel.pipeline": 1}))
    assert "pipeline" not in one.summary
    assert np.array_equal(plain.requests.e2e_s, one.requests.e2e_s)


def test_every_request_ends_and_kv_is_conserved_under_load():
    out = run(load_scenario(PP_SCENARIO, {"workload.num_requests": 150,
                                          "workload.arrival.rate": 20}))
    assert out.summary["requests"]["finished"] == 150
    per = out.summary["pipeline"]["per_stage"]
    assert all(0 <= s["bubble_share"] < 1 and 0 < s["busy_share"] <= 1 for s in per)


@pytest.mark.parametrize("over, says", [
    ({"parallel.pipeline": 127}, "parallel.pipeline: 127 stages for the 126 layers of llama-3.1-405b"),
    ({"parallel.stage_link": "carrier-pigeon"}, "parallel.stage_link: unknown 'carrier-pigeon'"),
    ({"speculative": {"method": "ngram"}, "scheduler.policy": "continuous",
      "scheduler.max_num_batched_tokens": 8192},
     "speculative.method: speculative decoding with pipeline: 2 is not modelled"),
    ({"scheduler.policy": "static"}, "scheduler.policy: static batching with pipeline: 2"),
    ({"gpu": "h100-sxm", "parallel.tensor": 2},
     "parallel.pipeline: does not fit: weights 189.0 GiB"),
])
def test_refused_pipeline_layouts_get_one_line(over, says):
    with pytest.raises(SpecError) as e:
        replica_configs(load_scenario(PP_SCENARIO, over))
    assert says in str(e.value) and "\n" not in str(e.value)


def test_a_stage_that_does_not_fit_is_named():
    with pytest.raises(SpecError, match=r"pipeline stage 0 of 2.*more pipeline stages"):
        replica_configs(load_scenario(PP_SCENARIO, {"gpu": "h100-sxm", "parallel.tensor": 2}))


def test_prefix_caching_serves_every_micro_batch_and_returns_every_block():
    """The Mooncake trace's shared prefixes through 2 stages: every request ends, every KV
    block and prefix reference is given back (simulate checks), and the one cache hits
    about as often as without stages (the same requests reach the same cache)."""
    over = {"workload.num_requests": 1500}
    one = run(load_scenario(ROOT / "scenarios" / "prefix_caching_mooncake.yaml", over))
    two = run(load_scenario(ROOT / "scenarios" / "prefix_caching_mooncake.yaml",
                            {**over, "parallel.pipeline": 2}))
    assert two.summary["requests"]["finished"] + two.summary["requests"]["rejected"] == 1500
    assert two.summary["prefix_cache"]["hit_rate"] == pytest.approx(
        one.summary["prefix_cache"]["hit_rate"], abs=0.05)


def test_summary_pipeline_section_is_json(tmp_path):
    out = run(load_scenario(PP_SCENARIO, {"workload.num_requests": 30}))
    folder = out.write(tmp_path / "r", plots=False)
    s = json.loads((folder / "summary.json").read_text())
    assert s["pipeline"]["stages"] == 2 and s["parallel"]["pipeline"] == 2
    assert [x["layers"] for x in s["pipeline"]["per_stage"]] == [63, 63]


SMALL_PP = """\
name: small_pp
seed: 3
model: llama-3.1-8b
gpu: h200-sxm
runtime: cuda-graph
parallel: {tensor: 1, pipeline: 2}
scheduler: {policy: chunked, max_num_seqs: 64, max_num_batched_tokens: 1024}
kv: {manager: paged, block_size: 16, max_model_len: 4096}
slo: {ttft_s: 0.5, tpot_s: 0.05}
workload:
  num_requests: 60
  arrival: {kind: poisson, rate: 8}
  prompt: {kind: lognormal, median: 512, sigma: 0.8, max: 2048}
  output: {kind: lognormal, median: 64, sigma: 0.5, max: 256}
"""


def test_run_sweep_curve_and_plan_take_a_pipelined_scenario(tmp_path, llmsim):
    sc = tmp_path / "small_pp.yaml"
    sc.write_text(SMALL_PP)
    r = llmsim("run", str(sc), "--out", str(tmp_path / "run"))
    assert r.returncode == 0, r.stderr
    assert "pipeline: 2 stages x tensor 1" in r.stdout and "bubble" in r.stdout
    s = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert [x["layers"] for x in s["pipeline"]["per_stage"]] == [16, 16]
    r = llmsim("sweep", str(sc), "--field", "parallel.pipeline", "--values", "1,2,4",
               "--out", str(tmp_path / "sweep"))
    assert r.returncode == 0, r.stderr
    r = llmsim("curve", str(sc), "--rates", "4,16", "--requests", "60", "--workers", "1",
               "--out", str(tmp_path / "curve"))
    assert r.returncode == 0, r.stderr
    plan = tmp_path / "plan.yaml"
    plan.write_text("name: pp\nscenario: small_pp.yaml\ntarget_rate: 10\n"
                    "slo: {ttft_p99_s: 0.5, tpot_p99_s: 0.05}\n"
                    "search: {seeds: 1, requests: 40, rate_start: 8, max_probes: 3, "
                    "fleet_checks: 1, fleet_traffic_s: 20, headroom_probes: 0}\n"
                    "candidates:\n  pipeline: [1, 2]\n")
    r = llmsim("plan", str(plan), "--out", str(tmp_path / "plan"), "--workers", "1", timeout=600)
    assert r.returncode == 0, r.stderr
    rows = json.loads((tmp_path / "plan" / "plan.json").read_text())["candidates"]
    pp2 = next(row for row in rows if row["candidate"] == "pp2")
    assert pp2["unit_gpus"] == 2 and "pp2" in pp2["unit"]
    if pp2["status"] == "ok":
        assert len(pp2["stage_bubble_share"].split(" / ")) == 2


@pytest.mark.parametrize("pp, policy", [(2, "continuous"), (3, "chunked"), (4, "continuous")])
def test_invariants_of_a_pipelined_run(pp, policy):
    """Every request ends; no stage is busy longer than the run or idle more than all of
    it; no request's first token comes sooner than its prompt's lone prefill through every
    stage and transfer (continuous: a prompt is prefilled in one micro-batch)."""
    over = _small(pp, **{"runtime": "cuda-graph", "scheduler.policy": policy,
                         "scheduler.max_num_batched_tokens": 4096, "workload.num_requests": 120,
                         "workload.arrival": {"kind": "poisson", "rate": 30}})
    out = run(load_scenario(TP_SCENARIO, over))
    s = out.summary
    assert s["requests"]["finished"] == 120
    per = s["pipeline"]["per_stage"]
    assert len(per) == pp and sum(x["layers"] for x in per) == 32
    for x in per:
        assert 0 < x["busy_s"] <= s["duration_s"] and 0 <= x["bubble_share"] < 1
    if policy == "continuous":
        lat = replica_configs(out.scenario)[0].latency
        req = out.requests
        for p, ttft in zip(req.prompt_tokens, req.ttft_s, strict=True):
            alone = sum(st.prefill([(int(p), 0)]) for st in lat.stages) + (pp - 1) * lat.transfer_s(int(p))
            assert ttft >= alone * (1 - 1e-9)
