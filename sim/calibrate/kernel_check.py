"""Known-answer check of a paged decode-attention kernel, run before it is timed.

`check_paged(kernel, device, dtype)` runs `kernel(q, k_cache, v_cache, block_tables,
ctx_lens)` on each case of `CASES` and compares it with exact attention computed in
float64 over each sequence's own tokens only. The cases cover what a decode step
meets: head dim 64 and 128; GQA groups of 1, 4 and 8; block sizes 16 and 32; ragged
context lengths (1 token, exact multiples of the block, one past a multiple, long
and short sequences in one batch); block tables wider than 64 blocks, so that the
Triton kernel (at most 64 splits) walks several blocks per split; and a pool whose
every slot outside the sequences' tokens holds NaN (the tail of each last block and
block 0, which pads the block tables), as an uninitialised pool could.

A kernel that differs by more than the dtype's tolerance raises `KernelMismatch`
with the case and the error; the caller turns it into a one-line error.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch


class KernelMismatch(Exception):
    """A paged-attention kernel disagrees with exact attention (one line)."""


@dataclass(frozen=True)
class Case:
    hq: int
    hkv: int
    d: int
    block: int
    lens: tuple[int, ...]  # context tokens per sequence

    def label(self) -> str:
        return (f"hq={self.hq} hkv={self.hkv} d={self.d} block={self.block} "
                f"lens={list(self.lens)}")


CASES = (
    Case(hq=8, hkv=2, d=64, block=16, lens=(1, 17, 100, 160, 33)),  # group 4, ragged
    Case(hq=4, hkv=4, d=128, block=16, lens=(16, 5, 1040, 257)),  # group 1, 66 blocks wide
    Case(hq=16, hkv=2, d=128, block=16, lens=(1100, 2, 129)),  # group 8, 69 blocks wide
    Case(hq=8, hkv=1, d=64, block=32, lens=(64, 2100, 1, 31)),  # group 8, block 32
)
TOLERANCE = {torch.float32: 1e-4, torch.float64: 1e-6}  # others (bf16, fp16): 5e-2
PAGED_KERNEL = Callable[..., torch.Tensor]


def make_case(case: Case, device: torch.device, dtype: torch.dtype, seed: int = 0):
    """(q, k_cache, v_cache, block_tables, ctx_lens) with the pages in random order, the
    tables padded with block 0, and NaN in every pool slot no sequence owns."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    blocks = [-(-n // case.block) for n in case.lens]
    width, total = max(blocks), sum(blocks)
    shape = (total + 1, case.block, case.hkv, case.d)
    k = torch.randn(*shape, generator=gen)
    v = torch.randn(*shape, generator=gen)
    owned = torch.zeros(total + 1, case.block, dtype=torch.bool)
    perm = (torch.randperm(total, generator=gen) + 1).tolist()
    tables, i = [], 0
    for n, nb in zip(case.lens, blocks, strict=True):
        mine = perm[i:i + nb]
        i += nb
        for j, blk in enumerate(mine):
            owned[blk, : min(case.block, n - j * case.block)] = True
        tables.append(mine + [0] * (width - nb))
    k[~owned], v[~owned] = float("nan"), float("nan")
    q = torch.randn(len(case.lens), case.hq, case.d, generator=gen)
    to = dict(device=device, dtype=dtype)
    return (q.to(**to), k.to(**to), v.to(**to), torch.tensor(tables, device=device),
            torch.tensor(case.lens, device=device, dtype=torch.int32))


def exact(q, k_cache, v_cache, block_tables, ctx_lens) -> torch.Tensor:
    """float64 attention of each sequence over exactly its first ctx_lens tokens."""
    b, hq, d = q.shape
    hkv, block = k_cache.shape[2], k_cache.shape[1]
    out = torch.empty(b, hq, d, dtype=torch.float64)
    for row in range(b):
        n = int(ctx_lens[row])
        pages = block_tables[row, : -(-n // block)].cpu()
        k = k_cache.cpu()[pages].reshape(-1, hkv, d)[:n].double()  # [n, hkv, d]
        v = v_cache.cpu()[pages].reshape(-1, hkv, d)[:n].double()
        k, v = k.repeat_interleave(hq // hkv, 1), v.repeat_interleave(hq // hkv, 1)
        scores = torch.einsum("hd,nhd->hn", q[row].cpu().double(), k) / d ** 0.5
        out[row] = torch.einsum("hn,nhd->hd", scores.softmax(-1), v)
    return out


def check_paged(kernel: PAGED_KERNEL, device: torch.device, dtype: torch.dtype,
                cases: tuple[Case, ...] = CASES) -> float:
    """The largest |difference| over `cases`; KernelMismatch past the dtype's tolerance."""
    tol = TOLERANCE.get(dtype, 5e-2)
    worst = 0.0
    for case in cases:
        args = make_case(case, device, dtype)
        got = kernel(*args).double().cpu()
        err = float((got - exact(*args)).abs().max())  # NaN if the kernel gave any NaN
        if not err <= tol:
            raise KernelMismatch(f"paged attention differs from exact attention by {err:.3g} "
                                 f"(allowed {tol:g}) on {case.label()}, {dtype}")
        worst = max(worst, err)
    return worst
