"""Prefix caching (vLLM automatic prefix caching / SGLang radix cache, block-level).

A KV block is identified by the hash of its tokens and of every block before it,
so two prompts share cached blocks exactly as far as their prefixes agree. A
request reuses the blocks of its longest cached prefix and prefills only the
rest; after its prefill, its own full prompt blocks join the cache. Blocks
nobody references stay cached but count as free, and are evicted
least-recently-used when an allocation needs the room (as vLLM's free-block
queue does).

Hashes come from the workload: the Mooncake trace's `hash_ids` (512-token
blocks), or prefixes a synthetic workload declares (`workload.shared_prefix`:
a system prompt shared by a fraction of requests; `workload.multi_turn`:
conversations whose turns resend the history). One cache entry spans
`hash_tokens` tokens = `units` KV blocks.

With `kv.prefix_cache_host_gib`, blocks evicted from the GPU move to a host-memory
tier (LRU) and a hit there is copied back over PCIe, the copy time added to the step.

Hit rate, as vLLM v1 counts it (`PrefixCacheStats`, `KVCacheManager.get_computed_blocks`):
in tokens, over every request's first lookup, whether or not it carries a prefix hash:
`hit_rate` = prompt tokens served from the cache / prompt tokens looked up (vLLM's
`hits / queries`; it counts a preempted request's second lookup apart, and so do we, by
not counting it). The block-level figure (`block_hit_rate`: cached / looked-up full
prompt blocks that carry a hash) leaves out prompts without prefixes and the partial
last block, so it reads higher whenever only part of a prompt has a hash
(`workload.shared_prefix`, `multi_turn`).

Accounting, with the KV manager's `free_blocks` counting evictable blocks as free (a
hash is in at most one of: referenced, evictable on the GPU, in the host tier):
a hash block is allocated once, when it goes from evictable (or new) to
referenced, and freed once, when its last reference goes; a request's logical
blocks are its whole sequence, and on release it frees those not still
referenced by another request.
"""

from __future__ import annotations

import math
from collections import OrderedDict

from sim.policies.batch import Seq
from sim.policies.kv import PagedKV


def regroup(hashes: tuple[tuple[int, ...], ...], hash_tokens: int,
            block_size: int) -> tuple[tuple[tuple[int, ...], ...], int]:
    """Prefix hashes whose blocks are whole KV blocks: when `block_size` does not divide
    `hash_tokens`, every g consecutive hashes become one entry of lcm(hash_tokens,
    block_size) tokens (a trailing partial group is dropped), so only prefixes covering
    whole groups are shared. Returns (hashes, tokens per hash)."""
    unit = math.lcm(hash_tokens, block_size)
    g = unit // hash_tokens
    if g == 1:
        return hashes, hash_tokens
    grouped = tuple(tuple(hash(h[i:i + g]) for i in range(0, len(h) - g + 1, g)) for h in hashes)
    return grouped, unit


