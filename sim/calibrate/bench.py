"""Microbenchmarks: one `Point` per measured row of the profile's kernel tables.

A point checks that its tensors fit before allocating them (`Device.check_fits`),
builds random inputs, times the call (`Device.time_ms`) and returns the rows to
write. Shapes come from the models' lists of operations (`ModelSpec.ops`,
sim/costmodel/layer.py), the same the step model prices: every distinct GEMM (K, N)
including the LM head, every distinct attention head configuration (hq, hkv, d), and
every norm, elementwise kernel and embedding at its width (for a Llama layer: rmsnorm
and residual add at hidden, SiLU·mul at ffn, rotary at q_dim + kv_dim, KV write at
2·kv_dim, embedding at hidden).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from sim.calibrate import ops
from sim.calibrate.device import Device, DeviceError
from sim.calibrate.grids import every, tier_of
from sim.costmodel.layer import elementwise_calls
from sim.costmodel.models import ModelSpec


@dataclass(frozen=True)
class Point:
    table: str  # the CSV its rows go to
    tier: int  # 0: coarse grid, measured first
    label: str  # for the progress bar and skipped.csv
    run: Callable[[Device], list[dict]]


def _esize(dev: Device) -> int:
    return torch.finfo(dev.dtype).bits // 8


# ---- GEMM ------------------------------------------------------------------------------

def gemm_point(M: int, K: int, N: int, tier: int) -> Point:
    def run(dev: Device) -> list[dict]:
        dev.check_fits((M * K + N * K + M * N) * _esize(dev), f"gemm {M}x{K}x{N}")
        x, w = dev.randn(M, K), dev.randn(N, K, scale=K ** -0.5)
        return [{"M": M, "K": K, "N": N, "ms": dev.time_ms(lambda: F.linear(x, w))}]
    return Point("gemm", tier, f"gemm M={M} K={K} N={N}", run)


# ---- attention ---------------------------------------------------------------------------

def naive_prefill_scratch_bytes(b: int, hq: int, hkv: int, s: int, d: int, esize: int) -> int:
    """Peak bytes `ops.prefill_naive` allocates beyond its inputs and output, in any dtype.

    Its peak is at the softmax, where three fp32 copies of the b·hq·s² scores are alive
    at once: `scores` (QKᵀ cast to fp32 and scaled; the bf16 product and the unscaled fp32
    cast, 6 bytes a score, are freed before), the masked copy and the softmax's output
    (12 bytes a score; the bf16 cast of the probabilities comes after the masked copy is
    freed: 4 + 4 + 2 = 10). Plus the s² boolean mask and, under GQA, K and V repeated
    to hq heads."""
    repeated = 2 * b * hq * s * d * esize if hq != hkv else 0
    return 12 * b * hq * s * s + s * s + repeated


def prefill_point(impl: str, b: int, s: int, cfg: tuple[int, int, int], tier: int) -> Point:
    hq, hkv, d = cfg

    def run(dev: Device) -> list[dict]:
        io = (2 * b * hq * s * d + 2 * b * hkv * s * d) * _esize(dev)
        scratch = naive_prefill_scratch_bytes(b, hq, hkv, s, d, _esize(dev)) \
            if impl == "naive" else 0
        dev.check_fits(io + scratch, f"{impl} prefill batch {b} seq {s}")
        q = dev.randn(b, hq, s, d)
        k, v = dev.randn(b, hkv, s, d), dev.randn(b, hkv, s, d)
        fn = {"flash": ops.prefill_flash, "naive": ops.prefill_naive}[impl]
        ms = dev.time_ms(lambda: fn(q, k, v))
        peak = dev.peak_bytes(lambda: fn(q, k, v))
        return [{"impl": impl, "batch": b, "seq": s, "hq": hq, "hkv": hkv, "d": d, "ms": ms,
                 "peak_mib": max(peak, 1) / 2**20}]
    return Point("attn_prefill", tier, f"{impl} prefill b={b} s={s} {hq}/{hkv}/{d}", run)


def _check_triton(dev: Device) -> None:
    """Check the Triton kernel against exact attention on this device and dtype before
    timing it (once per Device: the result lives on the Device, not in the module)."""
    if not dev.cuda or "triton_paged" in dev.checked:
        return
    try:
        from sim.calibrate.kernel_check import KernelMismatch
        from sim.calibrate.triton_paged import check_paged_attention
    except ImportError as e:
        raise DeviceError(f"the paged-attention kernel needs Triton ({e})") from None
    try:
        dev.checked["triton_paged"] = check_paged_attention(dev.device, dev.dtype)
    except KernelMismatch as e:
        raise DeviceError(f"the Triton paged-attention kernel failed its check: {e}") from None


def decode_point(impl: str, b: int, lens: list[int] | int, cfg: tuple[int, int, int],
                 block: int, tier: int) -> Point:
    """One decode step of attention; `lens` an int (uniform) or one context per sequence."""
    hq, hkv, d = cfg
    lengths = [lens] * b if isinstance(lens, int) else list(lens)
    sum_ctx, max_ctx = sum(lengths), max(lengths)
    label = f"{impl} decode b={b} ctx={sum_ctx // b}" + ("" if isinstance(lens, int)
                                                        else f" max={max_ctx}")

    def run(dev: Device) -> list[dict]:
        blocks = [-(-n // block) for n in lengths]
        kv_bytes = 2 * (sum(blocks) + 1) * block * hkv * d * _esize(dev)
        # K/V-sized copies beyond the pool: contiguous K, V (or gathered pages) and SDPA's
        # working copies; the Triton kernel makes none, its PyTorch twin gathers K and V
        # and zeroes V past each length
        copies = {"contiguous": 4, "paged_gather": 4, "paged_reference": 0 if dev.cuda else 3}[impl]
        gather = copies * b * max(blocks) * block * hkv * d * _esize(dev)
        dev.check_fits(kv_bytes + gather, label)
        q = dev.randn(b, hq, d)
        if impl == "contiguous":
            k, v = dev.randn(b, hkv, max_ctx, d), dev.randn(b, hkv, max_ctx, d)
            q4 = q[:, :, None, :]
            ms = dev.time_ms(lambda: ops.decode_contiguous(q4, k, v))
        else:
            if impl == "paged_reference":
                _check_triton(dev)
            kc = dev.randn(sum(blocks) + 1, block, hkv, d)
            vc = dev.randn(sum(blocks) + 1, block, hkv, d)
            perm = (dev.randperm(sum(blocks)) + 1).tolist()  # pages in random order
            width, tables, i = max(blocks), [], 0
            for nb in blocks:
                tables.append(perm[i:i + nb] + [0] * (width - nb))
                i += nb
            bt = torch.tensor(tables, device=dev.device)
            ctx = torch.tensor(lengths, device=dev.device, dtype=torch.int32)
            fn = ops.DECODE_PAGED[impl]
            ms = dev.time_ms(lambda: fn(q, kc, vc, bt, ctx))
        return [{"impl": impl, "batch": b, "ctx": round(sum_ctx / b), "sum_ctx": sum_ctx,
                 "max_ctx": max_ctx, "hq": hq, "hkv": hkv, "d": d, "block": block, "ms": ms}]
    return Point("attn_decode", tier, label, run)


def mixed_lengths(b: int, max_ctx: int) -> list[int]:
    """Deterministic mixed contexts: evenly spread over [max/8, max], the longest first."""
    lo = max(1, max_ctx // 8)
    return [max_ctx - round(i * (max_ctx - lo) / max(1, b - 1)) for i in range(b)]


# ---- elementwise, embedding, sampling --------------------------------------------------------

def _elementwise_fn(op: str, M: int, H: int, d: int, vocab: int, dev: Device) -> Callable:
    if op == "rmsnorm":
        x, w = dev.randn(M, H), 1 + dev.randn(H, scale=0.02)
        return lambda: ops.rms_norm(x, w)
    if op == "residual_add":
        a, b = dev.randn(M, H), dev.randn(M, H)
        return lambda: a + b
    if op == "silu_mul":
        gu = dev.randn(M, 2 * H)
        return lambda: ops.silu_mul(gu)
    if op == "rotary":
        x = dev.randn(M, H // d, d)
        table = ops.rope_tables(max(M, 2), d, dev.device)
        pos = dev.randint(max(M, 2), M)
        return lambda: ops.rotary(x, table[pos])
    if op == "kv_write":
        hkv = H // (2 * d)
        k, v = dev.randn(M, hkv, d), dev.randn(M, hkv, d)
        slots_total = max(4 * M, 4096)
        kc, vc = dev.randn(slots_total, 1, hkv, d), dev.randn(slots_total, 1, hkv, d)
        slots = dev.randperm(slots_total)[:M]
        return lambda: ops.kv_write(kc, vc, k, v, slots)
    if op == "embedding":
        table, ids = dev.randn(vocab, H), dev.randint(vocab, M)
        return lambda: table[ids]
    raise ValueError(f"unknown elementwise op {op!r}")


def elementwise_point(op: str, M: int, H: int, d: int, vocab: int, tier: int) -> Point:
    def run(dev: Device) -> list[dict]:
        dev.check_fits((6 * M * H + (vocab * H if op == "embedding" else 0)) * _esize(dev),
                       f"{op} M={M}")
        fn = _elementwise_fn(op, M, H, d, vocab, dev)
        return [{"op": op, "M": M, "H": H, "ms": dev.time_ms(fn)}]
    return Point("elementwise", tier, f"{op} M={M} H={H}", run)


def sampling_point(M: int, V: int, tier: int) -> Point:
    def run(dev: Device) -> list[dict]:
        dev.check_fits(4 * M * V * 4, f"sampling M={M}")
        logits = dev.randn(M, V)
        return [{"op": "sample", "M": M, "V": V, "ms": dev.time_ms(
            lambda: ops.sample(logits, dev.gen))}]
    return Point("sampling", tier, f"sample M={M} V={V}", run)


def elementwise_shapes(m: ModelSpec) -> list[tuple[str, int, int]]:
    """(kernel, width, head_dim) of the norms, elementwise kernels and embedding of the
    model's operations (sim/costmodel/layer.py), at the widths the step model looks them up at."""
    ops = m.ops()
    d = ops.find("attention").shape[2]
    return [(kernel, width, d) for kernel, width, _ in
            elementwise_calls(ops.first + ops.layer + ops.last)]


