"""StepLatency.decode_span: a decode step's price and the steps after it that share it
(the price a run of decode steps reuses: sim/engine/decoderun.py)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from sim.config.scenario import scenario_from_dict
from sim.costmodel.decode_attn import (
    Q5,
    Q7,
    RUN5,
    RUN7,
    TABLED,
    _ctx_keys,
    _quantize,
    _quantize_run,
)
from sim.engine.build import build_fleet
from sim.engine.processes import simulate
from sim.engine.runner import prepare
from tests.test_decoderun import scenario
from tests.test_engine import latency_model

LAT = latency_model()


def rounded(ctx: int, rel_bits: int) -> int:
    """The rounding decode keys stand on, written out (the reference)."""
    shift = ctx.bit_length() - rel_bits
    q = 1 << shift if shift > 4 else 16
    r = (ctx + (q >> 1)) // q * q
    return r if r > q else q


@given(st.integers(0, 1 << 22), st.sampled_from([5, 7]))
def test_a_rounded_length_holds_for_the_lengths_its_run_counts(ctx, bits):
    value, run = _quantize_run(ctx, bits)
    assert value == rounded(ctx, bits) and run >= 1
    assert rounded(ctx + run - 1, bits) == value  # (rounding is monotone: all between too)


def test_the_rounding_tables_hold_every_length_below_their_end():
    for bits, values, runs in ((7, Q7, RUN7), (5, Q5, RUN5)):
        assert len(values) == len(runs) == TABLED
        for ctx in range(TABLED):  # (the reference above, and the arithmetic beyond the tables)
            assert values[ctx] == rounded(ctx, bits) and (values[ctx], runs[ctx]) == _quantize_run(ctx, bits)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 64), st.integers(1, 100000), st.integers(0, 100000))  # tables and beyond
def test_the_steps_a_price_holds_for_share_its_memo_entry(n, mean, extra):
    sum_ctx, max_ctx = n * mean + extra % n, mean + extra
    seconds, kernel_s, entry, steps = LAT.decode_span(n, sum_ctx, max_ctx)
    assert steps >= 1 and seconds == LAT.decode(n, sum_ctx, max_ctx) == entry[3]
    assert kernel_s == LAT.kernel_s == entry[4]
    for i in {1 % steps, steps // 2, steps - 1}:  # (0 where the price holds for one step)
        uses = entry[2]
        assert LAT.decode_span(n, sum_ctx + n * i, max_ctx + i)[2] is entry
        assert entry[2] == uses + 1  # each lookup is one use


def memo_uses(leap: bool) -> dict:
    sc = scenario_from_dict(scenario(300, 60.0, (50, 600), runtime="h200-eager-live"))
    configs, wl, rng = prepare(sc)
    fleet = build_fleet(sc, configs, rng)
    simulate(wl, fleet.replicas, fleet.router, leap=leap)
    return {k: e[2] for k, e in configs[0].latency._memo.items()}


def test_runs_reusing_prices_count_each_steps_use_as_stepping_does():
    """The uses behind the lookup provenance: a run adds those of the steps that reused a
    price to its memo entry; the counts are stepping's, one a step."""
    leapt, stepped = memo_uses(True), memo_uses(False)
    assert leapt == stepped
    assert max(c for k, c in leapt.items() if k[0] == "decode") > 10


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 300), st.integers(0, 1 << 20), st.integers(0, 1 << 20))
def test_a_spans_key_and_steps_are_the_rounding_runs_of_its_lengths(n, mean, extra):
    """decode_span reads the rounding tables (arithmetic beyond them); its key and run are `_quantize_run`'s."""
    sum_ctx, max_ctx = n * mean + extra % n, mean + extra
    ctx_q, steps = _quantize_run(sum_ctx // n, 7)
    max_q = ctx_q
    if n > 1:
        max_q, more = _quantize_run(max_ctx, 5)
        max_q, steps = min(max(max_q, ctx_q), ctx_q * n), min(steps, more)
    _, _, entry, got = LAT.decode_span(n, sum_ctx, max_ctx)
    assert got == steps and entry is LAT._memo[("decode", n, ctx_q, max_q)]


@given(st.integers(1, 300), st.integers(0, 1 << 22), st.integers(0, 1 << 22))
def test_a_steps_attention_key_is_its_lengths_rounded(n, mean, extra):
    """`_ctx_keys` reads the tables (rounds inline beyond them); its key is `_quantize`'s of the mean and the longest."""
    sum_ctx, max_ctx = n * mean + extra % n, mean + extra
    ctx_q = _quantize(sum_ctx // n, 7)
    max_q = ctx_q if n == 1 else min(max(ctx_q, _quantize(max_ctx, 5)), ctx_q * n)
    assert _ctx_keys(n, sum_ctx, max_ctx) == (ctx_q, max_q)
