"""README blocks about how a deployment is laid out (benchmarks/readme/readme_results.py): the
batching, KV-layout and attention comparisons of "Scenarios", tensor parallelism and
memory feasibility, and clusters of replicas (routers, disaggregated prefill/decode, a
mixed fleet)."""

from __future__ import annotations

import sys
from pathlib import Path

from benchmarks.readme.readme_format import grouped, ms, pct, sig3, table
from benchmarks.readme.readme_runs import ROOT, SCENARIOS, Runs


def scenario_comparisons(runs: Runs) -> str:
    static = runs.summary("batching", **{"scheduler.policy": "static"})
    cont = runs.summary("batching", **{"scheduler.policy": "continuous"})
    contig = runs.summary("kv_paged_vs_contiguous", **{"kv.manager": "contiguous"})
    paged = runs.summary("kv_paged_vs_contiguous", **{"kv.manager": "paged"})
    naive = runs.summary("attention_flash_vs_naive", **{"attention.prefill": "naive"})
    flash = runs.summary("attention_flash_vs_naive", **{"attention.prefill": "flash"})
    rows = [
        ["static vs continuous batching (600 ShareGPT requests at 3.5 req/s, `vllm` runtime)",
         f"static serves {static['request_throughput']:.2f} req/s and queues (TTFT p50 "
         f"{static['ttft_s']['p50']:.0f} s); continuous serves {cont['request_throughput']:.2f} "
         f"req/s with TTFT p50 {cont['ttft_s']['p50']:.2f} s"],
        ["contiguous vs paged KV (Llama-2-13B, 4k window, 20 req/s)",
         f"contiguous: {pct(contig['kv']['reserved_unused_share'])} of reserved KV never holds a "
         "token (the vLLM paper measured 62-80 % in earlier systems), "
         f"{contig['mean_batch_size']:.0f} requests in flight, "
         f"{contig['request_throughput']:.1f} req/s; paged: "
         f"{pct(paged['kv']['reserved_unused_share'], 1)} waste, {paged['mean_batch_size']:.0f} "
         f"in flight, {paged['request_throughput']:.1f} req/s"],
        ["naive vs flash prefill (arXiv prompts up to 8k)",
         f"naive's 8k-token score matrix takes "
         f"{naive['memory_gib']['attention_scratch_gib']:.0f} GiB of scratch, cutting the KV "
         f"cache from {flash['kv']['capacity_tokens'] / 1e3:.0f}k to "
         f"{naive['kv']['capacity_tokens'] / 1e3:.0f}k tokens, and multiplies TTFT p50 by "
         f"{naive['ttft_s']['p50'] / flash['ttft_s']['p50']:.1f} "
         f"({ms(naive['ttft_s']['p50'])} vs {ms(flash['ttft_s']['p50'])} ms)"],
    ]
    return table(["comparison", "result"], rows)


TP_GPUS = [("a100-80gb", "A100 80GB", (1, 2, 4, 8)), ("h100-sxm", "H100 SXM", (2, 4, 8)),
           ("h200-sxm", "H200 SXM", (2, 4, 8))]


def tp_scaling(runs: Runs) -> str:
    """Step times of `llama2_70b_tp.yaml`'s replica (its runtime and kernels) per GPU and
    tensor degree, from the step model; KV capacity from its memory budget."""
    from sim.config.scenario import load_scenario
    from sim.engine.build import replica_configs
    from sim.io.specload import SpecError

    rows = []
    for gpu, label, degrees in TP_GPUS:
        for tp in degrees:
            sc = load_scenario(SCENARIOS / "llama2_70b_tp.yaml",
                               {"gpu": gpu, "parallel.tensor": tp})
            try:
                cfg = replica_configs(sc)[0]
            except SpecError:
                rows.append([label, str(tp), "does not fit", "", "", "", ""])
                continue
            lat, model = cfg.latency, cfg.model
            b1 = lat.decode(1, 1024, 1024)
            b64 = lat.decode(64, 64 * 1024, 1024)
            prefill = lat.prefill([(2048, 0)])
            # the per-layer all-reduces of a batch-1 step (after o and after down), bf16
            one, tag = cfg.profile.comm.all_reduce(model.hidden * 2, tp,
                                                   custom=cfg.runtime.custom_all_reduce)
            comm = 2 * model.layers * one * 1e-3
            rows.append([label, str(tp), grouped(cfg.budget.kv_tokens), ms(b1, 1), ms(b64, 1),
                         ms(prefill), f"{pct(comm / b1)} ({tag})"])
    return table(["GPU", "TP", "KV tokens", "decode b=1, ctx 1k (ms)", "decode b=64 (ms)",
                  "prefill 2,048 (ms)", "comm"], rows)


def memory_refusal(runs: Runs) -> str:
    """What `llmsim run` says when Llama-2-70B does not fit one A100 (the scenario named s.yaml)."""
    import subprocess
    import tempfile

    scenario = "scenarios/llama2_70b_tp.yaml"
    with tempfile.TemporaryDirectory() as tmp:
        done = subprocess.run([sys.executable, "-m", "sim", "run", scenario, "--set", "gpu=a100-80gb",
                               "--set", "parallel.tensor=1", "--out", str(Path(tmp) / "out")],
                              cwd=ROOT, capture_output=True, text=True, timeout=600)
    if done.returncode != 2:
        raise RuntimeError(f"expected a refusal (exit 2), got exit {done.returncode}: {done.stderr}")
    return "```\n" + done.stderr.strip().replace(scenario, "s.yaml") + "\n```"


