"""Pipeline parallelism combined with expert parallelism and attention data parallelism:
each stage a D x tensor group with its own layers' experts and all-to-alls; known answers."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from sim.config.scenario import load_scenario
from sim.costmodel.latency import StepLatency
from sim.costmodel.models import load_model
from sim.costmodel.parallel import ParallelSpec, check_layout
from sim.costmodel.pipeline import StageLatency, stage_link
from sim.costmodel.profiles import load_profile
from sim.costmodel.runtime import load_runtime
from sim.engine.build import replica_configs
from sim.engine.memory import memory_budget, stage_budgets
from sim.engine.runner import run
from sim.io.specload import SpecError, build

ROOT = Path(__file__).resolve().parent.parent
R1 = ROOT / "scenarios" / "deepseek_r1_h200.yaml"
PP_EP = ParallelSpec(data=8, expert=8, pipeline=2)


def _r1():
    return dataclasses.replace(load_model("deepseek-r1"), weight_dtype_bytes=1)


def test_each_stage_runs_a_dispatch_and_a_combine_for_each_of_its_moe_layers():
    # R1: 61 layers, the first 3 dense; vLLM's split of 61 over 2 stages is 31 + 30, so
    # stage 0 holds 3 dense + 28 MoE layers (56 all-to-alls), stage 1 30 MoE layers (60)
    m, p, rt = _r1(), load_profile("h200-sxm"), load_runtime("cuda-graph")
    stages = [StageLatency(m, p, rt, tensor=1, fp8_weights=True, expert=8, data=8, stage=s,
                           stages=2) for s in (0, 1)]
    assert [s.layers for s in stages] == [31, 30]
    calls = [sum(c for k, _, c, _ in s._collectives if k == "all_to_all") for s in stages]
    assert calls == [56, 60]


def test_stage_times_add_up_to_the_unstaged_step_of_the_same_layout():
    # cutting the layer list moves work between GPUs, never adds or drops any: the stages'
    # GPU ms of a step sum to the one-stage replica's (the same EP 8 + DP 8 ranks)
    m, p, rt = _r1(), load_profile("h200-sxm"), load_runtime("cuda-graph")
    kw = {"tensor": 1, "fp8_weights": True, "expert": 8, "data": 8}
    whole = StepLatency(m, p, rt, **kw)
    stages = [StageLatency(m, p, rt, stage=s, stages=2, **kw) for s in (0, 1)]
    for tokens in (64, 1024, 8192):
        parts = sum(s.dense_ms(tokens) + s.lm_head_ms(tokens // 8) for s in stages)
        assert parts == pytest.approx(whole.dense_ms(tokens) + whole.lm_head_ms(tokens // 8),
                                      rel=1e-9)


def test_each_attention_rank_sends_its_own_tokens_to_the_next_stage():
    sc = load_scenario(R1)
    sc = dataclasses.replace(sc, parallel=PP_EP)
    (cfg,) = replica_configs(sc)
    staged = cfg.latency
    # 16 GPUs: two 8-GPU nodes, so the stages talk over infiniband-ndr400 (50 GB/s, 10 us);
    # 1,024 tokens over 8 ranks: 128 x 7,168 hidden x 2 tensors x 2 bytes = 3,670,016 B
    assert staged.link.across_nodes and staged.link.name == "infiniband-ndr400"
    assert staged.transfer_s(1024) * 1e6 == pytest.approx(10 + 3_670_016 / 50e3)
    assert stage_link(ParallelSpec(data=4, expert=4, pipeline=2), load_profile("h200-sxm")
                      ).across_nodes is False  # 8 GPUs: one node, NVLink


def test_memory_per_stage_holds_its_layers_and_kv_for_every_rank():
    sc = dataclasses.replace(load_scenario(R1), parallel=PP_EP)
    m, p = load_model("deepseek-r1"), load_profile("h200-sxm")
    m = dataclasses.replace(m, weight_dtype_bytes=1, kv_dtype_bytes=1)
    one = memory_budget(dataclasses.replace(sc, parallel=ParallelSpec(data=8, expert=8)), m, p)
    budgets = stage_budgets(sc, m, p)
    # untied embeddings: stage 0 the embedding, stage 1 the LM head, each its own layers:
    # the two stages' GPUs together hold what one unstaged GPU holds
    assert sum(b.weight_bytes for b in budgets) == pytest.approx(one.weight_bytes, rel=1e-9)
    # MLA's fp8 cache: (512 latent + 64 rope) bytes a token a layer, 31 and 30 layers; each
    # of the 8 attention ranks holds its own sequences' KV
    for b, layers in zip(budgets, (31, 30), strict=True):
        assert b.kv_tokens == 8 * int(b.kv_bytes // (layers * 576))
    assert memory_budget(sc, m, p).kv_tokens == min(b.kv_tokens for b in budgets)
    assert memory_budget(sc, m, p).kv_tokens > 4 * one.kv_tokens  # half the weights a GPU


def test_experts_must_spread_over_one_stage_not_the_whole_replica():
    with pytest.raises(SpecError, match=r"parallel\.data: 8 attention ranks need the experts "
                                        r"spread over all 8 GPUs of a stage"):
        build(ParallelSpec, {"data": 8, "expert": 16, "pipeline": 2}, file="s.yaml",
              path="parallel")
    check_layout(PP_EP, _r1(), load_profile("h200-sxm"))  # fine
    sc = dataclasses.replace(load_scenario(R1), parallel=PP_EP)
    sc = dataclasses.replace(sc, speculative=dataclasses.replace(sc.speculative, method="mtp"))
    with pytest.raises(SpecError, match="speculative decoding with pipeline: 2"):
        replica_configs(sc)


def test_a_pp_ep_replica_serves_its_requests():
    sc = dataclasses.replace(load_scenario(R1), parallel=PP_EP)
    sc = dataclasses.replace(sc, workload=dataclasses.replace(sc.workload, num_requests=60))
    out = run(sc)
    s = out.summary
    assert (out.requests.status == "finished").sum() == 60
    assert s["pipeline"]["stages"] == 2 and s["pipeline"]["data"] == 8
    assert [st["layers"] for st in s["pipeline"]["per_stage"]] == [31, 30]
