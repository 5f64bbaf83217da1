"""The README's "Mixture-of-Experts at scale" block: one finding a line for each MoE scenario
(DeepSeek-R1 on H200 and B200, TP 8 against EP 8 with DP attention, MTP as its proposer;
wide EP on a GB200 NVL72 slice; disaggregated prefill/decode; Qwen3-30B-A3B against
Llama-3.1-8B; gpt-oss-120b on one H200 and one B200), each with the published figure beside it where one exists."""

from __future__ import annotations

from benchmarks.readme.readme_format import ms, sig3, table
from benchmarks.readme.readme_runs import Runs

TP8 = {"parallel.data": 1, "parallel.expert": 1, "parallel.tensor": 8}
# GPUStack performance lab, gpt-oss-120b on H100, "Long Prompt" (random dataset, 4,000 in,
# 200 out) with its baseline vLLM v0.10.2 on one H100 (TP 1) and vLLM's defaults there
# (max_num_seqs 1024, max_num_batched_tokens 8192, the model's 131,072-token window); its
# prompt count and rate are not stated in what was read: 1,000 requests offered at once
GPUSTACK_LONG = {"gpu": "h100-sxm", "runtime": "vllm-0.10", "scheduler.max_num_seqs": 1024,
                 "kv.max_model_len": None, "workload.num_requests": 1000,
                 "workload.arrival.rate": 1000,
                 **{f"workload.{w}.{k}": None for w in ("prompt", "output")
                    for k in ("median", "sigma", "max")},
                 "workload.prompt.kind": "fixed", "workload.prompt.value": 4000,
                 "workload.output.kind": "fixed", "workload.output.value": 200}
MTP = {"speculative.method": "mtp", "speculative.k": 1,
       "speculative.acceptance.alpha": 0.85}  # DeepSeek-V3 report §5.4.3: 85-90 %


EP16 = {"parallel.data": 16, "parallel.expert": 16, "workload.num_requests": 800}
H200_IB = {"gpu": "h200-sxm", "parallel.network": "infiniband-ndr400"}
DECODE_GPUS = 32  # deepseek_r1_disaggregated.yaml's decode replica


def _usd(s: dict) -> str:
    return f"${s['cost']['usd_per_m_output_tokens']['on_demand']:.2f}"


def _layouts(runs: Runs, scenario: str, gpu: str) -> list[str]:
    ep, tp = runs.summary(scenario), runs.summary(scenario, **TP8)
    return [f"`{scenario}.yaml`",
            f"8 × {gpu}, TP 8 → EP 8 + DP attention: KV {tp['kv']['capacity_tokens'] / 1e6:.1f} M → "
            f"{ep['kv']['capacity_tokens'] / 1e6:.1f} M tokens, output {sig3(tp['output_token_throughput'])} → "
            f"{sig3(ep['output_token_throughput'])} tokens/s, TTFT p50 {ms(tp['ttft_s']['p50'])} → "
            f"{ms(ep['ttft_s']['p50'])} ms, TPOT p50 {ms(tp['tpot_s']['p50'], 1)} → "
            f"{ms(ep['tpot_s']['p50'], 1)} ms, {_usd(tp)} → {_usd(ep)} per M output tokens",
            ]


