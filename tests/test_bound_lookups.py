"""Lookups bound to a replica's configuration (sim/costmodel/bound.py) give the bytes and
tags of the GPU profile's own lookups, and a latency model pricing with them fills its
memo (values, tags, use counts, order) and returns its seconds exactly as one pricing
through the profile's lookups: compared on random shapes, cold, on measured, derived and
table-borrowing profiles, with dense, sliding-window, MoE and FP8-KV models, tensor and
data parallel."""

from __future__ import annotations

from contextlib import contextmanager
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import sim.costmodel.latency as latency_module
from sim.costmodel.bound import (
    bound_decode_attn,
    bound_elementwise,
    bound_gemm,
    bound_prefill_attn,
)
from sim.costmodel.latency import StepLatency
from sim.costmodel.models import load_model
from sim.costmodel.parallel import DTypeSpec, with_dtypes
from sim.costmodel.profiles import IMPLS, load_profile
from sim.costmodel.runtime import load_runtime

# measured (the H200), derived from the H200 (B200), the H200's GEMM and elementwise rows
# with its own attention (H100), Vidur's fused A100 rows, an analytic-heavy AMD profile
PROFILES = ["h200-sxm", "b200", "h100-sxm", "a100-80gb", "mi300x"]
HEADS = [(32, 8, 128), (64, 8, 128), (8, 2, 128), (16, 16, 64), (4, 1, 64), (40, 8, 128)]
DECODE_IMPLS = [*IMPLS["attn_decode"]]


def fresh(name: str):
    """The shared profile with its memo and bound lookups emptied: every lookup cold."""
    p = load_profile(name)
    p._memo.clear()
    p.bound.clear()
    return p


@settings(max_examples=150, deadline=None)
@given(name=st.sampled_from(PROFILES), data=st.data())
def test_a_bound_gemm_or_elementwise_lookup_is_the_profiles(name, data):
    p = fresh(name)
    m = data.draw(st.integers(1, 40000))
    k, n = data.draw(st.sampled_from([*p._gemm, (4096, 5120), (1024, 333)]))
    f = bound_gemm(p, k, n)
    assert f(m) == p.gemm(m, k, n) and f(m) == p.gemm(m, k, n)  # cold, then memoised
    op = data.draw(st.sampled_from(IMPLS["elementwise"]))
    width = data.draw(st.sampled_from([*(w for o, w in p._elem if o == op), 4096, 2048, 777]))
    g = bound_elementwise(p, op, width)
    assert g(m) == p.elementwise(op, m, width) and g(m) == p.elementwise(op, m, width)


def heads_of(p, tables: dict, data) -> tuple[int, int, int]:
    """Mostly a configuration the profile measured (bound), else one it did not."""
    measured = sorted({c[1:] for c in tables})
    return data.draw(st.sampled_from(measured * 4 + HEADS if measured else HEADS))


@settings(max_examples=300, deadline=None)
@given(name=st.sampled_from(PROFILES), impl=st.sampled_from(DECODE_IMPLS),
       batch=st.integers(1, 600), mean=st.integers(1, 40000),
       extra=st.integers(0, 10**6), mixed=st.booleans(), again=st.booleans(), data=st.data())
