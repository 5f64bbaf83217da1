"""What ran out first when a candidate stopped meeting its SLOs: the `binding` column of a
plan's rows, read from the summary of the first failing probe (KV capacity, host
overhead, compute, memory bandwidth or queueing, after the SLO that broke).

Apart from the search that finds the failing probe (sim/planning/estimate.py,
capacity.py) because it only reads a summary: the same diagnosis serves any run that
broke, and its rules are tested on summaries alone."""

from __future__ import annotations


def binding(summary: dict, gpu: str, broke: list[str] | None = None) -> str:
    """`_binding`, marked '(stopped probe)' when read from a run stopped once its failure
    was certain (its figures are the requests finished by then: probestop.py)."""
    why = _binding(summary, gpu, broke)
    return f"{why} (stopped probe)" if summary.get("stopped") else why


def _binding(summary: dict, gpu: str, broke: list[str] | None = None) -> str:
    """What ran out first at the first failing probe (derived from its summary):
    KV capacity when requests were preempted or rejected or the cache peaked >= 95 %;
    else, when steps ran >= 85 % of the time: host overhead when under half of that was
    GPU kernels (the serving loop's CPU work paced it), else compute or memory bandwidth
    by a roofline test: mean tokens per iteration (~FLOPs per weight byte at bf16)
    against the GPU's FLOP/byte ridge; else queueing (idle time, requests waited).

    Given what broke (`violations`, first first), the answer names that SLO and why: a
    p99 TTFT that is mostly the prefill itself (p99 queueing under half of it) is
    "p99 TTFT: prefill time", not the decode-averaged roofline's "memory bandwidth"."""
    kv = summary["kv"]
    if summary["preemptions"] or summary["requests"]["rejected"] or kv["util_peak"] >= 0.95:
        return _broke(broke, "KV capacity")
    if broke and broke[0].startswith("p99 TTFT"):
        ttft, queue = summary["ttft_s"]["p99"], (summary.get("queue_s") or {}).get("p99")
        if ttft is not None and queue is not None and queue < 0.5 * ttft:
            return "p99 TTFT: prefill time"
    return _broke(broke, _resource(summary, gpu))


def _resource(summary: dict, gpu: str) -> str:
    """host overhead, compute or memory bandwidth for a busy GPU, else queueing."""
    from sim.costmodel.profiles import load_profile

    busy = summary["gpu_busy_fraction"]
    if busy >= 0.85:
        kernels = summary["gpu_kernel_fraction"]  # None: not modelled (a measured run)
        if kernels is not None and kernels < 0.5 * busy:
            return "host overhead"
        f = load_profile(gpu).facts
        ridge = (f.peak_tflops or f.datasheet_tflops) / (f.mem_bw_tbs or f.datasheet_mem_bw_tbs)
        iters = max(summary["iterations"]["total"], 1)
        per_iter = summary["total_token_throughput"] * summary["duration_s"] / iters
        return "compute" if per_iter >= ridge else "memory bandwidth"
    return "queueing"


def _broke(broke: list[str] | None, why: str) -> str:
    """`why`, after the SLO that broke first ('p99 TPOT: memory bandwidth')."""
    if not broke:
        return why
    first = broke[0]
    name = next((n for n in ("p99 TTFT", "p99 TPOT", "p99 E2E", "goodput", "steady throughput")
                 if first.startswith(n)), "rejections" if first.endswith(" rejected") else first)
    return f"{name}: {why}"
