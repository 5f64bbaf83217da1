"""A Hugging Face `config.json` as a model file (`llmsim models import`).

The fields of a `ModelSpec` (sim/costmodel/models.py) are read from the config's own keys:

    layers <- num_hidden_layers          hidden <- hidden_size
    heads <- num_attention_heads         kv_heads <- num_key_value_heads (absent: heads, MHA)
    head_dim <- head_dim (absent or null: hidden_size / num_attention_heads)
    ffn <- intermediate_size             vocab <- vocab_size
    max_len <- max_position_embeddings   tied_embeddings <- tie_word_embeddings (absent: false)
    qkv_bias <- attention_bias (qwen2: always true)

Only Llama-style decoders are expressible (pre-norm RMSNorm, gated SwiGLU MLP, rotary
attention): model_type llama, mistral, qwen2, qwen3. A Mixture-of-Experts config (one of
`MOE_KEYS`) or a latent-attention one (`MLA_KEYS`) is refused with one line until the cost
model can express it; so is any other model_type. What the cost model ignores (rope_theta,
rope scaling, a sliding window, Qwen3's q/k norms) is written as a comment in the file.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from sim.costmodel.models import ModelSpec
from sim.io.specload import SpecError, build, read_text, show

MOE_KEYS = ("num_experts", "num_local_experts", "n_routed_experts")
MLA_KEYS = ("kv_lora_rank",)
# model_type -> (qkv bias when the config has no attention_bias, what the cost model leaves out)
FAMILIES = {
    "llama": (False, ""),
    "mistral": (False, ""),
    "qwen2": (True, ""),
    "qwen3": (False, "per-head RMSNorm on q and k (q_norm, k_norm) not modelled"),
}
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


def unsupported(cfg: dict) -> str | None:
    """Why this config cannot be a model file yet, or None."""
    moe = [k for k in MOE_KEYS if cfg.get(k)]
    if moe:
        return (f"a Mixture-of-Experts config ({moe[0]}={show(cfg[moe[0]])}) is not expressible "
                "yet (allowed: a dense or GQA model)")
    mla = [k for k in MLA_KEYS if cfg.get(k)]
    if mla:
        return (f"a latent-attention (MLA) config ({mla[0]}={show(cfg[mla[0]])}) is not "
                "expressible yet (allowed: a dense or GQA model)")
    kind = cfg.get("model_type")
    if kind not in FAMILIES:
        return (f"model_type {show(kind)} is not a Llama-style decoder llmsim can express "
                f"(allowed: {', '.join(FAMILIES)})")
    return None


def model_fields(cfg: dict, name: str, *, file: Any = None, source: str | None = None
                 ) -> tuple[dict[str, Any], list[str]]:
    """The model file's fields for `cfg` under `name`, and its comment lines. Checked as a
    `ModelSpec` would be on load (SpecError naming the config file and key)."""
    why = unsupported(cfg)
    if why:
        key = next((k for k in (*MOE_KEYS, *MLA_KEYS) if cfg.get(k)), "model_type")
        raise SpecError(file, key, why)
    bias_default, left_out = FAMILIES[cfg["model_type"]]
    heads, hidden = _int(cfg, "num_attention_heads", file), _int(cfg, "hidden_size", file)
    kv_heads = _int(cfg, "num_key_value_heads", file) if "num_key_value_heads" in cfg else heads
    if cfg.get("head_dim") is not None:
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
        "source": source or str(cfg.get("_name_or_path") or file),
    }
    spec = build(ModelSpec, fields, file=file)  # the loader's own checks (kv_heads | heads, ...)
    notes = [f"model_type {cfg['model_type']}; {_gqa(spec)}, "
             f"{spec.params / 1e9:.2f}B parameters, bf16 weights and KV (set dtype in a scenario)"]
    ignored = [f"{k} {show(cfg[k])}" for k in ("rope_theta", "rope_scaling", "sliding_window")
               if cfg.get(k) is not None]
    if ignored or left_out:
        notes.append("not used by the cost model: " + "; ".join(ignored + ([left_out] if left_out else [])))
    return fields, notes


def _gqa(spec: ModelSpec) -> str:
    if spec.kv_heads == spec.heads:
        return f"multi-head attention ({spec.heads} heads)"
    return f"GQA ({spec.heads} query heads, {spec.kv_heads} KV heads)"


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
    return json.dumps(v) if isinstance(v, str) else str(v)


IMPORT_MARK = "# Imported by `llmsim models import`"  # the first line of a file it wrote
