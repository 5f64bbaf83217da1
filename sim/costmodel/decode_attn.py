"""Decode attention of a batch: the contexts it is priced at, and its lookups per layer kind.

A decode (or decode-kernel verify) step attends over each sequence's whole context. The
GPU profile times the kernel at (batch, mean context), moved towards the longest context's
time (sim/costmodel/mixed_decode.py); a step is priced at its mean context rounded to
~2^-7 relative precision and its longest to ~2^-5 (`_quantize`), so the steps of a
decoding batch, each a token longer per sequence, share a price until a rounding boundary
(`_quantize_run`: how many do; sim/engine/decoderun.py leaps over them). Per layer kind:
full attention reads every context, a sliding-window layer at most its window; an FP8 KV
cache is read at the measured bf16 rate for its bytes (half the context, tagged
extrapolated). On D attention data-parallel ranks the busiest rank's ⌈n/D⌉ contexts.

`DecodeAttnPricing` is the part of `sim.costmodel.latency.StepLatency` that does this.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from sim.costmodel.models import ModelSpec
from sim.costmodel.profiles import ANALYTIC, BF16, EXTRAPOLATED


def _quantize(ctx: int, rel_bits: int) -> int:
    """Round a context length to ~2^-rel_bits relative precision (at least 16 tokens):
    decode attention is memoised on these, so a step's lookup is a dict hit."""
    return _quantize_run(ctx, rel_bits)[0]


def _quantize_run(ctx: int, rel_bits: int) -> tuple[int, int]:
    """`_quantize(ctx, rel_bits)`, and how many lengths from `ctx` on (ctx, ctx + 1, ...)
    round to it at least: up to the next rounding boundary, or the next power of two where
    the step `q` grows (where it may not change the value: a lower bound)."""
    bits = ctx.bit_length()
    shift = bits - rel_bits
    q = 1 << shift if shift > 4 else 16
    half = q >> 1
    r = (ctx + half) // q * q
    run = r + q - half - ctx  # (ctx + half) reaches the next multiple of q
    if shift >= 4 and (1 << bits) - ctx < run:  # at 2^bits the shift passes 4: q doubles
        run = (1 << bits) - ctx
    return (r if r > q else q), run


TABLED = 1 << 16  # lengths below this are rounded by table lookup (`rounding_table`)


def rounding_table(rel_bits: int) -> tuple[list[int], list[int]]:
    """`_quantize_run(ctx, rel_bits)` for every ctx below TABLED, as two lists (the rounded
    lengths, the runs): a decode step's keys by two list reads instead of the arithmetic
    (a run of decode steps renews its price every ~10 steps). Exact integers: numpy's
    int64 shifts and floor divisions as `_quantize_run`'s (tests/test_decode_span.py)."""
    ctx = np.arange(TABLED, dtype=np.int64)
    bits = np.zeros(TABLED, dtype=np.int64)  # ctx.bit_length()
    for b in range(1, 17):
        bits[1 << (b - 1):1 << b] = b
    shift = bits - rel_bits
    q = np.where(shift > 4, np.left_shift(1, np.maximum(shift, 0)), 16)
    half = q >> 1
    r = (ctx + half) // q * q
    run = r + q - half - ctx
    to_power = np.left_shift(1, bits) - ctx
    run = np.where((shift >= 4) & (to_power < run), to_power, run)
    return np.where(r > q, r, q).tolist(), run.tolist()


Q7, RUN7 = rounding_table(7)  # the mean context's rounding
Q5, RUN5 = rounding_table(5)  # the longest context's


def _ctx_keys(n: int, sum_ctx: int, max_ctx: int) -> tuple[int, int]:
    """The decode attention key of `n` contexts totalling `sum_ctx`, the longest `max_ctx`:
    (their mean rounded to 2^-7, the longest rounded to 2^-5 within [mean, n x mean]);
    `_quantize`'s rounding read from its tables (a chunked step's pricing asks this once a
    step), computed by `_quantize_run` beyond them."""
    ctx = sum_ctx // n
    ctx_q = Q7[ctx] if ctx < TABLED else _quantize_run(ctx, 7)[0]
    if n == 1:
        return ctx_q, ctx_q
    max_q = Q5[max_ctx] if max_ctx < TABLED else _quantize_run(max_ctx, 5)[0]
    return ctx_q, min(max(ctx_q, max_q), ctx_q * n)


