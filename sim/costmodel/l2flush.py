"""Kernel tables timed with the L2 flushed: the dirty-L2 write-back they include, removed.

`triton.testing.do_bench` (how the H200 tables were timed) zeroes a 256 MiB buffer before
every timed call (the NVIDIA driver's `clear_cache`: `cache.zero_()`). That leaves the L2
full of dirty lines, so the timed kernel also writes them back to HBM as its own data
evicts them: W = min(X, D) extra bytes, X the bytes the kernel moves, D the dirty bytes
the flush leaves. The profile's own tables show it: below D the time grows about twice
as fast with X as above it, and a kernel much larger than D pays a constant D / B more
than a line through the small kernels predicts (`fit_write_back`, README of h200-sxm).

In a forward pass (eager or CUDA graph) the lines a kernel finds dirty are the
activations its predecessors wrote and it reads, A bytes (weights and the KV cache are
only read; a decode step's activations are a few KB), so it writes back W' = min(A, X, D)
instead. A profile timed with the flush says so (`timing: {method: l2_flushed,
dirty_l2_mb: D, write_back_tbs: B}`), and every row of its tables is lowered at load by
the roofline difference, so a compute-bound kernel (which hides the traffic) keeps its
time, and so does a memory-bound one whose inputs fill the L2 anyway (large elementwise):

    t_warm = max(t − Δ, min(t, floor)),   Δ = max(C, (X + W) / B) − max(C, (X + W') / B),
    floor = max(C, (X + W') / B), C = FLOPs / the GPU's dense peak

`python -m sim.cli.maintain l2flush gpu_profiles/h200-sxm` prints the fit of D and B.
"""

from __future__ import annotations

import csv
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np

BF16 = 2  # bytes per element
NAIVE_SCORE_BYTES = 10  # naive prefill: fp32 scores, fp32 softmax, bf16 probabilities
FIT_MAX_GEMM_M = 4  # GEMM rows fitted: weight-streaming (memory-bound) decode shapes
# bytes per element an elementwise op reads that an earlier kernel of the pass wrote (the
# rest of sim.costmodel.profiles.ELEMENTWISE_BYTES is its output, or clean tables: cos/sin, embeddings)
ACTIVATION_BYTES = {"rmsnorm": 2, "residual_add": 4, "silu_mul": 4, "rotary": 2,
                    "kv_write": 2, "embedding": 0}


@dataclass(frozen=True)
class Timing:
    """How a profile's kernel tables were timed (profile.yaml `timing`)."""

    method: Literal["clean", "l2_flushed"]  # l2_flushed: a dirty L2 before every timed call; clean: none (flushed by reads, or not at all)
    dirty_l2_mb: float = field(default=0.0, metadata={"ge": 0})  # D, bytes / 1e6
    write_back_tbs: float = field(default=1.0, metadata={"gt": 0})  # B, TB/s
    source: str = ""

    def check(self) -> tuple[str, str] | None:
        if self.method == "l2_flushed" and self.dirty_l2_mb <= 0:
            return "dirty_l2_mb", "must be > 0 for l2_flushed (allowed: the fitted dirty bytes, MB)"
        return None


def _rooflines(timing: Timing, flops: float, nbytes: float, dirty_in: float,
               flop_per_ms: float) -> tuple[float, float]:
    """(flushed, forward-pass) roofline times of a kernel, ms: max(C, (X + W) / B) with
    W = min(X, D) under the flush, and with W' = min(A, X, D) in a forward pass."""
    byte_per_ms, dirty = timing.write_back_tbs * 1e9, timing.dirty_l2_mb * 1e6
    compute = flops / flop_per_ms
    return (max(compute, (nbytes + min(nbytes, dirty)) / byte_per_ms),
            max(compute, (nbytes + min(dirty_in, nbytes, dirty)) / byte_per_ms))


def write_back_ms(timing: Timing, flops: float, nbytes: float, dirty_in: float,
                  flop_per_ms: float) -> float:
    """Δ: what the flush's write-back added to a kernel of `flops` and `nbytes` over the
    write-back of the `dirty_in` activation bytes it meets in a forward pass (ms)."""
    if timing.method != "l2_flushed":
        return 0.0
    flushed, forward = _rooflines(timing, flops, nbytes, dirty_in, flop_per_ms)
    return flushed - forward


def warm_ms(timing: Timing, ms: float, flops: float, nbytes: float, dirty_in: float,
            flop_per_ms: float) -> float:
    """A flushed time less the flush's extra write-back, never below its roofline floor
    max(C, (X + W') / B) nor above the measured time."""
    if timing.method != "l2_flushed":
        return ms
    flushed, floor = _rooflines(timing, flops, nbytes, dirty_in, flop_per_ms)
    if flushed <= floor:
        return ms
    return max(ms - (flushed - floor), min(ms, floor))


