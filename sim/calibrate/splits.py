"""How the Triton paged-decode kernel splits each sequence's KV over the SMs (the plan
both the kernel and the warm-up that compiles its variants read)."""

from __future__ import annotations

import torch


def pow2(n: int) -> int:
    """The smallest power of two >= n (at least 1)."""
    return 1 << max(0, (n - 1).bit_length())


def paged_sms(device: torch.device) -> int:
    """The SM count the Triton kernel plans its splits for (4 off CUDA: its interpreter)."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 4


def split_want(batch: int, kv_heads: int, sms: int) -> int:
    """Splits per sequence that would fill ~4 waves of the SMs (before the caps)."""
    return -(-4 * sms // max(1, batch * kv_heads))


def split_plan(batch: int, kv_heads: int, width: int, sms: int) -> tuple[int, int]:
    """(splits, blocks per split) of the Triton kernel for a block table `width` blocks
    wide: enough programs for ~4 waves of the SMs, at most 64 splits and one per block."""
    nsplit = max(1, min(width, split_want(batch, kv_heads, sms), 64))
    per_split = -(-width // nsplit)
    return -(-width // per_split), per_split

