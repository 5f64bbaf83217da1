"""Step-time jitter: a live server's step takes the model's time times a random factor.

A runtime profile may carry a fitted distribution of measured / modelled step time per
step kind (`sim/logfit.py` fits it from a serving log), stored as an empirical quantile
table: `quantiles[i]` is the factor at cumulative probability i / (n - 1), linear in
between. A step's time is the model's value times a factor drawn from its kind's table
(prefill steps from `prefill`; decode, verify and mixed steps from `decode`), so the
simulated tails (p90, p99) carry the live stack's stalls rather than only its medians.

Deterministic per seed: the factors come from their own Generator,
`np.random.default_rng([seed, 1])`, so the workload's random stream is unchanged and
the same seed gives the same run. Factors are drawn in blocks of 4096 (one numpy call
per block), so a step pays one list index. Off (no wrapper at all) for runtimes
without a jitter table.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

BLOCK = 4096


def _check_table(name: str, q: tuple[float, ...]) -> tuple[str, str] | None:
    if len(q) < 2:
        return name, "needs at least 2 quantiles (the factors at probability 0 and 1)"
    if any(v <= 0 for v in q):
        return name, "factors must be > 0"
    if any(b < a for a, b in zip(q, q[1:], strict=False)):
        return name, "quantiles must be non-decreasing"
    return None


@dataclass(frozen=True)
class JitterSpec:
    """Measured / modelled step time, as quantile tables per step kind (fitted)."""

    decode: tuple[float, ...] = field(default=(1.0, 1.0))
    prefill: tuple[float, ...] = field(default=(1.0, 1.0))
    source: str = ""

    def check(self):
        return _check_table("decode", self.decode) or _check_table("prefill", self.prefill)


class FactorStream:
    """Factors drawn from one quantile table, a block at a time."""

    def __init__(self, quantiles: tuple[float, ...], rng: np.random.Generator):
        self.q = np.asarray(quantiles, dtype=float)
        self.p = np.linspace(0.0, 1.0, len(self.q))
        self.rng = rng
        self.block: list[float] = []
        self.i = 0

    def refill(self) -> None:
        self.block = np.interp(self.rng.random(BLOCK), self.p, self.q).tolist()
        self.i = 0

    def next(self) -> float:
        if self.i == len(self.block):
            self.refill()
        f = self.block[self.i]
        self.i += 1
        return f


class JitteredLatency:
    """A StepLatency whose step methods return jittered seconds; everything else passes
    through (memo, provenance, piece lookups)."""

    def __init__(self, base, spec: JitterSpec, seed: int, replica: int = 0):
        self.base = base
        rng = np.random.default_rng([seed, 1] if replica == 0 else [seed, 1, replica])
        self.decode_f = FactorStream(spec.decode, rng)
        self.prefill_f = FactorStream(spec.prefill, rng)

    def __getattr__(self, name: str):
        return getattr(self.base, name)

    def decode(self, n: int, sum_ctx: int, max_ctx: int = 0) -> float:
        return self.base.decode(n, sum_ctx, max_ctx) * self.decode_f.next()

    def prefill(self, chunks: list[tuple[int, int]], seen: set | None = None) -> float:
        return self.base.prefill(chunks, seen) * self.prefill_f.next()

    def mixed(self, n: int, sum_ctx: int, max_ctx: int, chunks: list[tuple[int, int]],
              seen: set | None = None) -> float:
        f = self.decode_f.next() if n else self.prefill_f.next()
        return self.base.mixed(n, sum_ctx, max_ctx, chunks, seen) * f

    def verify(self, rows: list[tuple[int, int]]) -> float:
        return self.base.verify(rows) * self.decode_f.next()


def jittered(latency, seed: int, replica: int = 0):
    """`latency` with its runtime's jitter applied, or `latency` itself when it has none;
    each replica of a fleet draws its own stream."""
    spec = getattr(latency.rt, "jitter", None)
    return latency if spec is None else JitteredLatency(latency, spec, seed, replica)


def sample(spec: JitterSpec, kind: str, n: int, seed: int) -> np.ndarray:
    """`n` factors from one kind's table, drawn as a run's streams draw them (tests, reports)."""
    table = spec.prefill if kind == "prefill" else spec.decode
    stream = FactorStream(table, np.random.default_rng([seed, 1]))
    return np.array([stream.next() for _ in range(n)])
