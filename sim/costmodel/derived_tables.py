"""Kernel tables of an unmeasured GPU derived from a measured GPU's tables.

A profile with `derived_from: <measured profile>` (profile.yaml) has no measurements of
its own (one with `tables_from` takes some of its tables so). Its kernel times are the
measured profile's (as its lookups see them: the L2-flush write-back removed, rates
capped at that GPU's ceilings), each multiplied by the ratio of the two GPUs' roofline
times for the same shape (sim/costmodel/profiles.py: `gemm_model`, `elementwise_model`,
`prefill_model`, `decode_model`, each from the profile's own datasheet rates and
efficiencies):

    t_derived(shape) = t_measured(shape) × roofline_derived(shape) / roofline_measured(shape)

So the unmeasured GPU runs every kernel at the fraction of its roofline the measured GPU
reaches on the same shape: measured small-kernel floors, launch gaps and L2 effects carry
over, and a GPU at least as fast on every datasheet figure, with the same efficiencies,
is never costed slower (every roofline term is a floor plus work over a rate).

GEMMs apply the formula at every shape looked up, not only at the rows: a derived GPU's
GEMM kernel is the measured GPU's lookup at that (M, K, N) × the ratio of its roofline for
the kernel to the measured GPU's bf16 one (`GPUProfile.gemm_source`: the measured GPU
whose table it is; sim/costmodel/gemm_curve.py, which also keeps it from decreasing in M).
Scaling the rows and interpolating the scaled times instead let the fraction of the
roofline differ between two derived GPUs between rows (by up to 18 % next to a roofline's
bend), which reordered them on the FP8 and weight-only GEMMs, whose times are that
fraction × their own roofline.

The other tables are rows scaled by the formula (`derive_tables`), looked up as measured
rows are: every step of a lookup there (the monotone envelope, filling missing cells,
interpolating, scaling beyond the grid by the GPU's own roofline) keeps the order of two
GPUs' rows, and no other kernel reuses those lookups' fraction of their roofline (as the
FP8 and weight-only GEMMs reuse the bf16 GEMM's). Lookups in derived tables are tagged
`derived` (never `exact` or `interpolated`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol


class Roofline(Protocol):
    def elementwise_model(self, op: str, M: float, H: float) -> float: ...
    def prefill_model(self, impl: str, batch: float, q_len: float, kv_len: float,
                      hq: int, hkv: int, d: int) -> float: ...
    def decode_model(self, impl: str, batch: float, sum_ctx: float,
                     hq: int, hkv: int, d: int) -> float: ...


def _row_models(p: Roofline) -> dict[str, Callable[[dict], float]]:
    """Per table of rows: a row's roofline time on profile `p`."""
    return {
        "elementwise": lambda r: p.elementwise_model(r["op"], r["M"], r["H"]),
        "attn_prefill": lambda r: p.prefill_model(r["impl"], r["batch"], r["seq"], r["seq"],
                                                  r["hq"], r["hkv"], r["d"]),
        "attn_decode": lambda r: p.decode_model(r["impl"], r["batch"], r["sum_ctx"],
                                                r["hq"], r["hkv"], r["d"]),
    }


def derive_tables(tables: dict[str, list[dict]], measured: Roofline, target: Roofline
                  ) -> dict[str, list[dict]]:
    """`tables` (the measured GPU's rows; any but the GEMMs) with each `ms` scaled by
    target / measured roofline."""
    mine, theirs = _row_models(target), _row_models(measured)
    return {t: [{**r, "ms": r["ms"] * mine[t](r) / theirs[t](r)} for r in rows]
            for t, rows in tables.items()}
