"""A reference serving engine in plain PyTorch: the real loop the simulator is checked against.

A Llama-architecture model is built from a `models/` spec with random weights (no
downloads). Keys and values live in a paged cache: one pool of fixed-size blocks
per layer (`k[layer, block, offset, kv_head, d]`) and a block table per sequence.
Block 0 is scratch: rows that only pad a static batch write there.

Scheduling is the simulator's, literally: the loop asks the same policy
(`sim.policies.scheduler.POLICIES`) for a `StepPlan` from the same `ReplicaState`, and
applies it with the simulator's own accounting verbs (`sim.engine.replica.Replica`:
admission, KV counts, preemption, finishing, inter-token gaps). The only
differences are that each plan runs on the device and that the clock is the wall
clock: a request joins the queue once its arrival time has passed, and a step
lasts as long as it really takes (scheduling included, from the top of the loop to
the tokens being back on the host).

* prefill: one call per step; the step's tokens go through the dense layers
  together, attention runs per sequence (`ops.prefill_flash` or `prefill_naive`)
  and writes its keys and values into the sequence's blocks;
* decode: one token per running sequence, batched, attending over the pages
  (`ops.paged`: the Triton kernel on CUDA, portable PyTorch elsewhere; or
  `ops.paged_gather`);
* the LM head runs on each sequence's last row; tokens are sampled (softmax with
  an exponential race) but the trace's output length decides when a request ends.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F

from sim.calibrate import ops
from sim.calibrate.device import Device
from sim.config.scenario import Scenario, replace_scenario
from sim.costmodel.models import ModelSpec
from sim.costmodel.runtime import RuntimeSpec
from sim.engine.build import ReplicaConfig, build_replica, replica_configs
from sim.engine.replica import Replica, ReplicaResult, RunResult
from sim.io.specload import SpecError
from sim.policies.batch import Seq
from sim.policies.plan import StepKind
from sim.policies.scheduler import ContinuousPolicy, StaticPolicy
from sim.workload.requests import Workload

POLICIES = {"continuous": ContinuousPolicy, "static": StaticPolicy}  # the ones it implements


class Llama:
    """Weights of a Llama-style decoder, random normal with std 1/sqrt(fan-in)."""

    def __init__(self, spec: ModelSpec, dev: Device):
        self.spec, self.dev = spec, dev
        m = spec

        shapes = m.gemm_shapes()  # (K, N) of each GEMM, from the model's list of operations

        def w(gemm: str) -> torch.Tensor:
            k, n = shapes[gemm]
            return dev.randn(n, k, scale=k ** -0.5)

        def norm() -> torch.Tensor:
            return 1 + dev.randn(m.hidden, scale=0.02)

        self.embed = dev.randn(m.vocab, m.hidden)
        self.layers = [dict(
            attn_norm=norm(), wqkv=w("qkv"), wo=w("o"), ffn_norm=norm(), w13=w("gate_up"),
            w2=w("down"),
        ) for _ in range(m.layers)]
        self.norm = norm()
        self.lm_head = self.embed if m.tied_embeddings else w("lm_head")
        self.rope = ops.rope_tables(m.max_len, m.head_dim, dev.device)

    def mlp(self, x: torch.Tensor, lw: dict) -> torch.Tensor:
        h = ops.rms_norm(x, lw["ffn_norm"])
        up = F.linear(h, lw["w13"])
        return F.linear(ops.silu_mul(up) if self.spec.gated_mlp else F.gelu(up), lw["w2"])

    def qkv(self, x: torch.Tensor, lw: dict, positions: torch.Tensor):
        m = self.spec
        h = ops.rms_norm(x, lw["attn_norm"])
        q, k, v = F.linear(h, lw["wqkv"]).split([m.q_dim, m.kv_dim, m.kv_dim], dim=-1)
        cs = self.rope[positions]
        q = ops.rotary(q.view(-1, m.heads, m.head_dim), cs)
        k = ops.rotary(k.view(-1, m.kv_heads, m.head_dim), cs)
        return q, k, v.reshape(-1, m.kv_heads, m.head_dim)

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(ops.rms_norm(x, self.norm), self.lm_head)


class PagedCache:
    """Per-layer block pools and a block table per sequence; block 0 is scratch."""

    def __init__(self, spec: ModelSpec, num_blocks: int, block: int, dev: Device):
        shape = (spec.layers, num_blocks + 1, block, spec.kv_heads, spec.head_dim)
        dev.check_fits(2 * np.prod(shape) * torch.finfo(dev.dtype).bits / 8, "the KV cache")
        self.k, self.v = dev.randn(*shape), dev.randn(*shape)
        self.block = block
        self.free_list = list(range(num_blocks, 0, -1))
        self.tables: dict[int, list[int]] = {}

    def ensure(self, rid: int, tokens: int) -> list[int]:
        """Grow `rid`'s table to hold `tokens` tokens; returns the table."""
        table = self.tables.setdefault(rid, [])
        while len(table) * self.block < tokens:
            if not self.free_list:
                raise RuntimeError("reference KV pool exhausted (scheduler accounting bug)")
            table.append(self.free_list.pop())
        return table

    def free(self, rid: int) -> list[int]:
        table = self.tables.pop(rid, [])
        self.free_list.extend(reversed(table))
        return table

    def slot(self, table: list[int], pos: int) -> int:
        return table[pos // self.block] * self.block + pos % self.block

    def slots(self, table: list[int], n: int) -> torch.Tensor:
        """The flat slots of positions 0..n-1 (on the host)."""
        blocks = torch.tensor(table[: -(-n // self.block)])
        offsets = torch.arange(self.block)
        return (blocks[:, None] * self.block + offsets[None, :]).flatten()[:n]


def prefill_step(model: Llama, cache: PagedCache, rows: list[tuple[int, list[int]]],
                 attn: Callable = ops.prefill_flash) -> torch.Tensor:
    """Prefill `rows` of (request id, token ids) from position 0; one sampled token each."""
    m, dev = model.spec, model.dev.device
    lens = [len(t) for _, t in rows]
    ids = torch.tensor([t for _, toks in rows for t in toks], device=dev)
    pos = torch.cat([torch.arange(n) for n in lens]).to(dev)
    slots = torch.cat([cache.slots(cache.ensure(rid, n), n) for (rid, _), n in zip(
        rows, lens, strict=True)]).to(dev)
    x = model.embed[ids]
    for li, lw in enumerate(model.layers):
        q, k, v = model.qkv(x, lw, pos)
        ops.kv_write(cache.k[li], cache.v[li], k, v, slots)
        outs, start = [], 0
        for n in lens:
            sl = slice(start, start + n)
            o = attn(q[sl].transpose(0, 1)[None], k[sl].transpose(0, 1)[None],
                     v[sl].transpose(0, 1)[None])
            outs.append(o[0].transpose(0, 1).reshape(n, m.q_dim))
            start += n
        x = x + F.linear(torch.cat(outs), lw["wo"])
        x = x + model.mlp(x, lw)
    last = torch.tensor(np.cumsum(lens) - 1, device=dev)
    return ops.sample(model.logits(x[last]), model.dev.gen)


def decode_step(model: Llama, cache: PagedCache, ids: torch.Tensor, pos: torch.Tensor,
                slots: torch.Tensor, tables: torch.Tensor, lens: torch.Tensor,
                attn: Callable = ops.paged) -> torch.Tensor:
    """One sampled token for each row: ids, pos, slots, lens [B], tables [B, max_blocks]."""
    logits = decode_logits(model, cache, ids, pos, slots, tables, lens, attn)
    return ops.sample(logits, model.dev.gen)


def decode_logits(model: Llama, cache: PagedCache, ids: torch.Tensor, pos: torch.Tensor,
                  slots: torch.Tensor, tables: torch.Tensor, lens: torch.Tensor,
                  attn: Callable = ops.paged) -> torch.Tensor:
    """`decode_step` up to the LM head's logits [B, vocab] (writes the new K, V)."""
    m = model.spec
    x = model.embed[ids]
    for li, lw in enumerate(model.layers):
        q, k, v = model.qkv(x, lw, pos)
        ops.kv_write(cache.k[li], cache.v[li], k, v, slots)
        o = attn(q, cache.k[li], cache.v[li], tables, lens)
        x = x + F.linear(o.reshape(-1, m.q_dim), lw["wo"])
        x = x + model.mlp(x, lw)
    return model.logits(x)


@dataclass
class StepDetail:
    """What each real step computed, so the step model can be replayed on it."""

    kind: list[str] = field(default_factory=list)
    prefill_lens: list[list[int]] = field(default_factory=list)  # [] for decode steps
    sum_ctx: list[int] = field(default_factory=list)  # decode: the simulator's sum_ctx, max_ctx
    max_ctx: list[int] = field(default_factory=list)

    def add(self, kind: str, lens: list[int], sum_ctx: int, max_ctx: int) -> None:
        self.kind.append(kind)
        self.prefill_lens.append(lens)
        self.sum_ctx.append(sum_ctx)
        self.max_ctx.append(max_ctx)


def check_supported(sc: Scenario) -> None:
    """A one-line SpecError for what the reference engine does not implement."""
    where = sc.file or None
    if sc.kv.manager != "paged":
        raise SpecError(where, "kv.manager", f"'{sc.kv.manager}': the reference engine "
                        "keeps a paged cache (allowed: paged)")
    if sc.scheduler.policy not in POLICIES:
        raise SpecError(where, "scheduler.policy", f"'{sc.scheduler.policy}' is not implemented "
                        f"by the reference engine (allowed: {', '.join(POLICIES)})")
    if sc.scheduler.preemption != "recompute":
        raise SpecError(where, "scheduler.preemption", "'swap' is not implemented by the "
                        "reference engine (allowed: recompute)")
    if sc.workload.clients is not None:
        raise SpecError(where, "workload.clients", "closed-loop clients are not implemented by "
                        "the reference engine (allowed: open-loop arrivals)")
    if getattr(sc.kv, "prefix_caching", False):
        raise SpecError(where, "kv.prefix_caching", "not implemented by the reference engine "
                        "(allowed: false)")
    if sc.speculative.method != "none":
        raise SpecError(where, "speculative.method", f"'{sc.speculative.method}' is not "
                        "implemented by the reference engine (allowed: none)")
    if sc.elementwise == "fused":
        raise SpecError(where, "elementwise", "'fused': the reference engine runs RMSNorm, "
                        "SiLU*mul and adds as PyTorch ops (allowed: unfused, or leave it out)")
    if sc.decode_attention not in ops.DECODE_PAGED:
        raise SpecError(where, "attention.decode", f"{sc.decode_attention!r} (allowed: "
                        f"{', '.join(ops.DECODE_PAGED)})")


def _wait_until(clock: Callable[[], float], t: float) -> None:
    """Poll the clock until `t` (the next arrival or policy wake-up). Not a sleep: on a
    virtual machine the first step after a sleep runs 1-3 ms slower (the thread wakes
    late, caches and clocks are cold); a polling loop keeps the engine ready, as
    high-throughput servers' busy loops do, so the replay measures steps, not wake-ups."""
    while clock() < t:
        pass


@dataclass
class _Run:
    """One replay's state: the simulator's replica, the requests and their token ids."""

    rep: Replica
    seqs: list[Seq]
    tokens: dict[int, list[int]]  # prompt + generated token ids per request
    static: bool
    t0: float
    clock_fn: Callable[[], float] = time.perf_counter
    next: int = 0  # the next request to arrive
    padding: list[tuple[int, list[int], int]] = field(default_factory=list)  # static rows
    detail: StepDetail = field(default_factory=StepDetail)

    def clock(self) -> float:
        return self.clock_fn() - self.t0


class _NoLatency:
    """The simulator's accounting asks for a step's latency up front; the real step is timed."""

    kernel_s = math.nan  # no modelled kernel time: the real step is measured

    def prefill(self, chunks, seen=None) -> float:
        return 0.0

    def decode(self, n, sum_ctx, max_ctx=0) -> float:
        return 0.0


def reference_config(sc: Scenario, kv_tokens: int, max_model_len: int) -> ReplicaConfig:
    """The replica the reference engine schedules with, built as every replica is
    (`sim/engine/build.py`), with the engine's real KV pool and context window; its step
    latency is never modelled (`_NoLatency`: the real step is timed)."""
    sc = replace_scenario(sc, kv=dataclasses.replace(sc.kv, max_model_len=max_model_len))
    (cfg,) = replica_configs(sc, runtime=RuntimeSpec(name="reference"), kv_tokens=kv_tokens)
    return cfg


class ReferenceEngine:
    """Replays a workload through the model in real time, with the simulator's policy
    (wall time on a GPU; on the CPU the engine thread's CPU time, which the idle polling
    loop keeps advancing, so a shared machine's steal does not stretch the replay).

    The plan is applied by `sim.engine.replica.Replica.start` and `.finish`, the same two calls
    the simulator's `replica()` process makes; only the step itself and the clock differ.
    """

    def __init__(self, sc: Scenario, model: Llama, kv_tokens: int, max_model_len: int):
        check_supported(sc)
        self.sc, self.model, self.dev = sc, model, model.dev
        self.kv_tokens, self.max_len = kv_tokens, max_model_len
        self.prefill_attn = {"flash": ops.prefill_flash, "naive": ops.prefill_naive}[
            sc.attention.prefill]
        self.decode_attn = ops.DECODE_PAGED[sc.decode_attention]
        rows = sc.scheduler.max_num_seqs if sc.scheduler.policy == "continuous" \
            else sc.scheduler.max_batch_size
        self.cache = PagedCache(model.spec, kv_tokens // sc.kv.block_size + rows,
                                sc.kv.block_size, model.dev)
        self.config = reference_config(sc, kv_tokens, max_model_len)

    def run(self, wl: Workload, seed: int = 0) -> tuple[RunResult, StepDetail]:
        """Serve every request of `wl`; returns the simulator's RunResult and step details."""
        r = self._start(wl, seed)
        st, rep, seqs = r.rep.st, r.rep, r.seqs
        while rep.done < len(seqs):
            now = r.clock()
            while r.next < len(seqs) and seqs[r.next].arrival <= now:
                st.waiting.append(seqs[r.next])
                r.next += 1
            plan = rep.policy.schedule(st, now)
            step = rep.start(plan, now)  # rejections, preemption, admissions, KV: as simulated
            for v in plan.preempt:
                self.cache.free(v.rid)
            if step is not None:
                if plan.kind is StepKind.DECODE:
                    self._decode_plan(r)
                else:
                    self._prefill_plan(r, plan)
                for s in rep.finish(step, now, r.clock()):
                    table = self.cache.free(s.rid)
                    if r.static and plan.kind is StepKind.DECODE:  # padding until the batch ends
                        r.padding.append((s.rid, table, len(r.tokens[s.rid])))
            elif plan.kind is StepKind.IDLE:
                wake = seqs[r.next].arrival if r.next < len(seqs) else float("inf")
                wake = min(wake, plan.wake_at if plan.wake_at is not None else wake)
                if wake == float("inf"):
                    break  # nothing will arrive or wake the policy: accounted for below
                _wait_until(r.clock, wake)
            if r.static and len(st.batch) == 0 and not st.batch.n_compute:
                r.padding.clear()  # the static batch ended: its padding rows are gone
            rep.end_of_step()
        if rep.done != len(seqs):
            raise RuntimeError(f"reference run ended with {len(seqs) - rep.done} requests "
                               "unaccounted for")
        rep.rec.check_limits(rep.name, rep.policy.max_seqs, rep.policy.step_tokens)
        return (RunResult(seqs, [ReplicaResult.of(rep)], rep.rec.gaps, rep.rec.weights, r.clock()),
                r.detail)

    def _start(self, wl: Workload, seed: int) -> _Run:
        rng = np.random.default_rng(seed)
        rep = build_replica(self.config, rng, latency=_NoLatency())
        static = rep.holds_batch
        seqs = [Seq(i, float(a), int(p), int(o), int(mx)) for i, (a, p, o, mx) in enumerate(
            zip(wl.arrival_s, wl.prompt_tokens, wl.output_tokens, wl.max_tokens, strict=True))]
        tokens = {s.rid: rng.integers(0, self.model.spec.vocab, s.prompt).tolist() for s in seqs}
        for rid in list(self.cache.tables):
            self.cache.free(rid)
        clock = self.dev.clock  # wall time on a GPU, the thread's CPU time on the CPU
        return _Run(rep, seqs, tokens, static, clock(), clock)

    def _decode_plan(self, r: _Run) -> None:
        """Compute the decode step `Replica.start` set up: one token per live row."""
        batch = r.rep.st.batch
        sum_ctx, max_ctx = batch.sum_ctx(), batch.max_ctx()
        live = list(batch.members)
        new = self._decode(live, r.padding, r.tokens)
        for s, tok in zip(live, new, strict=True):
            r.tokens[s.rid].append(tok)
        r.detail.add("decode", [], sum_ctx, max_ctx)

    def _prefill_plan(self, r: _Run, plan) -> None:
        """Compute the prefill step `Replica.start` admitted: a first token per request."""
        rows = [(s.rid, r.tokens[s.rid][:s.tokens_to_prefill]) for s in plan.prefill]
        new = prefill_step(self.model, self.cache, rows, self.prefill_attn).tolist()
        for s, tok in zip(plan.prefill, new, strict=True):
            r.tokens[s.rid].append(tok)
        r.detail.add("prefill", [len(toks) for _, toks in rows], 0, 0)

    def _decode(self, live: list[Seq], padding: list[tuple[int, list[int], int]],
                tokens: dict[int, list[int]]) -> list[int]:
        """Run one decode step for the live rows (and a static batch's padding rows)."""
        cache, dev = self.cache, self.dev.device
        ids, pos, slots, tables, lens = [], [], [], [], []
        for s in live:
            toks = tokens[s.rid]
            p = len(toks) - 1
            table = cache.ensure(s.rid, p + 1)
            ids.append(toks[-1])
            pos.append(p)
            slots.append(cache.slot(table, p))
            tables.append(table)
            lens.append(p + 1)
        for rid, table, length in padding:  # finished rows computed as padding; write to scratch
            ids.append(tokens[rid][-1])
            pos.append(length - 1)
            slots.append(0)
            tables.append(table)
            lens.append(length)
        width = max(len(t) for t in tables)
        grid = [t + [0] * (width - len(t)) for t in tables]
        out = decode_step(
            self.model, cache, torch.tensor(ids, device=dev), torch.tensor(pos, device=dev),
            torch.tensor(slots, device=dev), torch.tensor(grid, device=dev),
            torch.tensor(lens, device=dev, dtype=torch.int32), self.decode_attn)
        return out.tolist()[: len(live)]
