"""Warming up the reference engine before `validate` times it: every kernel variant first.

Triton compiles a kernel the first time it meets a new specialisation, which takes
hundreds of milliseconds: a timed step that meets one would be charged for it. The
paged decode kernel (`triton_paged`) is specialised on its constexpr arguments and,
as Triton does for integer arguments, on whether each integer argument is 1 and
whether it is divisible by 16. Within one model its head counts, head dim and block
are fixed; what varies from step to step is the batch size and the block-table width,
through the split plan (`splits.split_plan`): the padded split count `NSPLIT_P`, the
table's row stride (= its width), the blocks per split and the split count.
`decode_classes` maps every (batch, width) a run can produce — batch 1 up to the
scheduler's row limit (or the trace's size), width 1 up to the blocks of the
trace's longest sequence — to its specialisation, and keeps the cheapest (batch,
width) of each class (compilation depends on the class alone, and the cheapest
cannot run out of memory where the timed steps would not); `warm_kernels` runs one
decode step per class, and one prefill of the longest prompt (so the caching
allocator has grown to a long prefill), untimed, on block 0 (the pool's scratch
block). Enumerating is exact and
cheap where a full untimed replay of the trace is neither: a replay takes as long as
the trace and may still miss a (batch, width) that the timed runs' own timing
produces.

On the CPU the paged kernel is PyTorch (nothing to compile); the same steps run, so
the tests exercise the enumeration.
"""

from __future__ import annotations

import torch

from sim.calibrate import splits
from sim.calibrate.reference import ReferenceEngine, decode_step, prefill_step
from sim.workload.requests import Workload


def _int_spec(x: int) -> tuple[bool, bool]:
    return x == 1, x % 16 == 0


def specialisation(batch: int, width: int, kv_heads: int, sms: int) -> tuple:
    """What the paged decode kernel is compiled for at this batch and table width."""
    nsplit, per_split = splits.split_plan(batch, kv_heads, width, sms)
    return splits.pow2(nsplit), _int_spec(width), _int_spec(per_split), _int_spec(nsplit)


def decode_classes(max_batch: int, max_width: int, kv_heads: int,
                   sms: int) -> dict[tuple, tuple[int, int]]:
    """Specialisation -> the cheapest (batch, width) with it (fewest blocks read), over
    every batch in 1..max_batch and width in 1..max_width."""
    best: dict[tuple, tuple[int, int, int]] = {}
    # batches with the same `split_want` get the same plan at every width: the smallest stands
    smallest: dict[int, int] = {}
    for b in range(max_batch, 0, -1):
        smallest[splits.split_want(b, kv_heads, sms)] = b
    for b in smallest.values():
        for w in range(1, max_width + 1):
            key = specialisation(b, w, kv_heads, sms)
            best[key] = min(best.get(key, (b * w, b, w)), (b * w, b, w))
    return {key: (b, w) for key, (_, b, w) in best.items()}


def run_bounds(engine: ReferenceEngine, wl: Workload) -> tuple[int, int]:
    """(largest decode batch, widest block table) the engine can meet on `wl`."""
    sc = engine.sc
    rows = sc.scheduler.max_num_seqs if sc.scheduler.policy == "continuous" \
        else sc.scheduler.max_batch_size
    longest = int((wl.prompt_tokens + wl.output_tokens).max()) if len(wl) else 1
    longest = min(longest, engine.max_len)
    return max(1, min(rows, len(wl))), -(-longest // sc.kv.block_size)


def warm_kernels(engine: ReferenceEngine, wl: Workload) -> int:
    """Run, untimed, one decode step per kernel specialisation `wl` can meet and one
    prefill of its longest prompt; returns the number of steps run."""
    model, cache, dev = engine.model, engine.cache, engine.dev.device
    block = cache.block
    max_batch, max_width = run_bounds(engine, wl)
    classes = decode_classes(max_batch, max_width, model.spec.kv_heads, splits.paged_sms(dev))
    for b, w in classes.values():
        ctx = (w - 1) * block + 1  # the shortest context that needs w blocks
        ids = torch.zeros(b, dtype=torch.long, device=dev)
        decode_step(model, cache, ids, torch.full((b,), ctx - 1, device=dev),
                    torch.zeros(b, dtype=torch.long, device=dev),  # slot 0: scratch
                    torch.zeros(b, w, dtype=torch.long, device=dev),
                    torch.full((b,), ctx, device=dev, dtype=torch.int32),
                    engine.decode_attn).tolist()
    longest = min(int(wl.prompt_tokens.max()) if len(wl) else 1, len(cache.free_list) * block)
    prefill_step(model, cache, [(-1, [0] * longest)], engine.prefill_attn).tolist()
    cache.free(-1)
    return len(classes) + 1
