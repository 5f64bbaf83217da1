"""Run summaries as text: the summary table the CLI prints and reports quote, number
formatting, and results frames (sweep, curve) as text."""

from __future__ import annotations

import math
import numbers

import numpy as np


def num(v: float) -> str:
    """A figure for the tables: thousands with commas (28,302), below 1,000 three
    significant figures with their trailing zeros (9.00, 20.8, 0.0123); NaN is `-`."""
    if math.isnan(v):
        return "-"
    if abs(v) >= 999.5:  # rounds to 4+ digits: no exponent, commas instead
        return f"{v:,.0f}"
    text = f"{v:#.3g}"
    return text if "e" in text else text.rstrip(".")


def fmt(v, unit=""):
    """One table cell: None/NaN `-`, booleans as YAML writes them, integers with commas,
    other numbers as `num` (`unit="ms"`: seconds shown in milliseconds)."""
    if v is None:
        return "-"
    if isinstance(v, bool | np.bool_):
        return "true" if v else "false"
    if isinstance(v, numbers.Integral):
        return f"{int(v):,}"
    if isinstance(v, numbers.Real):
        return num(float(v) * (1e3 if unit == "ms" else 1.0))
    return str(v)


def share(x: float | None) -> str:
    """A percentage that never rounds a non-zero share to 0 % or a partial one to 100 %;
    `-` where it is not modelled (None)."""
    if x is None:
        return "-"
    if 0 < x < 0.005:
        return "<1%"
    if 0.995 <= x < 1:
        return ">99%"
    return f"{x:.0%}"


# what a step time stands on: measured = an exact or interpolated measured point
PROVENANCE_CLASSES = (("measured", ("exact", "interpolated")), ("derived", ("derived",)),
                      ("extrapolated", ("extrapolated",)), ("analytic", ("analytic",)))


def provenance_shares(p: dict[str, float]) -> str:
    """Share of simulated step time by what it stands on, every class shown."""
    return " / ".join(share(sum(p.get(t, 0.0) for t in tags)) for _, tags in PROVENANCE_CLASSES)


def _energy(s: dict, key: str) -> str:
    """An `energy` figure, `-` where the run has no power model (or predates it)."""
    e = s.get("energy") or {}
    return fmt(e.get(key)) if e.get("available") else "-"


def _usd_per_m(s: dict) -> str:
    c = s.get("cost") or {}
    return fmt(c["usd_per_m_output_tokens"].get("on_demand")) if c.get("available") else "-"


ROWS = [
    ("requests finished", lambda s: f"{fmt(s['requests']['finished'])}/{fmt(s['requests']['total'])}"),
    ("rejected", lambda s: fmt(s["requests"]["rejected"])),
    ("duration (s)", lambda s: fmt(s["duration_s"])),
    ("requests/s", lambda s: fmt(s["request_throughput"])),
    ("output tokens/s", lambda s: fmt(s["output_token_throughput"])),
    ("TTFT p50 / p99 (ms)", lambda s: f"{fmt(s['ttft_s']['p50'], 'ms')} / {fmt(s['ttft_s']['p99'], 'ms')}"),
    ("TPOT p50 / p99 (ms)", lambda s: f"{fmt(s['tpot_s']['p50'], 'ms')} / {fmt(s['tpot_s']['p99'], 'ms')}"),
    ("ITL p50 / p99 / max (ms)", lambda s: f"{fmt(s['itl_s']['p50'], 'ms')} / {fmt(s['itl_s']['p99'], 'ms')}"
     f" / {fmt(s['itl_s'].get('max'), 'ms')}"),
    ("E2E p50 / p99 (s)", lambda s: f"{fmt(s['e2e_s']['p50'])} / {fmt(s['e2e_s']['p99'])}"),
    ("mean batch size", lambda s: fmt(s["mean_batch_size"])),
    ("busy: steps / GPU kernels", lambda s: f"{s['gpu_busy_fraction']:.0%} / {share(s['gpu_kernel_fraction'])}"),
    ("KV capacity (tokens)", lambda s: f"{s['kv']['capacity_tokens']:,}"),
    ("KV used mean / peak", lambda s: f"{s['kv']['util_mean']:.0%} / {s['kv']['util_peak']:.0%}"),
    ("KV reserved but unused", lambda s: f"{s['kv']['reserved_unused_share']:.1%}"),
    ("preemptions", lambda s: fmt(s["preemptions"])),
    ("spec. tokens/round", lambda s: f"{s['speculative']['tokens_per_round']:.2f}" if s.get("speculative") else "-"),
    ("spec. speed-up vs decode", lambda s: f"{s['speculative']['speedup_vs_decode']:.2f}x" if s.get("speculative") else "-"),
    ("prefix cache hit rate (tokens)", lambda s: f"{s['prefix_cache']['hit_rate']:.1%}" if s.get("prefix_cache") else "-"),
    ("goodput (req/s)", lambda s: fmt(s["goodput"]["requests_per_s"]) if s.get("goodput") else "-"),
    ("energy (kWh / M output tokens)", lambda s: _energy(s, "kwh_per_m_output_tokens")),
    ("average power (W)", lambda s: _energy(s, "average_power_w")),
    ("$ / M output tokens (on demand)", lambda s: _usd_per_m(s)),
    ("step time: measured/derived/extrap./analytic",
     lambda s: provenance_shares(s["lookup_provenance"])),
    ("wall time (s)", lambda s: f"{s['wall_s']:.2f}"),
]