class DecodeAttnPricing:
    """Decode attention's keys and parts (a mixin of `StepLatency`, which sets `m`, `data`,
    `attn_windows` and `_decode_attn`, the profile's decode lookup bound to the replica's
    kernel and heads, sim/costmodel/bound.py; `_rank` comes from sim/costmodel/ranks.py,
    `_piece` from StepLatency)."""

    m: ModelSpec
    data: int
    attn_windows: list[tuple[int, int]]
    _decode_attn: Callable[[int, int, int | None], tuple[float, str]]
    _rank: Callable[[int], int]
    _piece: Callable[[tuple, Callable], float]

    def decode_attn_ms(self, n: int, sum_ctx: int, max_ctx: int = 0) -> float:
        """Decode attention over `n` contexts totalling `sum_ctx`, the longest `max_ctx`
        (lengths mixed within a batch cost more than their mean suggests)."""
        ctx_q, max_q = self._ctx_keys(n, sum_ctx, max_ctx)
        return self._piece(("da", n, ctx_q, max_q), lambda: self._decode_attn_parts(n, ctx_q, max_q))

    _ctx_keys = staticmethod(_ctx_keys)

    def _kv_ctx(self, ctx: int) -> int:
        """The bf16 context of equal KV bytes: decode kernels read an fp8 cache's bytes at
        the measured bf16 rate (half the bytes for fp8; tagged by `_kv_tag`)."""
        kvb = self.m.kv_dtype_bytes
        return ctx if kvb == BF16 else max(1, round(ctx * kvb / BF16))

    def _kv_tag(self, tag: str) -> str:
        if self.m.kv_dtype_bytes == BF16 or tag in (EXTRAPOLATED, ANALYTIC):
            return tag
        return EXTRAPOLATED

    def _decode_attn_parts(self, n: int, ctx_q: int, max_q: int) -> list[tuple[float, str]]:
        """Decode attention over n contexts of mean ctx_q (the busiest rank's ⌈n/D⌉ of them)."""
        if self.data > 1:
            n = self._rank(n)
            max_q = min(max_q, ctx_q * n)
        same = self.m.kv_dtype_bytes == BF16  # `_kv_ctx` and `_kv_tag`: the identity
        parts = []
        for window, calls in self.attn_windows:  # a sliding layer reads min(context, window)
            c, mx = (min(ctx_q, window), min(max_q, window)) if window else (ctx_q, max_q)
            if not same:
                c, mx = self._kv_ctx(c), self._kv_ctx(mx)
            ms, tag = self._decode_attn(n, c * n, mx if mx > c else None)
            parts.append((calls * ms, tag if same else self._kv_tag(tag)))
        return parts

    def _windowed(self, ctx_q: int, max_q: int) -> list[tuple[int, int, int]]:
        """(mean, longest context, calls) per layer kind: a sliding layer reads at most its
        window of each context."""
        return [((min(ctx_q, window), min(max_q, window), calls) if window
                 else (ctx_q, max_q, calls)) for window, calls in self.attn_windows]

    def _verify_decode_parts(self, n: int, q: int, ctx_q: int, max_q: int
                             ) -> list[tuple[float, str]]:
        """Verifying `q` tokens of each of `n` sequences with the decode kernel: one query row
        per token, each reading its sequence's whole context."""
        r = self._rank(n)
        parts = []
        for c, mx, calls in self._windowed(ctx_q, max_q):
            c, mx = self._kv_ctx(c), self._kv_ctx(mx)
            mx = min(mx, c * r)
            ms, tag = self._decode_attn(r * q, c * r * q, mx if mx > c else None)
            parts.append((calls * ms, self._kv_tag(tag)))
        return parts
