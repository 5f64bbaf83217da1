"""Step-time jitter: a live server's step takes the model's time times a random factor.

A runtime profile may carry a fitted model of measured / modelled step time
(`sim/fit/logfit.py` fits it from a serving log, with the fitting helpers at the end of this
module), in three parts:

* a **marginal** per step kind, an empirical quantile table: `quantiles[i]` is the factor
  at cumulative probability i / (n - 1), linear in between (prefill steps draw from
  `prefill`; decode, verify and mixed steps from `decode`);
* optional **decode levels**: the median factor per band of decode batch sizes
  (`decode_levels`, bands by `max_seqs`), what the deterministic model leaves that
  depends on the batch's size (a decode or mixed step of n sequences is multiplied by
  its band's factor; beyond the last band by 1, the deterministic model's own value);
* optional **persistence** per kind: a live stack's slow and fast spells come in runs.
  Each kind's stream has a state (a draw from its marginal) that a step keeps with
  probability `stay` and redraws otherwise, so a state lasts 1 / (1 - stay) steps on
  average; a step takes the state's factor with probability `share`, else a fresh,
  independent draw. Every step's factor still follows the marginal exactly; the
  correlation of factors k steps of a kind apart is share² · stay^k (on their ranks).

Deterministic per seed: the factors come from their own Generator,
`np.random.default_rng([seed, 1])` (`[seed, 1, replica]` for a fleet's later
replicas), so the workload's random stream is unchanged and the same seed gives the same
run; without persistence the draws are those of independent factors. Factors are drawn
in blocks of 4096 (a few numpy calls per block), so a step pays one list index. Off (no
wrapper at all) for runtimes without a jitter model.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

BLOCK = 4096
MIN_BAND_STEPS = 30  # decode steps per level band (fewer: merged with the next band)
ACF_LAGS = 20  # lags of the persistence fit
MIN_PERSISTENCE_STEPS = 200  # fewer steps of a kind: autocorrelations too noisy (1/sqrt(n) > 0.07)


def _check_table(name: str, q: tuple[float, ...]) -> tuple[str, str] | None:
    if len(q) < 2:
        return name, "needs at least 2 quantiles (the factors at probability 0 and 1)"
    if any(v <= 0 for v in q):
        return name, "factors must be > 0"
    if any(b < a for a, b in zip(q, q[1:], strict=False)):
        return name, "quantiles must be non-decreasing"
    return None


@dataclass(frozen=True)
class Persistence:
    """How a kind's factors run together (fitted): keep the state with probability
    `stay` per step; take the state's factor with probability `share`."""

    stay: float = field(default=0.0, metadata={"ge": 0, "lt": 1})
    share: float = field(default=0.0, metadata={"ge": 0, "le": 1})


@dataclass(frozen=True)
class BatchLevel:
    """The median factor of decode steps of up to `max_seqs` sequences (and more than
    the previous band's)."""

    max_seqs: int = field(metadata={"ge": 1, "le": 1_000_000})
    factor: float = field(metadata={"gt": 0})


@dataclass(frozen=True)
class JitterSpec:
    """Measured / modelled step time: quantile tables per step kind, decode levels by
    batch size, persistence per kind (fitted)."""

    decode: tuple[float, ...] = field(default=(1.0, 1.0))
    prefill: tuple[float, ...] = field(default=(1.0, 1.0))
    decode_levels: tuple[BatchLevel, ...] = ()
    decode_persistence: Persistence = field(default_factory=Persistence)
    prefill_persistence: Persistence = field(default_factory=Persistence)
    source: str = ""

    def check(self):
        problem = _check_table("decode", self.decode) or _check_table("prefill", self.prefill)
        if problem:
            return problem
        bounds = [b.max_seqs for b in self.decode_levels]
        if any(b <= a for a, b in zip(bounds, bounds[1:], strict=False)):
            return "decode_levels", "max_seqs must increase from band to band"
        return None

    def level_by_seqs(self) -> list[float]:
        """The decode level factor of a step of n sequences at index n (n = 0 unused); the
        last entry, 1, is for steps larger than the last band. [1.0] without levels."""
        out = [1.0]
        for band in self.decode_levels:
            out += [band.factor] * (band.max_seqs + 1 - len(out))
        return out + [1.0]


