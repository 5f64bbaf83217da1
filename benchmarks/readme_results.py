"""Every simulated result quoted in README.md, regenerated from the shipped scenarios.

    python benchmarks/readme_results.py [--only NAME,...]   # print each block
    python benchmarks/readme_results.py --check             # list blocks that differ; exit 1
    python benchmarks/readme_results.py --write             # replace them in README.md
    python benchmarks/readme_results.py --list              # block names and README sections

README.md marks each generated block with HTML comments,

    <!-- results:NAME -->
    ...the Markdown this script prints for NAME...
    <!-- /results:NAME -->

and everything between a pair of markers belongs to this script: edit the template here,
never the numbers there. Each block is built from the shipped scenario files (seed as
shipped, with the overrides the README names) through the public API (`sim.run`,
`sim.curve.run_curve`, `sim.build.replica_configs`, `sim.runtime_fit`), so a change to a
kernel table, a runtime or the engine moves exactly the numbers it should.

Not here: wall-time figures (benchmarks/*_speed.py: they depend on the machine), the
published check (benchmarks/published_check.py writes docs/fidelity.md and its
summary), and the live-log fit and replay tables of "Live serving"
(benchmarks/live_check.py).
"""

from __future__ import annotations

import argparse
import json
import math
import re
import statistics
import sys
import textwrap
import time
from collections.abc import Callable
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # this checkout's sim, not an installed one

README = ROOT / "README.md"
SCENARIOS = ROOT / "scenarios"
MARKER = re.compile(r"<!-- (/?)results:([a-z0-9_-]+) -->")


# ---- formatting ------------------------------------------------------------------
def grouped(x: float) -> str:
    """An integer with thousands separators: 1,436,565."""
    return f"{round(x):,}"


def sig3(x: float) -> str:
    """Three significant figures, grouped: 1,253 -> 1,250; 787 -> 790."""
    return grouped(float(f"{x:.3g}"))


def ms(seconds: float, digits: int = 0) -> str:
    return f"{seconds * 1e3:,.{digits}f}"


def pct(share: float, digits: int = 0) -> str:
    return f"{share * 100:.{digits}f} %"


def times(x: float) -> str:
    return f"{x:.2f}×"


def half_up(x: float, digits: int) -> str:
    """A decimal written as people round it (0.0575 -> 0.058), not as binary floats do."""
    q = Decimal(1).scaleb(-digits)
    return str(Decimal(repr(round(x, 10))).quantize(q, rounding=ROUND_HALF_UP))


def prose(text: str) -> str:
    """A generated sentence or paragraph, wrapped as the README's paragraphs are."""
    return textwrap.fill(text, width=88, break_long_words=False, break_on_hyphens=False)


def table(header: list[str], rows: list[list[str]], align: list[str] | None = None) -> str:
    rule = align or ["---"] * len(header)
    def line(cells: list[str]) -> str:
        return "|" + "|".join(f" {c} " if c else " " for c in cells) + "|"

    return "\n".join([line(header), "|" + "|".join(rule) + "|", *map(line, rows)])


# ---- runs, each simulated once per invocation -------------------------------------
class Runs:
    """Summaries of scenario runs, memoised for one invocation of this script."""

    def __init__(self) -> None:
        self._done: dict[tuple, dict] = {}

    def summary(self, scenario: str, **overrides) -> dict:
        key = (scenario, tuple(sorted(overrides.items())))
        if key not in self._done:
            from sim import run
            from sim.metrics import itl_table

            out = run(SCENARIOS / f"{scenario}.yaml", overrides)
            gaps = itl_table(out.result)
            worst = float(gaps["gap_s"].max()) if len(gaps["gap_s"]) else 0.0
            self._done[key] = {**out.summary, "itl_max_s": worst}
        return self._done[key]


