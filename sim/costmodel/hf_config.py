"""A Hugging Face `config.json` as a model file (`llmsim models import`).

The fields of a `ModelSpec` (sim/costmodel/models.py) are read from the config's own keys:

    layers <- num_hidden_layers          hidden <- hidden_size
    heads <- num_attention_heads         kv_heads <- num_key_value_heads (absent: heads, MHA)
    head_dim <- head_dim (absent or null: hidden_size / num_attention_heads)
    ffn <- intermediate_size             vocab <- vocab_size
    max_len <- max_position_embeddings   tied_embeddings <- tie_word_embeddings (absent: false)
    qkv_bias <- attention_bias (qwen2: always true)

Mixture-of-Experts configs add (sim/costmodel/moe.py):

    num_experts <- n_routed_experts | num_local_experts | num_experts
    num_experts_per_tok <- num_experts_per_tok
    moe_intermediate_size <- moe_intermediate_size (mixtral: intermediate_size, each expert's)
    n_shared_experts <- n_shared_experts (qwen2_moe: shared_expert_intermediate_size /
                        moe_intermediate_size, when whole)
    first_k_dense_replace <- first_k_dense_replace (the leading dense layers)

and DeepSeek's latent attention (MLA) its kv_lora_rank, q_lora_rank (null: 0),
qk_rope_head_dim, qk_nope_head_dim and v_head_dim, with head_dim = nope + rope.

Sliding-window attention, as configs state it: `layer_types` (full_attention |
sliding_attention per layer; gpt-oss, and Gemma 2/3 and Qwen in recent transformers) with
`sliding_window` its size; or, without layer_types, a `sliding_window` that applies to every
layer (Mistral 7B v0.1) -> sliding_window, layer_types. Qwen's `use_sliding_window: false`
turns its sliding_window off; `use_sliding_window: true` (sliding layers from
max_window_layers on) and Gemma 3's `sliding_window_pattern` without layer_types are refused.
gpt-oss adds attention sinks (attention_sinks: true; no config key: the architecture has
them) and MXFP4 experts (quantization_config.quant_method mxfp4 -> expert_dtype_bytes 0.53125,
4-bit values and an 8-bit scale per 32 of them; the attention, router, embedding and LM head
stay bf16, as its modules_to_not_convert lists).

Only what the cost model can express is imported (pre-norm RMSNorm, gated SwiGLU MLP or
experts, rotary attention over the whole context or a sliding window): model_type llama,
mistral, qwen2, qwen3, mixtral, qwen3_moe, qwen2_moe, deepseek_v2, deepseek_v3, gpt_oss.
Anything else is refused with one line saying why: another model_type, MoE layers that are
not every layer after the dense ones (decoder_sparse_step, mlp_only_layers, moe_layer_freq),
a shared expert whose width is not a whole number of experts, a layer type other than full
or sliding attention. What the cost model ignores (rope_theta, rope scaling, Qwen3's q/k
norms, group-limited routing, the MTP layer, gpt-oss's biases and clamped SwiGLU) is written
as a comment in the file.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from sim.costmodel.models import ModelSpec
from sim.io.specload import SpecError, build, read_text, show

MOE_KEYS = ("n_routed_experts", "num_local_experts", "num_experts")
MLA_KEYS = ("kv_lora_rank", "q_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim")
_QK_NORM = "per-head RMSNorm on q and k (q_norm, k_norm) not modelled"
_GROUPS = "group-limited routing (n_group, topk_group) not modelled: routing is uniform"
# model_type -> (qkv bias when the config has no attention_bias, what the cost model leaves out)
FAMILIES = {
    "llama": (False, ""),
    "mistral": (False, ""),
    "qwen2": (True, ""),
    "qwen3": (False, _QK_NORM),
    "mixtral": (False, ""),
    "qwen2_moe": (True, "the shared expert's sigmoid gate not modelled"),
    "qwen3_moe": (False, _QK_NORM),
    "deepseek_v2": (False, _GROUPS),
    "deepseek_v3": (False, _GROUPS),
    "gpt_oss": (True, "the o, router and expert biases (0.04 B of gpt-oss-120b's 117 B) not "
                "counted; its clamped SwiGLU priced as SiLU·mul"),
}
SINKS = ("gpt_oss",)  # model types whose attention has a learned sink logit per head
# quantization_config.quant_method -> bytes per routed-expert weight: MXFP4 (OCP
# Microscaling spec v1.0: 32 FP4 E2M1 values share one E8M0 scale, (32 x 4 + 8) / 32 bits)
EXPERT_QUANT_BYTES = {"mxfp4": 0.53125}
_LAYER_TYPES = ("full_attention", "sliding_attention")
_MAX_CONFIG_BYTES = 2**20


def read_config(path: str | Path) -> dict[str, Any]:
    """The config.json as a mapping; bad JSON is one SpecError naming the file."""
    text = read_text(path, max_bytes=_MAX_CONFIG_BYTES)
    try:
        cfg = json.loads(text)
    except json.JSONDecodeError as e:
        raise SpecError(path, "", f"not valid JSON: line {e.lineno} column {e.colno}: {e.msg} "
                                  "(allowed: a Hugging Face config.json)") from None
    if not isinstance(cfg, dict):
        raise SpecError(path, "", f"is a JSON {type(cfg).__name__}, not an object "
                                  "(allowed: a Hugging Face config.json)")
    return cfg


def _int(cfg: dict, key: str, file: Any) -> int:
    v = cfg.get(key)
    if v is None:
        raise SpecError(file, key, "missing (allowed: a positive integer, as in the model's config.json)")
    if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
        raise SpecError(file, key, f"{show(v)} is not a positive integer")
    return v


def unsupported(cfg: dict) -> tuple[str, str] | None:
    """(the config key, why) this config cannot be a model file, or None."""
    kind = cfg.get("model_type")
    if kind not in FAMILIES:
        return "model_type", (f"model_type {show(kind)} is not a decoder llmsim can express "
                              f"(allowed: {', '.join(FAMILIES)})")
    if cfg.get("decoder_sparse_step", 1) != 1:
        return "decoder_sparse_step", (f"{show(cfg['decoder_sparse_step'])}: MoE every n-th "
                                       "layer is not expressible (allowed: 1)")
    if cfg.get("mlp_only_layers"):
        return "mlp_only_layers", ("dense layers between MoE layers are not expressible "
                                   "(allowed: [], or leading dense layers as first_k_dense_replace)")
    if cfg.get("moe_layer_freq", 1) != 1:
        return "moe_layer_freq", (f"{show(cfg['moe_layer_freq'])}: MoE every n-th layer is not "
                                  "expressible (allowed: 1)")
    if cfg.get("use_sliding_window") is True:
        return "use_sliding_window", ("true: sliding layers chosen by max_window_layers are not "
                                      "expressible (allowed: false, or layer_types)")
    types = cfg.get("layer_types")
    if types is not None:
        if not isinstance(types, list):
            return "layer_types", f"{show(types)} is not a list (allowed: one type per layer)"
        bad = next((t for t in types if t not in _LAYER_TYPES), None)
        if bad is not None:
            return "layer_types", (f"{show(bad)}: only full and sliding-window attention are "
                                   f"expressible (allowed: {', '.join(_LAYER_TYPES)})")
    elif cfg.get("sliding_window_pattern"):
        return "sliding_window_pattern", ("without layer_types is not read (allowed: a config "
                                          "with layer_types)")
    return None


def _experts(cfg: dict, file: Any) -> dict[str, Any]:
    """The MoE fields of a MoE config ({} for a dense one)."""
    key = next((k for k in MOE_KEYS if cfg.get(k)), None)
    if key is None:
        return {}
    own_width = cfg["model_type"] in ("mixtral", "gpt_oss")  # intermediate_size is each expert's
    width_key = "intermediate_size" if own_width else "moe_intermediate_size"
    width = _int(cfg, width_key, file)
    out = {"num_experts": _int(cfg, key, file),
           "num_experts_per_tok": _int(cfg, "num_experts_per_tok", file),
           "moe_intermediate_size": width}
    if cfg.get("n_shared_experts"):
        out["n_shared_experts"] = _int(cfg, "n_shared_experts", file)
    elif cfg.get("shared_expert_intermediate_size"):
        shared = _int(cfg, "shared_expert_intermediate_size", file)
        if shared % width:
            raise SpecError(file, "shared_expert_intermediate_size", f"{shared} is not a whole "
                            f"number of experts of moe_intermediate_size={width} (allowed: a "
                            "multiple)")
        out["n_shared_experts"] = shared // width
    if cfg.get("first_k_dense_replace"):
        out["first_k_dense_replace"] = _int(cfg, "first_k_dense_replace", file)
    return out


def _windows(cfg: dict, file: Any) -> dict[str, Any]:
    """The sliding-window fields ({} when every layer attends over the whole context)."""
    if cfg.get("use_sliding_window") is False or cfg.get("sliding_window") is None:
        if "sliding_attention" in (cfg.get("layer_types") or ()):
            raise SpecError(file, "sliding_window", "missing with sliding_attention layers "
                            "(allowed: a positive integer)")
        return {}
    window = _int(cfg, "sliding_window", file)
    types = cfg.get("layer_types")
    if types is None:  # Mistral-style: every layer
        return {"sliding_window": window}
    if "sliding_attention" not in types:
        return {}
    return {"sliding_window": window, "layer_types": list(types)}


def _quant(cfg: dict) -> dict[str, Any]:
    """The routed experts' weight width from quantization_config ({} for one not read)."""
    q = cfg.get("quantization_config")
    method = q.get("quant_method") if isinstance(q, dict) else None
    if method in EXPERT_QUANT_BYTES and any(cfg.get(k) for k in MOE_KEYS):
        return {"expert_dtype_bytes": EXPERT_QUANT_BYTES[method]}
    return {}