def moe_scenarios(runs: Runs) -> str:
    rows = []
    h200 = _layouts(runs, "deepseek_r1_h200", "H200")
    rows.append(h200 + ["SGLang v0.4: DP attention up to 1.9× decoding throughput for "
                        "DeepSeek models (lmsys.org/blog/2024-12-04-sglang-v0-4)"])
    rows.append(_layouts(runs, "deepseek_r1_b200", "B200") + ["-"])
    ep, mtp = runs.summary("deepseek_r1_h200"), runs.summary("deepseek_r1_h200", **MTP)
    spec = mtp["speculative"]
    rows.append(["`deepseek_r1_h200.yaml` + MTP",
                 f"the MTP layer as proposer (k 1, acceptance 0.85): {spec['tokens_per_round']:.2f} "
                 f"tokens a round, TPOT p50 {ms(ep['tpot_s']['p50'], 1)} → "
                 f"{ms(mtp['tpot_s']['p50'], 1)} ms, {spec['speedup_vs_decode']:.2f}× decode",
                 "DeepSeek-V3 report (arXiv 2412.19437 §5.4.3): 85-90 % second-token "
                 "acceptance, 1.8× TPS"])
    wide = runs.summary("deepseek_r1_nvl72")
    gpus = wide["parallel"]["data"]
    rows.append(["`deepseek_r1_nvl72.yaml`",
                 f"wide EP {gpus} on a GB200 NVL72 slice, all-to-all on NVLink 5: "
                 f"{sig3(wide['output_token_throughput'] / gpus)} output tokens/s per GPU "
                 f"with prefill colocated, TPOT p50 {ms(wide['tpot_s']['p50'], 1)} ms, "
                 f"{_usd(wide)} per M output tokens", "-"])
    rack = runs.summary("deepseek_r1_nvl72", **EP16)
    ib = runs.summary("deepseek_r1_nvl72", **EP16, **H200_IB)
    rows.append(["`deepseek_r1_nvl72.yaml`, EP 16",
                 f"EP 16 (800 requests) on the GB200 NVL72 rack vs across two 8 × H200 nodes (slower GPUs, and "
                 f"the all-to-all half over a 400 Gb/s NIC a GPU): TPOT p50 {ms(rack['tpot_s']['p50'], 1)} vs "
                 f"{ms(ib['tpot_s']['p50'], 1)} ms, output {sig3(rack['output_token_throughput'])} "
                 f"vs {sig3(ib['output_token_throughput'])} tokens/s", "-"])
    dis = runs.summary("deepseek_r1_disaggregated")
    dec = [r for r in dis["per_replica"] if r["role"] == "decode"][0]
    pre = [r for r in dis["per_replica"] if r["role"] == "prefill"]
    dec_gpus = DECODE_GPUS
    rows.append(["`deepseek_r1_disaggregated.yaml`",
                 f"{len(pre)} prefill replicas of 8 + a decode replica of {dec_gpus} (EP 32): "
                 f"decode {sig3(dec['output_token_throughput'] / dec_gpus)} output tokens/s "
                 f"per GPU at {dec['mean_batch_size'] / dec_gpus:.0f} sequences a GPU, TPOT p50 "
                 f"{ms(dis['tpot_s']['p50'], 1)} ms, prefill GPUs "
                 f"{sum(r['gpu_busy_fraction'] for r in pre) / len(pre) * 100:.0f} % busy",
                 "SGLang on GB200 NVL72, 48 decode GPUs, 2,000-token inputs: 7,583 output "
                 "tokens/s per GPU at its own (larger) batch (lmsys.org/blog/2025-06-16-gb200-part-1)"])
    moe, dense = runs.summary("qwen3_30b_a3b_vs_8b"), runs.summary("qwen3_30b_a3b_vs_8b",
                                                                     model="llama-3.1-8b")
    rows.append(["`qwen3_30b_a3b_vs_8b.yaml`",
                 f"one H200, 8 req/s chat: Qwen3-30B-A3B TPOT p50 {ms(moe['tpot_s']['p50'], 1)} "
                 f"ms vs Llama-3.1-8B {ms(dense['tpot_s']['p50'], 1)} ms, KV "
                 f"{moe['kv']['capacity_tokens'] / 1e3:.0f} k vs "
                 f"{dense['kv']['capacity_tokens'] / 1e3:.0f} k tokens, {_usd(moe)} vs {_usd(dense)} "
                 "per M output tokens (both keep up: equal traffic, near-equal cost)", "-"])
    oss, b200 = runs.summary("gpt_oss_120b_h200"), runs.summary("gpt_oss_120b_h200", gpu="b200")
    rows.append(["`gpt_oss_120b_h200.yaml`",
                 f"gpt-oss-120b (MXFP4 experts, half its layers over a 128-token window), "
                 f"long-context chat at 4 req/s: one H200 holds "
                 f"{oss['kv']['capacity_tokens'] / 1e6:.2f} M KV tokens (the full layers' bytes "
                 f"beyond the window), TPOT p50 {ms(oss['tpot_s']['p50'], 1)} ms, "
                 f"{_usd(oss)} per M output tokens; one B200: TPOT p50 "
                 f"{ms(b200['tpot_s']['p50'], 1)} ms, {_usd(b200)}", "-"])
    h100 = runs.summary("gpt_oss_120b_h200", **GPUSTACK_LONG)
    rows.append(["`gpt_oss_120b_h200.yaml` on one H100",
                 f"vLLM 0.10 runtime, 1,000 requests of 4,000 in / 200 out at once: "
                 f"{sig3(h100['total_token_throughput'])} total tokens/s, TPOT mean "
                 f"{ms(h100['tpot_s']['mean'], 1)} ms",
                 "GPUStack performance lab, vLLM v0.10.2 baseline on one H100, 4,000 in / "
                 "200 out: 14,247 total tokens/s, TPOT mean 31.7 ms "
                 "(docs.gpustack.ai/latest/performance-lab/gpt-oss-120b/h100)"])
    return table(["scenario", "simulated (cuda-graph kernels)", "published"], rows)


def simulated_figures(runs: Runs) -> dict[str, tuple[float, list[dict]]]:
    """The simulated side of the block's published figures, from the same runs: name ->
    (value, the summaries it comes from); scored by the accuracy suite
    (benchmarks/fidelity/accuracy.py, published-ratios)."""
    ep, tp = runs.summary("deepseek_r1_h200"), runs.summary("deepseek_r1_h200", **TP8)
    mtp = runs.summary("deepseek_r1_h200", **MTP)
    dis = runs.summary("deepseek_r1_disaggregated")
    dec = [r for r in dis["per_replica"] if r["role"] == "decode"][0]
    h100 = runs.summary("gpt_oss_120b_h200", **GPUSTACK_LONG)
    return {"gpt_oss_h100_total_tok_s": (h100["total_token_throughput"], [h100]),
            "dp_attention_throughput_ratio": (ep["output_token_throughput"]
                                              / tp["output_token_throughput"], [ep, tp]),
            "mtp_speedup_vs_decode": (mtp["speculative"]["speedup_vs_decode"], [mtp]),
            "gb200_decode_tok_s_per_gpu": (dec["output_token_throughput"] / DECODE_GPUS, [dis])}