class PrefixCache:
    def __init__(self, kv: PagedKV, hash_tokens: int, host_blocks: int = 0):
        if hash_tokens % kv.block_size:
            raise ValueError(f"prefix blocks of {hash_tokens} tokens are not whole KV blocks of "
                             f"{kv.block_size}")
        self.kv = kv
        self.hash_tokens = hash_tokens
        self.units = hash_tokens // kv.block_size
        self.refs: dict[int, int] = {}                        # hash -> live references
        self.evictable: OrderedDict[int, None] = OrderedDict()  # refcount 0, LRU first
        self.query_tokens = 0  # prompt tokens looked up: every request, first admission
        self.hit_tokens = 0    # ... of which were served from the cache
        self.block_lookups = 0  # full prompt blocks carrying a hash, looked up at first admission
        self.block_hits = 0     # ... of which were cached
        self.tokens_saved = 0  # prompt tokens not prefilled, all admissions
        self.evictions = 0
        self.extra_refs = 0   # references beyond the first (shared blocks counted once more)
        # second tier in host memory (as Mooncake's pool, SGLang HiCache, LMCache): blocks
        # evicted from the GPU land here, LRU; a hit here is copied back over PCIe
        self.host: OrderedDict[int, None] = OrderedDict()
        self.host_capacity = host_blocks  # hash blocks
        self.host_hits = 0
        self.loaded = 0       # hash blocks copied host -> GPU (the engine charges PCIe time)

    # ---- queries (no mutation) ---------------------------------------------------
    def match(self, s: Seq) -> int:
        """Leading prompt hash blocks of `s` that are cached (at least one token is left
        to compute, as vLLM recomputes the last token)."""
        hashes = s.prefix
        if not hashes:
            return 0
        full = min(len(hashes), s.prompt // self.hash_tokens)
        h = 0
        refs, ev, host = self.refs, self.evictable, self.host
        while h < full and (hashes[h] in refs or hashes[h] in ev or hashes[h] in host):
            h += 1
        if h and h * self.hash_tokens >= s.tokens_to_prefill:
            h -= 1
        return h

    def admission_blocks(self, s: Seq, h: int, tokens: int | None = None) -> int:
        """KV blocks admitting `s` takes with `h` cached hash blocks, holding `tokens`
        tokens after this step (default: its whole prefill): the uncached ones, plus
        cached blocks nobody references (they leave the free pool) or that are in host
        memory (they are copied into new GPU blocks)."""
        t = s.tokens_to_prefill if tokens is None else tokens
        need = self.kv.blocks_for(t) - h * self.units
        refs = self.refs
        return need + sum(self.units for x in s.prefix[:h] if x not in refs)

    def shared_blocks(self, s: Seq) -> int:
        """KV blocks of `s` that another request also references (not freed with it)."""
        refs = self.refs
        return sum(self.units for x in s.prefix_refs if refs[x] > 1)

    # ---- mutation (the engine's) ---------------------------------------------------
    def acquire(self, s: Seq, h: int, first: bool) -> int:
        """Reference the first `h` hash blocks of `s`; returns the tokens served from cache."""
        if first:
            self.block_lookups += min(len(s.prefix or ()), s.prompt // self.hash_tokens)
            self.block_hits += h
            self.query_tokens += s.prompt
            self.hit_tokens += h * self.hash_tokens
        refs, ev, host = self.refs, self.evictable, self.host
        held = []
        for x in s.prefix[:h] if h else ():
            if x in ev:
                del ev[x]
                refs[x] = 1
            elif x in host:
                del host[x]
                refs[x] = 1
                self.loaded += 1
                if first:
                    self.host_hits += 1
            else:
                refs[x] += 1
                self.extra_refs += 1
            held.append(x)
        s.prefix_refs = held
        tokens = h * self.hash_tokens
        self.tokens_saved += tokens
        return tokens

    def miss(self, s: Seq) -> None:
        """The first lookup of a request without prefix hashes: nothing to find, but
        its prompt tokens count as looked up (as vLLM counts every new request)."""
        self.query_tokens += s.prompt

    def insert(self, s: Seq, tokens: int) -> None:
        """The request's first `tokens` tokens are computed: their full blocks join the cache."""
        if not s.prefix:
            return
        full = min(len(s.prefix), tokens // self.hash_tokens)
        refs, ev, host = self.refs, self.evictable, self.host
        held = s.prefix_refs
        for x in s.prefix[len(held):full]:
            if x in refs or x in ev:
                break  # someone cached this block meanwhile: keep our copy private
            if x in host:  # an evicted copy waits in host memory: ours, on the GPU, replaces it
                del host[x]
            refs[x] = 1
            held.append(x)

    def release(self, s: Seq) -> int:
        """Drop the references of `s`; returns how many of its KV blocks stay in use."""
        refs, ev = self.refs, self.evictable
        shared = 0
        for x in s.prefix_refs or ():
            r = refs[x] - 1
            if r:
                refs[x] = r
                shared += self.units
                self.extra_refs -= 1
            else:
                del refs[x]
                ev[x] = None
        s.prefix_refs = []
        return shared

    def evict_to_fit(self) -> None:
        """Evict least-recently-used cached blocks until the truly free ones cover the rest."""
        ev, kv, host = self.evictable, self.kv, self.host
        while ev and kv.free_blocks < len(ev) * self.units:
            x, _ = ev.popitem(last=False)
            self.evictions += 1
            if self.host_capacity:
                host[x] = None
                if len(host) > self.host_capacity:
                    host.popitem(last=False)

    def summary(self) -> dict:
        return {
            "hash_block_tokens": self.hash_tokens,
            **rates(self.query_tokens, self.hit_tokens, self.block_lookups, self.block_hits),
            "host_hits": self.host_hits,
            "host_blocks_loaded": self.loaded,
            "prompt_tokens_saved": self.tokens_saved,
            "evictions": self.evictions,
        }


def rates(query_tokens: int, hit_tokens: int, block_lookups: int, block_hits: int) -> dict:
    """The counters and the two hit rates they give (see the module docstring)."""
    return {
        "query_tokens": query_tokens,
        "hit_tokens": hit_tokens,
        "hit_rate": hit_tokens / query_tokens if query_tokens else 0.0,
        "block_lookups": block_lookups,
        "block_hits": block_hits,
        "block_hit_rate": block_hits / block_lookups if block_lookups else 0.0,
    }


def combine_summaries(parts: list[dict | None]) -> dict | None:
    """One summary for a fleet's prefix caches: counters summed, rates from the sums."""
    parts = [p for p in parts if p is not None]
    if not parts:
        return None
    out = {k: sum(p[k] for p in parts) for k in parts[0]}
    out.update(rates(*(out[k] for k in ("query_tokens", "hit_tokens", "block_lookups", "block_hits"))))
    out["hash_block_tokens"] = parts[0]["hash_block_tokens"]
    return out
