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


def _summary(**kw) -> dict:
    s = {"preemptions": 0, "requests": {"rejected": 0}, "kv": {"util_peak": 0.5},
         "gpu_busy_fraction": 0.99, "gpu_kernel_fraction": 0.9, "iterations": {"total": 100},
         "total_token_throughput": 1000.0, "duration_s": 10.0,  # 100 tokens per iteration
         "ttft_s": {"p99": 2.0}, "queue_s": {"p99": 0.1}}
    return {**s, **kw}


def test_binding_names_the_slo_that_broke_and_a_long_prefill_as_prefill_time():
    from sim.planning.plan import binding

    # p99 TTFT of 2 s of which 0.1 s waiting: the prefill itself, whatever the decode
    # steps' roofline says (100 tokens per iteration: memory bandwidth)
    assert binding(_summary(), "h200-sxm") == "memory bandwidth"  # no SLO given: as before
    assert binding(_summary(), "h200-sxm", ["p99 TTFT 2 s > 1 s"]) == "p99 TTFT: prefill time"
    waited = _summary(queue_s={"p99": 1.5})
    assert binding(waited, "h200-sxm", ["p99 TTFT 2 s > 1 s"]) == "p99 TTFT: memory bandwidth"
    assert binding(_summary(), "h200-sxm", ["p99 TPOT 0.08 s > 0.06 s", "p99 TTFT 2 s > 1 s"]) \
        == "p99 TPOT: memory bandwidth"
    assert binding(_summary(preemptions=2), "h200-sxm", ["p99 E2E 30 s > 20 s"]) == "p99 E2E: KV capacity"
    assert binding(_summary(gpu_busy_fraction=0.3), "h200-sxm",
                   ["steady throughput 70% of offered < 90%"]) == "steady throughput: queueing"
