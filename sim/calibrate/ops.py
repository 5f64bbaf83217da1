"""The operators of one Llama layer, as the reference engine runs them and calibrate times them.

Shapes: a step's T tokens are rows (`x[T, hidden]`); attention tensors are
`[batch, heads, tokens, head_dim]`; the paged KV cache of one layer is
`k_cache[num_blocks, block, kv_heads, head_dim]` (and `v_cache`), a block table is
`[batch, max_blocks]` of block ids and `ctx_lens[batch]` the tokens each sequence
attends over.

Attention implementations (the names of the profile's `impl` column):

* prefill `flash`: `F.scaled_dot_product_attention` restricted to the fused
  flash / memory-efficient kernels on CUDA (the CPU's SDPA has its own flash
  kernel); `naive`: QKᵀ materialised, fp32 softmax, then ·V.
* decode `contiguous`: SDPA over per-sequence contiguous K, V;
  `paged` (`paged_reference` in scenarios and tables): a paged-attention kernel over
  the block pool — the Triton kernel in
  `triton_paged.py` on CUDA, `paged_torch` elsewhere; `paged_gather`: the pages
  gathered into a contiguous tensor, then SDPA.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

ROPE_BASE = 500000.0  # Llama 3


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    """RMSNorm as unfused PyTorch ops (fp32 statistics)."""
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * w


def rope_tables(max_len: int, d: int, device, base: float = ROPE_BASE) -> torch.Tensor:
    """cos and sin for every position: [max_len, d // 2, 2] fp32."""
    inv = 1.0 / base ** (torch.arange(0, d, 2, device=device, dtype=torch.float32) / d)
    ang = torch.outer(torch.arange(max_len, device=device, dtype=torch.float32), inv)
    return torch.stack([ang.cos(), ang.sin()], dim=-1)


def rotary(x: torch.Tensor, cs: torch.Tensor) -> torch.Tensor:
    """Rotate pairs of x[T, heads, d] by cs[T, d // 2, 2] (gpt-fast's interleaved form)."""
    xs = x.float().reshape(*x.shape[:-1], -1, 2)
    c, s = cs[:, None, :, 0], cs[:, None, :, 1]
    out = torch.stack([xs[..., 0] * c - xs[..., 1] * s, xs[..., 1] * c + xs[..., 0] * s], -1)
    return out.flatten(-2).to(x.dtype)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def kv_write(k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
             slots: torch.Tensor) -> None:
    """Store k, v[T, kv_heads, d] at flat slots (block id × block + offset) of the pool."""
    k_cache.view(-1, *k_cache.shape[2:]).index_copy_(0, slots, k)
    v_cache.view(-1, *v_cache.shape[2:]).index_copy_(0, slots, v)


def _sdpa_flash(q, k, v, causal: bool) -> torch.Tensor:
    gqa = q.shape[1] != k.shape[1]
    if q.is_cuda:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        with sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION]):
            try:
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)
            except RuntimeError:  # no fused kernel takes GQA here: expand the KV heads
                rep = q.shape[1] // k.shape[1]
                return F.scaled_dot_product_attention(
                    q, k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1), is_causal=causal)
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)


def prefill_flash(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal attention of q[b, hq, s, d] over k, v[b, hkv, s, d] with fused kernels."""
    return _sdpa_flash(q, k, v, causal=True)


def prefill_naive(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal attention with the score matrix materialised and an fp32 softmax."""
    rep = q.shape[1] // k.shape[1]
    if rep > 1:
        k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    s = q.shape[2]
    scores = torch.matmul(q, k.transpose(-1, -2)).float() * (1.0 / math.sqrt(q.shape[-1]))
    mask = torch.ones(s, s, dtype=torch.bool, device=q.device).triu(1)
    probs = scores.masked_fill(mask, float("-inf")).softmax(-1).to(q.dtype)
    return torch.matmul(probs, v)


def decode_contiguous(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """One query token per sequence, q[b, hq, 1, d], over contiguous k, v[b, hkv, ctx, d]."""
    return _sdpa_flash(q, k, v, causal=False)


def gather_pages(cache: torch.Tensor, block_tables: torch.Tensor) -> torch.Tensor:
    """The pages of each sequence side by side: [b, max_blocks × block, hkv, d]."""
    b, nb = block_tables.shape
    return cache[block_tables].reshape(b, nb * cache.shape[1], *cache.shape[2:])


def _length_mask(ctx_lens: torch.Tensor, n: int) -> torch.Tensor:
    return torch.arange(n, device=ctx_lens.device)[None, :] < ctx_lens[:, None]  # [b, n]


def paged_torch(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                block_tables: torch.Tensor, ctx_lens: torch.Tensor) -> torch.Tensor:
    """Portable paged attention for q[b, hq, d]: index the pool through the block table,
    then masked attention per KV-head group with an fp32 softmax; returns [b, hq, d].

    Slots past a sequence's length (the tail of its last block, padding entries of the
    block table) may hold anything, NaN included: their scores are replaced by -inf and
    their values by zeros with `where` (a probability of 0 times NaN would still be NaN)."""
    b, hq, d = q.shape
    hkv = k_cache.shape[2]
    k = gather_pages(k_cache, block_tables)  # [b, n, hkv, d]
    v = gather_pages(v_cache, block_tables)
    valid = _length_mask(ctx_lens, k.shape[1])  # [b, n]
    v = torch.where(valid[:, :, None, None], v, v.new_zeros(()))
    qg = q.view(b, hkv, hq // hkv, d)
    scores = torch.einsum("bhgd,bnhd->bhgn", qg, k).float() * (1.0 / math.sqrt(d))
    scores = torch.where(valid[:, None, None, :], scores, float("-inf"))
    probs = scores.softmax(-1).to(q.dtype)
    return torch.einsum("bhgn,bnhd->bhgd", probs, v).reshape(b, hq, d)


def paged_gather(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 block_tables: torch.Tensor, ctx_lens: torch.Tensor) -> torch.Tensor:
    """Gather the pages into contiguous [b, hkv, n, d] tensors, then SDPA with a length mask."""
    k = gather_pages(k_cache, block_tables).transpose(1, 2)
    v = gather_pages(v_cache, block_tables).transpose(1, 2)
    mask = _length_mask(ctx_lens, k.shape[2])[:, None, None, :]
    gqa = q.shape[1] != k.shape[1]
    out = F.scaled_dot_product_attention(q[:, :, None, :], k, v, attn_mask=mask, enable_gqa=gqa)
    return out[:, :, 0, :]


def paged(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
          block_tables: torch.Tensor, ctx_lens: torch.Tensor) -> torch.Tensor:
    """The `paged` decode kernel: Triton on CUDA, the portable PyTorch one elsewhere."""
    if q.is_cuda:
        from sim.calibrate.triton_paged import paged_attention

        return paged_attention(q, k_cache, v_cache, block_tables, ctx_lens)
    return paged_torch(q, k_cache, v_cache, block_tables, ctx_lens)


DECODE_PAGED = {"paged_reference": paged, "paged_gather": paged_gather}


def sample(logits: torch.Tensor, generator: torch.Generator | None = None,
           temperature: float = 1.0) -> torch.Tensor:
    """One token per row of logits[rows, vocab]: softmax sampling by the exponential race
    (argmax of p / E, E ~ Exp(1), as gpt-fast does, with no host synchronisation)."""
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    race = torch.empty_like(probs).exponential_(1.0, generator=generator)
    return torch.argmax(probs / race, dim=-1)
