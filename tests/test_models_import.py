"""`llmsim models import config.json`: a Hugging Face config as a model file; the Llama-3.1
and Qwen3 model files. Known answers are the configs' own values (hand-copied below from
meta-llama/Llama-3.1-8B and Qwen/Qwen3-32B) and parameter counts worked by hand."""

from __future__ import annotations

import json

import pytest

from sim.costmodel.models import load_model
from tests.conftest import tree

LLAMA_31_8B = {  # meta-llama/Llama-3.1-8B config.json (the keys llmsim reads, and some it ignores)
    "_name_or_path": "meta-llama/Llama-3.1-8B", "architectures": ["LlamaForCausalLM"],
    "attention_bias": False, "hidden_act": "silu", "hidden_size": 4096,
    "intermediate_size": 14336, "max_position_embeddings": 131072, "model_type": "llama",
    "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
    "rms_norm_eps": 1e-05, "rope_scaling": {"factor": 8.0, "rope_type": "llama3"},
    "rope_theta": 500000.0, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "vocab_size": 128256,
}
QWEN3_32B = {  # Qwen/Qwen3-32B config.json
    "architectures": ["Qwen3ForCausalLM"], "attention_bias": False, "head_dim": 128,
    "hidden_act": "silu", "hidden_size": 5120, "intermediate_size": 25600,
    "max_position_embeddings": 40960, "model_type": "qwen3", "num_attention_heads": 64,
    "num_hidden_layers": 64, "num_key_value_heads": 8, "rope_theta": 1000000,
    "tie_word_embeddings": False, "vocab_size": 151936,
}


def write(tmp_path, cfg, name="config.json"):
    p = tmp_path / name
    p.write_text(json.dumps(cfg) if isinstance(cfg, dict) else cfg)
    return p


def dense_params(L, H, heads, kv, d, F, V, tied=False):
    """By hand: embeddings (+ LM head), per layer q/o (H x heads*d), k/v (H x kv*d),
    gate/up/down (3 H F), two RMSNorms; the final norm."""
    per_layer = 2 * H * heads * d + 2 * H * kv * d + 3 * H * F + 2 * H
    return V * H * (1 if tied else 2) + L * per_layer + H


def test_llama_31_8b_config_gives_its_known_architecture(tmp_path, llmsim):
    out = tmp_path / "llama-3.1-8b.yaml"
    r = llmsim("models", "import", str(write(tmp_path, LLAMA_31_8B)), "--out", str(out))
    assert r.returncode == 0, r.stderr
    m = load_model(str(out))
    assert (m.name, m.hidden, m.layers, m.heads, m.kv_heads, m.head_dim, m.ffn, m.vocab,
            m.max_len, m.tied_embeddings, m.qkv_bias, m.gated_mlp) == (
        "llama-3.1-8b", 4096, 32, 32, 8, 128, 14336, 128256, 131072, False, False, True)
    assert m.source == "meta-llama/Llama-3.1-8B"
    assert "rope_theta 500000" in out.read_text()  # recorded, not used by the cost model
    shipped = load_model("llama-3.1-8b")
    assert m.params == shipped.params == dense_params(32, 4096, 32, 8, 128, 14336, 128256)


def test_qwen3_keeps_its_own_head_dim(tmp_path, llmsim):
    out = tmp_path / "q.yaml"
    r = llmsim("models", "import", str(write(tmp_path, QWEN3_32B)), "--out", str(out))
    assert r.returncode == 0, r.stderr
    m, shipped = load_model(str(out)), load_model("qwen3-32b")
    assert m.head_dim == 128 and m.q_dim == 8192 != m.hidden  # 64 x 128, hidden 5120
    assert m.params == shipped.params == dense_params(64, 5120, 64, 8, 128, 25600, 151936)
    assert "q_norm" in out.read_text()  # what is left out is said


def test_defaults_head_dim_from_hidden_and_kv_heads_from_heads_and_qwen2_biases(tmp_path):
    from sim.costmodel.hf_config import model_fields

    cfg = {k: v for k, v in LLAMA_31_8B.items() if k != "num_key_value_heads"}
    f, _ = model_fields(cfg, "mha")
    assert f["kv_heads"] == 32 and f["head_dim"] == 128
    f, _ = model_fields({**LLAMA_31_8B, "model_type": "qwen2"}, "q2")
    assert f["qkv_bias"] is True


