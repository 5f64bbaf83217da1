"""One replica's KV accounting: the KV manager's block counts and the prefix cache's
references, behind a few verbs (as vLLM v1's `KVCacheManager` over its `BlockPool`).

`allocate(blocks) -> blocks | None` takes blocks, evicting unreferenced cached prefix
blocks as the room is needed, or returns None and takes nothing when they do not fit
(the caller decides: the engine treats it as a broken plan). A request's prefix
references live here too: `admit` references its cached prefix and says what else it
needs, `cache` offers its computed blocks to the prefix cache, and `free` lets go of
its logical blocks, of which only those nobody else references go back.
"""

from __future__ import annotations

from sim.policies.batch import Seq
from sim.policies.prefix import PrefixCache
from sim.policies.protocols import DecodeBatch, KVManager


class KVAccount:
    """The KV blocks of one replica and the prefix-cache references of its requests."""

    __slots__ = ("kv", "prefix", "batch", "paged")

    def __init__(self, kv: KVManager, prefix: PrefixCache | None, batch: DecodeBatch):
        self.kv, self.prefix, self.batch = kv, prefix, batch
        self.paged = kv.paged

    def allocate(self, blocks: int) -> int | None:
        """Take `blocks` (cached prefix blocks nobody references make room, least recently
        used first); None, with nothing taken, when they do not fit."""
        kv = self.kv
        if blocks > kv.free_blocks:
            return None
        kv.allocate(blocks)
        if self.prefix is not None:
            self.prefix.evict_to_fit()
        return blocks

    def take(self, blocks: int) -> None:
        """`allocate`, for blocks a plan counted on: not fitting is an engine bug."""
        if self.allocate(blocks) is None:
            raise RuntimeError(f"KV over-allocation: {blocks} > {self.kv.free_blocks} free")

    def free(self, s: Seq, held: int) -> None:
        """`s` lets go of `held` logical blocks; blocks another request shares stay."""
        prefix = self.prefix
        self.kv.free(held - prefix.release(s) if prefix is not None else held)

    def held(self, s: Seq) -> int:
        """Logical blocks `s` holds now (a contiguous request: its whole reservation)."""
        if not self.paged:
            return s.reserved
        if s in self.batch.members:
            return self.batch.held_blocks(s)
        return self.kv.blocks_for(s.prefilled)

    def admit(self, s: Seq, cached_blocks: int, upto: int | None, first: bool) -> int:
        """Admit paged `s` reusing `cached_blocks` prefix-cache blocks (referenced now), for
        `upto` tokens after this step (None: its whole prefill); sets the tokens it starts
        from and returns the blocks still to take. Every admission of a plan references its
        prefix before any block is taken, so none evicts a block a later one counts on."""
        prefix = self.prefix
        if prefix is not None and s.prefix:
            if upto is not None:
                upto += cached_blocks * prefix.hash_tokens
            need = prefix.admission_blocks(s, cached_blocks, upto)
            s.prefilled = prefix.acquire(s, cached_blocks, first)
            if first:
                s.cached_tokens = s.prefilled
            return need
        if prefix is not None and first:
            prefix.miss(s)
        s.prefilled = 0
        return self.kv.blocks_for(upto if upto is not None else s.tokens_to_prefill)

    def cache(self, s: Seq, tokens: int) -> None:
        """The first `tokens` tokens of `s` are computed: the prefix cache may keep them."""
        if self.prefix is not None:
            self.prefix.insert(s, tokens)

    def release(self, s: Seq) -> None:
        """`s` leaves with all its KV (finished, or handed to a decode replica): the prefix
        cache keeps its computed tokens, and the blocks only it holds are freed."""
        tokens = s.prompt + s.generated - 1
        self.cache(s, tokens)
        self.free(s, self.kv.blocks_for(tokens))

    def loaded(self) -> int:
        """Prefix blocks copied back from host memory so far (0 without a host tier)."""
        return self.prefix.loaded if self.prefix is not None else 0

    def shared_tokens(self) -> int:
        """Tokens counted more than once by the requests' own counts (a shared block holds
        its tokens once)."""
        prefix = self.prefix
        return prefix.extra_refs * prefix.hash_tokens if prefix is not None else 0

    def check_conserved(self) -> None:
        """At the end of a run every KV block is free again."""
        kv, prefix = self.kv, self.prefix
        if kv.free_blocks != kv.num_blocks or (prefix is not None and prefix.refs):
            raise RuntimeError(f"KV leak: {kv.num_blocks - kv.free_blocks} of {kv.num_blocks} "
                               f"blocks still taken after every request ended")
