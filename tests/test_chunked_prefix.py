"""Chunked prefill and prefix caching: known timelines and KV conservation."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sim.engine.runner import run
from tests.test_engine import ROOT, latency_model, scenario


def test_long_prompt_is_prefilled_in_budget_sized_chunks_while_decodes_continue():
    sc = scenario(
        scheduler={"policy": "chunked", "max_num_batched_tokens": 512},
        workload={"num_requests": 2, "arrival": {"kind": "constant", "rate": 2.0},
                  "prompt": {"kind": "fixed", "value": 4000}, "output": {"kind": "fixed", "value": 300}},
    )
    out = run(sc)
    steps = out.steps
    # request 0 alone: ceil(4000 / 512) = 8 chunk steps; request 1 (at 0.5 s) then shares
    # steps with request 0's decodes (511 prompt tokens + 1 decode each)
    first = steps[steps.t_end <= out.requests.first_token_s[0] + 1e-12]
    assert (first.kind == "prefill").sum() == 8
    assert (steps.kind == "mixed").sum() >= 7
    assert steps.num_tokens.max() <= 512
    lat = latency_model()
    expected = sum(lat.prefill([(min(512, 4000 - d), d)]) for d in range(0, 4000, 512))
    assert out.requests.ttft_s[0] == pytest.approx(expected, rel=1e-9)


def test_second_request_reuses_the_cached_system_prompt():
    sc = scenario(
        kv={"prefix_caching": True},
        workload={"num_requests": 2, "arrival": {"kind": "constant", "rate": 0.1},
                  "prompt": {"kind": "fixed", "value": 200}, "output": {"kind": "fixed", "value": 10},
                  "shared_prefix": {"tokens": 1024, "fraction": 1.0}},
    )
    out = run(sc)
    req = out.requests
    assert list(req.prompt_tokens) == [1224, 1224]
    assert list(req.cached_tokens) == [0, 1024]
    lat = latency_model()
    assert req.ttft_s[0] == pytest.approx(lat.prefill([(1224, 0)]), rel=1e-9)
    assert req.ttft_s[1] == pytest.approx(lat.prefill([(200, 1024)]), rel=1e-9)
    pc = out.summary["prefix_cache"]
    assert pc["block_hits"] == 64 and pc["block_lookups"] == 2 * (1224 // 16)
    assert pc["hit_tokens"] == 1024 and pc["query_tokens"] == 2 * 1224


def test_fully_cached_prompt_still_computes_its_last_block():
    sc = scenario(
        kv={"prefix_caching": True},
        workload={"num_requests": 2, "arrival": {"kind": "constant", "rate": 0.1},
                  "prompt": {"kind": "fixed", "value": 1}, "output": {"kind": "fixed", "value": 5},
                  "shared_prefix": {"tokens": 1024, "fraction": 1.0}},
    )
    req = run(sc).requests
    assert req.cached_tokens[1] == 1024  # 1025 tokens: 64 full blocks cached, 1 token computed


def test_multi_turn_conversations_resend_their_history_and_hit_the_cache():
    sc = scenario(
        kv={"prefix_caching": True},
        workload={"num_requests": 40, "arrival": {"kind": "poisson", "rate": 2.0},
                  "prompt": {"kind": "fixed", "value": 100}, "output": {"kind": "fixed", "value": 50},
                  "multi_turn": {"turns": 4}},
    )
    out = run(sc)
    req = out.requests
    assert sorted(set(req.prompt_tokens)) == [100, 250, 400, 550]
    later = req[req.prompt_tokens > 100]
    assert (later.cached_tokens > 0).mean() > 0.9


def test_lru_eviction_under_memory_pressure_keeps_every_block_accounted_for():
    sc = scenario(
        kv={"prefix_caching": True, "num_blocks": 300},
        workload={"num_requests": 200, "arrival": {"kind": "poisson", "rate": 20.0},
                  "prompt": {"kind": "uniform", "low": 50, "high": 800},
                  "output": {"kind": "uniform", "low": 5, "high": 200},
                  "shared_prefix": {"tokens": 512, "fraction": 0.7, "groups": 6}},
    )
    out = run(sc)
    assert out.summary["prefix_cache"]["evictions"] > 0
    assert out.result.kv.free_blocks == out.result.kv.num_blocks
    assert (out.requests.status == "finished").all()


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 10_000),
    n=st.integers(1, 50),
    rate=st.floats(0.5, 200.0),
    blocks=st.integers(60, 400),
    policy=st.sampled_from(["continuous", "chunked"]),
    budget=st.sampled_from([64, 512, 2048]),
    caching=st.booleans(),
    prefix=st.sampled_from([None, {"tokens": 256, "fraction": 0.5, "groups": 2}, "multi"]),
)
def test_chunked_and_cached_runs_conserve_requests_and_blocks(seed, n, rate, blocks, policy, budget,
                                                              caching, prefix):
    wl = {"num_requests": n, "arrival": {"kind": "poisson", "rate": rate},
          "prompt": {"kind": "lognormal", "mean": 200, "sigma": 1.0, "max": 1500},
          "output": {"kind": "lognormal", "mean": 60, "sigma": 1.0, "max": 300}}
    if prefix == "multi":
        wl["multi_turn"] = {"turns": 3}
    elif prefix:
        wl["shared_prefix"] = prefix
    sc = scenario(seed=seed,
                  scheduler={"policy": policy, "max_num_batched_tokens": max(budget, 2048 if policy == "continuous" else budget),
                             "max_num_seqs": 32},
                  kv={"num_blocks": blocks, "prefix_caching": caching,
                      **({"max_model_len": 2048} if policy == "continuous" else {})}, workload=wl)
    out = run(sc)
    req = out.requests
    assert set(req.status) <= {"finished", "rejected"}
    assert out.result.kv.free_blocks == out.result.kv.num_blocks
    fin = req[req.status == "finished"]
    assert (fin.generated_tokens == fin.output_tokens).all()
    assert (fin.cached_tokens < fin.prompt_tokens).all()
    assert (out.steps.num_tokens <= max(budget, 2048 if policy == "continuous" else budget) + 32).all()


def test_chunked_rejects_a_prompt_whose_first_chunk_never_fits_above_the_watermark():
    # 68 tokens = 17 blocks of 4; 20 blocks with a 20 % watermark leave 16 to admit into
    out = run(scenario(scheduler={"policy": "chunked", "watermark": 0.2},
                       kv={"block_size": 4, "num_blocks": 20},
                       workload={"num_requests": 1, "prompt": {"kind": "fixed", "value": 68}}))
    req = out.requests
    assert list(req.status) == ["rejected"]
    assert "17 KV blocks, more than the 16" in req.reject_reason[0]


def test_prefix_cache_works_with_kv_blocks_larger_than_the_prefix_hash_blocks():
    # 16-token synthetic prefix hashes, 32-token KV blocks: the cache shares whole KV blocks
    out = run(scenario(
        kv={"prefix_caching": True, "block_size": 32},
        workload={"num_requests": 3, "arrival": {"kind": "constant", "rate": 0.1},
                  "prompt": {"kind": "fixed", "value": 200}, "output": {"kind": "fixed", "value": 10},
                  "shared_prefix": {"tokens": 64, "fraction": 1.0}}))
    req = out.requests
    assert list(req.cached_tokens) == [0, 64, 64]
    assert out.summary["prefix_cache"]["hash_block_tokens"] == 32
    assert out.result.kv.free_blocks == out.result.kv.num_blocks


def test_prefix_cache_with_a_block_size_that_does_not_divide_mooncake_hash_blocks():
    # 512-token hash blocks, 48-token KV blocks: shared in groups of lcm = 1536 tokens
    out = run(ROOT / "scenarios" / "prefix_caching_mooncake.yaml",
              {"kv.block_size": 48, "workload.trace.limit": 300})
    assert out.summary["prefix_cache"]["hash_block_tokens"] == 1536
    assert (out.requests.cached_tokens % 1536 == 0).all()
    assert out.result.kv.free_blocks == out.result.kv.num_blocks


def test_prefill_step_with_cache_hits_stays_within_the_token_budget_when_admissions_evict():
    # 18 blocks for 9 multi-turn requests: admitting one request evicts cached blocks that
    # a later admission of the same step planned to reuse
    out = run(scenario(
        seed=20, scheduler={"max_num_batched_tokens": 256, "watermark": 0.0, "max_num_seqs": 8},
        kv={"num_blocks": 18, "block_size": 16, "prefix_caching": True, "max_model_len": 256},
        workload={"num_requests": 9, "arrival": {"kind": "constant", "rate": 1000},
                  "prompt": {"kind": "uniform", "low": 1, "high": 100},
                  "output": {"kind": "uniform", "low": 1, "high": 30}, "multi_turn": {"turns": 3}}))
    prefill = out.steps[out.steps.kind == "prefill"]
    assert prefill.num_tokens.max() <= 256
    assert set(out.requests.status) <= {"finished", "rejected"}
    assert out.result.kv.free_blocks == 18


def test_chunked_starts_from_scratch_when_a_cached_prefix_does_not_fit_above_the_watermark():
    # the second request's 160 cached tokens plus a 16-token chunk need 11 blocks, the
    # watermark leaves 10 of 12: alone in the replica, it is prefilled without the cache
    out = run(scenario(
        scheduler={"policy": "chunked", "watermark": 0.2, "max_num_batched_tokens": 16},
        kv={"block_size": 16, "num_blocks": 12, "prefix_caching": True},
        workload={"num_requests": 2, "arrival": {"kind": "constant", "rate": 0.1},
                  "prompt": {"kind": "fixed", "value": 16}, "output": {"kind": "fixed", "value": 2},
                  "shared_prefix": {"tokens": 160}}))
    assert list(out.requests.status) == ["finished", "finished"]
    assert list(out.requests.cached_tokens) == [0, 0]
    assert out.result.kv.free_blocks == 12


def test_a_block_recomputed_while_its_evicted_copy_waits_in_host_memory_keeps_every_reference():
    # issue 18: a prompt of exactly one cached block recomputes that block (vLLM
    # recomputes the last token), and its copy in the host tier was inserted as new: the
    # block sat in the host tier and in the GPU cache at once, the next hit from the host
    # overwrote its reference count, and the second release was a KeyError.
    from sim.policies.batch import Seq
    from sim.policies.kv import PagedKV
    from sim.policies.prefix import PrefixCache

    kv = PagedKV(num_blocks=4, block_size=16)
    cache = PrefixCache(kv, hash_tokens=16, host_blocks=4)

    def request(rid: int) -> Seq:
        s = Seq(rid, 0.0, 16, 4, 4)
        s.prefix = (7,)
        return s

    a = request(0)
    cache.insert(a, 16)            # a computed the block: cached, referenced once
    assert cache.release(a) == 0   # ... and unreferenced (evictable) when a leaves
    kv.allocate(4)                 # memory pressure: the evictable block moves to host
    cache.evict_to_fit()
    kv.free(4)
    assert list(cache.host) == [7] and not cache.evictable
    b = request(1)
    assert cache.match(b) == 0     # its whole prompt is cached: the last block is recomputed
    cache.acquire(b, 0, True)
    cache.insert(b, 16)            # b's own GPU copy replaces the one in host memory
    assert 7 not in cache.host and cache.refs == {7: 1}
    c = request(2)
    c.prompt = 32                  # c reuses the block, from the GPU
    assert cache.match(c) == 1
    cache.acquire(c, 1, True)
    assert cache.refs == {7: 2} and cache.loaded == 0
    assert cache.release(b) == 1   # c still holds it
    assert cache.release(c) == 0
    assert cache.refs == {} and list(cache.evictable) == [7]