def yaml_scalar(v) -> str:
    """An input value as a scenario YAML spells it (true, null, 0.5)."""
    if v is None:
        return "null"
    if isinstance(v, bool | np.bool_):
        return "true" if v else "false"
    if isinstance(v, numbers.Integral):
        return str(int(v))
    if isinstance(v, numbers.Real):
        return "-" if math.isnan(v) else f"{float(v):g}"
    return str(v)


def frame_text(frame, inputs: list[str]) -> str:
    """A results frame (sweep, curve) as text: the `inputs` columns as the YAML spells
    them, the other columns as the summary table's cells (`-` where there is no value)."""
    import pandas as pd

    cells = {c: [yaml_scalar(v) if c in inputs else fmt(v) for v in frame[c]] for c in frame.columns}
    return pd.DataFrame(cells, columns=list(frame.columns)).to_string(index=False)


def table(names: list[str], summaries: list[dict]) -> str:
    """A side-by-side text table of summaries (one column per run)."""
    cols = [[label] + [str(f(s)) for s in summaries] for label, f in ROWS]
    header = [""] + names
    widths = [max(len(r[i]) for r in [header] + cols) for i in range(len(header))]
    lines = ["  ".join(h.ljust(w) if i == 0 else h.rjust(w) for i, (h, w) in enumerate(zip(header, widths, strict=True)))]
    lines.append("  ".join("-" * w for w in widths))
    for r in cols:
        lines.append("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True))))
    return "\n".join(lines)


REPLICA_COLUMNS = ("replica", "gpu", "role", "requests", "req/s", "TTFT p50/p99 ms",
                   "TPOT p50 ms", "busy", "kernels", "KV mean")
REPLICA_NOTE = ("prefill rows: requests and req/s count prefills run; "
                "other rows: requests routed there, finishes per second")


def replica_cells(rows: list[dict]) -> list[tuple[str, ...]]:
    """One tuple of cells (REPLICA_COLUMNS) per replica of a fleet: where its requests went
    and how it fared. A prefill replica's `requests` and `req/s` count the prefills it ran
    (none finish there)."""
    out = []
    for r in rows:
        prefill = r["role"] == "prefill"
        n = r.get("prefills", r["requests"]) if prefill else r["requests"]
        rate = r.get("prefill_throughput", r["request_throughput"]) if prefill else r["request_throughput"]
        out.append((r["replica"], r["gpu"], r["role"], f"{n:d}", fmt(rate),
                    f"{fmt(r['ttft_s']['p50'], 'ms')}/{fmt(r['ttft_s']['p99'], 'ms')}",
                    fmt(r["tpot_s"]["p50"], "ms"), f"{r['gpu_busy_fraction']:.0%}",
                    share(r["gpu_kernel_fraction"]), f"{r['kv_util_mean']:.0%}"))
    return out


def replica_table(rows: list[dict]) -> str:
    """`replica_cells` as the CLI prints them, one line per replica."""
    head = (f"{'replica':16} {'gpu':10} {'role':7} {'requests':>8} {'req/s':>6} "
            f"{'TTFT p50/p99 ms':>16} {'TPOT p50 ms':>11} {'busy':>5} {'kernels':>7} {'KV mean':>7}")
    lines = [head, "-" * len(head)]
    for name, gpu, role, n, rate, ttft, tpot, busy, kernels, kv in replica_cells(rows):
        lines.append(f"{name[:16]:16} {gpu[:10]:10} {role:7} {n:>8} {rate:>6} {ttft:>16} "
                     f"{tpot:>11} {busy:>5} {kernels:>7} {kv:>7}")
    if any(r["role"] == "prefill" for r in rows):
        lines.append(f"({REPLICA_NOTE})")
    return "\n".join(lines)


STAGE_COLUMNS = ("stage", "layers", "busy", "bubble", "weights GiB", "KV GiB", "KV tokens")
STAGE_NOTE = ("pipeline stages: busy = share of the run a stage's GPUs computed; bubble = "
              "share of the time a micro-batch was in flight that the stage sat idle")


def stage_cells(pipe: dict) -> list[tuple[str, ...]]:
    """One tuple of cells (STAGE_COLUMNS) per pipeline stage (summary → `pipeline`)."""
    return [(str(r["stage"]), str(r["layers"]), f"{r['busy_share']:.0%}",
             f"{r['bubble_share']:.0%}", f"{r['memory_gib']['weights_gib']:.1f}",
             f"{r['memory_gib']['kv_gib']:.1f}", f"{r['memory_gib']['kv_tokens']:,}")
            for r in pipe["per_stage"]]


def stage_table(pipe: dict) -> str:
    """`stage_cells` as the CLI prints them, with the link between the stages."""
    link = pipe["link"]
    where = "across nodes" if link["across_nodes"] else "within a node"
    head = "  ".join(f"{c:>11}" for c in STAGE_COLUMNS)
    ranks = f" x data {pipe['data']} (expert {pipe['expert']})" if "data" in pipe else ""
    lines = [f"pipeline: {pipe['stages']} stages x tensor {pipe['tensor']}{ranks}, {link['name']} "
             f"({where}, {link['gbs']:g} GB/s, {link['latency_us']:g} us)", head, "-" * len(head)]
    lines += ["  ".join(f"{c:>11}" for c in row) for row in stage_cells(pipe)]
    lines.append(f"({STAGE_NOTE})")
    return "\n".join(lines)
