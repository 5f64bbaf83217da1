"""GPU memory budget: what is left for the KV cache once weights and activations are in.

Per GPU of a replica split `tensor` ways (sim/costmodel/parallel.py):
KV capacity = GPU memory x gpu_memory_utilization - weights/tensor - activation scratch,
where the scratch is what the largest step the scheduler can build allocates
on top of the weights: the activations of its token count (the residual stream, a
norm's output, q/k/v and the MLP's widest intermediate, gate and up: each operation's
`activation` bytes in the model's list, sim/costmodel/layer.py), the attention call's
own scratch from the profile (flash grows O(N) with the prompt, naive's materialised
score matrix O(N^2)) and fp32 logits for one row per sequence. Weights and KV bytes
per token are read from the same list.

With `pipeline` stages each GPU holds its stage's layers only (sim/costmodel/pipeline.py:
weights of its layers, the embedding on the first stage, the LM head and logits on the
last) and KV for those layers only; every stage must hold the KV of every token in
flight, so the replica's KV tokens are the fewest any stage holds (`stage_budgets`), and
a stage that cannot hold one max_model_len sequence is refused naming that stage.

Sliding-window layers (gpt-oss, Gemma, Mistral 7B v0.1): vLLM's hybrid KV cache manager
(docs/design/hybrid_kv_cache_manager.md) gives the full and the sliding layers their own
blocks from one pool and frees a sliding layer's blocks once they leave its window, so a
token beyond the window holds KV in the full layers only. Here the KV tokens are counted at
the full layers' bytes per token, and each sequence holding KV takes, besides its tokens'
blocks, the blocks its sliding layers hold once it is longer than the window: those
covering its last window - 1 tokens and the current one, ⌈(window - 1) / block⌉ + 1 per
layer (`ModelOps.kv_split`; `ReplicaConfig.window_blocks` in blocks of the pool,
sim/policies/kv.PagedKV.extra_blocks). Simplifications: a sequence shorter than the
window is charged the whole window (vLLM: its length), and a prefill chunk's sliding
blocks beyond the window are not taken for the step that computes them. A window at
least as long as max_model_len is full attention; a model with no full layer is counted as
full attention (every token at every layer's bytes, an upper bound).
"""

from __future__ import annotations

from dataclasses import dataclass

from sim.config.scenario import Scenario
from sim.costmodel.models import ModelSpec
from sim.costmodel.parallel import valid_tensor_degrees
from sim.costmodel.pipeline import stage_ops
from sim.costmodel.profiles import GPUProfile
from sim.io.specload import SpecError

GIB = 1024**3


@dataclass(frozen=True)
class MemoryBudget:
    gpu_bytes: float
    usable_bytes: float
    weight_bytes: float
    activation_bytes: float
    attention_scratch_bytes: float
    kv_bytes: float
    kv_tokens: int  # the replica's: one GPU's x its attention data-parallel ranks

    def as_dict(self) -> dict[str, float]:
        """The budget as `summary.json` → `memory_gib` writes it: sizes in GiB, keys named so."""
        return {SUMMARY_KEYS.get(k, k): (v / GIB if k in SUMMARY_KEYS else v)
                for k, v in self.__dict__.items()}


# MemoryBudget field (bytes) -> summary key (GiB)
SUMMARY_KEYS = {"gpu_bytes": "gpu_gib", "usable_bytes": "usable_gib", "weight_bytes": "weights_gib",
                "activation_bytes": "activations_gib",
                "attention_scratch_bytes": "attention_scratch_gib", "kv_bytes": "kv_gib"}


def memory_budget(sc: Scenario, model: ModelSpec, profile: GPUProfile,
                  draft: ModelSpec | None = None) -> MemoryBudget:
    """The budget of one GPU of the replica (`sc.parallel.tensor` GPUs share the model);
    a speculative draft model adds its weights and its own KV per token. A model or
    layout that cannot hold even one `max_model_len` sequence is a SpecError naming the
    shortfall in GiB. With pipeline stages: the stage that holds the fewest KV tokens."""
    return min(stage_budgets(sc, model, profile, draft), key=lambda b: b.kv_tokens)


def stage_budgets(sc: Scenario, model: ModelSpec, profile: GPUProfile,
                  draft: ModelSpec | None = None) -> list[MemoryBudget]:
    """The budget of one GPU of each pipeline stage (one entry without pipelining)."""
    return [_budget(sc, model, profile, draft, s) for s in range(sc.parallel.pipeline)]


