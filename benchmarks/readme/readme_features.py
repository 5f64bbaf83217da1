"""README blocks about scheduling and caching features (benchmarks/readme/readme_results.py):
speculative decoding, chunked prefill, prefix caching on the Mooncake trace, and the
capacity curves of chunked vs prefill-first scheduling."""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass
from pathlib import Path

from benchmarks.readme.readme_format import grouped, ms, pct, prose, table, times
from benchmarks.readme.readme_runs import ROOT, SCENARIOS, Runs

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
    from sim.config.scenario import load_scenario
    from sim.engine.build import replica_configs

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
    from sim.config.scenario import load_scenario

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

    pc = on["prefix_cache"]
    return table(["", "hit rate (prompt tokens)", "TTFT mean", "TTFT p50 / p99", "TPOT p50"], [
        row("no caching", "—", off),
        row("prefix caching", f"{pct(pc['hit_rate'], 1)} (blocks: {pct(pc['block_hit_rate'], 1)}; "
            f"trace: {pct(reuse.repeats / reuse.blocks, 1)} of blocks repeat)", on)])


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
    from sim.planning.curve import run_curve

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
