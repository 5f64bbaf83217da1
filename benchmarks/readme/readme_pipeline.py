"""README block of "Pipeline parallelism" (benchmarks/readme/readme_results.py): Llama-3.1-405B
on one H200 node at TP 8 against two nodes at TP 8 x PP 2 (scenarios/llama405b_tp8_pp2.yaml
as shipped and with `parallel.pipeline: 1`), at the shipped rate and twice it."""

from __future__ import annotations

from benchmarks.readme.readme_format import grouped, ms, pct, table
from benchmarks.readme.readme_runs import Runs

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
