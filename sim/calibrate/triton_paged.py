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

Not exercised by the CPU tests (Triton needs a GPU); its result is checked against
`ops.paged_torch` by `check_paged_attention`, which `llmsim calibrate` runs once on
CUDA before timing it.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl


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
        k = tl.load(K + blk * stride_kb + t[:, None] * stride_ks + kvh * stride_kh
                    + dd[None, :]).to(tl.float32)
        s = tl.sum(q[:, None, :] * k[None, :, :], axis=2) * scale  # [GROUP_P, BLOCK]
        s = tl.where((j * BLOCK + t < ctx)[None, :], s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))
        alpha = tl.exp(m - m_new)
        p = tl.exp(s - m_new[:, None])
        v = tl.load(V + blk * stride_vb + t[:, None] * stride_vs + kvh * stride_vh
                    + dd[None, :]).to(tl.float32)
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


def _pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def split_count(batch: int, kv_heads: int, max_blocks: int, sms: int) -> int:
    """Splits per sequence: enough programs for ~4 waves of the SMs, at most one per block."""
    want = -(-4 * sms // max(1, batch * kv_heads))
    return max(1, min(max_blocks, want, 64))


def paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                    block_tables: torch.Tensor, ctx_lens: torch.Tensor) -> torch.Tensor:
    """q[b, hq, d] over the pages of each sequence; returns [b, hq, d] in q's dtype."""
    b, hq, d = q.shape
    _, block, hkv, _ = k_cache.shape
    if d != _pow2(d) or block != _pow2(block):
        raise ValueError(f"paged_attention needs power-of-two head_dim and block, got {d}, {block}")
    q = q.contiguous()
    group = hq // hkv
    max_blocks = block_tables.shape[1]
    sms = torch.cuda.get_device_properties(q.device).multi_processor_count if q.is_cuda else 4
    nsplit = split_count(b, hkv, max_blocks, sms)
    per_split = -(-max_blocks // nsplit)
    nsplit = -(-max_blocks // per_split)
    f32 = dict(device=q.device, dtype=torch.float32)
    m, den = torch.empty(b, hq, nsplit, **f32), torch.empty(b, hq, nsplit, **f32)
    acc = torch.empty(b, hq, nsplit, d, **f32)
    _split_kernel[(b, hkv, nsplit)](
        q, k_cache, v_cache, block_tables, ctx_lens, m, den, acc,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2), block_tables.stride(0),
        per_split, 1.0 / math.sqrt(d), nsplit, H=hq, GROUP=group, GROUP_P=_pow2(group), D=d, BLOCK=block)
    out = torch.empty_like(q)
    _merge_kernel[(b, hq)](m, den, acc, out, out.stride(0), out.stride(1), nsplit,
                           NSPLIT_P=_pow2(nsplit), H=hq, D=d)
    return out


def check_paged_attention(device: torch.device, dtype: torch.dtype = torch.bfloat16) -> float:
    """Max |difference| against the portable PyTorch kernel on mixed-length random data;
    raises AssertionError past a bf16-sized tolerance."""
    from .ops import paged_torch

    gen = torch.Generator(device=device).manual_seed(0)
    b, hq, hkv, d, block, nb = 5, 8, 2, 64, 16, 64
    kc = torch.randn(nb, block, hkv, d, generator=gen, device=device).to(dtype)
    vc = torch.randn(nb, block, hkv, d, generator=gen, device=device).to(dtype)
    q = torch.randn(b, hq, d, generator=gen, device=device).to(dtype)
    lens = torch.tensor([1, 17, 100, 160, 33], device=device, dtype=torch.int32)
    tables = torch.randperm(nb, generator=gen, device=device)[: b * 10].view(b, 10)
    want = paged_torch(q.float(), kc.float(), vc.float(), tables, lens)
    got = paged_attention(q, kc, vc, tables, lens).float()
    err = float((got - want).abs().max())
    assert err < 5e-2, f"Triton paged attention differs from PyTorch by {err}"
    return err
