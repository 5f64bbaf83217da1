"""KV-cache managers: how much GPU memory a request's keys and values hold.

Both managers count slots; the simulator never needs block identities for
batching (prefix caching, which does, keeps its own hashed-block index).

* `PagedKV` (PagedAttention): memory in fixed blocks of `block_size` tokens,
  allocated on demand as a sequence grows; the only waste is the unfilled
  tail of each sequence's last block.
* `ContiguousKV` (pre-PagedAttention): each request reserves room for its
  maximum length (prompt + max output tokens) when it is admitted, as one
  contiguous slab; everything not yet written, or never written, is waste.

Verbs follow vLLM's manager: `can_allocate`, `allocate`, `free`, `usage`.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class PagedKV:
    num_blocks: int
    block_size: int
    free_blocks: int = -1

    def __post_init__(self) -> None:
        if self.free_blocks < 0:
            self.free_blocks = self.num_blocks

    kind = "paged"

    def blocks_for(self, tokens: int) -> int:
        """Blocks that hold `tokens` tokens."""
        return -(-tokens // self.block_size)

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

    def reserve_for(self, prompt_tokens: int, max_total_tokens: int) -> int:
        return max_total_tokens


def make_kv(manager: str, num_tokens: int, block_size: int) -> PagedKV:
    """A manager holding `num_tokens` token slots (rounded down to whole blocks)."""
    if manager == "paged":
        return PagedKV(num_tokens // block_size, block_size)
    return ContiguousKV(num_tokens, 1)
