"""KV-cache managers: how much GPU memory a request's keys and values hold.

Both managers count slots; the simulator never needs block identities for
batching (prefix caching, which does, keeps its own hashed-block index).

* `PagedKV` (PagedAttention): memory in fixed blocks of `block_size` tokens,
  allocated on demand as a sequence grows; the only waste is the unfilled
  tail of each sequence's last block. A model with sliding-window layers
  (gpt-oss) counts a block at its full layers' bytes, and each sequence holds
  `extra_blocks` more for its sliding layers' window (vLLM's hybrid KV cache
  manager frees a sliding layer's blocks once they leave the window:
  sim/engine/memory.py).
* `ContiguousKV` (pre-PagedAttention): each request reserves room for its
  maximum length (prompt + max output tokens) when it is admitted, as one
  contiguous slab; everything not yet written, or never written, is waste.

Verbs follow vLLM's manager: `can_allocate`, `allocate`, `free`, `usage`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from sim.io.specload import MAX_BLOCK_SIZE, MAX_HOST_GIB, MAX_TOKENS


@dataclass(frozen=True)
class KVSpec:
    manager: Literal["paged", "contiguous"] = "paged"
    block_size: int = field(default=16, metadata={"gt": 0, "le": MAX_BLOCK_SIZE})
    gpu_memory_utilization: float = field(default=0.9, metadata={"gt": 0, "le": 1})
    num_blocks: int | None = field(default=None, metadata={"gt": 0})  # overrides the memory budget
    # default: the model's context window; larger is refused (as vLLM does)
    max_model_len: int | None = field(default=None, metadata={"gt": 0, "le": MAX_TOKENS})
    swap_space_gib: float = field(default=4.0, metadata={"ge": 0, "le": MAX_HOST_GIB})  # host memory for swap preemption
    # contiguous only: what a request reserves at admission. max_model_len: the whole
    # context window (FasterTransformer, Orca "max"); max_tokens: its prompt plus its
    # output cap (a system that knows each request's max_tokens)
    reserve: Literal["max_model_len", "max_tokens"] = "max_model_len"
    # paged only: reuse KV blocks of cached prompt prefixes (hashes come from the workload)
    prefix_caching: bool = False
    prefix_cache_host_gib: float = field(default=0.0, metadata={"ge": 0, "le": MAX_HOST_GIB})  # host-memory tier


@dataclass
class PagedKV:
    num_blocks: int
    block_size: int
    free_blocks: int = -1
    extra_blocks: int = 0  # a sequence's sliding-window blocks, besides its tokens' own

    def __post_init__(self) -> None:
        if self.free_blocks < 0:
            self.free_blocks = self.num_blocks

    kind = "paged"
    paged = True  # blocks taken as a sequence grows

    @classmethod
    def of_tokens(cls, num_tokens: int, block_size: int) -> PagedKV:
        """A manager of `num_tokens` token slots, rounded down to whole blocks."""
        return cls(num_tokens // block_size, block_size)

    def blocks_for(self, tokens: int) -> int:
        """Blocks that hold a sequence of `tokens` tokens (with its window's, if any)."""
        return -(-tokens // self.block_size) + (self.extra_blocks if tokens > 0 else 0)

    def reserve_for(self, prompt_tokens: int, max_total_tokens: int) -> int:
        """Blocks taken at admission: just the tokens to prefill."""
        return self.blocks_for(prompt_tokens)

    def can_allocate(self, blocks: int, watermark_blocks: int = 0) -> bool:
        return self.free_blocks - blocks >= watermark_blocks

    def allocate(self, blocks: int) -> None:
        if blocks > self.free_blocks:
            raise RuntimeError(f"KV over-allocation: {blocks} > {self.free_blocks} free")
        self.free_blocks -= blocks

    def free(self, blocks: int) -> None:
        self.free_blocks += blocks
        if self.free_blocks > self.num_blocks:
            raise RuntimeError("KV double free")

    @property
    def used_blocks(self) -> int:
        return self.num_blocks - self.free_blocks

    @property
    def capacity_tokens(self) -> int:
        return self.num_blocks * self.block_size


@dataclass
class ContiguousKV(PagedKV):
    """Slots of one token; a request takes prompt + max output at admission."""

    kind = "contiguous"
    paged = False  # a whole slab at admission

    @classmethod
    def of_tokens(cls, num_tokens: int, block_size: int) -> ContiguousKV:
        """Contiguous reservations are counted in token slots (blocks of one token)."""
        return cls(num_tokens, 1)

    def reserve_for(self, prompt_tokens: int, max_total_tokens: int) -> int:
        return max_total_tokens + self.extra_blocks


KV_MANAGERS = {"paged": PagedKV, "contiguous": ContiguousKV}  # KVSpec.manager


def make_kv(manager: str, num_tokens: int, block_size: int, extra_blocks: int = 0) -> PagedKV:
    """A manager holding `num_tokens` token slots (rounded down to whole blocks), each
    sequence `extra_blocks` more for its sliding-window layers."""
    kv = KV_MANAGERS[manager].of_tokens(num_tokens, block_size)
    kv.extra_blocks = extra_blocks
    return kv