def _budget(sc: Scenario, model: ModelSpec, profile: GPUProfile, draft: ModelSpec | None,
            stage: int) -> MemoryBudget:
    max_len = sc.kv.max_model_len or model.max_len
    tp = sc.parallel.tensor
    gpu = profile.facts.memory_gib * GIB
    usable = gpu * sc.kv.gpu_memory_utilization
    weights, activations, scratch, kv_per_token = _per_gpu(sc, model, profile, draft, tp, stage)
    kv_bytes = usable - weights - activations - scratch
    if sc.kv.num_blocks is not None:
        bs = sc.kv.block_size if sc.kv.manager == "paged" else 1
        kv_tokens = sc.kv.num_blocks * bs
    else:
        one_sequence = max_len * kv_per_token + _window_bytes(sc, model, tp, stage)
        if kv_bytes < one_sequence:
            raise _does_not_fit(sc, model, profile, draft, usable, max_len, stage)
        # attention data parallelism: each of the D ranks holds the KV of its own sequences
        kv_tokens = int(kv_bytes // kv_per_token) * sc.parallel.data
    return MemoryBudget(gpu, usable, weights, activations, scratch, max(kv_bytes, 0.0), kv_tokens)


def _per_gpu(sc: Scenario, model: ModelSpec, profile: GPUProfile, draft: ModelSpec | None,
             tp: int, stage: int = 0) -> tuple[float, float, float, int]:
    """Weights, activations, attention scratch (bytes) and KV bytes per token on one GPU
    of a `tp`-way tensor-parallel replica (of pipeline stage `stage`)."""
    max_len = sc.kv.max_model_len or model.max_len
    if sc.scheduler.policy == "static":
        step_tokens = sc.scheduler.max_batch_size * max_len
        rows = sc.scheduler.max_batch_size
        longest = max_len
    else:
        step_tokens = sc.scheduler.max_num_batched_tokens
        rows = sc.scheduler.max_num_seqs
        longest = min(max_len, sc.scheduler.max_num_batched_tokens)
    ops = stage_ops(model.ops(tp, sc.parallel.expert), stage, sc.parallel.pipeline)
    draft_ops = draft.ops(tp) if draft else None
    weights = float(ops.weight_bytes(model.weight_dtype_bytes, model.expert_width)) + (
        draft_ops.weight_bytes(draft.weight_dtype_bytes) if draft_ops else 0)
    kv_per_token = ops.kv_split(model.kv_dtype_bytes, max_len)[0] + (
        draft_ops.kv_bytes_per_token(draft.kv_dtype_bytes) if draft_ops else 0)
    if sc.speculative.method == "mtp":  # the MTP module: one more layer and its projection
        layer = sum(op.params for op in ops.layer) + 2 * model.hidden * model.hidden
        weights += layer * model.weight_dtype_bytes
        kv_per_token += round(sum(op.cache for op in ops.layer) * model.kv_dtype_bytes)
    # bf16 activations (also with fp8 weights) of one layer at a time; fp32 logits over
    # the whole vocabulary (gathered on the first GPU of the group)
    activations = ops.activation_bytes(step_tokens, rows)
    heads, kv_heads, head_dim = ops.find("attention").shape
    scratch, _ = profile.prefill_attn_mem_bytes(
        sc.attention.prefill, 1, longest, heads, kv_heads, head_dim
    )
    return weights, activations, scratch, kv_per_token


def _window_bytes(sc: Scenario, model: ModelSpec, tp: int, stage: int = 0) -> int:
    """Bytes one sequence's sliding-window layers hold on one GPU at most (0 without
    windows shorter than max_model_len)."""
    ops = stage_ops(model.ops(tp, sc.parallel.expert), stage, sc.parallel.pipeline)
    if not ops.windows:
        return 0
    block = sc.kv.block_size if sc.kv.manager == "paged" else 1
    return ops.kv_split(model.kv_dtype_bytes, sc.kv.max_model_len or model.max_len, block)[1]


def _does_not_fit(sc: Scenario, model: ModelSpec, profile: GPUProfile,
                  draft: ModelSpec | None, usable: float, max_len: int,
                  stage: int = 0) -> SpecError:
    tp, pp = sc.parallel.tensor, sc.parallel.pipeline
    weights, activations, scratch, kv_per_token = _per_gpu(sc, model, profile, draft, tp, stage)
    field = "model" if tp == 1 and pp == 1 else ("parallel.pipeline" if pp > 1 else "parallel.tensor")
    if weights + activations + scratch < usable:
        field = "kv.max_model_len"
    short = weights + activations + scratch + max_len * kv_per_token - usable
    what = model.name + (f" with its draft {draft.name}" if draft else "")
    hints = []
    for t in valid_tensor_degrees(model, profile) if pp == 1 else ():
        w, a, s, k = _per_gpu(sc, model, profile, draft, t)
        if t > tp and w + a + s + max_len * k <= usable and (draft is None or draft.tensor_problem(t) is None):
            hints.append(f"parallel.tensor >= {t}")
            break
    link = profile.facts.interconnect
    if pp == 1 and not hints and link is not None and tp * 2 >= link.gpus_per_node:
        hints.append("parallel.pipeline >= 2 (stages across nodes)")
    if sc.dtype.weights == "bf16" and profile.facts.datasheet_fp8_tflops is not None:
        hints.append("dtype.weights: fp8")
    hints += (["more pipeline stages"] if pp > 1 else []) + ["a smaller kv.max_model_len",
                                                             "a larger GPU"]
    return SpecError(
        sc.file or None, field,
        f"does not fit: weights {weights / GIB:.1f} GiB + activations {(activations + scratch) / GIB:.1f} GiB "
        f"+ KV for one max_model_len sequence {max_len * kv_per_token / GIB:.1f} GiB "
        f"> {usable / GIB:.1f} GiB usable per GPU, {short / GIB:.1f} GiB short "
        f"({what} on {profile.name} at tensor {tp}"
        f"{f', pipeline stage {stage} of {pp}' if pp > 1 else ''}, "
        f"kv.gpu_memory_utilization {sc.kv.gpu_memory_utilization}; allowed: {', '.join(hints)})",
    )
