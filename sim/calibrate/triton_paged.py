"""A straightforward split-K paged-attention decode kernel in Triton (CUDA only).

One query token per sequence attends over its KV cache, stored in a shared pool of
fixed-size blocks (`k_cache[num_blocks, block, kv_heads, d]`) and found through a
block table. The first kernel runs one program per (sequence, KV head, split):
it walks its split's blocks, scores the GROUP query heads that share the KV head
against each block, and keeps an online softmax (running max m, sum l, weighted
values acc). The second kernel merges the splits: out = Σ acc·e^(m−M) / Σ l·e^(m−M).
Splitting the context keeps the GPU busy at small batch sizes.

Nothing here synchronises with the host, so a decode step that uses it can be
captured in a CUDA graph (the split count depends only on the block table's width).

Loads of K and V are masked to the sequence's tokens: the tail of the last block
may hold anything (NaN included), and a zero probability times NaN is still NaN.

Its result is checked against exact attention on several shapes by
`check_paged_attention` (`kernel_check.CASES`), which `llmsim calibrate` runs on
CUDA before timing it; the CPU tests run the same check in Triton's interpreter
(`TRITON_INTERPRET=1`) where Triton is installed.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from sim.calibrate.splits import paged_sms, pow2, split_plan


@triton.jit
def _split_kernel(Q, K, V, BT, LENS, M_OUT, L_OUT, ACC_OUT,
                  stride_qb, stride_qh, stride_kb, stride_ks, stride_kh,
                  stride_vb, stride_vs, stride_vh, stride_bt, blocks_per_split, scale, nsplit,
                  H: tl.constexpr, GROUP: tl.constexpr,
                  GROUP_P: tl.constexpr, D: tl.constexpr, BLOCK: tl.constexpr):
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    sp = tl.program_id(2)
    ctx = tl.load(LENS + b)
    g = tl.arange(0, GROUP_P)
    dd = tl.arange(0, D)
    t = tl.arange(0, BLOCK)
    heads = kvh * GROUP + g
    gmask = g < GROUP
    q = tl.load(Q + b * stride_qb + heads[:, None] * stride_qh + dd[None, :],
                mask=gmask[:, None], other=0.0).to(tl.float32)
    m = tl.full([GROUP_P], float("-inf"), tl.float32)
    den = tl.zeros([GROUP_P], tl.float32)
    acc = tl.zeros([GROUP_P, D], tl.float32)
    first = sp * blocks_per_split
    last = tl.minimum(first + blocks_per_split, tl.cdiv(ctx, BLOCK))
    for j in range(first, last):
        blk = tl.load(BT + b * stride_bt + j)
        valid = j * BLOCK + t < ctx  # the last block's tail is not the sequence's
        k = tl.load(K + blk * stride_kb + t[:, None] * stride_ks + kvh * stride_kh
                    + dd[None, :], mask=valid[:, None], other=0.0).to(tl.float32)
        s = tl.sum(q[:, None, :] * k[None, :, :], axis=2) * scale  # [GROUP_P, BLOCK]
        s = tl.where(valid[None, :], s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))
        alpha = tl.exp(m - m_new)
        p = tl.exp(s - m_new[:, None])
        v = tl.load(V + blk * stride_vb + t[:, None] * stride_vs + kvh * stride_vh
                    + dd[None, :], mask=valid[:, None], other=0.0).to(tl.float32)
        den = den * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.sum(p[:, :, None] * v[None, :, :], axis=1)
        m = m_new
    row = (b * H + heads) * nsplit + sp
    tl.store(M_OUT + row, m, mask=gmask)
    tl.store(L_OUT + row, den, mask=gmask)
    tl.store(ACC_OUT + row[:, None] * D + dd[None, :], acc, mask=gmask[:, None])


@triton.jit
def _merge_kernel(M_IN, L_IN, ACC_IN, OUT, stride_ob, stride_oh, nsplit,
                  NSPLIT_P: tl.constexpr, H: tl.constexpr, D: tl.constexpr):
    b = tl.program_id(0)
    h = tl.program_id(1)
    s = tl.arange(0, NSPLIT_P)
    dd = tl.arange(0, D)
    smask = s < nsplit
    base = (b * H + h) * nsplit
    m = tl.load(M_IN + base + s, mask=smask, other=float("-inf"))
    den = tl.load(L_IN + base + s, mask=smask, other=0.0)
    acc = tl.load(ACC_IN + (base + s)[:, None] * D + dd[None, :], mask=smask[:, None], other=0.0)
    top = tl.max(m, axis=0)
    w = tl.where(smask, tl.exp(m - top), 0.0)
    out = tl.sum(acc * w[:, None], axis=0) / tl.sum(den * w, axis=0)
    tl.store(OUT + b * stride_ob + h * stride_oh + dd, out.to(OUT.dtype.element_ty))


def paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                    block_tables: torch.Tensor, ctx_lens: torch.Tensor) -> torch.Tensor:
    """q[b, hq, d] over the pages of each sequence; returns [b, hq, d] in q's dtype."""
    b, hq, d = q.shape
    _, block, hkv, _ = k_cache.shape
    if d != pow2(d) or block != pow2(block):
        raise ValueError(f"paged_attention needs power-of-two head_dim and block, got {d}, {block}")
    q = q.contiguous()
    group = hq // hkv
    nsplit, per_split = split_plan(b, hkv, block_tables.shape[1], paged_sms(q.device))
    f32 = dict(device=q.device, dtype=torch.float32)
    m, den = torch.empty(b, hq, nsplit, **f32), torch.empty(b, hq, nsplit, **f32)
    acc = torch.empty(b, hq, nsplit, d, **f32)
    _split_kernel[(b, hkv, nsplit)](
        q, k_cache, v_cache, block_tables, ctx_lens, m, den, acc,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2), block_tables.stride(0),
        per_split, 1.0 / math.sqrt(d), nsplit, H=hq, GROUP=group, GROUP_P=pow2(group), D=d, BLOCK=block)
    out = torch.empty_like(q)
    _merge_kernel[(b, hq)](m, den, acc, out, out.stride(0), out.stride(1), nsplit,
                           NSPLIT_P=pow2(nsplit), H=hq, D=d)
    return out


def check_paged_attention(device: torch.device, dtype: torch.dtype = torch.bfloat16) -> float:
    """Max |difference| from exact attention over `kernel_check.CASES` (several shapes,
    NaN in unowned pool slots); raises `kernel_check.KernelMismatch` past the tolerance."""
    from sim.calibrate.kernel_check import check_paged

    return check_paged(paged_attention, device, dtype)
