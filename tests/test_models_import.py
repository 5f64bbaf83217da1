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

# Mixture-of-Experts configs (the public Hugging Face config.json files' keys and values)
MIXTRAL_8X7B = {  # mistralai/Mixtral-8x7B-v0.1
    "_name_or_path": "mistralai/Mixtral-8x7B-v0.1", "architectures": ["MixtralForCausalLM"],
    "hidden_act": "silu", "hidden_size": 4096, "intermediate_size": 14336,
    "max_position_embeddings": 32768, "model_type": "mixtral", "num_attention_heads": 32,
    "num_experts_per_tok": 2, "num_hidden_layers": 32, "num_key_value_heads": 8,
    "num_local_experts": 8, "rms_norm_eps": 1e-05, "rope_theta": 1000000.0,
    "router_aux_loss_coef": 0.02, "sliding_window": None, "tie_word_embeddings": False,
    "vocab_size": 32000,
}
QWEN3_30B_A3B = {  # Qwen/Qwen3-30B-A3B
    "_name_or_path": "Qwen/Qwen3-30B-A3B", "architectures": ["Qwen3MoeForCausalLM"],
    "attention_bias": False, "decoder_sparse_step": 1, "head_dim": 128, "hidden_size": 2048,
    "intermediate_size": 6144, "max_position_embeddings": 40960, "mlp_only_layers": [],
    "model_type": "qwen3_moe", "moe_intermediate_size": 768, "norm_topk_prob": True,
    "num_attention_heads": 32, "num_experts": 128, "num_experts_per_tok": 8,
    "num_hidden_layers": 48, "num_key_value_heads": 4, "rope_theta": 1000000.0,
    "sliding_window": None, "tie_word_embeddings": False, "use_sliding_window": False,
    "vocab_size": 151936,
}
QWEN3_235B_A22B = {**QWEN3_30B_A3B, "_name_or_path": "Qwen/Qwen3-235B-A22B",  # the keys that differ
                   "hidden_size": 4096, "intermediate_size": 12288, "moe_intermediate_size": 1536,
                   "num_attention_heads": 64, "num_hidden_layers": 94}
DEEPSEEK_V3 = {  # deepseek-ai/DeepSeek-V3 (DeepSeek-R1's is the same but for its name)
    "_name_or_path": "deepseek-ai/DeepSeek-V3", "architectures": ["DeepseekV3ForCausalLM"],
    "attention_bias": False, "first_k_dense_replace": 3, "hidden_act": "silu",
    "hidden_size": 7168, "intermediate_size": 18432, "kv_lora_rank": 512,
    "max_position_embeddings": 163840, "model_type": "deepseek_v3",
    "moe_intermediate_size": 2048, "moe_layer_freq": 1, "n_group": 8, "n_routed_experts": 256,
    "n_shared_experts": 1, "norm_topk_prob": True, "num_attention_heads": 128,
    "num_experts_per_tok": 8, "num_hidden_layers": 61, "num_key_value_heads": 128,
    "num_nextn_predict_layers": 1, "q_lora_rank": 1536, "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64, "rope_theta": 10000, "routed_scaling_factor": 2.5,
    "scoring_func": "sigmoid", "tie_word_embeddings": False, "topk_group": 4,
    "topk_method": "noaux_tc", "v_head_dim": 128, "vocab_size": 129280,
    "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "type": "yarn",
                     "original_max_position_embeddings": 4096},
}
GPT_OSS_120B = {  # openai/gpt-oss-120b
    "architectures": ["GptOssForCausalLM"], "attention_bias": True, "experts_per_token": 4,
    "head_dim": 64, "hidden_size": 2880, "intermediate_size": 2880,
    "layer_types": ["sliding_attention", "full_attention"] * 18, "max_position_embeddings": 131072,
    "model_type": "gpt_oss", "num_attention_heads": 64, "num_experts_per_tok": 4,
    "num_hidden_layers": 36, "num_key_value_heads": 8, "num_local_experts": 128,
    "sliding_window": 128, "tie_word_embeddings": False, "vocab_size": 201088,
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
    ({"model_type": "gpt2"}, "model_type 'gpt2' is not a decoder llmsim can express"),
    ({**QWEN3_30B_A3B, "decoder_sparse_step": 2}, "decoder_sparse_step: 2: MoE every n-th layer"),
    ({**QWEN3_30B_A3B, "mlp_only_layers": [0, 1]}, "mlp_only_layers: dense layers between"),
    ({**QWEN3_30B_A3B, "model_type": "qwen2_moe", "shared_expert_intermediate_size": 1000},
     "shared_expert_intermediate_size: 1000 is not a whole number of experts"),
])
def test_what_cannot_be_expressed_is_refused_in_one_line(tmp_path, refused, extra, needle):
    cfg = write(tmp_path, {**LLAMA_31_8B, **extra})
    before = tree(tmp_path)
    refused(["models", "import", str(cfg), "--out", str(tmp_path / "m.yaml")], tmp_path,
            "allowed:", needle)
    assert tree(tmp_path) == before  # nothing written


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