# ---- all kernel points -------------------------------------------------------------------------

def kernel_points(models: list[ModelSpec], g: dict) -> list[Point]:
    """Every microbenchmark point for these models, unordered (see calibrate.order)."""
    pts: list[Point] = []
    shapes = dict.fromkeys((k, n) for m in models for k, n in m.gemm_shapes().values())
    for k, n in shapes:
        pts += [gemm_point(M, k, n, tier_of(g["gemm_m"], M)) for M in every(g["gemm_m"])]
    cfgs = dict.fromkeys(op.shape for m in models for op in m.ops().of_kind("attention"))
    block = g["block"]
    for cfg in cfgs:
        for b in every(g["decode_batch"]):
            for c in every(g["decode_ctx"]):
                if b * c > g["decode_max_tokens"]:
                    continue
                tier = max(tier_of(g["decode_batch"], b), tier_of(g["decode_ctx"], c))
                pts += [decode_point(i, b, c, cfg, block, tier)
                        for i in ("paged_reference", "contiguous", "paged_gather")]
        for b in g["mixed"]["batch"]:
            for mx in g["mixed"]["max_ctx"]:
                if b * mx <= g["decode_max_tokens"]:
                    pts += [decode_point(i, b, mixed_lengths(b, mx), cfg, block, 1)
                            for i in ("paged_reference", "paged_gather")]
        for b in g["prefill_batch"]:
            for s in every(g["prefill_seq"]):
                tier = tier_of(g["prefill_seq"], s)
                pts += [prefill_point(i, b, s, cfg, tier) for i in ("flash", "naive")]
    seen = set()
    for m in models:
        for op, h, d in elementwise_shapes(m):
            if (op, h) not in seen:
                seen.add((op, h))
                pts += [elementwise_point(op, M, h, d, m.vocab, tier_of(g["elementwise_m"], M))
                        for M in every(g["elementwise_m"])]
    for v in dict.fromkeys(m.vocab for m in models):
        pts += [sampling_point(M, v, tier_of(g["sampling_m"], M)) for M in every(g["sampling_m"])]
    return pts


