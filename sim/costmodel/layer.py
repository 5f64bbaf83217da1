"""A model's forward pass as a list of operations: the one place its layer is described.

`decoder_layer(m)` lists one Llama-style layer (dense, grouped-query attention) in the
order it runs; `model_ops(model, tensor)` adds what runs before the layers (the
embedding) and after them (final norm, LM head) on one GPU of a `tensor`-way
tensor-parallel group, with the collectives the splits need. Everything else reads
this list:

* sizes (`sim/costmodel/models.py`): parameters and weight bytes (each op's `params`),
  KV bytes per token (`cache`), FLOPs and GEMM shapes (the `gemm` and `lm_head` ops);
* one step's GPU time (`sim/costmodel/latency.py`): a lookup per GEMM, per elementwise
  kernel and width, per attention call, per collective; fused stacks fuse each residual
  add into the norm after it (`fuse_add_norms`, chosen by `sim/costmodel/fused.py`);
* tensor parallelism: each op's `split` says how its weight divides (column: N; row: K;
  vocab: the vocabulary's rows, rounded up; replicated: whole on every GPU); the widths
  come from `ModelSpec.shard` and every row-split op and the vocabulary-split embedding
  are followed by an all-reduce of their output, the LM head by an all-gather;
* FP8 weights: ops with `fp8` run at the FP8 rate (the projections; the LM head stays
  bf16); every weight counts at the model's weight width;
* memory (`sim/engine/memory.py`): weights, and the activations of the largest step
  (each op's `activation` bytes per row, one layer's at a time);
* calibration (`sim/calibrate/bench.py`): the GEMM shapes, attention head
  configurations and elementwise widths to measure.

A row is a token of the step, or a sequence for ops with `per_sequence` (the LM head
and its gather run on one row per sequence). Activations are bf16 whatever the weights.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal, Protocol

from sim.costmodel.moe import Routing, local_routing

Kind = Literal["gemm", "grouped_gemm", "attention", "norm", "elementwise", "collective",
               "embedding", "lm_head"]
Split = Literal["column", "row", "replicated", "vocab"]

BF16 = 2  # bytes per activation element
LOGIT_BYTES = 4  # fp32 logits
# Elementwise kernels in the order their lookups are summed (a step's time sums its
# parts in a fixed order, so equal inputs give equal bytes out): the kernel table's
# order, with the derived fused add+RMSNorm beside RMSNorm
ELEMENTWISE_ORDER = ("rmsnorm", "add_rmsnorm", "residual_add", "silu_mul", "rotary",
                     "kv_write", "embedding")


class Architecture(Protocol):
    """What the layer builders read of a model (`sim.costmodel.models.ModelSpec` is one)."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    gated_mlp: bool
    vocab: int
    tied_embeddings: bool
    qkv_bias: bool
    num_experts: int
    num_experts_per_tok: int
    moe_intermediate_size: int
    n_shared_experts: int
    first_k_dense_replace: int
    router_zipf_s: float
    expert_load: tuple[float, ...] | None
    kv_lora_rank: int
    q_lora_rank: int
    qk_rope_head_dim: int
    qk_nope_head_dim: int
    v_head_dim: int
    attention_sinks: bool

    @property
    def q_dim(self) -> int: ...

    @property
    def kv_dim(self) -> int: ...

    def shard(self, tensor: int, expert: int = 1) -> Architecture: ...

    def layer_windows(self) -> tuple[int, ...]: ...


@dataclass(frozen=True)
class Op:
    """One operation of the forward pass, at the widths of one GPU.

    `shape` is per row, so the op's shape in a step of R rows is `at(R)`: a GEMM
    (K, N) for F.linear(x[R, K], W[N, K]); a norm, elementwise kernel or embedding
    (width,); attention (query heads, KV heads, head_dim); a collective (bytes,).
    """

    name: str  # unique within its list
    kind: Kind
    kernel: str  # the lookup that prices it: gemm, attention, an elementwise kernel, a collective
    shape: tuple[int, ...]
    split: Split = "replicated"  # how tensor parallelism divides its weight (and work)
    params: int = 0  # weights it holds (biases and norm scales included)
    activation: int = 0  # bytes per row it adds to the step's activation footprint
    cache: int = 0  # KV-cache elements it stores per token
    fp8: bool = False  # runs at the FP8 rate when the weights are fp8
    per_sequence: bool = False  # one row per sequence (else one per token)
    # grouped_gemm: the experts' GEMMs, each expert's rows from the routing (see moe.py)
    routing: Routing | None = None
    # a row-split op whose partial sums join the next row-split op's before one all-reduce
    # (the shared experts' down projection, summed with the routed experts')
    reduce_with_next: bool = False
    # attention: the (query heads, KV heads, head_dim) decode and verify run at, when not
    # `shape` (latent attention's absorbed form: every query head over one latent KV head)
    decode_shape: tuple[int, ...] | None = None
    # runs on the rows dispatched to this GPU's experts from every attention data-parallel
    # rank (the replica's tokens), not on its own rank's share (sim/costmodel/parallel.py)
    dispatched: bool = False

    def at(self, rows: int) -> tuple[int, ...]:
        """The op's shape in a step of `rows` rows."""
        return (rows, *self.shape)

    def weight_bytes(self, width: float) -> float:
        """Bytes of its weights at `width` bytes each."""
        return self.params * width


