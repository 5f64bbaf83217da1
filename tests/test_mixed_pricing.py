"""A chunked-prefill step priced from a warm memo (sim/costmodel/latency.py
`StepLatency.mixed`'s dict hits, `_combine`'s host terms memoised on the step's counts)
gives the bytes of the plain formula, written out here, and counts the same uses of each
memo entry: on shapes in any order, repeats included."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from sim.costmodel.jitter import jittered
from sim.costmodel.latency import StepLatency
from sim.costmodel.models import load_model
from sim.costmodel.profiles import load_profile
from sim.costmodel.runtime import load_runtime

H200 = load_profile("h200-sxm")
LAYOUTS = {"tp1": dict(tensor=1), "tp2": dict(tensor=2), "dp2": dict(tensor=1, data=2)}


def latency(layout: str, runtime: str) -> StepLatency:
    return StepLatency(load_model("llama-3-8b"), H200, load_runtime(runtime), "flash",
                       "paged_reference", **LAYOUTS[layout])


def plain_mixed(lat: StepLatency, n: int, sum_ctx: int, max_ctx: int,
                chunks: list[tuple[int, int]]) -> tuple[float, float]:
    """(seconds, kernel seconds) of a step of `n` decodes and `chunks`, piece by piece and
    with `_combine`'s formula (no new-shape stall), as before either was memoised."""
    tokens, gpu = lat._per_sequence(chunks, lat.prefill_attn_ms)
    gpu += lat.decode_attn_ms(n, sum_ctx, max_ctx)
    gpu += lat.dense_ms(n + tokens) + lat.lm_head_ms(n + len(chunks))
    rt, layers, pre, dec = lat.rt, lat.m.layers, len(chunks), n
    if lat.data > 1:
        pre, dec = lat._rank(pre), lat._rank(dec)
    host = (rt.host_ms_per_step + rt.host_ms_per_layer * layers
            + rt.host_ms_per_prefill_seq * pre + rt.host_ms_per_decode_seq * dec)
    host += rt.host_ms_per_layer_decode_extra * layers
    host += layers * (rt.host_ms_per_prefill_seq_layer * pre + rt.host_ms_per_verify_seq_layer * 0)
    g = gpu * rt.gpu_scale_decode
    serial = rt.serial_ms_per_step + rt.serial_ms_per_seq * (pre + dec)
    if lat.remote:
        serial += lat.remote * (rt.serial_ms_per_rank + rt.serial_ms_per_rank_seq * (pre + dec))
    return ((host + g if rt.combine == "sum" else max(host, g)) + serial) * 1e-3, g * 1e-3


steps = st.lists(st.tuples(st.integers(0, 40), st.integers(1, 3000), st.integers(0, 3000),
                           st.lists(st.tuples(st.sampled_from([1, 16, 100, 512]),
                                              st.sampled_from([0, 100, 2048])),
                                    min_size=1, max_size=3)),
                 min_size=1, max_size=10)


@settings(max_examples=30, deadline=None)
@given(shapes=steps, layout=st.sampled_from(sorted(LAYOUTS)),
       runtime=st.sampled_from(["h200-eager-live", "cuda-graph"]))
def test_a_mixed_step_prices_warm_as_the_plain_formula_does(shapes, layout, runtime):
    lat, plain = latency(layout, runtime), latency(layout, runtime)
    for _ in range(2):  # the second pass prices every shape from the warm memo
        for n, mean, longest, chunks in shapes:
            secs = lat.mixed(n, n * mean, mean + longest, chunks)
            if not n:  # a prefill step: StepLatency.prefill's own
                plain.prefill(chunks)
                continue
            assert (secs, lat.kernel_s) == plain_mixed(plain, n, n * mean, mean + longest, chunks)
    assert {k: e[2] for k, e in lat._memo.items()} == {k: e[2] for k, e in plain._memo.items()}


arrivals = st.lists(st.tuples(st.integers(0, 40), st.integers(1, 3000), st.integers(0, 3000),
                              st.sampled_from([1, 16, 100, 512, 2048])),
                    min_size=1, max_size=10)


@settings(max_examples=30, deadline=None)
@given(shapes=arrivals, layout=st.sampled_from(sorted(LAYOUTS)),
       runtime=st.sampled_from(["h200-eager-live", "cuda-graph"]))
def test_an_arrivals_one_chunk_step_prices_as_the_mixed_step_of_its_chunk(shapes, layout,
                                                                          runtime):
    """`mixed_one(n, .., q)` is `mixed(n, .., [(q, 0)])`: the same seconds, kernel seconds,
    memo use counts and new prefill shapes, cold and warm, jittered (the same draws) or not."""
    one, many = latency(layout, runtime), latency(layout, runtime)
    seen_one, seen_many = set(), set()
    jit_one, jit_many = jittered(one, 7, 1), jittered(many, 7, 1)
    for _ in range(2):  # cold, then from the warm memo
        for n, mean, longest, q in shapes:
            n_ctx = (n * mean, mean + longest)
            assert (one.mixed_one(n, *n_ctx, q, seen_one), one.kernel_s) == (
                many.mixed(n, *n_ctx, [(q, 0)], seen_many), many.kernel_s)
            assert jit_one.mixed_one(n, *n_ctx, q) == jit_many.mixed(n, *n_ctx, [(q, 0)])
    assert seen_one == seen_many
    assert {k: e[2] for k, e in one._memo.items()} == {k: e[2] for k, e in many._memo.items()}
