"""Whole-iteration latencies of the reference engine, to fit the host-overhead runtime profile.

Each point times one step of `reference.prefill_step` or `reference.decode_step` the
way the serving loop runs it: inputs built from Python lists, the step launched,
its tokens copied back to the host (so the wall time includes host launch
overhead and a synchronisation). Rows follow `sim.fit.runtime_fit`'s grid format
(`model,kind,batch,new_tokens,ctx,ms`): prefill rows are `batch` prompts of
`new_tokens` from an empty cache; decode rows are `batch` sequences at context
`ctx`, their pages in random order in the pool.

`eager` rows go to `iter_grid_eager.csv`. On CUDA, decode steps are also
captured in a CUDA graph per (batch, block-table width) and replayed (inputs
copied into the graph's static buffers): those rows go to `iter_grid_graphs.csv`.
Both kinds of decode row sample their tokens (`sampled_decode`), as serving does.
"""

from __future__ import annotations

import gc

import torch

from sim.calibrate import ops
from sim.calibrate.bench import Point
from sim.calibrate.device import Device, TooLarge
from sim.calibrate.grids import every, tier_of
from sim.calibrate.reference import Llama, PagedCache, decode_logits, prefill_step
from sim.costmodel.models import ModelSpec


class Resident:
    """The one model (and its KV pool) kept on the device while iteration points run.

    `calibrate` owns one per run and calls `release` before any kernel point that follows
    an iteration point, and at the end: kernel tables are measured on an empty device
    (free memory and allocator state as for every other kernel point)."""

    def __init__(self) -> None:
        self.spec: ModelSpec | None = None
        self.model: Llama | None = None
        self.cache: PagedCache | None = None

    def get(self, spec: ModelSpec, dev: Device, pool_tokens: int,
            block: int) -> tuple[Llama, PagedCache]:
        if self.spec is not spec:
            self.release(dev)
            dev.check_fits(spec.params * torch.finfo(dev.dtype).bits / 8,
                           f"{spec.name} weights")
            self.model = Llama(spec, dev)
            per_token = spec.ops().kv_bytes_per_token(torch.finfo(dev.dtype).bits / 8)
            tokens = min(pool_tokens, int(0.5 * dev.free_bytes() / per_token))  # room for steps
            self.cache = PagedCache(spec, max(1, tokens // block), block, dev)
            self.spec = spec
        return self.model, self.cache

    def release(self, dev: Device) -> None:
        """Drop the model and pool, collect, and return the memory (no-op when empty)."""
        if self.model is None and self.cache is None:
            return
        self.spec = self.model = self.cache = None
        gc.collect()
        dev.release()


def sampled_decode(model: Llama, cache: PagedCache, ids, pos, slots, tables, lens,
                   generator: torch.Generator | None) -> torch.Tensor:
    """The decode step both row kinds time: logits, then sampling, as serving does. The
    eager rows sample with the device's generator, as `decode_step` does; a captured graph
    samples with the default CUDA generator, the one every PyTorch version lets a graph
    capture (the ops, and so the cost, are the same)."""
    return ops.sample(decode_logits(model, cache, ids, pos, slots, tables, lens, ops.paged),
                      generator)


class GraphDecode:
    """A decode step captured in a CUDA graph for a fixed batch and block-table width."""

    def __init__(self, model: Llama, cache: PagedCache, batch: int, width: int):
        dev = model.dev.device
        self.bufs = dict(ids=torch.zeros(batch, dtype=torch.long, device=dev),
                         pos=torch.zeros(batch, dtype=torch.long, device=dev),
                         slots=torch.zeros(batch, dtype=torch.long, device=dev),
                         tables=torch.zeros(batch, width, dtype=torch.long, device=dev),
                         lens=torch.ones(batch, dtype=torch.int32, device=dev))
        args = (model, cache, *self.bufs.values())
        side = torch.cuda.Stream(device=dev)
        side.wait_stream(torch.cuda.current_stream(dev))
        with torch.cuda.stream(side):
            for _ in range(2):  # warm-up (Triton compilation) outside the capture
                sampled_decode(*args, generator=None)
        torch.cuda.current_stream(dev).wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.out = sampled_decode(*args, generator=None)

    def __call__(self, ids, pos, slots, tables, lens) -> list[int]:
        for buf, host in zip(self.bufs.values(), (ids, pos, slots, tables, lens), strict=True):
            buf.copy_(torch.tensor(host, dtype=buf.dtype), non_blocking=True)
        self.graph.replay()
        return self.out.tolist()


def _row(spec: ModelSpec, kind: str, b: int, new: int, ctx: int, ms: float, mode: str) -> dict:
    return {"_table": f"iter_grid_{mode}", "model": spec.name, "kind": kind, "batch": b,
            "new_tokens": new, "ctx": ctx, "ms": ms}


def prefill_point(spec: ModelSpec, b: int, n: int, pool: int, block: int, tier: int,
                  limits: tuple[float, int], resident: Resident) -> Point:
    def run(dev: Device) -> list[dict]:
        model, cache = resident.get(spec, dev, pool, block)
        rows = [(i, dev.randint(spec.vocab, n).tolist()) for i in range(b)]

        def step() -> list[int]:
            for rid, _ in rows:
                cache.free(rid)
            return prefill_step(model, cache, rows).tolist()
        ms = dev.wall_ms(step, *limits)
        for rid, _ in rows:
            cache.free(rid)
        return [_row(spec, "prefill", b, n, 0, ms, "eager")]
    return Point("iteration", tier, f"{spec.name} prefill step b={b} n={n}", run)


def decode_point(spec: ModelSpec, b: int, ctx: int, pool: int, block: int, tier: int,
                 limits: tuple[float, int], resident: Resident) -> Point:
    def run(dev: Device) -> list[dict]:
        model, cache = resident.get(spec, dev, pool, block)
        nblk = -(-(ctx + 1) // block)
        free = cache.free_list
        if b * nblk > len(free):
            raise TooLarge(f"needs {b * nblk} KV blocks, the pool that fits holds {len(free)}")
        order = dev.randperm(len(free)).tolist()[: b * nblk]  # pages in random order
        picked = [free[i] for i in order]
        tables = [picked[i * nblk:(i + 1) * nblk] for i in range(b)]
        ids = dev.randint(spec.vocab, b).tolist()
        pos = [ctx - 1] * b
        slots = [t[(ctx - 1) // block] * block + (ctx - 1) % block for t in tables]
        lens = [ctx] * b
        d = dev.device

        def step() -> list[int]:
            return sampled_decode(model, cache, torch.tensor(ids, device=d),
                                  torch.tensor(pos, device=d), torch.tensor(slots, device=d),
                                  torch.tensor(tables, device=d),
                                  torch.tensor(lens, device=d, dtype=torch.int32),
                                  generator=dev.gen).tolist()
        out = [_row(spec, "decode", b, 1, ctx, dev.wall_ms(step, *limits), "eager")]
        if dev.cuda:
            graph = GraphDecode(model, cache, b, nblk)
            ms = dev.wall_ms(lambda: graph(ids, pos, slots, tables, lens), *limits)
            out.append(_row(spec, "decode", b, 1, ctx, ms, "graphs"))
            del graph
        return out
    return Point("iteration", tier, f"{spec.name} decode step b={b} ctx={ctx}", run)


def iteration_points(models: list[ModelSpec], g: dict, resident: Resident) -> list[Point]:
    """Prefill and decode steps over the grid, grouped by model (one model on the device,
    held by `resident`)."""
    pre, dec, block = g["iter_prefill"], g["iter_decode"], g["block"]
    pts: list[Point] = []
    for spec in models:
        rows = [(b, n) for b in every(pre["batch"]) for n in every(pre["new_tokens"])
                if b * n <= g["iter_max_tokens"]]
        pool = max([b * (c + block) for b in every(dec["batch"]) for c in every(dec["ctx"])]
                   + [b * (n + block) for b, n in rows])
        pts += [prefill_point(spec, b, n, pool, block,
                              max(tier_of(pre["batch"], b), tier_of(pre["new_tokens"], n)),
                              (g["iter_max_s"], g["iter_repeats"]), resident)
                for b, n in rows]
        pts += [decode_point(spec, b, c, pool, block,
                             max(tier_of(dec["batch"], b), tier_of(dec["ctx"], c)),
                             (g["iter_max_s"], g["iter_repeats"]), resident)
                for b in every(dec["batch"]) for c in every(dec["ctx"])]
    return pts
