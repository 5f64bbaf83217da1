from __future__ import annotations

import dataclasses

import pytest
import yaml

from sim.costmodel.models import ModelSpec, known_models, load_model
from sim.io.specload import ROOT, SpecError, build

KIB = 1024
GIB = 1024**3

TINY = {
    "name": "tiny",
    "layers": 2,
    "hidden": 256,
    "heads": 4,
    "kv_heads": 2,
    "head_dim": 64,
    "ffn": 688,
    "gated_mlp": True,
    "vocab": 1024,
    "tied_embeddings": False,
    "max_len": 2048,
    "source": "test",
}


def write_model(tmp_path, **changes) -> str:
    data = {**TINY, **changes}
    p = tmp_path / f"{data['name']}.yaml"
    p.write_text(yaml.safe_dump(data))
    return str(p)


# ---- known answers ------------------------------------------------------------------


def test_llama2_7b_fp16_kv_is_512_kib_per_token_and_2_gib_for_4096_tokens():
    m = load_model("llama-2-7b")
    assert m.kv_bytes_per_token == 2 * 32 * 32 * 128 * 2 == 524288 == 512 * KIB
    assert 4096 * m.kv_bytes_per_token == 2 * GIB


def test_llama3_8b_gqa_kv_is_128_kib_per_token():
    assert load_model("llama-3-8b").kv_bytes_per_token == 131072 == 128 * KIB


@pytest.mark.parametrize(
    "name, published",
    [
        ("llama-2-7b", 6.74e9),
        ("llama-2-70b", 68.98e9),
        ("llama-3-8b", 8.03e9),
        ("llama-3.2-1b", 1.24e9),
    ],
)
def test_param_count_matches_published_size_within_half_a_percent(name, published):
    assert load_model(name).params == pytest.approx(published, rel=0.005)


def test_tied_embeddings_drop_the_lm_head_from_params_but_not_from_flops():
    m = load_model("llama-3.2-1b")
    untied = dataclasses.replace(m, tied_embeddings=False)
    assert untied.params - m.params == m.vocab * m.hidden
    assert untied.flops_per_token() == m.flops_per_token()


def test_qkv_bias_adds_one_bias_per_projection_output():
    m = load_model("qwen2.5-7b")
    plain = dataclasses.replace(m, qkv_bias=False)
    assert m.params - plain.params == m.layers * (28 + 2 * 4) * 128


def test_weight_bytes_are_params_times_dtype_bytes():
    m = load_model("llama-3-8b")
    assert m.weight_bytes == 2 * m.params
    assert dataclasses.replace(m, weight_dtype_bytes=0.5).weight_bytes == m.params // 2


def test_fp8_kv_cache_halves_kv_bytes():
    m = load_model("llama-3-8b")
    assert dataclasses.replace(m, kv_dtype_bytes=1).kv_bytes_per_token == 64 * KIB


def test_gemm_shapes_of_llama3_8b():
    shapes = load_model("llama-3-8b").gemm_shapes()
    assert shapes == {
        "qkv": (4096, 6144),
        "o": (4096, 4096),
        "gate_up": (4096, 28672),
        "down": (14336, 4096),
        "lm_head": (4096, 128256),
    }


def test_ungated_mlp_has_one_up_projection():
    m = dataclasses.replace(load_model("tiny-llama"), gated_mlp=False)
    assert m.gemm_shapes()["gate_up"] == (256, 688)


def test_flops_per_token_is_twice_the_matmul_weights_plus_attention():
    m = load_model("tiny-llama")
    matmul = sum(k * n for op, (k, n) in m.gemm_shapes().items() if op != "lm_head")
    matmul = m.layers * matmul + m.hidden * m.vocab
    assert m.flops_per_token() == 2 * matmul
    assert m.flops_per_token(100) - m.flops_per_token() == 4 * 2 * 4 * 64 * 100


def test_llama2_7b_decode_flops_are_about_twice_its_params():
    m = load_model("llama-2-7b")
    assert m.flops_per_token() == pytest.approx(2 * m.params, rel=0.02)


# ---- loading ------------------------------------------------------------------------


def test_every_model_yaml_loads_and_is_named_after_its_file():
    names = sorted(p.stem for p in (ROOT / "models").glob("*.yaml"))
    assert names == known_models()
    for name in names:
        m = load_model(name)
        assert m.name == name
        assert m.source


def test_required_models_are_present():
    required = {
        "llama-2-7b",
        "llama-2-13b",
        "llama-2-70b",
        "llama-3-8b",
        "llama-3-70b",
        "llama-3.2-1b",
        "mistral-7b",
        "qwen2.5-7b",
        "tiny-llama",
    }
    assert required <= set(known_models())


def test_loading_twice_returns_the_cached_spec():
    assert load_model("tiny-llama") is load_model("tiny-llama")


def test_a_yaml_path_loads_that_file(tmp_path):
    m = load_model(write_model(tmp_path))
    assert (m.name, m.layers, m.weight_dtype_bytes, m.qkv_bias) == ("tiny", 2, 2, False)


def test_a_relative_yaml_path_is_taken_from_the_scenario_folder(tmp_path):
    write_model(tmp_path)
    m = load_model("tiny.yaml", file=tmp_path / "scenario.yaml", path="model")
    assert m.name == "tiny"


def test_unknown_model_name_is_one_line_naming_file_path_and_known_models():
    with pytest.raises(SpecError) as e:
        load_model("llama-9", file="scenario.yaml", path="cluster.replicas[0].model")
    text = str(e.value)
    assert "\n" not in text
    assert text.startswith("scenario.yaml: cluster.replicas[0].model: unknown 'llama-9' (known: ")
    assert ", ".join(known_models()) in text


def test_missing_model_file_is_reported_at_the_scenario_field(tmp_path):
    with pytest.raises(SpecError) as e:
        load_model(str(tmp_path / "nope.yaml"), file="s.yaml", path="model")
    assert str(e.value).startswith("s.yaml: model: model file not found")


def test_unknown_key_in_model_yaml_names_the_file_and_key(tmp_path):
    f = write_model(tmp_path, hidden_size=4096)
    with pytest.raises(SpecError) as e:
        load_model(f, file="s.yaml")
    assert e.value.file == str((tmp_path / "tiny.yaml").resolve())
    assert e.value.path == "hidden_size"
    assert "unknown key" in e.value.message


def test_negative_layers_is_rejected(tmp_path):
    with pytest.raises(SpecError) as e:
        load_model(write_model(tmp_path, layers=-2))
    assert e.value.path == "layers"
    assert "out of range" in e.value.message


def test_kv_heads_must_divide_heads():
    with pytest.raises(SpecError) as e:
        build(ModelSpec, {**TINY, "kv_heads": 3}, file="m.yaml")
    assert str(e.value).startswith("m.yaml: kv_heads: 3 does not divide heads=4")


def test_model_name_must_match_its_file_name(tmp_path):
    p = tmp_path / "other.yaml"
    p.write_text(open(write_model(tmp_path)).read())
    with pytest.raises(SpecError) as e:
        load_model(str(p))
    assert (e.value.file, e.value.path) == (str(p.resolve()), "name")


def test_missing_required_field_is_named(tmp_path):
    data = {k: v for k, v in TINY.items() if k != "vocab"}
    with pytest.raises(SpecError) as e:
        build(ModelSpec, data, file="m.yaml")
    assert e.value.path == "vocab"
