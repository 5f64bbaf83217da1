"""What a plan's candidates and figures are called: labels a planner can tell apart."""

from __future__ import annotations

from sim.planning.candidates import candidate_grid, label


def test_candidate_labels_tell_bf16_from_fp8_weights_and_kv_cache():
    assert label({"gpu": "h100-sxm", "parallel.tensor": 2, "dtype.weights": "fp8"}) == "h100-sxm tp2 fp8"
    assert label({"gpu": "h100-sxm", "parallel.tensor": 2, "dtype.weights": "bf16"}) == "h100-sxm tp2 bf16"
    assert label({"dtype.kv_cache": "fp8"}) == "fp8 KV"
    assert label({"gpu": "h200-sxm", "dtype": {"weights": "fp8", "kv_cache": "fp8"}}) == "h200-sxm fp8 fp8 KV"
    grid = candidate_grid({"gpu": ("h100-sxm",), "dtype.weights": ("bf16", "fp8"),
                           "dtype.kv_cache": ("bf16", "fp8")})
    names = [label(c) for c in grid]
    assert names == ["h100-sxm bf16 bf16 KV", "h100-sxm bf16 fp8 KV", "h100-sxm fp8 bf16 KV",
                     "h100-sxm fp8 fp8 KV"]


def test_other_candidate_labels_are_as_before():
    assert label({"gpu": "h200-sxm", "scheduler.policy": "chunked", "kv.block_size": 32}) == \
        "h200-sxm chunked block_size=32"
    assert label({}) == "base"