def test_a_bound_decode_attention_lookup_is_the_profiles(name, impl, batch, mean,
                                                         extra, mixed, again, data):
    p = fresh(name)
    heads = heads_of(p, p._dec, data)
    f = bound_decode_attn(p, impl, *heads)
    sum_ctx = batch * mean + extra % batch  # any total, not only a multiple of the batch
    longest = (-(-sum_ctx // batch) + extra % max(1, sum_ctx - -(-sum_ctx // batch) + 1)
               if mixed else None)
    if again:  # the mean's time memoised first, by the bound lookup or by the profile
        f(batch, sum_ctx)
    got = f(batch, sum_ctx, longest)
    p._memo.clear()
    assert got == p.decode_attn(impl, batch, sum_ctx, *heads, max_ctx=longest)


@settings(max_examples=200, deadline=None)
@given(name=st.sampled_from(PROFILES), impl=st.sampled_from(IMPLS["attn_prefill"]),
       batch=st.integers(1, 8), q=st.integers(1, 9000),
       cached=st.one_of(st.just(0), st.integers(1, 40000)), data=st.data())
def test_a_bound_prefill_attention_lookup_is_the_profiles(name, impl, batch, q, cached, data):
    p = fresh(name)
    heads = heads_of(p, p._pre, data)
    got = bound_prefill_attn(p, impl, *heads)(batch, q, q + cached)
    p._memo.clear()
    assert got == p.prefill_attn(impl, batch, q, q + cached, *heads)


def test_a_bound_lookup_refuses_what_the_profile_refuses():
    p = fresh("h200-sxm")
    with pytest.raises(ValueError, match="batch <= sum_ctx"):
        bound_decode_attn(p, "paged_reference", 32, 8, 128)(8, 4)
    with pytest.raises(ValueError, match="kv_len >= q_len"):
        bound_prefill_attn(p, "flash", 32, 8, 128)(1, 100, 50)
    with pytest.raises(ValueError, match=">= 1"):
        bound_gemm(p, 4096, 4096)(0)


# ---- a whole latency model: bound lookups against the profile's own, step by step -------

def _plain_gemm(p, k, n):
    return lambda m: p.gemm(m, k, n)


def _plain_elementwise(p, op, width):
    return lambda m: p.elementwise(op, m, width)


def _plain_decode(p, impl, hq, hkv, d):
    return lambda b, s, mx=None: p.decode_attn(impl, b, s, hq, hkv, d, max_ctx=mx)


def _plain_prefill(p, impl, hq, hkv, d):
    return lambda b, q, kv: p.prefill_attn(impl, b, q, kv, hq, hkv, d)


@contextmanager
def profile_lookups():
    """Latency models built inside look every kernel up through the profile's methods."""
    with mock.patch.multiple(latency_module, bound_gemm=_plain_gemm,
                             bound_elementwise=_plain_elementwise,
                             bound_decode_attn=_plain_decode,
                             bound_prefill_attn=_plain_prefill):
        yield


LAYOUTS = {  # (model, profile, runtime, layout, KV cache format)
    "llama-tp1": ("llama-3-8b", "h200-sxm", "h200-eager-live", {}, "bf16"),
    "llama-tp2": ("llama-3-8b", "h200-sxm", "h200-eager-live", {"tensor": 2}, "bf16"),
    "llama-dp2": ("llama-3-8b", "h200-sxm", "h200-eager-live", {"data": 2}, "bf16"),
    "llama-fp8kv-fused": ("llama-3.1-8b", "h200-sxm", "vllm", {}, "fp8"),
    "gpt-oss-sliding-moe": ("gpt-oss-20b", "b200", "vllm", {}, "bf16"),
    "mistral-a100": ("mistral-7b", "a100-80gb", "vllm-0.6", {}, "bf16"),
}


def build(layout: str, plain: bool) -> StepLatency:
    model, gpu, runtime, kw, kv = LAYOUTS[layout]
    p = load_profile(gpu)
    m = with_dtypes(load_model(model), DTypeSpec(kv_cache=kv), p)
    with profile_lookups() if plain else contextmanager(lambda: (yield))():
        return StepLatency(m, p, load_runtime(runtime), "flash", "paged",
                           verify_impl="paged", **kw)


chunk = st.tuples(st.integers(1, 3000), st.integers(0, 20000))
step = st.one_of(
    st.tuples(st.just("decode"), st.integers(1, 300), st.integers(1, 9000), st.integers(0, 30000)),
    st.tuples(st.just("prefill"), st.lists(chunk, min_size=1, max_size=4)),
    st.tuples(st.just("mixed"), st.integers(1, 200), st.integers(1, 9000), st.integers(0, 30000),
              st.lists(chunk, min_size=1, max_size=3)),
    st.tuples(st.just("verify"), st.integers(1, 64), st.integers(1, 5), st.integers(1, 9000),
              st.integers(0, 30000)),
)


@settings(max_examples=60, deadline=None)
@given(layout=st.sampled_from(sorted(LAYOUTS)), steps=st.lists(step, min_size=1, max_size=25))
def test_a_latency_model_with_bound_lookups_prices_as_the_profiles_lookups_do(layout, steps):
    fast, plain = build(layout, plain=False), build(layout, plain=True)
    fast.p._memo.clear()
    fast.p.bound.clear()
    fast = build(layout, plain=False)  # bound afresh: every bound lookup cold
    for s in steps:
        got = []
        for lat in (fast, plain):
            kind = s[0]
            if kind == "decode":
                _, n, mean, extra = s
                got.append(lat.decode(n, n * mean, mean + extra))
            elif kind == "prefill":
                got.append(lat.prefill(s[1], set()))
            elif kind == "mixed":
                _, n, mean, extra, chunks = s
                got.append(lat.mixed(n, n * mean, mean + extra, chunks, set()))
            else:
                _, n, q, mean, extra = s
                got.append(lat.verify_batch(n, q, n * mean, mean + extra,
                                            [(q, mean)] * n))
            got.append(lat.kernel_s)
        assert got[:2] == got[2:]
    assert list(fast._memo.items()) == list(plain._memo.items())
    assert fast.provenance_seconds() == plain.provenance_seconds()
