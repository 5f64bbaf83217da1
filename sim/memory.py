"""GPU memory budget: what is left for the KV cache once weights and activations are in.

KV capacity = GPU memory x gpu_memory_utilization - weights - activation scratch,
where the scratch is what the largest step the scheduler can build allocates
on top of the weights: the activations of its token count (the widest
intermediate is the MLP's gate/up output), the attention call's own scratch
from the profile (flash grows O(N) with the prompt, naive's materialised score
matrix O(N^2)) and fp32 logits for one row per sequence.
"""

from __future__ import annotations

from dataclasses import dataclass

from .models import ModelSpec
from .profiles import GPUProfile
from .scenario import Scenario
from .specload import SpecError

GIB = 1024**3


@dataclass(frozen=True)
class MemoryBudget:
    gpu_bytes: float
    usable_bytes: float
    weight_bytes: float
    activation_bytes: float
    attention_scratch_bytes: float
    kv_bytes: float
    kv_tokens: int

    def as_dict(self) -> dict[str, float]:
        return {k: (v / GIB if k.endswith("_bytes") else v) for k, v in self.__dict__.items()}


def memory_budget(sc: Scenario, model: ModelSpec, profile: GPUProfile,
                  draft: ModelSpec | None = None) -> MemoryBudget:
    """The budget; a speculative draft model adds its weights and its own KV per token."""
    max_len = sc.kv.max_model_len or model.max_len
    if sc.scheduler.policy == "static":
        step_tokens = sc.scheduler.max_batch_size * max_len
        rows = sc.scheduler.max_batch_size
        longest = max_len
    else:
        step_tokens = sc.scheduler.max_num_batched_tokens
        rows = sc.scheduler.max_num_seqs
        longest = min(max_len, sc.scheduler.max_num_batched_tokens)
    gpu = profile.facts.memory_gib * GIB
    usable = gpu * sc.kv.gpu_memory_utilization
    weights = float(model.weight_bytes) + (draft.weight_bytes if draft else 0)
    kv_per_token = model.kv_bytes_per_token + (draft.kv_bytes_per_token if draft else 0)
    act_width = model.hidden * 2 + model.q_dim + 2 * model.kv_dim + 2 * model.ffn
    activations = step_tokens * act_width * model.weight_dtype_bytes + rows * model.vocab * 4
    scratch, _ = profile.prefill_attn_mem_bytes(
        sc.attention.prefill, 1, longest, model.heads, model.kv_heads, model.head_dim
    )
    kv_bytes = usable - weights - activations - scratch
    if sc.kv.num_blocks is not None:
        bs = sc.kv.block_size if sc.kv.manager == "paged" else 1
        kv_tokens = sc.kv.num_blocks * bs
    else:
        if kv_bytes <= 0:
            raise SpecError(
                sc.file or None,
                "model",
                f"{model.name}{' with its draft ' + draft.name if draft else ''} does not fit on {profile.name}: weights {weights / GIB:.1f} GiB + "
                f"activations {(activations + scratch) / GIB:.1f} GiB > {usable / GIB:.1f} GiB usable "
                f"at kv.gpu_memory_utilization {sc.kv.gpu_memory_utilization} "
                "(allowed: a smaller model, a larger GPU, or smaller scheduler limits)",
            )
        kv_tokens = int(kv_bytes // kv_per_token)
    return MemoryBudget(gpu, usable, weights, activations, scratch, max(kv_bytes, 0.0), kv_tokens)