def decoder_layer(m: Architecture) -> tuple[Op, ...]:
    """One Llama-style layer in the order it runs: RMSNorm, fused q/k/v projection (with
    biases when `qkv_bias`), rotary on q and k, the KV-cache write, attention (with a sink
    logit per query head when `attention_sinks`: its parameters, not its negligible compute),
    o, residual add, RMSNorm, fused gate/up projection, SiLU·mul, down, residual add.

    Activation footprint: the norm's output, q/k/v and the MLP's widest intermediate
    (gate and up; a plain MLP's up and its activation), all bf16; the other outputs
    reuse those buffers. A plain (ungated) MLP's activation is priced as SiLU·mul."""
    h, q, kv, f = m.hidden, m.q_dim, m.kv_dim, m.ffn
    qkv = q + 2 * kv
    up = (2 if m.gated_mlp else 1) * f
    return (
        Op("input_norm", "norm", "rmsnorm", (h,), params=h, activation=h * BF16),
        Op("qkv", "gemm", "gemm", (h, qkv), "column", params=h * qkv + (qkv if m.qkv_bias else 0),
           activation=qkv * BF16, fp8=True),
        Op("rotary", "elementwise", "rotary", (q + kv,), "column"),
        Op("kv_write", "elementwise", "kv_write", (2 * kv,), "column", cache=2 * kv),
        Op("attention", "attention", "attention", (m.heads, m.kv_heads, m.head_dim), "column",
           params=m.heads if m.attention_sinks else 0),
        Op("o", "gemm", "gemm", (q, h), "row", params=q * h, fp8=True),
        Op("attention_residual", "elementwise", "residual_add", (h,)),
        Op("mlp_norm", "norm", "rmsnorm", (h,), params=h),
        Op("gate_up", "gemm", "gemm", (h, up), "column", params=h * up,
           activation=2 * f * BF16, fp8=True),
        Op("activation", "elementwise", "silu_mul", (f,), "column"),
        Op("down", "gemm", "gemm", (f, h), "row", params=f * h, fp8=True),
        Op("mlp_residual", "elementwise", "residual_add", (h,)),
    )


def attention_block(m: Architecture) -> tuple[Op, ...]:
    """The layer's attention, up to its residual add: `decoder_layer`'s, or latent
    attention's when the model has `kv_lora_rank`."""
    return mla_attention(m) if m.kv_lora_rank else decoder_layer(m)[:7]