class FactorStream:
    """Factors drawn from one quantile table, a block at a time, with persistence."""

    def __init__(self, quantiles: tuple[float, ...], rng: np.random.Generator,
                 persistence: Persistence | None = None):
        self.q = np.asarray(quantiles, dtype=float)
        self.p = np.linspace(0.0, 1.0, len(self.q))
        self.rng = rng
        keep = persistence if persistence is not None else Persistence()
        self.stay, self.share = keep.stay, keep.share
        self.state = -1.0  # the current state's probability (< 0: none drawn yet)
        self.block: list[float] = []
        self.i = 0

    def uniforms(self) -> np.ndarray:
        """A block's probabilities: independent, or following the persistent state."""
        fresh = self.rng.random(BLOCK)
        if not self.share:
            return fresh
        keep = self.rng.random(BLOCK) < self.stay
        if self.state < 0:
            keep[0] = False
        states = self.rng.random(BLOCK)
        states[0] = self.state if keep[0] else states[0]
        # each step's state: the latest redraw at or before it
        last = np.maximum.accumulate(np.where(keep, 0, np.arange(BLOCK)))
        states = states[last]
        self.state = float(states[-1])
        follow = self.rng.random(BLOCK) < self.share
        return np.where(follow, states, fresh)

    def refill(self) -> None:
        self.block = np.interp(self.uniforms(), self.p, self.q).tolist()
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
        self.decode_f = FactorStream(spec.decode, rng, spec.decode_persistence)
        self.prefill_f = FactorStream(spec.prefill, rng, spec.prefill_persistence)
        self.levels = spec.level_by_seqs()
        self.top = len(self.levels) - 1

    def __getattr__(self, name: str):
        return getattr(self.base, name)

    def decode(self, n: int, sum_ctx: int, max_ctx: int = 0) -> float:
        s = self.decode_f  # FactorStream.next, inlined: the hot path
        if s.i == len(s.block):
            s.refill()
        f = s.block[s.i]
        s.i += 1
        return self.base.decode(n, sum_ctx, max_ctx) * f * self.levels[n if n < self.top else self.top]

    def prefill(self, chunks: list[tuple[int, int]], seen: set | None = None) -> float:
        return self.base.prefill(chunks, seen) * self.prefill_f.next()

    def mixed(self, n: int, sum_ctx: int, max_ctx: int, chunks: list[tuple[int, int]],
              seen: set | None = None) -> float:
        f = self.decode_f.next() * self.levels[n if n < self.top else self.top] if n \
            else self.prefill_f.next()
        return self.base.mixed(n, sum_ctx, max_ctx, chunks, seen) * f

    def mixed_one(self, n: int, sum_ctx: int, max_ctx: int, q: int,
                  seen: set | None = None) -> float:
        f = self.decode_f.next() * self.levels[n if n < self.top else self.top] if n \
            else self.prefill_f.next()
        return self.base.mixed_one(n, sum_ctx, max_ctx, q, seen) * f

    def verify(self, rows: list[tuple[int, int]]) -> float:
        return self.base.verify(rows) * self.decode_f.next()


# ---- fitting (sim/fit/logfit.py gives the measured / modelled ratios) ----------------
def decode_levels(seqs: np.ndarray, ratio: np.ndarray) -> tuple[BatchLevel, ...]:
    """Median measured / modelled per power-of-two band of decode batch sizes; bands with
    fewer than MIN_BAND_STEPS steps merged with the next (the last with the previous).
    Only over the batch sizes seen (factor 1 below the smallest, and above the largest)."""
    if len(seqs) < MIN_BAND_STEPS:
        return ()
    top = int(seqs.max())
    edges = [0] + [1 << i for i in range(top.bit_length() + 1) if (1 << i) < top] + [top]
    groups: list[list[int]] = []  # [upper edge, steps]
    for hi, lo in zip(edges[1:], edges, strict=False):
        count = int(((seqs > lo) & (seqs <= hi)).sum())
        if groups and groups[-1][1] < MIN_BAND_STEPS:
            groups[-1] = [hi, groups[-1][1] + count]
        else:
            groups.append([hi, count])
    if len(groups) > 1 and groups[-1][1] < MIN_BAND_STEPS:
        groups[-2] = [groups[-1][0], groups[-2][1] + groups[-1][1]]
        groups.pop()
    low = int(seqs.min())  # below the batch sizes seen: the deterministic model (factor 1)
    out, lo = ([BatchLevel(max_seqs=low - 1, factor=1.0)] if low > 1 else []), low - 1
    for hi, _count in groups:
        band = (seqs > lo) & (seqs <= hi)
        out.append(BatchLevel(max_seqs=hi, factor=round(float(np.median(ratio[band])), 4)))
        lo = hi
    return tuple(out)


def fit_persistence(ratio: np.ndarray) -> Persistence:
    """share² · stay^k fitted to the rank autocorrelation of consecutive factors."""
    n = len(ratio)
    if n < MIN_PERSISTENCE_STEPS:
        return Persistence()
    u = np.argsort(np.argsort(ratio)) + 0.5
    acf = np.array([np.corrcoef(u[:-k], u[k:])[0, 1] for k in range(1, ACF_LAGS + 1)])
    if not acf[0] > 2 / np.sqrt(n):
        return Persistence()
    k = np.arange(1, ACF_LAGS + 1)
    stays = np.linspace(0.005, 0.995, 199)[:, None] ** k  # rows: candidate stay^k
    amp = np.clip((stays * acf).sum(1) / (stays**2).sum(1), 0, 1)
    sse = ((amp[:, None] * stays - acf) ** 2).sum(1)
    i = int(sse.argmin())
    return Persistence(stay=round(float(stays[i, 0]), 4), share=round(float(np.sqrt(amp[i])), 4))


def mean_factor(table: tuple[float, ...]) -> float:
    """The mean of a quantile table's factors (linear between quantiles)."""
    return float(np.trapezoid(table, np.linspace(0, 1, len(table))))


def jittered(latency, seed: int, replica: int = 0):
    """`latency` with its runtime's jitter applied, or `latency` itself when it has none;
    each replica of a fleet draws its own stream."""
    spec = getattr(latency.rt, "jitter", None)
    return latency if spec is None else JitteredLatency(latency, spec, seed, replica)


def sample(spec: JitterSpec, kind: str, n: int, seed: int) -> np.ndarray:
    """`n` factors of one kind (levels not applied), drawn as a run's first stream of that
    kind would draw them when it is the only kind drawn (tests, reports)."""
    table, keep = ((spec.prefill, spec.prefill_persistence) if kind == "prefill"
                   else (spec.decode, spec.decode_persistence))
    stream = FactorStream(table, np.random.default_rng([seed, 1]), keep)
    return np.array([stream.next() for _ in range(n)])