# ---- Mixture-of-Experts and latent attention ------------------------------------------------

@pytest.mark.parametrize(("cfg", "shipped"), [
    (MIXTRAL_8X7B, "mixtral-8x7b"), (QWEN3_30B_A3B, "qwen3-30b-a3b"),
    (DEEPSEEK_V3, "deepseek-v3"), (QWEN3_235B_A22B, "qwen3-235b-a22b"),
    ({**DEEPSEEK_V3, "_name_or_path": "deepseek-ai/DeepSeek-R1"}, "deepseek-r1")])
def test_moe_configs_import_to_the_shipped_model_files(tmp_path, llmsim, cfg, shipped):
    out = tmp_path / f"{shipped}.yaml"
    r = llmsim("models", "import", str(write(tmp_path, cfg)), "--out", str(out))
    assert r.returncode == 0, r.stderr
    m, ship = load_model(str(out)), load_model(shipped)
    for f in ("layers", "hidden", "heads", "kv_heads", "head_dim", "vocab", "num_experts",
              "num_experts_per_tok", "moe_intermediate_size", "n_shared_experts",
              "first_k_dense_replace", "kv_lora_rank", "q_lora_rank", "qk_rope_head_dim",
              "qk_nope_head_dim", "v_head_dim", "max_len", "tied_embeddings"):
        assert getattr(m, f) == getattr(ship, f), f
    assert m.params == ship.params and m.kv_bytes_per_token == ship.kv_bytes_per_token


def test_mixtral_imports_with_its_published_46_7_b_and_expert_width(tmp_path, llmsim):
    out = tmp_path / "mx.yaml"
    assert llmsim("models", "import", str(write(tmp_path, MIXTRAL_8X7B)), "--out",
                  str(out)).returncode == 0
    m = load_model(str(out))
    assert (m.num_experts, m.num_experts_per_tok, m.moe_intermediate_size) == (8, 2, 14336)
    # by hand: attention 4096 x (2 x 4096 + 2 x 1024) per layer, 8 experts of 3 x 4096 x 14336,
    # the router 4096 x 8, 2 norms; embeddings 2 x 32000 x 4096; the final norm
    per_layer = 4096 * (2 * 4096 + 2 * 1024) + 8 * 3 * 4096 * 14336 + 4096 * 8 + 2 * 4096
    assert m.params == 32 * per_layer + 2 * 32000 * 4096 + 4096  # 46.70 B


def test_deepseek_v3_imports_latent_attention_shared_experts_and_says_what_it_leaves_out(
        tmp_path, llmsim):
    out = tmp_path / "ds.yaml"
    assert llmsim("models", "import", str(write(tmp_path, DEEPSEEK_V3)), "--out",
                  str(out)).returncode == 0
    m, text = load_model(str(out)), out.read_text()
    assert m.head_dim == 192 and m.kv_lora_rank == 512 and m.n_shared_experts == 1
    assert m.kv_bytes_per_token == 61 * 576 * 2  # the latent and the rope key, bf16
    assert round(m.params / 1e9) == 671
    assert "group-limited routing" in text and "num_nextn_predict_layers 1" in text


def test_qwen3_235b_a22b_has_its_published_235_b_and_22_b_active(tmp_path):
    m = load_model("qwen3-235b-a22b")  # Qwen3 technical report: 235 B total, 22 B activated
    assert round(m.params / 1e9) == 235
    assert round(m.active_params / 1e9) == 22