@pytest.mark.parametrize(("extra", "needle"), [
    ({"num_local_experts": 8, "model_type": "mixtral"}, "num_local_experts: a Mixture-of-Experts"),
    ({"num_experts": 128, "model_type": "qwen3_moe"}, "num_experts: a Mixture-of-Experts"),
    ({"n_routed_experts": 256, "kv_lora_rank": 512, "model_type": "deepseek_v3"}, "n_routed_experts"),
    ({"kv_lora_rank": 512, "model_type": "deepseek_v2"}, "latent-attention (MLA)"),
    ({"model_type": "gpt2"}, "model_type 'gpt2' is not a Llama-style decoder"),
])
def test_what_cannot_be_expressed_is_refused_in_one_line(tmp_path, refused, extra, needle):
    cfg = write(tmp_path, {**LLAMA_31_8B, **extra})
    refused(["models", "import", str(cfg), "--out", str(tmp_path / "m.yaml")], tmp_path,
            "not expressible yet" if "expert" in needle or "MLA" in needle else "allowed:", needle)


@pytest.mark.parametrize(("text", "needle"), [
    ("{not json", "not valid JSON: line 1 column 2"),
    ("[1, 2]", "is a JSON list, not an object"),
    (json.dumps({k: v for k, v in LLAMA_31_8B.items() if k != "vocab_size"}), "vocab_size: missing"),
    (json.dumps({**LLAMA_31_8B, "num_hidden_layers": "32"}), "num_hidden_layers: '32' is not a positive integer"),
    (json.dumps({**LLAMA_31_8B, "num_key_value_heads": 5}), "kv_heads: 5 does not divide heads=32"),
])
def test_bad_configs_are_one_line_and_exit_2(tmp_path, refused, text, needle):
    refused(["models", "import", str(write(tmp_path, text)), "--out", str(tmp_path / "m.yaml")],
            tmp_path, needle)


def test_an_existing_file_is_replaced_only_with_force_and_only_if_import_wrote_it(tmp_path, refused,
                                                                                llmsim):
    cfg, out = write(tmp_path, LLAMA_31_8B), tmp_path / "m.yaml"
    assert llmsim("models", "import", str(cfg), "--out", str(out)).returncode == 0
    refused(["models", "import", str(cfg), "--out", str(out)], tmp_path, "exists", "--force")
    first = out.read_text()
    cfg.write_text(json.dumps({**LLAMA_31_8B, "max_position_embeddings": 8192}))
    assert llmsim("models", "import", str(cfg), "--out", str(out), "--force").returncode == 0
    assert out.read_text() != first and load_model(str(out)).max_len == 8192
    mine = tmp_path / "mine.yaml"
    mine.write_text("# my own model file\n")
    refused(["models", "import", str(cfg), "--out", str(mine), "--force"], tmp_path,
            "was not written by llmsim")


def test_name_and_out_must_agree(tmp_path, refused):
    cfg = write(tmp_path, LLAMA_31_8B)
    before = tree(tmp_path)
    refused(["models", "import", str(cfg), "--name", "a", "--out", str(tmp_path / "b.yaml")],
            tmp_path, "--name: a: differs from the --out file's name 'b'")
    assert tree(tmp_path) == before


@pytest.mark.parametrize(("name", "L", "H", "heads", "F"), [
    ("llama-3.1-70b", 80, 8192, 64, 28672), ("llama-3.1-405b", 126, 16384, 128, 53248)])
def test_llama_31_files_have_128k_windows_and_their_known_sizes(name, L, H, heads, F):
    m = load_model(name)
    assert m.max_len == 131072 and m.kv_heads == 8 and m.vocab == 128256
    assert m.params == dense_params(L, H, heads, 8, 128, F, 128256)
    assert round(load_model("llama-3.1-405b").params / 1e9, 2) == 405.85  # Meta: "405B"