def footprint(table: str, elementwise_bytes: dict[str, int]) -> Callable[[dict], tuple[float, float, float]]:
    """(FLOPs, bytes moved through the L2, bytes of activations read) of a row of `table`:
    GEMM operands and output, x the activations; prefill Q, K, V, O (and naive's
    materialised scores), Q, K, V activations; decode each KV head once plus q and out,
    q and the new token's K, V activations; elementwise its ELEMENTWISE_BYTES per element,
    ACTIVATION_BYTES of them activations."""
    if table == "gemm":
        return lambda r: (2 * r["M"] * r["K"] * r["N"],
                          (r["M"] * r["K"] + r["K"] * r["N"] + r["M"] * r["N"]) * BF16,
                          r["M"] * r["K"] * BF16)
    if table == "attn_prefill":
        def prefill(r: dict) -> tuple[float, float, float]:
            b, s, hq, hkv, d = (r[k] for k in ("batch", "seq", "hq", "hkv", "d"))
            scores = b * hq * s * s * NAIVE_SCORE_BYTES if r["impl"] == "naive" else 0
            return (2 * b * hq * d * s * s, b * s * (2 * hq + 2 * hkv) * d * BF16 + scores,
                    b * s * (hq + 2 * hkv) * d * BF16)
        return prefill
    if table == "attn_decode":
        return lambda r: (4 * r["sum_ctx"] * r["hq"] * r["d"],
                          (r["sum_ctx"] * 2 * r["hkv"] + r["batch"] * 2 * r["hq"]) * r["d"] * BF16,
                          r["batch"] * (r["hq"] + 2 * r["hkv"]) * r["d"] * BF16)
    return lambda r: (0.0, r["M"] * r["H"] * elementwise_bytes[r["op"]],
                      r["M"] * r["H"] * ACTIVATION_BYTES[r["op"]])


def remove_write_back(tables: dict[str, list[dict]], timing: Timing | None, tflops: float,
                      elementwise_bytes: dict[str, int]) -> dict[str, int]:
    """Lower every row of a flushed profile's tables to its warm time, in place; returns
    the rows lowered per table (nothing for a profile without `timing` or timed clean)."""
    if timing is None or timing.method != "l2_flushed":
        return {}
    flop_per_ms, lowered = tflops * 1e9, {}
    for table, rows in tables.items():
        work, n = footprint(table, elementwise_bytes), 0
        for r in rows:
            t = warm_ms(timing, r["ms"], *work(r), flop_per_ms)
            n += t < r["ms"]
            r["ms"] = t
        lowered[table] = n
    return lowered


def describe(timing: Timing | None, lowered: dict[str, int]) -> str:
    """One line for `llmsim gpus` and the profile summary ("" when nothing was removed)."""
    if timing is None or timing.method != "l2_flushed":
        return ""
    return (f"timed with the L2 flushed: the flush's dirty-L2 write-back (up to {timing.dirty_l2_mb:g} MB"
            f" at {timing.write_back_tbs:g} TB/s) removed from {sum(lowered.values())} rows (derived)")


# ---- the fit --------------------------------------------------------------------


def _fit_rows(folder: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(bytes, ms, family) of the uniform contiguous decode rows (family 0) and the GEMM
    rows with M <= FIT_MAX_GEMM_M (family 1): kernels that stream their bytes once."""
    def read(name: str) -> list[dict]:
        with (folder / f"{name}.csv").open(newline="") as f:
            return list(csv.DictReader(f))
    dec = [{k: (v if k == "impl" else float(v)) for k, v in r.items()} for r in read("attn_decode")]
    dec = [r for r in dec if r["impl"] == "contiguous" and r["max_ctx"] == r["ctx"]
           and r["sum_ctx"] == r["batch"] * r["ctx"]]
    gemm = [{k: float(v) for k, v in r.items()} for r in read("gemm")]
    gemm = [r for r in gemm if r["M"] <= FIT_MAX_GEMM_M]
    x = [footprint("attn_decode", {})(r)[1] for r in dec] + [footprint("gemm", {})(r)[1] for r in gemm]
    t = [r["ms"] for r in dec] + [r["ms"] for r in gemm]
    return np.array(x), np.array(t), np.array([0] * len(dec) + [1] * len(gemm))


def _solve(x: np.ndarray, t: np.ndarray, family: np.ndarray, dirty: float):
    """Least squares in relative error of t = c[family] + (x + min(x, dirty)) / B."""
    a = np.column_stack([family == 0, family == 1, x + np.minimum(x, dirty)]).astype(float)
    coef = np.linalg.lstsq(a / t[:, None], np.ones_like(t), rcond=None)[0]
    return coef, a @ coef / t - 1


def fit_write_back(folder: str | Path, step_mb: float = 0.1, max_mb: float = 100.0) -> dict:
    """D (MB) and B (TB/s) fitted to a flushed profile's streaming rows (a scan over D,
    linear least squares in the intercepts and 1 / B at each), with the errors of the
    fit and of the same model without write-back (D = 0)."""
    x, t, family = _fit_rows(Path(folder))
    scan = {round(d, 1): _solve(x, t, family, d * 1e6) for d in np.arange(0.0, max_mb + step_mb / 2, step_mb)}
    rms = {d: float(np.sqrt((e ** 2).mean())) for d, (_, e) in scan.items()}
    best = min(rms, key=rms.__getitem__)

    def stats(d: float) -> dict:
        coef, e = scan[d]
        by = {name: e[family == i] for i, name in enumerate(("decode", "gemm"))}
        return {"dirty_l2_mb": d, "write_back_tbs": 1 / coef[2] / 1e9,
                "floor_us": {"decode": coef[0] * 1e3, "gemm": coef[1] * 1e3}, "rms": rms[d],
                "median": {k: float(np.median(np.abs(v))) for k, v in by.items()}}
    near = [d for d in rms if rms[d] <= rms[best] + 0.002]
    return {"fit": stats(best), "no_write_back": stats(0.0), "rows": len(t),
            "within_0.2_points": (min(near), max(near))}
