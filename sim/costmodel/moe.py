"""Mixture-of-Experts routing: which experts a step's tokens reach, and how many rows each.

Each token picks `top_k` of `experts` experts. Routing is described by q_e, the
probability that one token picks expert e (Σ q_e = top_k):

* uniform: q_e = k / E;
* skewed (Zipf, exponent s): expert popularity p_e ∝ 1 / rank^s (normalised to 1), q_e = k · p_e;
* measured: p_e = the expert's share of routed token slots in a histogram, q_e = k · p_e;

(a share above 1/k would make q_e > 1: those experts are capped at 1, every token picks
them, and the rest rescaled so Σ q_e = k still holds.)

Tokens route independently, so over T tokens expert e is hit with probability
1 − (1 − q_e)^T, and the expected number of distinct experts touched is

    D(T) = Σ_e [1 − (1 − q_e)^T]          (uniform: E · (1 − (1 − k/E)^T))

— at T = 1 it is k, and it rises to E as T grows: decode of a small batch reads only
the weights of the experts it hits, the whole story of MoE decode. An expert that is
hit sees T · q_e / (1 − (1 − q_e)^T) rows on average (its expected rows given at least
one). A step's grouped expert GEMM (one kernel, as vLLM's fused_moe) is priced per group
of equally popular experts as one GEMM of their expected rows m over the D_g · N output
columns of the D_g experts it expects to hit: the weights of the experts hit, read once,
and m · D_g · K · N multiply-adds (sim/costmodel/latency.py; derived: per-expert rows vary
around their mean, and a grouped kernel's tiles are not a dense GEMM's). One expert (E = k = 1) is hit
by every token with T rows: the dense MLP exactly.

Under expert parallelism over R ranks the step waits for the busiest rank. Its expected
share of a token's k rows is s = Σ q_e over its experts / k (1/R uniform; more for the rank
holding the most popular experts), and over a step of T tokens its rows vary around
T·k·s: taken as Binomial(T·k, s) (a token's k picks are distinct experts, which only
narrows the spread: conservative), the busiest of R ranks gets on average

    T·k·s · (1 + z_R · √((1 − s) / (T·k·s))),   z_R = Φ⁻¹((R − 0.375) / (R + 0.25))

(Blom's approximation of the expected largest of R standard normals: 1.43 at R = 8, 2.04
at R = 32), never more than all T·k rows. The factor in brackets (`busiest_factor`) scales
the rows of that rank's grouped GEMMs and the bytes its all-to-alls receive; it falls to 1
as batches grow (analytic).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

MAX_GROUPS = 8  # a skewed routing's experts are priced in at most this many popularity groups


@dataclass(frozen=True)
class Routing:
    """How tokens reach the experts of one GPU's MoE layer: q_e per expert (Σ = top_k)."""

    top_k: int
    picks: tuple[float, ...]  # q_e: probability one token picks expert e, most popular first
    ranks: int = 1  # expert-parallel ranks: the busiest one's random excess (busiest_factor)

    @property
    def experts(self) -> int:
        return len(self.picks)

    def distinct(self, tokens: int) -> float:
        """Expected distinct experts hit by `tokens` tokens: Σ_e 1 − (1 − q_e)^T."""
        return math.fsum(1.0 - (1.0 - q) ** tokens for q in self.picks)

    def groups(self, tokens: int) -> tuple[tuple[float, float], ...]:
        """(expected experts hit, expected rows each) per popularity group, for a step of `tokens`
        tokens: experts of equal q_e together (uniform: one group), a skewed routing cut
        into at most MAX_GROUPS runs of equal size, most popular first."""
        if tokens <= 0:
            return ()
        runs = _runs(self.picks)
        out = []
        for run in runs:
            hit = math.fsum(1.0 - (1.0 - q) ** tokens for q in run)
            if hit <= 0:
                continue
            out.append((hit, max(1.0, tokens * math.fsum(run) / hit)))
        if self.ranks > 1:  # the busiest rank's rows, spread over the experts it hits
            f = self.busiest_factor(tokens)
            out = [(hit, rows * f) for hit, rows in out]
        return tuple(out)

    def busiest_factor(self, tokens: int) -> float:
        """The busiest of `ranks` expert-parallel ranks' rows over this rank's mean rows, in
        a step of `tokens` tokens (1 without expert parallelism; see the module text)."""
        if self.ranks == 1 or tokens <= 0:
            return 1.0
        share = math.fsum(self.picks) / self.top_k
        if share >= 1.0:
            return 1.0
        from statistics import NormalDist  # here: a dense model's run need not import it

        slots = tokens * self.top_k
        z = NormalDist().inv_cdf((self.ranks - 0.375) / (self.ranks + 0.25))
        return min(1.0 / share, 1.0 + z * math.sqrt((1.0 - share) / (slots * share)))


def _runs(picks: tuple[float, ...]) -> list[tuple[float, ...]]:
    """`picks` in runs of equal values, or (when there are more than MAX_GROUPS distinct
    values) MAX_GROUPS runs of near-equal length."""
    if len(set(picks)) == 1:
        return [picks]
    n = len(picks)
    g = min(MAX_GROUPS, n)
    bounds = [round(i * n / g) for i in range(g + 1)]
    return [picks[a:b] for a, b in zip(bounds, bounds[1:], strict=False) if b > a]


def pick_probabilities(experts: int, top_k: int, *, zipf_s: float = 0.0,
                       load: tuple[float, ...] | None = None) -> tuple[float, ...]:
    """q_e for each expert, most popular first: uniform, Zipf(s), or a measured load
    histogram (any non-negative counts or shares, one per expert), capped at 1."""
    if load is not None:
        shares = sorted(load, reverse=True)
    elif zipf_s > 0:
        shares = [1.0 / (r ** zipf_s) for r in range(1, experts + 1)]
    else:
        return (top_k / experts,) * experts
    total = math.fsum(shares)
    q = [top_k * s / total for s in shares]
    # cap at 1: experts every token picks; rescale the rest so Σ q = k
    capped = 0
    while capped < len(q) and q[capped] > 1.0:
        capped += 1
        rest = math.fsum(q[capped:])
        scale = (top_k - capped) / rest if rest > 0 else 0.0
        q = [1.0] * capped + [v * scale for v in q[capped:]]
    return tuple(q)


def local_routing(experts: int, top_k: int, *, zipf_s: float = 0.0,
                  load: tuple[float, ...] | None = None, ep: int = 1,
                  rank: int = 0) -> Routing:
    """The routing seen by one of `ep` expert-parallel ranks holding experts
    [rank·E/ep, (rank+1)·E/ep) of the popularity order (rank 0: the most loaded, which
    sets the step's pace; a measured histogram is placed in its own order)."""
    if load is not None:
        q_all = pick_probabilities(experts, top_k, load=load)
        order = sorted(range(experts), key=lambda e: -load[e])
        by_expert = [0.0] * experts
        for e, qv in zip(order, q_all, strict=True):
            by_expert[e] = qv
    else:
        by_expert = list(pick_probabilities(experts, top_k, zipf_s=zipf_s))
    per = experts // ep
    if ep == 1:
        mine = by_expert
    elif load is not None:
        ranks = [by_expert[r * per:(r + 1) * per] for r in range(ep)]
        mine = max(ranks, key=math.fsum)
    else:
        # popularity order, dealt round-robin would balance; contiguous blocks as placed
        # by default (expert ids in order) put the most popular together on rank 0
        mine = by_expert[rank * per:(rank + 1) * per]
    return Routing(top_k, tuple(sorted(mine, reverse=True)), ep)
