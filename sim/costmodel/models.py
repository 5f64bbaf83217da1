"""Model architecture specs (`models/<name>.yaml`) and the sizes derived from them.

A `ModelSpec` holds the few numbers of a decoder-only transformer that decide its
cost: layer count, widths, head counts, vocabulary and dtypes. Everything else
(parameter count, weight and KV-cache bytes, FLOPs, GEMM shapes) is read from its
list of operations (`ModelSpec.ops`, sim/costmodel/layer.py), the one description of
its layer that latency, memory, tensor parallelism and calibration also read.

The architecture assumed is Llama-style: RMSNorm before attention and before the
MLP, q/k/v/o projections without biases (unless `qkv_bias`, as in Qwen2), an MLP
without biases (SwiGLU when `gated_mlp`), a final norm and an LM head.

Sliding-window attention (Mistral 7B v0.1, Gemma 2/3, gpt-oss): the layers that
`layer_types` marks `sliding_attention` (every layer when `sliding_window` is set without
`layer_types`, Mistral-style) attend over the last `sliding_window` tokens only; their
attention time and KV reads use min(context, window), and a token beyond the window holds
KV in the full layers only (sim/costmodel/layer.py, `ModelOps.kv_split`). Attention sinks
(gpt-oss: one learned logit per query head added to the softmax's denominator) count as
`heads` parameters a layer; their compute (one add per head and query) is negligible and
not priced.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from sim.costmodel.layer import ModelOps, model_ops
from sim.io.filecache import FileCache
from sim.io.specload import (
    ROOT,
    SpecError,
    build,
    is_file,
    known_names,
    load_yaml,
    read_text,
    show,
)

MODELS_DIR = ROOT / "models"
LAYER_TYPES = ("full_attention", "sliding_attention")  # ModelSpec.layer_types, as in HF configs

_POSITIVE = {"gt": 0}


@dataclass(frozen=True)
class ModelSpec:
    """One model's architecture, as in its Hugging Face config.json."""

    name: str  # equals the YAML file's name without .yaml
    layers: int = field(metadata=_POSITIVE)  # num_hidden_layers
    hidden: int = field(metadata=_POSITIVE)  # hidden_size
    heads: int = field(metadata=_POSITIVE)  # num_attention_heads (query heads)
    kv_heads: int = field(metadata=_POSITIVE)  # num_key_value_heads
    head_dim: int = field(metadata=_POSITIVE)
    ffn: int = field(metadata=_POSITIVE)  # intermediate_size
    gated_mlp: bool  # SwiGLU (gate, up, down) rather than (up, down)
    vocab: int = field(metadata=_POSITIVE)  # vocab_size
    tied_embeddings: bool  # tie_word_embeddings: the LM head reuses the embedding matrix
    max_len: int = field(metadata=_POSITIVE)  # max_position_embeddings
    source: str  # where the numbers come from (e.g. the HF repo id)
    weight_dtype_bytes: float = field(default=2, metadata=_POSITIVE)  # 0.5 for 4-bit weights
    kv_dtype_bytes: float = field(default=2, metadata=_POSITIVE)  # 1 for an fp8 KV cache
    qkv_bias: bool = False  # biases on the q, k and v projections (Qwen2)
    # Mixture-of-Experts (sim/costmodel/moe.py; 0 experts: a dense model)
    num_experts: int = field(default=0, metadata={"ge": 0})  # routed experts per MoE layer
    num_experts_per_tok: int = field(default=0, metadata={"ge": 0})  # top-k
    moe_intermediate_size: int = field(default=0, metadata={"ge": 0})  # each expert's MLP width
    n_shared_experts: int = field(default=0, metadata={"ge": 0})  # experts every token uses
    first_k_dense_replace: int = field(default=0, metadata={"ge": 0})  # leading dense layers
    router_zipf_s: float = field(default=0.0, metadata={"ge": 0})  # skew (0: uniform routing)
    expert_load: tuple[float, ...] | None = None  # measured routed-token count per expert
    # or those counts in a file beside the model file: one number per line, `#` comments
    expert_load_file: str | None = None
    # Multi-head latent attention (DeepSeek; sim/costmodel/layer.mla_attention; 0: none)
    kv_lora_rank: int = field(default=0, metadata={"ge": 0})  # the cached KV latent's width
    q_lora_rank: int = field(default=0, metadata={"ge": 0})  # q's low-rank width (0: full q)
    qk_rope_head_dim: int = field(default=0, metadata={"ge": 0})  # rotary part of q and k
    qk_nope_head_dim: int = field(default=0, metadata={"ge": 0})  # the rest of q and k
    v_head_dim: int = field(default=0, metadata={"ge": 0})
    # Sliding-window attention: the window in tokens (0: none) and each layer's kind, as in
    # HF configs (`layer_types`: full_attention | sliding_attention, one per layer; None: every
    # layer sliding when sliding_window > 0, Mistral-style, else every layer full)
    sliding_window: int = field(default=0, metadata={"ge": 0})
    layer_types: tuple[Literal["full_attention", "sliding_attention"], ...] | None = None
    attention_sinks: bool = False  # a learned sink logit per query head (gpt-oss)
    # the routed experts' weight width when it differs from weight_dtype_bytes (0: the same):
    # MXFP4 (gpt-oss) is 4-bit values plus an 8-bit scale per 32, 4.25 bits = 0.53125 bytes
    expert_dtype_bytes: float = field(default=0, metadata={"ge": 0})

    def check(self) -> tuple[str, str] | None:
        """Cross-field rules; (field, message) for the first one broken."""
        if not self.name:
            return "name", "empty name (allowed: the model file's name)"
        if self.heads % self.kv_heads:
            return (
                "kv_heads",
                f"{self.kv_heads} does not divide heads={self.heads} (allowed: a divisor of heads)",
            )
        if self.kv_lora_rank and not (self.qk_rope_head_dim and self.qk_nope_head_dim
                                      and self.v_head_dim):
            return ("kv_lora_rank", "latent attention without qk_rope_head_dim, "
                    "qk_nope_head_dim and v_head_dim (allowed: all four > 0, or kv_lora_rank 0)")
        return self._check_window() or self._check_moe()

    def _check_window(self) -> tuple[str, str] | None:
        types = self.layer_types
        if types is not None:
            if len(types) != self.layers:
                return "layer_types", (f"{len(types)} entries (allowed: one per layer, "
                                       f"layers={self.layers})")
            bad = next((t for t in types if t not in LAYER_TYPES), None)
            if bad is not None:
                return "layer_types", f"{bad!r} is unknown (allowed: {', '.join(LAYER_TYPES)})"
            if "sliding_attention" in types and not self.sliding_window:
                return "sliding_window", "0 with sliding_attention layers (allowed: > 0)"
        if self.sliding_layers and self.kv_lora_rank:
            return "sliding_window", "with latent attention is not expressible (allowed: 0)"
        if self.sliding_layers and self.first_k_dense_replace:
            return "sliding_window", ("with leading dense layers (first_k_dense_replace) is "
                                      "not expressible (allowed: 0)")
        if self.expert_dtype_bytes and not self.num_experts:
            return "expert_dtype_bytes", "set on a model without experts (allowed: 0)"
        return None

    def _check_moe(self) -> tuple[str, str] | None:
        E, k = self.num_experts, self.num_experts_per_tok
        moe_fields = (k, self.moe_intermediate_size, self.n_shared_experts,
                      self.first_k_dense_replace, self.router_zipf_s, self.expert_load)
        if not E:
            if any(moe_fields):
                return "num_experts", "0 with other MoE fields set (allowed: >= 1 for a MoE model)"
            return None
        if not 1 <= k <= E:
            return "num_experts_per_tok", f"{k} (allowed: 1 to num_experts={E})"
        if not self.moe_intermediate_size:
            return "moe_intermediate_size", "missing for a MoE model (allowed: > 0)"
        if self.first_k_dense_replace >= self.layers:
            return ("first_k_dense_replace", f"{self.first_k_dense_replace} (allowed: < "
                    f"layers={self.layers})")
        if self.expert_load is not None:
            if any(not math.isfinite(c) for c in self.expert_load):
                return "expert_load", "a count that is not finite (allowed: counts >= 0)"
            if self.router_zipf_s:
                return "expert_load", "given with router_zipf_s (allowed: one of the two)"
            if len(self.expert_load) != E:
                return "expert_load", (f"{len(self.expert_load)} counts (allowed: one per expert, "
                                       f"{E})")
            if min(self.expert_load) < 0 or not sum(self.expert_load) > 0:
                return "expert_load", "negative or all zero (allowed: counts >= 0, not all 0)"
        return None

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def sliding_layers(self) -> int:
        """How many layers attend over a sliding window."""
        if self.layer_types is None:
            return self.layers if self.sliding_window else 0
        return sum(t == "sliding_attention" for t in self.layer_types)

    def layer_windows(self) -> tuple[int, ...]:
        """Each layer's attention window in tokens, 0 for full attention (() when no layer
        has a window)."""
        if not self.sliding_layers:
            return ()
        if self.layer_types is None:
            return (self.sliding_window,) * self.layers
        return tuple(self.sliding_window if t == "sliding_attention" else 0
                     for t in self.layer_types)

    @property
    def expert_width(self) -> float:
        """Bytes per routed-expert weight (the model's weight width unless stated)."""
        return self.expert_dtype_bytes or self.weight_dtype_bytes

    @property
    def active_params(self) -> int:
        """Parameters one token uses (of the routed experts, its k; dense: all)."""
        return self.ops().active_params

    # ---- parameter counts -------------------------------------------------------

    @property
    def q_dim(self) -> int:
        """Width of the query projection output (heads × head_dim)."""
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        """Width of the key (or value) projection output (kv_heads × head_dim)."""
        return self.kv_heads * self.head_dim

    def ops(self, tensor: int = 1, expert: int = 1) -> ModelOps:
        """Its forward pass as a list of operations on one GPU of a `tensor`-way group,
        `expert`-way expert parallel (sim/costmodel/layer.py): the sizes below are read
        from it."""
        return model_ops(self, tensor, expert)

    @property
    def params(self) -> int:
        """All parameters: embeddings, layers (with qkv biases and 2 RMSNorms), final
        norm, and the LM head unless it is tied to the embeddings."""
        return self.ops().params

    @property
    def weight_bytes(self) -> int:
        """Bytes of all weights at `weight_dtype_bytes` each."""
        return self.ops().weight_bytes(self.weight_dtype_bytes, self.expert_width)

    @property
    def kv_bytes_per_token(self) -> int:
        """KV-cache bytes one token occupies: K and V, in every layer, for every KV head."""
        return self.ops().kv_bytes_per_token(self.kv_dtype_bytes)

    # ---- compute ----------------------------------------------------------------

    def flops_per_token(self, context: int = 0) -> float:
        """Forward-pass FLOPs for one token that attends to `context` tokens.

        Convention: a multiply-add counts 2 FLOPs. The matmul part is 2 × every weight
        matmul including the LM head (tied or not), but not the embedding lookup,
        biases, norms or activations. The attention part is
        4 × layers × heads × head_dim × context: QKᵀ and the weighted sum of V,
        each 2 × head_dim FLOPs per (head, key). `context` is the number of keys
        this token sees (its own position + 1 under a causal mask); the caller sums
        over the tokens of a step, so no causal halving happens here.
        """
        return self.ops().flops_per_token(context)

    def gemm_shapes(self) -> dict[str, tuple[int, int]]:
        """Per-layer GEMMs (and the LM head) as op -> (K, N) for F.linear(x[M, K], W[N, K]).

        M is the number of tokens in the step, so it is left to the caller. q, k and
        v are fused into one GEMM, as are gate and up when the MLP is gated.
        """
        return self.ops().gemm_shapes()


    # ---- tensor parallelism -------------------------------------------------------

    def tensor_problem(self, tensor: int) -> str | None:
        """Why `tensor`-way tensor parallelism cannot split this model, or None."""
        if self.heads % tensor:
            return f"{tensor} does not divide heads={self.heads}"
        if self.kv_heads % tensor and tensor % self.kv_heads:
            return (f"{tensor} neither divides kv_heads={self.kv_heads} nor is a multiple of it "
                    "(KV heads are split, or replicated when the degree exceeds them)")
        if self.ffn % tensor and (not self.is_moe or self.first_k_dense_replace):
            return f"{tensor} does not divide ffn={self.ffn}"
        if self.is_moe and self.moe_intermediate_size % tensor:
            return f"{tensor} does not divide moe_intermediate_size={self.moe_intermediate_size}"
        return None

    def expert_problem(self, expert: int, gpus: int) -> str | None:
        """Why `expert`-way expert parallelism over a replica of `gpus` GPUs (tensor x
        data) cannot hold this model, or None."""
        if expert == 1:
            return None
        if not self.is_moe:
            return f"{self.name} has no experts"
        if expert != gpus:
            return (f"{expert} differs from the replica's {gpus} GPUs (parallel.tensor x "
                    "parallel.data; experts are spread over all of them)")
        if self.num_experts % expert:
            return f"{expert} does not divide num_experts={self.num_experts}"
        return None

    def shard(self, tensor: int, expert: int = 1) -> ModelSpec:
        """What one GPU of a `tensor`-way tensor-parallel group holds (Megatron-style).

        Column-parallel q/k/v and gate/up keep their K and split N; row-parallel o and
        down split K; each GPU has heads/tensor query heads and kv_heads/tensor KV heads,
        or one KV head (replicated) when the degree exceeds kv_heads; the vocabulary
        (embedding and LM head) is split, rounded up. Norms and `hidden` are replicated.
        So the shard's weight_bytes, kv_bytes_per_token, gemm_shapes and head counts
        are per GPU. tensor = 1 returns the model itself.
        """
        if tensor == 1:
            return self
        moe = {}
        if self.is_moe:  # experts split like the MLP, or held whole under expert parallelism
            split = self.moe_intermediate_size // tensor
            moe = dict(moe_intermediate_size=split if expert == 1 else self.moe_intermediate_size)
        return dataclasses.replace(
            self, name=f"{self.name}/tp{tensor}", heads=self.heads // tensor,
            kv_heads=max(1, self.kv_heads // tensor), ffn=self.ffn // tensor,
            vocab=-(-self.vocab // tensor), **moe,
        )


# ---- loading --------------------------------------------------------------------


def known_models() -> list[str]:
    """Names of the models in ROOT/models/, sorted."""
    return known_names(MODELS_DIR)


def load_model(
    name_or_path: str, *, file: str | Path | None = None, path: str = "model"
) -> ModelSpec:
    """The spec for a model name (ROOT/models/NAME.yaml) or a path ending in .yaml.

    `file` and `path` are the caller's (the scenario's) file and field path: an
    unknown name or a missing file is reported there. Errors inside the model YAML
    name the model file and its field. A relative .yaml path is taken relative to
    the folder of `file` when given, else to the current directory.
    """
    if name_or_path.endswith(".yaml"):
        p = Path(name_or_path)
        if not p.is_absolute() and file is not None:
            p = Path(file).parent / p
        if not is_file(p):
            raise SpecError(file, path, f"model file not found: {show(name_or_path)}")
    else:
        known = known_models()
        if name_or_path not in known:
            raise SpecError(file, path, f"unknown {show(name_or_path)} (known: {', '.join(known)})")
        p = MODELS_DIR / f"{name_or_path}.yaml"
    p = p.resolve()
    return _LOADED.get(p, lambda watch: _read_model(watch(p), watch))


_LOADED: FileCache[ModelSpec] = FileCache()  # by path, while the file is unchanged


def _read_model(p: Path, watch=lambda f: f) -> ModelSpec:
    data = load_yaml(p)
    if isinstance(data, dict) and isinstance(data.get("expert_load_file"), str):
        if "expert_load" in data:
            raise SpecError(p, "expert_load_file", "given with expert_load (allowed: one of the two)")
        load = p.parent / data["expert_load_file"]
        data = {**data, "expert_load": read_expert_load(watch(load) if is_file(load) else load, p)}
    spec = build(ModelSpec, data, file=p)
    if spec.name != p.stem:
        raise SpecError(
            p, "name", f"{spec.name!r} differs from the file name (allowed: {p.stem!r})"
        )
    return spec


def read_expert_load(f: Path, model_file: Path) -> list[float]:
    """A measured expert-load histogram: one count (or share) per expert per line, in expert
    order; blank lines and `#` comments skipped."""
    if not is_file(f):
        raise SpecError(model_file, "expert_load_file", f"file not found: {show(str(f))}")
    counts = []
    for i, line in enumerate(read_text(f).splitlines(), 1):
        text = line.split("#", 1)[0].strip()
        if not text:
            continue
        try:
            counts.append(float(text))
        except ValueError:
            raise SpecError(f, f"line {i}", f"{show(text)} is not a number (allowed: one count "
                            "per line)") from None
    return counts


def context_window(model: ModelSpec, max_model_len: int | None, *,
                   file: str | Path | None = None, path: str = "kv.max_model_len") -> int:
    """The context window a run uses: `max_model_len` (None: the model's own window).

    As in vLLM, a `max_model_len` above the model's window (`max_len`, its
    max_position_embeddings) is refused: the model was not trained for those positions.
    """
    if max_model_len is None:
        return model.max_len
    if max_model_len > model.max_len:
        raise SpecError(file, path, f"{max_model_len} is over {model.name}'s context window "
                                    f"(allowed: <= {model.max_len})")
    return max_model_len