def mla_attention(m: Architecture) -> tuple[Op, ...]:
    """DeepSeek's multi-head latent attention (MLA), up to its residual add: RMSNorm; q
    down-projection (q_lora_rank; replicated) and its RMSNorm, q up-projection to
    heads × (nope + rope) (column); the joint KV down-projection to the latent
    (kv_lora_rank) and the shared rope key (qk_rope_head_dim), replicated, and the latent's
    RMSNorm; rotary; the cache write of latent + rope key (kv_lora_rank + qk_rope_head_dim
    elements per token and layer, the same on every GPU of a tensor-parallel group); the KV
    up-projection latent → heads × (nope + v) (column); attention; o (row).

    Prefill expands the latent (the KV up-projection on the step's rows) and runs
    multi-head attention at head_dim nope + rope; decode and verify run the absorbed form
    (`decode_shape`): every query head over one KV head of latent + rope, the up-projection's
    weights applied to q and to the output instead (equal FLOPs and weight bytes per row:
    the same GEMM). The decode kernel's table counts K and V apart: reading one latent of
    kv_lora_rank + rope elements is priced as a head of half that (K and V of it together),
    the bytes a latent cache holds; its FLOPs then undercount the value product
    (analytic; no MLA kernel measured)."""
    h, H = m.hidden, m.heads
    rope, nope, v, r = m.qk_rope_head_dim, m.qk_nope_head_dim, m.v_head_dim, m.kv_lora_rank
    qk = nope + rope
    latent = r + rope
    ops = [Op("input_norm", "norm", "rmsnorm", (h,), params=h, activation=h * BF16)]
    if m.q_lora_rank:
        ql = m.q_lora_rank
        ops += [Op("q_a", "gemm", "gemm", (h, ql), params=h * ql, activation=ql * BF16, fp8=True),
                Op("q_a_norm", "norm", "rmsnorm", (ql,), params=ql),
                Op("q_b", "gemm", "gemm", (ql, H * qk), "column", params=ql * H * qk,
                   activation=H * qk * BF16, fp8=True)]
    else:
        ops.append(Op("q", "gemm", "gemm", (h, H * qk), "column", params=h * H * qk,
                      activation=H * qk * BF16, fp8=True))
    ops += [Op("kv_a", "gemm", "gemm", (h, latent), params=h * latent, activation=latent * BF16,
               fp8=True),
            Op("kv_a_norm", "norm", "rmsnorm", (r,), params=r),
            Op("rotary", "elementwise", "rotary", (H * rope + rope,), "column"),
            Op("kv_write", "elementwise", "kv_write", (latent,), cache=latent),
            Op("kv_b", "gemm", "gemm", (r, H * (nope + v)), "column", params=r * H * (nope + v),
               activation=H * (nope + v) * BF16, fp8=True),
            Op("attention", "attention", "attention", (H, H, qk), "column",
               decode_shape=(H, 1, max(1, latent // 2))),
            Op("o", "gemm", "gemm", (H * v, h), "row", params=H * v * h, fp8=True),
            Op("attention_residual", "elementwise", "residual_add", (h,))]
    return tuple(ops)


def moe_layer(m: Architecture, ep: int = 1) -> tuple[Op, ...]:
    """One Mixture-of-Experts layer: attention as in `decoder_layer`, then RMSNorm, the
    router GEMM (hidden → E logits, replicated; none with one expert), the shared experts
    (one gated MLP n_shared_experts × moe_intermediate_size wide, its output summed into
    the routed experts' before their all-reduce), the routed experts as grouped GEMMs
    (gate/up, SiLU·mul, down) over the tokens' k choices, the weighted combine of each
    token's k outputs (priced as an add over k · hidden; none when k = 1) and the residual
    add. SiLU·mul on T·k rows of width f is priced as T rows of width k·f (equal bytes).

    With `ep`-way expert parallelism (over the replica's `tensor` GPUs) this GPU holds E/ep
    whole experts and the shared experts whole, and runs at the pace of the most loaded
    rank (moe.local_routing): its tokens reach it by an all-to-all dispatch and return by
    an all-to-all combine (that rank receives T · Σq_local rows of hidden, bf16) in place
    of the experts' all-reduce. Under attention data parallelism the ops marked `dispatched`
    run on every rank's tokens (the replica's), the rest on this rank's own."""
    h, E, k, f = m.hidden, m.num_experts, m.num_experts_per_tok, m.moe_intermediate_size
    local = E // ep
    routing = local_routing(E, k, zipf_s=m.router_zipf_s, load=m.expert_load, ep=ep)
    mlp: list[Op] = [Op("mlp_norm", "norm", "rmsnorm", (h,), params=h)]
    if E > 1:
        mlp.append(Op("router", "gemm", "gemm", (h, E), params=h * E, activation=E * 4))
    if m.n_shared_experts:
        fs = m.n_shared_experts * f
        col: Split = "column" if ep == 1 else "replicated"  # EP: whole on every GPU
        mlp += [Op("shared_gate_up", "gemm", "gemm", (h, 2 * fs), col, params=2 * h * fs,
                   activation=2 * fs * BF16, fp8=True),
                Op("shared_activation", "elementwise", "silu_mul", (fs,), col),
                Op("shared_down", "gemm", "gemm", (fs, h), "row" if ep == 1 else "replicated",
                   params=fs * h, fp8=True, reduce_with_next=True)]
    share = routing_rows_share(routing, k, ep)
    kf = round(k * f * share)
    tp_split: Split = "replicated" if ep > 1 else "column"
    if ep > 1:  # the max rank receives T · Σq_local rows of hidden, bf16
        mlp.append(Op("experts_dispatch", "collective", "all_to_all",
                      (round(k * share * h) * BF16,), dispatched=True))
    mlp += [Op("experts_gate_up", "grouped_gemm", "gemm", (h, 2 * f), tp_split,
               params=local * 2 * h * f, activation=2 * kf * BF16, fp8=True, routing=routing,
               dispatched=True),
            Op("experts_activation", "elementwise", "silu_mul", (kf,), tp_split, dispatched=True),
            Op("experts_down", "grouped_gemm", "gemm", (f, h), "replicated" if ep > 1 else "row",
               params=local * f * h, fp8=True, routing=routing, dispatched=True)]
    if ep > 1:
        mlp.append(Op("experts_combine_all_to_all", "collective", "all_to_all",
                      (round(k * share * h) * BF16,), dispatched=True))
    if k > 1:
        mlp.append(Op("experts_combine", "elementwise", "residual_add", (k * h,)))
    mlp.append(Op("mlp_residual", "elementwise", "residual_add", (h,)))
    return (*attention_block(m), *mlp)


def routing_rows_share(routing: Routing, k: int, ep: int) -> float:
    """The share of a token's k expert rows that this GPU computes: 1 without expert
    parallelism, else Σ q_e over its experts / k (the most loaded rank's)."""
    return 1.0 if ep == 1 else sum(routing.picks) / k


@dataclass(frozen=True)
class ModelOps:
    """A forward pass on one GPU: `first` before the layers, `dense` run `dense_layers`
    times (a MoE model's first dense layers), `layer` run `layers` times, `last` after.
    `windows`: the attention window of each of the `layers` (0: full attention; (): every
    one full), for sliding-window models; their other operations are the same."""

    layers: int
    first: tuple[Op, ...]
    layer: tuple[Op, ...]
    last: tuple[Op, ...]
    dense: tuple[Op, ...] = ()
    dense_layers: int = 0
    windows: tuple[int, ...] = ()

    def blocks(self) -> tuple[tuple[tuple[Op, ...], int], ...]:
        """The layer types with the times each runs per pass, in the order they run."""
        main = ((self.layer, self.layers),)
        return ((self.dense, self.dense_layers), *main) if self.dense_layers else main

    def each(self) -> tuple[tuple[Op, int], ...]:
        """Every op with the times it runs per pass."""
        return (*((op, 1) for op in self.first),
                *((op, n) for ops, n in self.blocks() for op in ops),
                *((op, 1) for op in self.last))

    def find(self, name: str) -> Op:
        for op, _ in self.each():
            if op.name == name:
                return op
        raise KeyError(name)

    def of_kind(self, *kinds: str) -> tuple[Op, ...]:
        """The ops of these kinds, in the order they run (each layer op once)."""
        return tuple(op for op in (*self.first, *self.dense, *self.layer, *self.last)
                     if op.kind in kinds)

    @property
    def params(self) -> int:
        return sum(op.params * times for op, times in self.each())

    @property
    def active_params(self) -> int:
        """Parameters one token uses: every weight, but of the routed experts only its k
        (a grouped GEMM's K · N per expert row; the embedding counts whole)."""
        return sum(times * (self._rows_per_token(op) * op.shape[0] * op.shape[1]
                            if op.kind == "grouped_gemm" else op.params)
                   for op, times in self.each())

    @staticmethod
    def _rows_per_token(op: Op) -> float:
        """Expert rows per token a grouped GEMM computes on this GPU (Σ q_e: k without EP)."""
        return sum(op.routing.picks) if op.routing is not None else 1.0

    def weight_bytes(self, width: float, expert_width: float | None = None) -> int:
        """Bytes of all weights at `width` bytes each, the routed experts' at `expert_width`
        (None: `width`; MXFP4 experts: 0.53125)."""
        if expert_width is None or expert_width == width:
            return round(self.params * width)
        experts = sum(op.params * times for op, times in self.each() if op.kind == "grouped_gemm")
        return round((self.params - experts) * width + experts * expert_width)

    def kv_bytes_per_token(self, width: float) -> int:
        """KV-cache bytes one token holds, every layer, at `width` bytes per element (a
        token within every sliding window)."""
        return round(sum(op.cache * times for op, times in self.each()) * width)

    def attention_windows(self) -> tuple[tuple[int, int], ...]:
        """(window, layers) of the pass's attention calls, full attention (window 0) first,
        then each window in increasing order; layers with no calls left out."""
        calls = sum(times for op, times in self.each() if op.kind == "attention")
        groups: dict[int, int] = {}
        for w in self.windows:
            if w:
                groups[w] = groups.get(w, 0) + 1
        full = calls - sum(groups.values())
        return tuple((w, n) for w, n in ((0, full), *sorted(groups.items())) if n)

    def _layer_cache(self) -> int:
        return sum(op.cache for op in self.layer)

    def kv_bytes(self, tokens: int, width: float) -> int:
        """KV-cache bytes one sequence of `tokens` tokens holds: every token in the full
        layers, the last min(tokens, window) in each sliding-window layer."""
        elements = sum(op.cache * times for op, times in self.each()) * tokens
        elements -= self._layer_cache() * sum(max(0, tokens - w) for w in self.windows if w)
        return round(elements * width)

    def kv_split(self, width: float, context: int, block: int = 1) -> tuple[int, int]:
        """How a sequence of up to `context` tokens holds KV, as vLLM's hybrid KV cache
        manager allocates it: (bytes per token of the layers that keep every token: the full
        ones and windows >= context; the most bytes the other, sliding, layers hold for one
        sequence: the blocks of `block` tokens covering its last window - 1 tokens and the
        current one, ⌈(window - 1) / block⌉ + 1 blocks, at most `context` tokens). Without
        windows shorter than the context, or without a full layer (then counted as full
        attention, an upper bound): (kv_bytes_per_token, 0)."""
        short = [w for w in self.windows if 0 < w < context]
        per_token = self.kv_bytes_per_token(width)
        cache = self._layer_cache() * width
        full = per_token - round(cache * len(short))
        if not short or not full:
            return per_token, 0
        held = sum(min(context, (-(-(w - 1) // block) + 1) * block) for w in short)
        return full, round(cache * held)

    def activation_bytes(self, tokens: int, sequences: int) -> int:
        """Activation bytes of a step of `tokens` rows of tokens and `sequences` of
        sequences: one layer's at a time (buffers are reused layer to layer)."""
        per_token = per_seq = 0
        for op in (*self.first, *max((self.layer, self.dense), key=_activation), *self.last):
            if op.per_sequence:
                per_seq += op.activation
            else:
                per_token += op.activation
        return tokens * per_token + sequences * per_seq

    def gemm_shapes(self) -> dict[str, tuple[int, int]]:
        """The GEMMs (and the LM head) as name -> (K, N), in the order they run."""
        return {op.name: op.shape for op in self.of_kind("gemm", "grouped_gemm", "lm_head")}

    def flops_per_token(self, context: int) -> float:
        """Forward FLOPs of one token attending to `context` keys: 2 per weight of every
        GEMM (the LM head too, tied or not; of the routed experts its k), and
        4 · heads · head_dim per key and layer (QKᵀ and the weighted sum of V). Embedding,
        biases, norms and activations: none."""
        matmul = attention = 0.0
        for op, times in self.each():
            if op.kind in ("gemm", "lm_head"):
                matmul += times * op.shape[0] * op.shape[1]
            elif op.kind == "grouped_gemm":
                matmul += times * self._rows_per_token(op) * op.shape[0] * op.shape[1]
            elif op.kind == "attention":
                keys = times * context
                if op in self.layer:  # sliding layers see the last `window` keys only
                    keys -= sum(max(0, context - w) for w in self.windows if w)
                attention += 4 * keys * op.shape[0] * op.shape[2]
        return float(2 * matmul + attention)


def attended_keys(q_len: int, kv_len: int, window: int = 0) -> int:
    """Query-key pairs of a causal call of `q_len` new tokens, the last of them at position
    `kv_len`: each query at position p (1-based) sees p keys, or min(p, window) over a
    sliding window (window 0: full attention)."""
    a, b = kv_len - q_len + 1, kv_len  # the queries' positions
    full = (a + b) * q_len // 2
    if not window or b <= window:
        return full
    if a > window:
        return window * q_len
    return (a + window) * (window - a + 1) // 2 + window * (b - window)


def _activation(ops: tuple[Op, ...]) -> int:
    return sum(op.activation for op in ops if not op.per_sequence)


def model_ops(model: Architecture, tensor: int = 1, expert: int = 1) -> ModelOps:
    """The forward pass of `model` on one GPU of a `tensor`-way tensor-parallel group
    (`expert`-way expert parallel over the same GPUs for a MoE model)."""
    s = model.shard(tensor, expert)
    h = s.hidden
    first = (Op("embedding", "embedding", "embedding", (h,), "vocab", params=s.vocab * h,
                activation=h * BF16),)  # the residual stream
    last = (Op("final_norm", "norm", "rmsnorm", (h,), params=h),
            Op("lm_head", "lm_head", "gemm", (h, s.vocab), "vocab",
               params=0 if s.tied_embeddings else s.vocab * h,
               activation=model.vocab * LOGIT_BYTES, per_sequence=True))  # fp32, gathered
    windows = s.layer_windows()  # none with leading dense layers or latent attention
    if s.num_experts:
        lead = s.first_k_dense_replace
        dense = (*attention_block(s), *decoder_layer(s)[7:]) if lead else ()
        ops = ModelOps(s.layers - lead, first, moe_layer(s, expert), last, dense, lead, windows)
    elif s.kv_lora_rank:
        ops = ModelOps(s.layers, first, (*attention_block(s), *decoder_layer(s)[7:]), last)
    else:
        ops = ModelOps(s.layers, first, decoder_layer(s), last, windows=windows)
    return with_collectives(ops, tensor, model.vocab) if tensor > 1 else ops


def with_collectives(ops: ModelOps, tensor: int, vocab: int) -> ModelOps:
    """The pass with the collectives of `tensor`-way tensor parallelism: an all-reduce of
    the output after every row-split op and the vocabulary-split embedding (partial sums),
    an all-gather of the logits after the vocabulary-split LM head."""
    def add(seq: tuple[Op, ...]) -> tuple[Op, ...]:
        out: list[Op] = []
        for op in seq:
            out.append(op)
            if op.reduce_with_next:
                continue
            if op.split == "row" or (op.split == "vocab" and op.kind == "embedding"):
                width = op.shape[-1] if op.kind in ("gemm", "grouped_gemm") else op.shape[0]
                out.append(Op(f"{op.name}_all_reduce", "collective", "all_reduce",
                              (width * BF16,), per_sequence=op.per_sequence))
            elif op.split == "vocab" and op.kind == "lm_head":
                out.append(Op(f"{op.name}_all_gather", "collective", "all_gather",
                              (vocab * BF16,), per_sequence=True))
        return tuple(out)
    return dataclasses.replace(ops, first=add(ops.first), layer=add(ops.layer), last=add(ops.last),
                               dense=add(ops.dense))


def fuse_add_norms(layer: tuple[Op, ...]) -> tuple[Op, ...]:
    """The layer as fused-kernel stacks run it: each residual add and the RMSNorm right
    after it (the layer's last add and the next layer's input norm, cyclically) as one
    add+RMSNorm kernel (vLLM's `fused_add_rms_norm`), at the norm's place."""
    n = len(layer)
    fused = {(i + 1) % n for i, op in enumerate(layer)
             if op.kernel == "residual_add" and layer[(i + 1) % n].kernel == "rmsnorm"
             and layer[(i + 1) % n].shape == op.shape}
    return tuple(dataclasses.replace(op, kernel="add_rmsnorm") if i in fused else op
                 for i, op in enumerate(layer)
                 if not (op.kernel == "residual_add" and (i + 1) % n in fused))


def elementwise_calls(ops: tuple[Op, ...]) -> list[tuple[str, int, int]]:
    """The norms, elementwise kernels and embeddings of `ops` as (kernel, width, calls),
    one entry per distinct kernel and width, in ELEMENTWISE_ORDER."""
    return [(k, w, c) for k, w, c, _ in elementwise_calls_by_rows(ops, split=False)]


def elementwise_calls_by_rows(ops: tuple[Op, ...], split: bool = True
                              ) -> list[tuple[str, int, int, bool]]:
    """As `elementwise_calls`, with whether each entry runs on dispatched rows (`split`:
    kept apart from the rank's own rows; else all counted as the rank's own)."""
    calls: dict[tuple[str, int, bool], int] = {}
    for op in ops:
        if op.kind in ("norm", "elementwise", "embedding"):
            key = (op.kernel, op.shape[0], op.dispatched and split)
            calls[key] = calls.get(key, 0) + 1
    return [(k, w, c, d) for (k, w, d), c in sorted(calls.items(),
                                                    key=lambda kv: ELEMENTWISE_ORDER.index(kv[0][0]))]
