"""Decode attention over a batch of mixed context lengths.

Decode is looked up at (batch, mean context = sum_ctx / batch). On the H200's
mixed-length rows (max context ≈ 8k, mean 3.3k–6.5k) the mean alone underpredicts
paged by up to 42 % (mean 17 %) and paged_gather by up to 49 % (mean 35 %): they
pay for the longest sequence. Given `max_ctx`, the time moves (in log space) from
the mean-context time towards the max-context one by a weight per batch size fitted
at load to the table's mixed rows (paged ≈ 0.9 at batch ≤ 16, ≈ 0.2 above;
paged_gather ≈ 0.76); fitted to the MHA rows alone, it predicts the GQA rows
within 9.2 % (paged, mean 4.9 %) and 2.8 % (paged_gather, mean 1.2 %).
`GPUProfile.decode_attn` (sim/costmodel/profiles.py) applies them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from sim.io.tables import Grid, bracket


@dataclass(frozen=True)
class MixWeights:
    """One decode configuration's weights towards the max-context time, per measured batch
    size (sorted), interpolated in log batch between them and held beyond them."""

    batches: list[int]
    weights: list[float]
    logs: list[float] = field(init=False, repr=False, compare=False)  # log of each batch
    _at: dict[int, float] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self):
        object.__setattr__(self, "logs", [math.log(x) for x in self.batches])

    def at(self, batch: int) -> float:
        w = self._at.get(batch)  # each batch size's weight computed once
        if w is None:
            w = self._at[batch] = self._weight(batch)
        return w

    def _weight(self, batch: int) -> float:
        batches, weights = self.batches, self.weights
        b = min(max(batch, batches[0]), batches[-1])
        i, w = bracket(batches, self.logs, b)
        return weights[i] + w * (weights[i + 1] - weights[i]) if len(batches) > 1 else weights[0]


def fit_mix_weights(mixed: dict[tuple, dict[tuple, float]],
                    uniform: dict[tuple, Grid]) -> dict[tuple, MixWeights]:
    """Per configuration, from its mixed rows {(batch, sum_ctx, max_ctx): ms}: each row's
    weight w with ms = lo^(1-w) · hi^w (lo, hi: the uniform table's times at the mean and
    at the max context; clipped to [0, 1]), the median per batch size. A configuration
    none of whose rows lies above its mean-context time gets no weights."""
    out: dict[tuple, MixWeights] = {}
    for c, rows in mixed.items():
        by_batch: dict[int, list[float]] = {}
        for (b, s, mx), ms in rows.items():
            lo, hi = uniform[c].lookup(b, s / b)[0], uniform[c].lookup(b, mx)[0]
            if hi > lo:
                w = math.log(ms / lo) / math.log(hi / lo)
                by_batch.setdefault(b, []).append(min(1.0, max(0.0, w)))
        if by_batch:
            batches = sorted(by_batch)
            out[c] = MixWeights(batches, [median(by_batch[b]) for b in batches])
    return out


def median(values: list[float]) -> float:
    """`statistics.median`'s value (the middle one, or the mean of the middle two), without
    importing `statistics` (with `fractions` and `decimal`: ~3 ms of every run's start)."""
    s = sorted(values)
    n = len(s)
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


def blend(lo_ms: float, hi_ms: float, weight: float) -> float:
    """The mixed batch's time: from the mean-context time towards the max-context one."""
    return lo_ms ** (1 - weight) * hi_ms ** weight
