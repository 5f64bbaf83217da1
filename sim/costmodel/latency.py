"""The latency of one iteration (a "step") from its batch.

GPU time of a step over T new tokens in S sequences is one lookup per operation of the
model's forward pass, read from its list of operations (`ModelSpec.ops`,
sim/costmodel/layer.py); for a Llama model of L layers:

    L x [ GEMM(qkv, T) + GEMM(o, T) + GEMM(gate_up, T) + GEMM(down, T)
          + 2 RMSNorm(T) + 2 residual add(T) + SiLU*mul(T) + rotary(T) + KV write(T)
          + attention ]
    + final RMSNorm(T) + embedding(T) + LM head(rows)

(a fused-kernel stack on a profile that timed unfused ones: 2 add+RMSNorm(T) kernels per
layer in place of the norms and adds, SiLU*mul one kernel, derived: sim/costmodel/fused.py)

and, on a `tensor`-way tensor-parallel replica, every GEMM and attention call at
its per-GPU shape (`ModelSpec.shard`) plus the collectives the list adds

    (2 L + 1) x all-reduce(T x hidden x 2 bytes)  + all-gather of the LM head's logits

(after attention's o and the MLP's down projection in every layer, and after the
vocabulary-parallel embedding; sim/costmodel/comm.py: measured table or α–β link model),
where attention is, per layer, the configured prefill kernel (flash or naive,
one call per sequence, each query attending over its cached context too) or one
batched decode kernel (paged, paged_gather or contiguous) over all sequences'
contexts, and the LM head runs on one row per sequence (k+1 rows per sequence
when verifying k draft tokens). Every kernel time comes from the GPU profile
(measured tables, interpolated or extrapolated, or analytic roofline).

Host overhead (a runtime profile's host and serial terms, combined with the GPU time):
sim/costmodel/hoststep.py.

`cuda-graph` has no host cost (kernels only, a lower bound for any stack).

Attention data parallelism and expert parallelism (`data`, `expert` > 1): what the busiest
rank runs, sim/costmodel/ranks.py.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from operator import itemgetter, mul

from sim.costmodel.bound import (
    Sized,
    bound_decode_attn,
    bound_elementwise,
    bound_gemm,
    bound_prefill_attn,
)
from sim.costmodel.decode_attn import (
    Q5,
    Q7,
    RUN5,
    RUN7,
    TABLED,
    DecodeAttnPricing,
    _ctx_keys,
    _quantize,
    _quantize_run,
)
from sim.costmodel.deepep import AllToAllSpec, DeepEP
from sim.costmodel.fused import derives_fused, stack_elementwise
from sim.costmodel.hoststep import HostPricing
from sim.costmodel.layer import (
    ModelOps,
    attended_keys,
    elementwise_calls,
    elementwise_calls_by_rows,
)
from sim.costmodel.models import ModelSpec
from sim.costmodel.moe import Routing
from sim.costmodel.profiles import DERIVED, GPUProfile
from sim.costmodel.ranks import _TAG_INDEX, TAGS, RankPricing
from sim.costmodel.runtime import RuntimeSpec


def _by_rows(p: GPUProfile, own: bool, lookup) -> Callable[[str, int], Sized]:
    """(kernel, width) -> its elementwise lookup by rows: bound to the profile's table where
    the step looks kernels up as measured (`own`), else the stack's derived `lookup`."""
    if own:
        return lambda kernel, width: bound_elementwise(p, kernel, width)
    return lambda kernel, width: lambda m: lookup(kernel, m, width)


def _at_least(tag: str, floor: str) -> str:
    """The less exact of two provenance tags."""
    return tag if _TAG_INDEX[tag] >= _TAG_INDEX[floor] else floor


