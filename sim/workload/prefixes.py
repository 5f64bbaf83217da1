"""Synthetic prefixes: shared system prompts and multi-turn conversations.

A workload's prompts carry prefix hashes, one per `HASH_TOKENS` tokens: the Mooncake
trace brings its own (`hash_ids`), a synthetic workload declares them here
(`workload.shared_prefix`: a system prompt shared by a fraction of requests;
`workload.multi_turn`: conversations whose turns resend the history). Prefix caching
(`sim/policies/prefix.py`) reuses the KV of equal hashes.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np


@dataclass(frozen=True)
class SharedPrefixSpec:
    """A system prompt of `tokens` tokens prepended to a `fraction` of the requests,
    one of `groups` different prompts each (e.g. several applications)."""

    tokens: int = field(metadata={"gt": 0})
    fraction: float = field(default=1.0, metadata={"ge": 0, "le": 1})
    groups: int = field(default=1, metadata={"gt": 0})


@dataclass(frozen=True)
class MultiTurnSpec:
    """Conversations of `turns` requests: request i is turn i // C of conversation
    i % C (C = requests / turns, so turns interleave in time), and each turn's prompt
    is the previous turn's prompt and output followed by its own new tokens."""

    turns: int = field(metadata={"gt": 1})


HASH_TOKENS = 16  # prefix-hash granularity of synthetic prefixes (one KV block)
_UNIQUE = 1 << 40  # hash ids from here on belong to one request only


def declare_prefixes(wl, shared: SharedPrefixSpec | None, multi: MultiTurnSpec | None,
                     rng: np.random.Generator):
    """Add synthetic prefix hashes (and the tokens they add) to a workload."""
    if shared is None and multi is None:
        return wl
    n = len(wl)
    prompt = wl.prompt_tokens.astype(np.int64).copy()
    out = wl.output_tokens
    streams: list[list[int]] = [[] for _ in range(n)]  # block ids of each request's prompt
    if multi is not None:
        convs = max(1, n // multi.turns)
        history: dict[int, tuple[int, int]] = {}  # conversation -> (prompt, output) of last turn
        for i in range(n):
            c = i % convs
            if c in history:
                p, o = history[c]
                prompt[i] += p + o
            history[c] = (int(prompt[i]), int(out[i]))
            streams[i] = [c * 1_000_003 + j for j in range(-(-int(prompt[i] + out[i]) // HASH_TOKENS))]
    if shared is not None:
        chosen = rng.random(n) < shared.fraction
        group = rng.integers(0, shared.groups, size=n)
        blocks = shared.tokens // HASH_TOKENS
        for i in np.flatnonzero(chosen):
            prompt[i] += shared.tokens
            head = [-(int(group[i]) * 1_000_003 + j + 1) for j in range(blocks)]
            tail = streams[i] or [_UNIQUE + i * 1_000_003 + j for j in range(-(-int(prompt[i]) // HASH_TOKENS))]
            streams[i] = head + tail if shared.tokens % HASH_TOKENS == 0 else head
    hashes = tuple(tuple(x) for x in streams)
    return replace(wl, prompt_tokens=prompt, prefix_hashes=hashes, block_tokens=HASH_TOKENS)