# ---- blocks -------------------------------------------------------------------------
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
         f"{naive['memory_gib']['attention_scratch_bytes']:.0f} GiB of scratch, cutting the KV "
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
    from sim.build import replica_configs
    from sim.scenario import load_scenario
    from sim.specload import SpecError

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
        f" tokens/s — each TP-2 GPU holds {tp2['memory_gib']['weight_bytes']:.0f} GiB of "
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


SPEC_BATCHES = (1, 4, 16, 64, 256)
SELF_DRAFT = {"speculative.method": "self_draft", "speculative.draft_model": None,
              "speculative.draft_cost": 0.05}


def speculative(runs: Runs) -> str:
    draft, selfd = [], []
    for b in SPEC_BATCHES:
        draft.append(times(runs.summary("speculative", **{"scheduler.max_num_seqs": b})
                           ["speculative"]["speedup_vs_decode"]))
        selfd.append(times(runs.summary("speculative", **{"scheduler.max_num_seqs": b,
                                                          **SELF_DRAFT})
                           ["speculative"]["speedup_vs_decode"]))
    return table(["batch", *map(str, SPEC_BATCHES)],
                 [["draft model: speed-up", *draft],
                  ["self-draft (0.05 per token): speed-up", *selfd]])


NUMBER_WORDS = {2: "two", 3: "three", 4: "four", 5: "five", 6: "six", 7: "seven", 8: "eight"}


def speculative_batch1(runs: Runs) -> str:
    """The batch-1 arithmetic under the speculative table, from the step model."""
    from sim.build import replica_configs
    from sim.scenario import load_scenario

    sc = load_scenario(SCENARIOS / "speculative.yaml")
    cfg = replica_configs(sc)[0]
    k = sc.speculative.k
    alpha = sc.speculative.acceptance.alpha
    ctx = 512
    target = cfg.latency.decode(1, ctx, ctx)
    draft = cfg.draft_latency.decode(1, ctx, ctx)
    c = draft / target
    expect = (1 - alpha ** (k + 1)) / (1 - alpha)
    verify = cfg.latency.verify_batch(1, k + 1, ctx, ctx, [(k + 1, ctx)])
    measured = runs.summary("speculative", **{"scheduler.max_num_seqs": 1})
    return prose(
        f"At batch 1 a draft step costs c = {c:.2f} of a target step ({ms(draft, 1)} vs "
        f"{ms(target, 1)} ms at a {ctx}-token context, `{sc.runtime}` runtime), so "
        f"E / (k·c + 1) = {expect:.2f} / {k * c + 1:.2f} = {expect / (k * c + 1):.2f}; "
        f"verifying {NUMBER_WORDS.get(k + 1, k + 1)} tokens costs {ms(verify, 1)} ms "
        f"({verify / target:.2f} decode steps), giving "
        f"{times(measured['speculative']['speedup_vs_decode'])}.")


def chunked(runs: Runs) -> str:
    pf, ch = runs.summary("prefill_first"), runs.summary("chunked_prefill")

    def row(label, s):
        return [label, f"{ms(s['ttft_s']['p50'])} / {ms(s['ttft_s']['p99'])} ms",
                f"{ms(s['tpot_s']['p50'], 1)} / {ms(s['tpot_s']['p99'], 1)} ms",
                f"{ms(s['itl_s']['p99'])} ms", f"{s['e2e_s']['p99']:.2f} s"]

    out = table(["policy", "TTFT p50 / p99", "TPOT p50 / p99", "ITL p99", "E2E p99"],
                [row("prefill-first (vLLM v0, 8192-token steps)", pf),
                 row("chunked, 512-token budget", ch)])
    tpot_cut = 1 - ch["tpot_s"]["p99"] / pf["tpot_s"]["p99"]
    itl_fold = pf["itl_s"]["p99"] / ch["itl_s"]["p99"]
    ttft_more = ch["ttft_s"]["p99"] / pf["ttft_s"]["p99"]
    return out + "\n\n" + prose(
        f"Chunking cuts the TPOT tail by {pct(tpot_cut)} and the ITL tail {itl_fold:.1f}-fold "
        "(no decode waits behind an 8k-token prefill), at the price of a TTFT tail "
        f"{ttft_more:.1f}× as long for long prompts.")


