"""README block of "Pipeline parallelism" (benchmarks/readme/readme_results.py): Llama-3.1-405B
on one H200 node at TP 8 against two nodes at TP 8 x PP 2 (scenarios/llama405b_tp8_pp2.yaml
as shipped and with `parallel.pipeline: 1`), at the shipped rate and twice it."""

from __future__ import annotations

from benchmarks.readme.readme_format import grouped, ms, pct, table
from benchmarks.readme.readme_runs import SCENARIOS, Runs

SCENARIO = "llama405b_tp8_pp2"
RATES = (2, 4)


def pipeline_405b(runs: Runs) -> str:
    rows = []
    for rate in RATES:
        for pp in (1, 2):
            s = runs.summary(SCENARIO, **{"parallel.pipeline": pp, "workload.arrival.rate": rate})
            stages = (s.get("pipeline") or {}).get("per_stage") or []
            bubble = " / ".join(pct(x["bubble_share"]) for x in stages) or "-"
            cost = (s.get("cost") or {}).get("usd_per_m_output_tokens", {}).get("on_demand")
            rows.append([f"{rate}", f"TP 8 x PP {pp}" if pp > 1 else "TP 8", str(8 * pp),
                         grouped(s["kv"]["capacity_tokens"]), f"{s['request_throughput']:.2f}",
                         f"{ms(s['ttft_s']['p50'])} / {ms(s['ttft_s']['p99'])}",
                         f"{ms(s['tpot_s']['p50'])} / {ms(s['tpot_s']['p99'])}",
                         f"{s['goodput']['requests_per_s']:.2f}", bubble,
                         f"{cost:.1f}" if cost is not None else "-"])
    return table(["req/s offered", "layout", "GPUs", "KV tokens", "finished req/s",
                  "TTFT p50 / p99 (ms)", "TPOT p50 / p99 (ms)", "goodput (req/s)",
                  "stage bubble", "$ / M output tokens"], rows)


# NVIDIA Technical Blog, "Boosting Llama 3.1 405B Throughput by Another 1.5x on NVIDIA H200
# Tensor Core GPUs and NVLink Switch" (2024-10-09): TensorRT-LLM, Llama-3.1-405B FP8 on one
# HGX H200 (8 GPUs): tensor parallel 8 is 5.6x pipeline parallel 8 at minimum latency
# (one user), pipeline parallel 8 is 1.5x tensor parallel 8 at maximum throughput.
PUBLISHED = {"min_latency_tp_over_pp": 5.6, "max_throughput_pp_over_tp": 1.5}
FP8_TRTLLM = {"dtype.weights": "fp8", "runtime": "trtllm"}
LONE = {"workload.num_requests": 1, "workload.prompt": {"kind": "fixed", "value": 2048},
        "workload.output": {"kind": "fixed", "value": 128}}
FLOOD = {"workload.num_requests": 1024, "workload.arrival": {"kind": "constant", "rate": 1000},
         "workload.prompt": {"kind": "fixed", "value": 1024},
         "workload.output": {"kind": "fixed", "value": 256},
         "scheduler.max_num_seqs": 256, "scheduler.max_num_batched_tokens": 8192}


def simulated_ratios() -> dict[str, tuple[float, list[dict]]]:
    """PUBLISHED's two ratios as llmsim runs them: name -> (ratio, the summaries it divides);
    also scored by the accuracy suite (benchmarks/fidelity/accuracy.py, published-ratios)."""
    from sim import run  # lengths as mappings: not the memo's hashable overrides

    def layout(tp: int, pp: int, work: dict) -> dict:
        return run(SCENARIOS / f"{SCENARIO}.yaml", {"parallel.tensor": tp, "parallel.pipeline": pp,
                                                    **FP8_TRTLLM, **work}).summary
    lone_pp, lone_tp = layout(1, 8, LONE), layout(8, 1, LONE)
    flood_pp, flood_tp = layout(1, 8, FLOOD), layout(8, 1, FLOOD)
    return {"min_latency_tp_over_pp": (lone_pp["tpot_s"]["p50"] / lone_tp["tpot_s"]["p50"],
                                       [lone_pp, lone_tp]),
            "max_throughput_pp_over_tp": (flood_pp["output_token_throughput"]
                                          / flood_tp["output_token_throughput"],
                                          [flood_pp, flood_tp])}


def pipeline_published(runs: Runs) -> str:
    sim = simulated_ratios()
    lat, thr = sim["min_latency_tp_over_pp"][0], sim["max_throughput_pp_over_tp"][0]
    rows = [["minimum latency (one request, 2,048 in / 128 out): TP 8 faster than PP 8 by",
             f"{PUBLISHED['min_latency_tp_over_pp']:.1f}x", f"{lat:.1f}x"],
            ["maximum throughput (1,024 requests at once, 1,024 in / 256 out): PP 8 over TP 8",
             f"{PUBLISHED['max_throughput_pp_over_tp']:.1f}x", f"{thr:.2f}x"]]
    return table(["Llama-3.1-405B FP8 on 8 x H200", "published (TensorRT-LLM)", "llmsim (trtllm)"],
                 rows)