def _latent(cfg: dict, file: Any) -> dict[str, Any]:
    """The latent-attention (MLA) fields of a DeepSeek config ({} without kv_lora_rank)."""
    if not cfg.get("kv_lora_rank"):
        return {}
    out = {k: _int(cfg, k, file) for k in MLA_KEYS if k != "q_lora_rank"}
    out["q_lora_rank"] = _int(cfg, "q_lora_rank", file) if cfg.get("q_lora_rank") else 0
    return out


def model_fields(cfg: dict, name: str, *, file: Any = None, source: str | None = None
                 ) -> tuple[dict[str, Any], list[str]]:
    """The model file's fields for `cfg` under `name`, and its comment lines. Checked as a
    `ModelSpec` would be on load (SpecError naming the config file and key)."""
    why = unsupported(cfg)
    if why:
        raise SpecError(file, *why)
    bias_default, left_out = FAMILIES[cfg["model_type"]]
    heads, hidden = _int(cfg, "num_attention_heads", file), _int(cfg, "hidden_size", file)
    kv_heads = _int(cfg, "num_key_value_heads", file) if "num_key_value_heads" in cfg else heads
    latent = _latent(cfg, file)
    if latent:
        head_dim = latent["qk_nope_head_dim"] + latent["qk_rope_head_dim"]
    elif cfg.get("head_dim") is not None:
        head_dim = _int(cfg, "head_dim", file)
    elif hidden % heads:
        raise SpecError(file, "head_dim", f"missing, and hidden_size={hidden} is not a multiple "
                                          f"of num_attention_heads={heads} (allowed: head_dim)")
    else:
        head_dim = hidden // heads
    for key in ("tie_word_embeddings", "attention_bias"):
        if key in cfg and not isinstance(cfg[key], bool):
            raise SpecError(file, key, f"{show(cfg[key])} is not true or false")
    fields = {
        "name": name,
        "layers": _int(cfg, "num_hidden_layers", file),
        "hidden": hidden, "heads": heads, "kv_heads": kv_heads, "head_dim": head_dim,
        "ffn": _int(cfg, "intermediate_size", file),
        "gated_mlp": True,
        "vocab": _int(cfg, "vocab_size", file),
        "tied_embeddings": bool(cfg.get("tie_word_embeddings", False)),
        "weight_dtype_bytes": 2,
        "kv_dtype_bytes": 2,
        "max_len": _int(cfg, "max_position_embeddings", file),
        "qkv_bias": bool(cfg.get("attention_bias", bias_default)) or cfg["model_type"] == "qwen2",
        **_experts(cfg, file),
        **latent,
        **_windows(cfg, file),
        **({"attention_sinks": True} if cfg["model_type"] in SINKS else {}),
        **_quant(cfg),
        "source": source or str(cfg.get("_name_or_path") or file),
    }
    spec = build(ModelSpec, fields, file=file)  # the loader's own checks (kv_heads | heads, ...)
    experts = (f", {spec.expert_dtype_bytes} bytes per expert weight" if spec.expert_dtype_bytes
               else "")
    notes = [f"model_type {cfg['model_type']}; {_attention(spec)}{_moe(spec)}, "
             f"{spec.params / 1e9:.2f}B parameters, bf16 weights and KV{experts} (set dtype in "
             "a scenario)"]
    ignored = [f"{k} {show(cfg[k])}" for k in ("rope_theta", "rope_scaling")
               if cfg.get(k) is not None]
    if cfg.get("sliding_window") is not None and not spec.sliding_window:
        ignored.append(f"sliding_window {cfg['sliding_window']} (use_sliding_window false)")
    if cfg.get("num_nextn_predict_layers"):
        ignored.append(f"num_nextn_predict_layers {cfg['num_nextn_predict_layers']} (the MTP "
                       "layer's weights; as a proposer: speculative.method mtp)")
    if ignored or left_out:
        notes.append("not used by the cost model: " + "; ".join(ignored + ([left_out] if left_out else [])))
    return fields, notes