def ceilings(dev: Device, copy_mib: int, n: int) -> dict[str, float]:
    """Measured memory bandwidth (TB/s, a device-to-device copy counted as read + write),
    dense matmul rate (TFLOP/s, an n³ GEMM) and host-link rate (GB/s)."""
    elems = copy_mib * 2**20 // 4
    dev.check_fits(2 * elems * 4 + 3 * n * n * _esize(dev), "ceiling measurements")
    src = dev.randn(elems, dtype=torch.float32)
    dst = torch.empty_like(src)
    copy_ms = dev.time_ms(lambda: dst.copy_(src), flush=False)
    a, b = dev.randn(n, n), dev.randn(n, n, scale=n ** -0.5)
    gemm_ms = dev.time_ms(lambda: a @ b)
    out = {"mem_bw_tbs": 2 * elems * 4 / (copy_ms * 1e9), "peak_tflops": 2 * n**3 / (gemm_ms * 1e9)}
    if dev.cuda:
        host = torch.empty(elems, dtype=torch.float32).pin_memory()
        link_ms = dev.time_ms(lambda: src.copy_(host, non_blocking=True), flush=False)
        out["pcie_gbs"] = elems * 4 / (link_ms * 1e6)
    else:
        out["pcie_gbs"] = out["mem_bw_tbs"] * 1e3 / 2  # swap on a CPU is a memory copy
    return out