def tp_runs(runs: Runs) -> str:
    rows = []
    for tp in (2, 4, 8):
        s = runs.summary("llama2_70b_tp", **{"parallel.tensor": tp})
        req = s["requests"]
        rows.append([str(tp), grouped(s["kv"]["capacity_tokens"]), pct(s["kv"]["util_peak"]),
                     f"{grouped(req['finished'])} of {grouped(req['total'])}",
                     sig3(s["output_token_throughput"]), ms(s["ttft_s"]["p50"]),
                     ms(s["tpot_s"]["p50"], 1)])
    return table(["TP", "KV tokens", "KV peak use", "finished", "output tokens/s",
                  "TTFT p50 (ms)", "TPOT p50 (ms)"], rows)


ROUTERS = [("round_robin", "round robin"), ("random", "random"),
           ("least_outstanding", "least outstanding"), ("least_kv", "least KV (0.1 s stale)"),
           ("power_of_two", "power of two"),
           ("affinity", "affinity (no shared prefixes in this trace: as least outstanding)")]


def clusters(runs: Runs) -> str:
    tp4 = runs.summary("llama2_70b_tp", **{"parallel.tensor": 4})
    tp2 = runs.summary("llama2_70b_2x_tp2")
    tp2_kv = tp2["per_replica"][0]["kv_capacity_tokens"]
    row_tp = (
        f"TP 4: TTFT p50/p99 {ms(tp4['ttft_s']['p50'])}/{ms(tp4['ttft_s']['p99'])} ms, TPOT p50 "
        f"{ms(tp4['tpot_s']['p50'], 1)} ms, {sig3(tp4['output_token_throughput'])} output "
        f"tokens/s. 2 × TP 2: TTFT p50/p99 {ms(tp2['ttft_s']['p50'])}/{ms(tp2['ttft_s']['p99'])} "
        f"ms, TPOT p50 {ms(tp2['tpot_s']['p50'], 1)} ms, {sig3(tp2['output_token_throughput'])}"
        f" tokens/s — each TP-2 GPU holds {tp2['memory_gib']['weights_gib']:.0f} GiB of "
        f"weights, leaving {tp2_kv / 1e3:.0f} k KV tokens per replica (TP 4: "
        f"{tp4['kv']['capacity_tokens'] / 1e3:.0f} k), so batches stay small and queues form")
    parts = []
    for policy, label in ROUTERS:
        s = runs.summary("fleet_routers", **{"cluster.router.policy": policy})
        parts.append(f"{label} {ms(s['ttft_s']['p50'])} / {ms(s['ttft_s']['p99'])}, "
                     f"{ms(s['tpot_s']['p99'])}, {s['goodput']['requests_per_s']:.2f}")
    row_routers = ("TTFT p50 / p99 (ms), TPOT p99 (ms), goodput (req/s, TTFT ≤ 1 s and TPOT ≤ "
                   "50 ms): " + "; ".join(parts))
    dis, col = runs.summary("disaggregated"), runs.summary("colocated")
    busy = [r["gpu_busy_fraction"] for r in dis["per_replica"] if r["role"] == "prefill"]
    row_dis = (
        f"disaggregated: TTFT p50/p99 {ms(dis['ttft_s']['p50'])}/{ms(dis['ttft_s']['p99'])} ms, "
        f"TPOT p99 {ms(dis['tpot_s']['p99'], 1)} ms, ITL p99 / max {ms(dis['itl_s']['p99'], 1)} / "
        f"{ms(dis['itl_max_s'])} ms; colocated: TTFT {ms(col['ttft_s']['p50'])}/"
        f"{ms(col['ttft_s']['p99'])} ms, TPOT p99 {ms(col['tpot_s']['p99'], 1)} ms, ITL p99 / max "
        f"{ms(col['itl_s']['p99'], 1)} / {ms(col['itl_max_s'])} ms — decodes never wait behind a "
        "4k-token prefill once disaggregated (colocated, fewer than 1 % of gaps hold one, so "
        "the p99 misses them and the maximum and TPOT p99 show them), at the price of the prefill pool's "
        f"idle time (its GPUs are busy {' and '.join(pct(b) for b in busy)} of the time: least "
        f"outstanding breaks ties toward the first); {dis['kv']['transfer_gib']:.0f} GiB of KV "
        "crossed the link")
    het = runs.summary("hetero_fleet")
    share = {g: sum(r["requests"] for r in het["per_replica"] if r["group"] == g)
             for g in ("h200", "a100")}
    row_het = (
        f"{het['request_throughput']:.1f} req/s served, TTFT p50/p99 "
        f"{ms(het['ttft_s']['p50'])}/{ms(het['ttft_s']['p99'])} ms, TPOT p50 "
        f"{ms(het['tpot_s']['p50'], 1)} ms; the H200s take "
        f"{grouped(share['h200'])} requests, the A100s {grouped(share['a100'])} (`per_replica`)")
    return table(["scenario", "result"], [
        ["Llama-2-70B on 4 × H100, 1,000 chat requests at 4 req/s: one TP-4 replica vs two "
         "TP-2 replicas", row_tp],
        ["4 × Llama-3-8B / H200, Azure code trace at 4× (8,819 requests in 15 min), by router",
         row_routers],
        ["2 prefill + 2 decode vs 4 colocated H200s, 2,000 arXiv-summarization requests at "
         "6 req/s", row_dis],
        ["2 × H200 + 2 × A100, chat at 12 req/s, least outstanding", row_het],
    ])
