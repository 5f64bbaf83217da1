"""What `llmsim calibrate` measures: the size grids, and their order of importance.

Each grid lists its sizes in two tiers. Tier 0 is the coarse grid every table gets
first (the token counts and batch sizes that serving steps hit most: decode
batches of 1–64 and prefills of a few hundred to a few thousand tokens); tier 1
fills in between and extends the ends. Within a tier the tables run in the order
of `TABLE_ORDER`, most important first, so a time budget that runs out keeps a
usable profile: GEMMs, decode attention, prefill attention, elementwise ops,
sampling, then whole iterations of the reference engine.

`full` is meant for a GPU (about ten minutes for two 1–8B models on an H200);
`quick` is a small grid for CI and for trying the command on a CPU.
"""

from __future__ import annotations

TABLE_ORDER = ("gemm", "attn_decode", "attn_prefill", "elementwise", "sampling", "iteration")

GRIDS: dict[str, dict] = {
    "full": {
        "gemm_m": ([1, 16, 64, 256, 1024, 4096],
                   [2, 4, 8, 32, 128, 512, 2048, 8192, 16384]),
        "prefill_seq": ([512, 2048, 8192], [128, 256, 1024, 4096, 16384]),
        "prefill_batch": [1],
        "decode_batch": ([1, 16, 64], [4, 128, 256]),
        "decode_ctx": ([512, 4096], [128, 1024, 2048, 8192, 16384]),
        "decode_max_tokens": 1 << 20,  # batch x ctx at most this (KV memory)
        "mixed": {"batch": [8, 64], "max_ctx": [2048, 8192]},  # lengths uniform in [max/8, max]
        "elementwise_m": ([1, 128, 2048], [8, 32, 512, 8192]),
        "sampling_m": ([1, 64], [8, 256]),
        "iter_prefill": {"batch": ([1, 4], [2, 8]), "new_tokens": ([128, 1024], [32, 512, 2048, 8192])},
        "iter_decode": {"batch": ([1, 32, 128], [8, 64, 256]), "ctx": ([1024], [256, 4096])},
        "iter_max_tokens": 8192,  # prefill: batch x new_tokens at most this
        "block": 16,
        "ceilings": {"cuda": (1024, 8192), "cpu": (256, 2048)},  # copy MiB, square GEMM size
        "warmup": 5,
        "repeats": 20,
        "max_s_per_point": 0.5,
        "iter_repeats": 20,
        "iter_max_s": 1.0,  # whole iterations: the runtime fit rests on them
    },
    "quick": {
        "gemm_m": ([1, 16, 256], [4, 64, 1024]),
        "prefill_seq": ([64, 256], [128, 512]),
        "prefill_batch": [1],
        "decode_batch": ([1, 8], [4, 16]),
        "decode_ctx": ([64, 256], [128, 512]),
        "decode_max_tokens": 1 << 14,
        "mixed": {"batch": [8], "max_ctx": [512]},
        "elementwise_m": ([1, 64], [8, 256]),
        "sampling_m": ([1, 8], []),
        "iter_prefill": {"batch": ([1, 4], [2]), "new_tokens": ([32, 128], [64, 256])},
        "iter_decode": {"batch": ([1, 4, 16], [8]), "ctx": ([128], [32, 512])},
        "iter_max_tokens": 512,
        "block": 16,
        "ceilings": {"cuda": (256, 4096), "cpu": (64, 1024)},
        "warmup": 3,
        "repeats": 100,
        "max_s_per_point": 0.03,
        "iter_repeats": 40,
        "iter_max_s": 0.25,
    },
}


def tiers(value) -> tuple[list, list]:
    """(tier 0, tier 1) of a grid entry; a plain list is all tier 0."""
    if isinstance(value, tuple):
        return sorted(value[0]), sorted(value[1])
    return sorted(value), []


def tier_of(value, x) -> int:
    return 0 if x in tiers(value)[0] else 1


def every(value) -> list:
    a, b = tiers(value)
    return sorted(set(a) | set(b))
