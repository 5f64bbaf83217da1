"""What each rank of an attention data-parallel, expert-parallel replica runs, and so
what a step costs at the pace of the busiest rank (`RankPricing`, the part of
`sim.costmodel.latency.StepLatency` that splits a step's operations over ranks).

Attention data parallelism (`data` = D > 1; sim/costmodel/parallel.py): the replica's T
tokens in S sequences are spread evenly over D attention ranks, and a step runs at the
pace of the busiest: the rank's own operations (attention, the dense layers, norms, the
shared experts, embedding, LM head) on ⌈T/D⌉ tokens and ⌈S/D⌉ sequences, decode attention
over ⌈S/D⌉ contexts of the batch's mean length, per-sequence attention (prefill, verify)
as max(Σ/D, the longest call), and the ops after the all-to-all dispatch (the routed
experts, marked `dispatched`) on all T tokens' rows routed to the most loaded expert rank.
Host work is per rank (each rank's own process): its sequences are ⌈S/D⌉.
Expert parallelism (`expert` = R > 1): the routed experts' grouped GEMMs at the busiest
expert rank's rows and the all-to-all bytes it receives (`Routing.busiest_factor`,
sim/costmodel/moe.py), the dispatch and combine priced by sim/costmodel/comm.py.
"""

from __future__ import annotations

from sim.costmodel.deepep import DeepEP
from sim.costmodel.moe import Routing
from sim.costmodel.profiles import (
    ANALYTIC,
    DERIVED,
    EXACT,
    EXTRAPOLATED,
    INTERPOLATED,
)

TAGS = (EXACT, INTERPOLATED, DERIVED, EXTRAPOLATED, ANALYTIC)
_TAG_INDEX = {t: i for i, t in enumerate(TAGS)}


class RankPricing:
    """The lookups of a step split over D attention ranks and R expert ranks (a mixin of
    `StepLatency`, whose `_price_ops` fills `_gemms`, `_grouped`, `_layer_elementwise`,
    `_step_elementwise` and `_collectives`, and whose `_parts` memoises them)."""

    data: int
    expert: int
    tensor: int
    a2a: DeepEP | None  # DeepEP's kernels for the all-to-all, else the α–β one

    def _rank(self, rows: int) -> int:
        """The busiest attention data-parallel rank's share of `rows` (all of them at D = 1)."""
        return -(-rows // self.data)

    def _dense_lookup(self, T: int) -> list[tuple[float, str]]:
        """Everything but attention and the LM head for a step of T tokens: the rank's own
        ops on its ⌈T/D⌉, the dispatched ones on T (D = 1: all on T, in the order of
        `_price_ops`; D > 1: the rank's own first, each half memoised on its own rows)."""
        if self.data > 1:
            t = self._rank(T)
            own = self._parts.get(("own", t))
            if own is None:
                own = self._parts[("own", t)] = self._lookup(T, t, own=True)
            disp = self._parts.get(("dispatched", T))
            if disp is None:
                disp = self._parts[("dispatched", T)] = self._lookup(T, t, own=False)
            return own + disp
        return self._lookup(T, T)

    def _lookup(self, T: int, t: int, own: bool | None = None) -> list[tuple[float, str]]:
        """The lookups of `_dense_lookup`: the rank's own ops on t rows, the dispatched ones
        on T; `own` True or False: only those (None: both)."""
        mine, theirs = own is not False, own is not True
        parts = []
        if mine:
            for gemm, times in self._gemms:
                ms, tag = gemm(t)
                parts.append((times * ms, tag))
        if theirs:
            for shape, fp8, times, routing in self._grouped:
                parts += self._grouped_parts(T, shape, fp8, times, routing)
        for elementwise, calls, dispatched in self._layer_elementwise:
            if (theirs if dispatched else mine):
                ms, tag = elementwise(T if dispatched else t)
                parts.append((calls * ms, tag))
        if mine:
            for elementwise, calls in self._step_elementwise:
                ms, tag = elementwise(t)
                parts.append((calls * ms, tag))
        for kernel, nbytes, calls, dispatched in self._collectives:
            if (theirs if dispatched else mine):
                if kernel == "all_to_all":  # the busiest expert rank's bytes
                    ms, tag = self._collective(kernel, T * nbytes * self._busiest(T), t)
                else:
                    ms, tag = self._collective(kernel, (T if dispatched else t) * nbytes)
                parts.append((calls * ms, tag))
        return parts

    def _busiest(self, T: int) -> float:
        """The busiest expert-parallel rank's rows over its mean in a step of T tokens."""
        return self._grouped[0][3].busiest_factor(T) if self._grouped else 1.0

    def _grouped_parts(self, T: int, shape: tuple[int, ...], fp8: bool, times: int,
                       routing: Routing) -> list[tuple[float, str]]:
        """The experts' grouped GEMM over a step of T tokens, one kernel per popularity
        group (sim/costmodel/moe.py; uniform routing: one): the D experts it expects to hit,
        m rows each, priced as one GEMM of m rows over their D · N output columns (the
        weights of the experts hit, read once; m · D · K · N multiply-adds), m between whole
        rows interpolated linearly. Derived from the GEMM lookups; one expert taking every
        token is the dense GEMM itself."""
        k, n = shape
        gemm = self.p.gemm_fp8 if fp8 else self.p.gemm
        if self._expert_width:  # MXFP4 experts: 4.25-bit weights, bf16 compute
            def gemm(m: int, k: int, n: int, w: float = self._expert_width):
                return self.p.gemm_weights(m, k, n, w)
        parts = []
        for hit, rows in routing.groups(T):
            cols = max(1, round(hit * n))
            lo = int(rows)
            ms, tag = gemm(lo, k, cols)
            if rows > lo:  # between whole rows: linear between the two GEMMs
                hi_ms, hi_tag = gemm(lo + 1, k, cols)
                ms += (rows - lo) * (hi_ms - ms)
                tag = max(tag, hi_tag, key=_TAG_INDEX.__getitem__)
            if routing.experts > 1 and tag in (EXACT, INTERPOLATED):
                tag = DERIVED
            parts.append((times * ms, tag))
        return parts

    def _collective(self, kernel: str, nbytes: float, tokens: int = 0) -> tuple[float, str]:
        """A collective of `nbytes`; an all-to-all's `tokens`: the busiest attention rank's
        (DeepEP picks its kernel by them, sim/costmodel/deepep.py)."""
        if kernel == "all_to_all":
            if self.a2a is not None:
                return self.a2a.call_ms(nbytes, tokens)
            return self.p.comm.all_to_all(nbytes, self.expert, self.network)
        if kernel == "all_reduce":
            return self.p.comm.all_reduce(nbytes, self.tensor, custom=self.rt.custom_all_reduce)
        return self.p.comm.all_gather(nbytes, self.tensor)