class StepLatency(DecodeAttnPricing, RankPricing, HostPricing):
    """Seconds per step; lookups memoised, provenance counted per use. Shared by the
    replicas of a group: what a server has run before is its own, passed in as `seen`."""

    def __init__(
        self,
        model: ModelSpec,
        profile: GPUProfile,
        runtime: RuntimeSpec,
        prefill_impl: str = "flash",
        decode_impl: str = "paged",
        verify_impl: str = "paged_gather",
        tensor: int = 1,
        fp8_weights: bool = False,
        expert: int = 1,
        data: int = 1,
        network: tuple[float, float] | None = None,
        all_to_all: AllToAllSpec | None = None,
    ):
        """`model` is the whole model (with its dtype widths); each of the `tensor` GPUs
        runs `model.shard(tensor)`, the operations of `model.ops(tensor)`. `fp8_weights`:
        the ops marked fp8 (the projections) at the FP8 rate."""
        self.m, self.p, self.rt = model.shard(tensor, expert), profile, runtime
        self.model = model  # the whole model, as given (a step-time cache keys on it)
        self.prefill_impl, self.decode_impl = prefill_impl, decode_impl
        self.verify_impl = verify_impl
        self.tensor, self.fp8_weights = tensor, fp8_weights
        self.expert, self.data, self.network = expert, data, network
        self.a2a = (DeepEP(all_to_all, profile, expert, network)  # sim/costmodel/deepep.py
                    if all_to_all is not None and all_to_all.kernel == "deepep" else None)
        self.remote = runtime.remote_workers(tensor)  # workers the driver calls each step
        self._price_ops(model.ops(tensor, expert))
        self._memo: dict[tuple, list] = {}  # key -> [ms, breakdown per tag, uses(, s, kernel s)]
        self._parts: dict[tuple, list] = {}  # sub-results shared by memoised steps
        self._combines: dict[tuple, tuple[float, float]] = {}  # `_combined`'s (s, kernel s)
        self._hosts: dict[tuple, tuple] = {}  # `_combine`'s parts by the step's counts
        self.kernel_s = 0.0  # GPU kernel seconds of the step priced last (before jitter)

    def _price_ops(self, ops: ModelOps) -> None:
        """The lookups a step makes, read once from the pass's operations. A step sums
        them in this order (floating-point sums: a fixed order, so equal steps give equal
        bytes): the layer's GEMMs in the order they run; its norms and elementwise kernels,
        one lookup per kernel and width (ELEMENTWISE_ORDER); those before and after the
        layers; the collectives, one lookup per kind and size. The LM head and its gather
        run on their own rows (`_lm_parts`), attention per call (`*_attn_ms`)."""
        p = self.p
        self._gemms: list[tuple[Sized, int]] = []  # (lookup by rows, calls per step)
        self._grouped: list[tuple[tuple[int, ...], bool, int, Routing]] = []
        self._layer_elementwise: list[tuple[Sized, int, bool]] = []
        for block, times in ops.blocks():  # a MoE model's dense layers first
            lookup, layer = stack_elementwise(p, self.rt.elementwise, block)
            self._elementwise = _by_rows(p, not derives_fused(p, self.rt.elementwise), lookup)
            fp8 = self.fp8_weights
            self._gemms += [(self._gemm(op.shape, op.fp8 and fp8), times) for op in layer
                            if op.kind == "gemm"]
            fp8 = fp8 and not self.m.expert_dtype_bytes  # MXFP4 experts keep their own width
            self._grouped += [(op.shape, op.fp8 and fp8, times, op.routing) for op in layer
                              if op.kind == "grouped_gemm" and op.routing is not None]
            self._layer_elementwise += [(self._elementwise(k, w), c * times, d) for k, w, c, d
                                        in elementwise_calls_by_rows(layer, self.data > 1)]
        self._step_elementwise = [(self._elementwise(k, w), c)
                                  for k, w, c in elementwise_calls(ops.first + ops.last)]
        calls: dict[tuple[str, int, bool, bool], int] = {}
        for op, times in ops.each():
            if op.kind == "collective":
                key = (op.kernel, op.shape[0], op.per_sequence, op.dispatched and self.data > 1)
                calls[key] = calls.get(key, 0) + times
        self._collectives = [(k, b, c, d) for (k, b, per_seq, d), c in calls.items() if not per_seq]
        self._lm_collectives = [(k, b, c) for (k, b, per_seq, _), c in calls.items() if per_seq]
        self._lm_head = ops.find("lm_head")
        self._lm_gemm = self._gemm(self._lm_head.shape, self._lm_head.fp8 and self.fp8_weights)
        attention = ops.find("attention")
        self.heads, self.kv_heads, self.head_dim = attention.shape
        # decode and verify: latent attention's absorbed form where the op states one
        self.d_heads, self.d_kv_heads, self.d_head_dim = attention.decode_shape or attention.shape
        self.attn_calls = sum(times for op, times in ops.each() if op.kind == "attention")
        # (window, calls): full attention (0) and each sliding window's layers
        self.attn_windows = ops.attention_windows()
        width = self.m.expert_dtype_bytes  # weight-only quantised experts (MXFP4), or 0
        self._expert_width = width if width and width != self.m.weight_dtype_bytes else 0.0
        self._decode_attn = bound_decode_attn(p, self.decode_impl, self.d_heads,
                                              self.d_kv_heads, self.d_head_dim)
        self._prefill_attn = bound_prefill_attn(p, self.prefill_impl, self.heads,
                                                self.kv_heads, self.head_dim)

    def _gemm(self, shape: tuple[int, ...], fp8: bool) -> Sized:
        """The lookup of a GEMM of this `shape` (K, N) by its rows."""
        k, n = shape
        if fp8:
            return lambda m: self.p.gemm_fp8(m, k, n)
        return bound_gemm(self.p, k, n)

    # ---- pieces (GPU ms, memoised) ---------------------------------------------
    def _piece(self, key: tuple, compute) -> float:
        e = self._memo.get(key)
        if e is None:
            parts = compute()
            ms = 0.0
            br = [0.0] * len(TAGS)
            for t, tag in parts:
                ms += t
                br[_TAG_INDEX[tag]] += t
            e = self._memo[key] = [ms, br, 0]
        e[2] += 1
        return e[0]

    def _dense_parts(self, T: int) -> list[tuple[float, str]]:
        parts = self._parts.get(("dense", T))
        if parts is None:
            parts = self._parts[("dense", T)] = self._dense_lookup(T)
        return parts

    def _lm_parts(self, rows: int) -> list[tuple[float, str]]:
        """The LM head (bf16, vocabulary split across the GPUs) and the gather of its logits."""
        rows = self._rank(rows)
        parts = [self._lm_gemm(rows)]
        for kernel, nbytes, calls in self._lm_collectives:
            ms, tag = self._collective(kernel, rows * nbytes)
            parts.append((calls * ms, tag))
        return parts

    def dense_ms(self, tokens: int) -> float:
        return self._piece(("dense", tokens), lambda: self._dense_parts(tokens))

    def experts_ms(self, tokens: int) -> float:
        """GPU ms of the routed experts' grouped GEMMs in a step of `tokens` tokens (0 for a
        dense model): grows with the distinct experts the tokens hit (sim/costmodel/moe.py)."""
        return sum(ms for shape, fp8, times, routing in self._grouped
                   for ms, _ in self._grouped_parts(tokens, shape, fp8, times, routing))

    def mtp_ms(self, n: int, sum_ctx: int, max_ctx: int = 0) -> float:
        """GPU ms of one multi-token-prediction layer drafting a token for each of `n`
        sequences (DeepSeek-V3's MTP module): one average decoder layer of the target
        (everything but the LM head and attention over its layers, plus one layer's decode
        attention), the projection of [hidden; embedding] to hidden (2·hidden × hidden, at
        the bf16 rate) and the shared LM head. Derived from the target's lookups."""
        ctx_q, max_q = self._ctx_keys(n, sum_ctx, max_ctx)

        def compute():
            layers = self.m.layers
            parts = [(ms / layers, tag) for ms, tag in self._dense_parts(n)]
            parts += [(ms / layers, tag) for ms, tag in self._decode_attn_parts(n, ctx_q, max_q)]
            h = self.m.hidden
            parts.append(self.p.gemm(self._rank(n), 2 * h, h))
            return parts + self._lm_parts(n)
        return self._piece(("mtp", n, ctx_q, max_q), compute)

    def lm_head_ms(self, rows: int) -> float:
        return self._piece(("lm", rows), lambda: self._lm_parts(rows))

    def prefill_attn_ms(self, q_len: int, kv_len: int) -> float:
        def compute():
            ms, tag = self._prefill_attn(1, q_len, kv_len)
            return self._windowed_call(ms, tag, q_len, kv_len)

        return self._piece(("pa", q_len, kv_len), compute)

    def _windowed_call(self, ms: float, tag: str, q_len: int, kv_len: int
                       ) -> list[tuple[float, str]]:
        """A per-sequence attention call of `ms` over the whole context in every layer: a
        sliding-window layer's is that time × the share of query-key pairs its window keeps
        (`layer.attended_keys`; derived from the full call's lookup)."""
        parts = []
        for window, calls in self.attn_windows:
            if window and kv_len > window:
                share = attended_keys(q_len, kv_len, window) / attended_keys(q_len, kv_len)
                parts.append((calls * ms * share, _at_least(tag, DERIVED)))
            else:
                parts.append((calls * ms, tag))
        return parts

    def verify_attn_ms(self, q_len: int, kv_len: int) -> float:
        """Attention of `q_len` new tokens of one sequence over its `kv_len` cached tokens.

        `paged_gather` (the reference stack): gather the pages, then SDPA, one call per
        sequence; `flash`: a flash call with a KV prefix; `paged`: the decode kernel
        run once per query token.
        """
        kv_q = _quantize(kv_len, 7)

        def compute():
            if self.verify_impl == "flash":
                kv = max(kv_q, q_len)
                ms, tag = self.p.prefill_attn("flash", 1, q_len, kv,
                                              self.heads, self.kv_heads, self.head_dim)
                return self._windowed_call(ms, tag, q_len, kv)
            paged = self.verify_impl in ("paged", "paged_reference")
            impl = self.verify_impl if paged else "paged_gather"
            rows = q_len if paged else 1
            parts = []
            for window, calls in self.attn_windows:  # a sliding layer reads its window
                kv = min(kv_q, window) if window else kv_q
                ms, tag = self.p.decode_attn(impl, rows, rows * self._kv_ctx(kv), self.d_heads,
                                             self.d_kv_heads, self.d_head_dim)
                parts.append((calls * ms, self._kv_tag(tag)))
            return parts

        return self._piece(("va", q_len, kv_q), compute)

    # ---- steps (seconds) --------------------------------------------------------
    def _step(self, key: tuple, rows: int, attn, seqs: int) -> float:
        """Seconds of a whole decode-like step of `seqs` sequences, memoised by `key` (one
        dict hit when warm): the dense ops and the LM head on `rows` rows, then the parts
        `attn()` returns."""
        e = self._memo.get(key)
        if e is not None:
            e[2] += 1
            self.kernel_s = e[4]
            return e[3]
        return self._priced(key, rows, attn(), seqs)[3]

    def _priced(self, key: tuple, rows: int, attn: list[tuple[float, str]], seqs: int) -> list:
        """The memo entry of a step not priced before (`_step`), its first use counted."""
        ms, br = self._head(rows)
        br = br[:]
        for t, tag in attn:  # the sums _piece makes of all the parts, from the head's on
            ms += t
            br[_TAG_INDEX[tag]] += t
        e = self._memo[key] = [ms, br, 1]
        e.append(self._combine(ms, 0, 0, seqs, True))
        e.append(self.kernel_s)
        return e

    def _head(self, rows: int) -> tuple[float, list[float]]:
        """The running sums (ms, breakdown per tag) of a step's dense and LM-head parts on
        `rows` rows, in `_piece`'s order: shared by every step of that many rows, whatever
        its attention (a first step's pricing adds attention's few parts to them)."""
        head = self._parts.get(("head", rows))
        if head is None:
            ms = 0.0
            br = [0.0] * len(TAGS)
            for t, tag in self._dense_parts(rows) + self._lm_parts(rows):
                ms += t
                br[_TAG_INDEX[tag]] += t
            head = self._parts[("head", rows)] = (ms, br)
        return head

    def _warm_chunks(self, chunks: list[tuple[int, int]]) -> tuple[list, int] | None:
        """The memo entries of `chunks`' prefill attention, and their new tokens in all, where
        every one is memoised (one dict hit each; no use counted yet), else None."""
        memo = self._memo
        hits = []
        tokens = 0
        for q, cached in chunks:
            e = memo.get(("pa", q, q + cached))
            if e is None:
                return None
            hits.append(e)
            tokens += q
        return hits, tokens

    def prefill(self, chunks: list[tuple[int, int]], seen: set | None = None) -> float:
        """A step prefilling `chunks` of (new tokens, tokens already cached) per sequence;
        `seen`: the (new, cached) shapes this server has prefilled before (updated here)."""
        warm = self._warm_chunks(chunks) if self.data == 1 else None
        if warm is not None:  # each piece one dict hit, counted as `_piece` counts it
            memo, hits, tokens = self._memo, *warm
            dense, lm = memo.get(("dense", tokens)), memo.get(("lm", len(chunks)))
            if dense is not None and lm is not None:
                ms = 0.0  # the sums in `_per_sequence`'s and the cold path's order
                for e in hits:
                    ms += e[0]
                    e[2] += 1
                dense[2] += 1
                lm[2] += 1
                return self._combined(ms + (dense[0] + lm[0]), len(chunks),
                                      self._new_shapes(chunks, seen))
        tokens, gpu = self._per_sequence(chunks, self.prefill_attn_ms)
        gpu += self.dense_ms(tokens) + self.lm_head_ms(len(chunks))
        return self._combined(gpu, len(chunks), self._new_shapes(chunks, seen))

    def _per_sequence(self, rows: list[tuple[int, int]], attn) -> tuple[int, float]:
        """New tokens in all, and attention ms, of rows of (new tokens, cached tokens): their
        sum, or over D attention ranks the busiest's, max(sum / D, the longest call)."""
        tokens = 0
        ms = 0.0
        if self.data == 1:
            for q, cached in rows:
                tokens += q
                ms += attn(q, q + cached)
            return tokens, ms
        longest = 0.0
        for q, cached in rows:
            tokens += q
            a = attn(q, q + cached)
            ms += a
            longest = max(longest, a)
        return tokens, max(ms / self.data, longest)

    def decode(self, n: int, sum_ctx: int, max_ctx: int = 0) -> float:
        """A step decoding one token for each of `n` sequences attending over `sum_ctx`
        tokens in all (`max_ctx` the longest)."""
        return self.decode_span(n, sum_ctx, max_ctx)[0]

    def decode_span(self, n: int, sum_ctx: int,
                    max_ctx: int = 0) -> tuple[float, float, list, int]:
        """`decode`, and what the steps after it may reuse: (seconds, kernel seconds, the
        memo entry, steps), where the `steps` steps from this one on, each a token longer
        per row (`sum_ctx` + n·i, `max_ctx` + i), have this step's key, so its price (this
        lookup counts one use of the entry; a caller reusing the price for the steps after
        it adds their uses to the entry's count, `entry[2]`, itself)."""
        # `_quantize_run(sum_ctx // n, 7)` and `_quantize_run(max_ctx, 5)`, read from their
        # tables below TABLED: a run of decode steps prices itself here once per `steps`
        # steps (the same integers; tests/test_decode_span.py holds this to `_quantize_run`)
        ctx = sum_ctx // n  # one more each step
        ctx_q, steps = (Q7[ctx], RUN7[ctx]) if ctx < TABLED else _quantize_run(ctx, 7)
        if n == 1:
            max_q = ctx_q
        else:
            max_q, more = (Q5[max_ctx], RUN5[max_ctx]) if max_ctx < TABLED else _quantize_run(max_ctx, 5)
            if max_q < ctx_q:
                max_q = ctx_q
            if max_q > ctx_q * n:
                max_q = ctx_q * n
            if more < steps:
                steps = more
        key = ("decode", n, ctx_q, max_q)
        e = self._memo.get(key)
        if e is not None:
            e[2] += 1
            self.kernel_s = e[4]
            return e[3], e[4], e, steps
        e = self._priced(key, n, self._decode_attn_parts(n, ctx_q, max_q), n)
        return e[3], e[4], e, steps

    def mixed(self, n: int, sum_ctx: int, max_ctx: int, chunks: list[tuple[int, int]],
              seen: set | None = None) -> float:
        """A chunked-prefill step: `n` decodes (over `sum_ctx` tokens, longest `max_ctx`)
        plus prefill chunks of (new tokens, tokens already computed) per sequence."""
        if not chunks:
            return self.decode(n, sum_ctx, max_ctx)
        if not n:
            return self.prefill(chunks, seen)
        warm = self._warm_chunks(chunks) if self.data == 1 else None
        if warm is not None:  # each piece one dict hit, counted as `_piece` counts it
            memo, hits, tokens = self._memo, *warm
            ctx_q, max_q = _ctx_keys(n, sum_ctx, max_ctx)
            da = memo.get(("da", n, ctx_q, max_q))
            dense, lm = memo.get(("dense", n + tokens)), memo.get(("lm", n + len(chunks)))
            if da is not None and dense is not None and lm is not None:
                gpu = 0.0  # the sums in `_per_sequence`'s and the cold path's order
                for e in hits:
                    gpu += e[0]
                    e[2] += 1
                da[2] += 1
                dense[2] += 1
                lm[2] += 1
                gpu += da[0]
                gpu += dense[0] + lm[0]
                return self._combine(gpu, len(chunks), 0, n, True,
                                     self._new_shapes(chunks, seen))
        tokens, gpu = self._per_sequence(chunks, self.prefill_attn_ms)
        gpu += self.decode_attn_ms(n, sum_ctx, max_ctx)
        gpu += self.dense_ms(n + tokens) + self.lm_head_ms(n + len(chunks))
        return self._combine(gpu, prefill_seqs=len(chunks), decode_seqs=n, decode=True,
                             new_shapes=self._new_shapes(chunks, seen))

    def mixed_one(self, n: int, sum_ctx: int, max_ctx: int, q: int,
                  seen: set | None = None) -> float:
        """`mixed(n, sum_ctx, max_ctx, [(q, 0)], seen)`: `n` decodes and one request's whole
        prefill of `q` tokens (an arrival to a decoding replica), without the chunk lists
        where every piece is memoised: the same lookups, use counts, sums and seconds."""
        memo = self._memo
        if n and self.data == 1 and (e := memo.get(("pa", q, q))) is not None:
            ctx_q, max_q = _ctx_keys(n, sum_ctx, max_ctx)
            da = memo.get(("da", n, ctx_q, max_q))
            dense, lm = memo.get(("dense", n + q)), memo.get(("lm", n + 1))
            if da is not None and dense is not None and lm is not None:
                e[2] += 1
                da[2] += 1
                dense[2] += 1
                lm[2] += 1
                new = 0  # _new_shapes([(q, 0)], seen)
                if seen is not None and self.rt.serial_ms_per_new_prefill_shape and (
                        (q, 0) not in seen):
                    seen.add((q, 0))
                    new = 1
                # (0.0 + the chunk's) + the decodes' attention, + (dense + LM head): mixed's sums
                return self._combine(e[0] + da[0] + (dense[0] + lm[0]), 1, 0, n, True, new)
        return self.mixed(n, sum_ctx, max_ctx, [(q, 0)], seen)

    def verify(self, rows: list[tuple[int, int]]) -> float:
        """A step scoring `q` tokens per sequence over its cached context: rows of (q, cached)."""
        tokens, gpu = self._per_sequence(rows, self.verify_attn_ms)
        gpu += self.dense_ms(tokens) + self.lm_head_ms(tokens)
        return self._combine(gpu, verify_seqs=len(rows))

    def verify_batch(self, n: int, q: int, sum_ctx: int, max_ctx: int,
                     rows: list[tuple[int, int]]) -> float:
        """Verify `q` tokens for each of `n` sequences. With `paged_gather` or `flash`
        attention runs per sequence (`rows` of (q, cached)); otherwise the decode kernel
        runs once per query row (each row reads its sequence's whole context)."""
        if self.verify_impl in ("paged_gather", "flash"):
            return self.verify(rows)
        ctx_q, max_q = self._ctx_keys(n, sum_ctx, max_ctx)
        return self._step(("verify", n, q, ctx_q, max_q), n * q,
                          lambda: self._verify_decode_parts(n, q, ctx_q, max_q), n)

    def gpu_ms(self, kind: str, n: int, new_tokens: int, ctx: int) -> float:
        """Kernel-only time of a uniform step (for error tables against measured grids)."""
        if kind == "verify":
            return (self.dense_ms(n * new_tokens) + self.lm_head_ms(n * new_tokens)
                    + n * self.verify_attn_ms(new_tokens, ctx + new_tokens))
        if kind == "decode":
            return self.dense_ms(n) + self.lm_head_ms(n) + self.decode_attn_ms(n, n * ctx)
        return (
            self.dense_ms(n * new_tokens)
            + self.lm_head_ms(n)
            + n * self.prefill_attn_ms(new_tokens, new_tokens + ctx)
        )

    # ---- reporting ----------------------------------------------------------------
    def provenance(self) -> dict[str, float]:
        """Share of simulated GPU time that came from each kind of lookup."""
        tot = self.provenance_seconds()
        s = sum(tot.values()) or 1.0
        return {t: v / s for t, v in tot.items()}

    def provenance_seconds(self) -> dict[str, float]:
        """Simulated GPU milliseconds that came from each kind of lookup."""
        # math.fsum: exactly rounded, so the same whatever order the memo was filled in
        # (a parallel fleet merges its workers' memos: sim/engine/parallel.py)
        # (C loops over the entries, not a generator: faster, the same products)
        entries = list(self._memo.values())
        breakdowns, uses = [e[1] for e in entries], [e[2] for e in entries]
        tot = [math.fsum(map(mul, map(itemgetter(i), breakdowns), uses))
               for i in range(len(TAGS))]
        return dict(zip(TAGS, tot, strict=True))