def _moe(spec: ModelSpec) -> str:
    if not spec.is_moe:
        return ""
    shared = f" + {spec.n_shared_experts} shared" if spec.n_shared_experts else ""
    return (f", {spec.num_experts} experts (top-{spec.num_experts_per_tok}{shared}), "
            f"{spec.active_params / 1e9:.2f}B active")


def _attention(spec: ModelSpec) -> str:
    if spec.kv_lora_rank:
        return (f"latent attention (MLA, {spec.heads} heads, a {spec.kv_lora_rank} + "
                f"{spec.qk_rope_head_dim} latent cached)")
    return _gqa(spec)


def _gqa(spec: ModelSpec) -> str:
    if spec.kv_heads == spec.heads:
        kind = f"multi-head attention ({spec.heads} heads)"
    else:
        kind = f"GQA ({spec.heads} query heads, {spec.kv_heads} KV heads)"
    if spec.sliding_layers:
        kind += (f", {spec.sliding_layers} of {spec.layers} layers over a "
                 f"{spec.sliding_window}-token sliding window")
    return kind + (", attention sinks" if spec.attention_sinks else "")


def model_yaml(fields: dict[str, Any], notes: list[str], config: str | Path) -> str:
    """The model file's text: a comment saying where it came from, then one field a line."""
    head = [f"# Imported by `llmsim models import` from {config}.", *(f"# {n}" for n in notes)]
    body = [f"{k}: {_yaml_value(v)}" for k, v in fields.items()]
    return "\n".join(head + body) + "\n"


def _yaml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float) and math.isfinite(v) and v.is_integer():
        return str(int(v))
    return json.dumps(v) if isinstance(v, (str, list)) else str(v)


IMPORT_MARK = "# Imported by `llmsim models import`"  # the first line of a file it wrote