@dataclass(frozen=True)
class TraceReuse:
    requests: int
    blocks: int
    repeats: int            # block occurrences whose hash appeared earlier
    median_distance: float  # blocks of the stream between a repeat and its previous use


def mooncake_reuse() -> TraceReuse:
    """How the Mooncake trace's 512-token prefix blocks repeat (the trace itself, no run)."""
    from sim.scenario import load_scenario

    trace = load_scenario(SCENARIOS / "prefix_caching_mooncake.yaml").workload.trace
    path = Path(trace.path)
    if not path.is_absolute():
        path = next(p for p in (SCENARIOS / path, ROOT / path) if p.exists())
    last: dict[int, int] = {}
    distances, pos, n = [], 0, 0
    with path.open(encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            n += 1
            for h in json.loads(line)["hash_ids"]:
                if h in last:
                    distances.append(pos - last[h])
                last[h] = pos
                pos += 1
    return TraceReuse(n, pos, len(distances), statistics.median(distances))


def prefix_caching(runs: Runs) -> str:
    off = runs.summary("prefix_caching_mooncake", **{"kv.prefix_caching": False})
    on = runs.summary("prefix_caching_mooncake", **{"kv.prefix_caching": True})
    reuse = mooncake_reuse()

    def row(label, hit, s):
        return [label, hit, f"{s['ttft_s']['mean']:.2f} s",
                f"{s['ttft_s']['p50']:.2f} / {s['ttft_s']['p99']:.1f} s",
                f"{ms(s['tpot_s']['p50'], 1)} ms"]

    return table(["", "hit rate", "TTFT mean", "TTFT p50 / p99", "TPOT p50"], [
        row("no caching", "—", off),
        row("prefix caching", f"{pct(on['prefix_cache']['hit_rate'], 1)} (trace: "
            f"{pct(reuse.repeats / reuse.blocks, 1)} of blocks repeat)", on)])


def prefix_caching_gpu_only(runs: Runs) -> str:
    gpu = runs.summary("prefix_caching_mooncake", **{"kv.prefix_cache_host_gib": 0})
    reuse = mooncake_reuse()
    blocks = gpu["kv"]["capacity_tokens"] / gpu["prefix_cache"].get("hash_block_tokens", 512)
    return prose(
        f"With the GPU cache alone (about {grouped(round(blocks, -2))} such blocks) the hit rate "
        f"is {pct(gpu['prefix_cache']['hit_rate'])}: the median distance between a block and "
        f"its repeat is {grouped(round(reuse.median_distance, -2))} blocks, which is why "
        "Mooncake keeps its KV cache in a host-memory pool.")


CURVE_RATES = (4, 8, 16, 24, 32)


def curve_knees(runs: Runs) -> str:
    from sim.curve import run_curve

    files = [str(SCENARIOS / "prefill_first.yaml"), str(SCENARIOS / "chunked_prefill.yaml")]
    points, knees = run_curve(files, list(CURVE_RATES), None, requests=400, ttft_bound=2.0,
                              executor="sequential")
    rows = []
    for k in knees.itertuples(index=False):
        pts = points[points.scenario == k.scenario].sort_values("rate")
        after = pts[pts.rate > (k.knee_rate or 0)]
        knee = "none" if k.knee_rate is None or math.isnan(k.knee_rate) else \
            f"{k.knee_rate:g} req/s"
        if len(after):
            first = after.iloc[0]
            past = (f"{first.rate:g} req/s: steady throughput {pct(first['steady.ratio'])} of "
                    f"offered, p99 TTFT {first['ttft_s.p99']:.2f} s")
        else:
            past = f"none: it keeps up at every rate run (up to {max(CURVE_RATES):g} req/s)"
        rows.append([f"`{k.scenario}`", knee, past])
    return table(["scenario", "knee (p99 TTFT ≤ 2 s, steady ≥ 90 %)", "first rate past it"],
                 rows)


def warm_grid_accuracy(runs: Runs) -> str:
    from sim.runtime_fit import error_summary, fit, read_grid

    grid = ROOT / "gpu_profiles" / "h200-sxm" / "iter_grid_eager_reference.csv"
    _, rows = fit(read_grid(grid), "h200-sxm", "h200-eager-reference")
    names = {"llama-3-8b": "Llama-3-8B", "llama-3.2-1b": "Llama-3.2-1B"}
    kinds = {"prefill": 0, "decode": 1, "verify": 2}
    summary = error_summary(rows)
    order = sorted((k for k in summary if k != "all"),
                   key=lambda k: (k.split(" ")[0], kinds.get(k.split(" ")[1], 9)))
    out = []
    for key, e in ((k, summary[k]) for k in [*order, "all"]):
        model, _, kind = key.partition(" ")
        label = f"{names.get(model, model)} {kind}" if kind else key
        out.append([label, str(e["rows"]), pct(e["mape"], 1),
                    f"{e['bias'] * 100:+.1f} %".replace("-", "−"), pct(e["max"], 1)])
    return table(["model, step kind", "rows", "mean abs error", "mean error", "max abs error"],
                 out)


def warm_grid_fit(runs: Runs) -> str:
    """The refitted host model in words (its parameters are rounded decimals: half up)."""
    import yaml

    from sim.runtime_fit import fit, read_grid

    grid = ROOT / "gpu_profiles" / "h200-sxm" / "iter_grid_eager_reference.csv"
    spec, _ = fit(read_grid(grid), "h200-sxm", "h200-eager-reference")
    shipped = yaml.safe_load((ROOT / "gpu_profiles" / "runtimes" /
                              "h200-eager-reference.yaml").read_text(encoding="utf-8"))
    stale = [k for k in ("host_ms_per_step", "host_ms_per_layer", "host_ms_per_layer_decode_extra",
                         "host_ms_per_prefill_seq_layer", "host_ms_per_verify_seq_layer",
                         "gpu_scale", "gpu_scale_decode") if shipped.get(k) != getattr(spec, k)]
    if stale:
        print("warning: gpu_profiles/runtimes/h200-eager-reference.yaml differs from a refit in "
              f"{', '.join(stale)} (refit: python -m sim.runtime_fit "
              f"{grid.relative_to(ROOT)} --name h200-eager-reference --write)", file=sys.stderr)
    layers = 32
    step, layer, extra = spec.host_ms_per_step, spec.host_ms_per_layer, \
        spec.host_ms_per_layer_decode_extra
    return prose(
        f"The fitted host model (`gpu_profiles/runtimes/h200-eager-reference.yaml`): "
        f"{half_up(step, 2)} ms per step + {half_up(layer, 2)} ms per layer "
        f"(+{half_up(extra, 3)} ms per layer on decode's path), "
        f"{half_up(spec.host_ms_per_prefill_seq_layer, 2)} ms per sequence and layer for "
        f"per-sequence flash prefill, {half_up(spec.host_ms_per_verify_seq_layer, 2)} ms per "
        "sequence and layer for the gather+SDPA of multi-token steps; the host floor is "
        f"{half_up(step + layer * layers, 1)} ms for prefill and "
        f"{half_up(step + (layer + extra) * layers, 1)} ms for decode on a {layers}-layer model. "
        f"GPU time is scaled by {half_up(spec.gpu_scale, 2)} (prefill, verify) and "
        f"{half_up(spec.gpu_scale_decode, 2)} (decode).")


@dataclass(frozen=True)
class Block:
    section: str                    # the README section the block sits in
    make: Callable[[Runs], str]


BLOCKS: dict[str, Block] = {
    "scenario-comparisons": Block("Scenarios", scenario_comparisons),
    "memory-refusal": Block("Tensor parallelism, memory feasibility, FP8", memory_refusal),
    "tp-scaling": Block("Tensor parallelism, memory feasibility, FP8", tp_scaling),
    "tp-runs": Block("Tensor parallelism, memory feasibility, FP8", tp_runs),
    "clusters": Block("Clusters: replicas, routers, disaggregated prefill/decode", clusters),
    "speculative": Block("Speculative decoding", speculative),
    "speculative-batch1": Block("Speculative decoding", speculative_batch1),
    "chunked-prefill": Block("Chunked prefill", chunked),
    "prefix-caching": Block("Prefix caching", prefix_caching),
    "prefix-caching-gpu-only": Block("Prefix caching", prefix_caching_gpu_only),
    "curve-knees": Block("Capacity planning", curve_knees),
    "warm-grid-accuracy": Block("Accuracy", warm_grid_accuracy),
    "warm-grid-fit": Block("Accuracy", warm_grid_fit),
}


# ---- README blocks -------------------------------------------------------------------
def readme_blocks(text: str) -> dict[str, tuple[int, int]]:
    """name -> (start, end) offsets of the text between its markers. Raises ValueError
    on unpaired, nested, misordered or repeated markers."""
    found: dict[str, tuple[int, int]] = {}
    open_name, open_end = None, 0
    for m in MARKER.finditer(text):
        closing, name = m.group(1) == "/", m.group(2)
        if not closing:
            if open_name is not None:
                raise ValueError(f"results:{name} opens inside results:{open_name}")
            if name in found:
                raise ValueError(f"results:{name} appears twice")
            open_name, open_end = name, m.end()
        else:
            if open_name != name:
                raise ValueError(f"/results:{name} closes {open_name or 'nothing'}")
            found[name] = (open_end, m.start())
            open_name = None
    if open_name is not None:
        raise ValueError(f"results:{open_name} is never closed")
    return found


def current(text: str, span: tuple[int, int]) -> str:
    return text[span[0]:span[1]].strip("\n")


def replace_blocks(text: str, new: dict[str, str]) -> str:
    spans = readme_blocks(text)
    for name in sorted(new, key=lambda n: spans[n][0], reverse=True):
        a, b = spans[name]
        text = text[:a] + "\n" + new[name] + "\n" + text[b:]
    return text


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", help="comma-separated block names (default: all)")
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true", help="list blocks that differ from README.md")
    mode.add_argument("--write", action="store_true", help="replace differing blocks in README.md")
    mode.add_argument("--list", action="store_true", help="block names and sections")
    a = ap.parse_args(argv)
    if a.list:
        for name, b in BLOCKS.items():
            print(f"{name:26} {b.section}")
        return 0
    names = a.only.split(",") if a.only else list(BLOCKS)
    unknown = [n for n in names if n not in BLOCKS]
    if unknown:
        ap.error(f"unknown block(s) {', '.join(unknown)} (known: {', '.join(BLOCKS)})")
    text = README.read_text(encoding="utf-8")
    spans = readme_blocks(text)
    missing = [n for n in names if n not in spans]
    if missing and (a.check or a.write):
        print(f"README.md has no markers for: {', '.join(missing)}", file=sys.stderr)
        return 2
    runs, made, t0 = Runs(), {}, time.perf_counter()
    for name in names:
        t = time.perf_counter()
        made[name] = BLOCKS[name].make(runs)
        print(f"[{name}: {time.perf_counter() - t:.1f} s]", file=sys.stderr)
        if not (a.check or a.write):
            print(f"### {BLOCKS[name].section} (results:{name})\n\n{made[name]}\n")
    print(f"[all: {time.perf_counter() - t0:.1f} s]", file=sys.stderr)
    differ = [n for n in names if n in spans and made[n] != current(text, spans[n])]
    if a.check:
        for n in differ:
            print(f"differs: results:{n} ({BLOCKS[n].section})")
        return 1 if differ else 0
    if a.write and differ:
        README.write_text(replace_blocks(text, {n: made[n] for n in differ}), encoding="utf-8")
        print(f"README.md: rewrote {', '.join(differ)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
