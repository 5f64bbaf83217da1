"""Plots of one run: latency CDFs, and batch size and KV use over time.

`latency_cdfs` and `timeline` draw into axes you pass (a notebook's, say) or open a
pyplot figure; `plot_run` writes PNG files without touching pyplot or its backend.
They read the run's numpy tables (`out.request_table`, `out.step_tables`: one per
replica), not its pandas frames, and draw a thinned timeline (a few thousand points)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib.figure import Figure


def _cdf(ax, values, weights=None, label=None):
    v = np.asarray(values, dtype=float)
    w = np.ones_like(v) if weights is None else np.asarray(weights, dtype=float)
    keep = ~np.isnan(v) & (w > 0)
    v, w = v[keep], w[keep]
    if len(v) == 0:
        ax.text(0.5, 0.5, "no data", transform=ax.transAxes, ha="center")
        return
    order = np.argsort(v)
    v, w = v[order], np.cumsum(w[order])
    ax.plot(v, w / w[-1], label=label)


def latency_cdfs(out, ax_grid=None, label=None):
    """Four panels: TTFT, TPOT, ITL, E2E empirical CDFs (seconds)."""
    req = out.request_table
    done = np.asarray(req["status"], dtype=object) == "finished"
    if ax_grid is None:
        import matplotlib.pyplot as plt  # interactive use: the caller's backend

        fig, ax_grid = plt.subplots(2, 2, figsize=(10, 7))
    panels = (
        ("TTFT", req["ttft_s"][done], None),
        ("TPOT", req["tpot_s"][done], None),
        ("ITL", out.itl_table["gap_s"], out.itl_table["count"]),
        ("E2E latency", req["e2e_s"][done], None),
    )
    for ax, (title, v, w) in zip(np.ravel(ax_grid), panels, strict=True):
        _cdf(ax, v, w, label=label)
        ax.set_title(title)
        ax.set_xlabel("seconds")
        ax.set_ylabel("fraction of " + ("tokens" if title == "ITL" else "requests"))
        ax.grid(alpha=0.3)
    return ax_grid


def timeline(out, axes=None):
    """Running batch size (decode steps), prefill steps, and KV-cache use over time; a
    fleet gets one line per replica (the first MAX_REPLICA_LINES of them)."""
    if axes is None:
        import matplotlib.pyplot as plt  # interactive use: the caller's backend

        fig, axes = plt.subplots(2, 1, figsize=(10, 6), sharex=True)
    reps = out.result.replicas
    if len(reps) == 1:
        _timeline_one(out.step_tables[0], reps[0].kv, axes)
    else:
        _timeline_fleet(out.step_tables, reps, axes)
    ax1, ax2 = axes
    ax1.set_ylabel("sequences in step")
    ax1.grid(alpha=0.3)
    ax2.set_ylabel("KV cache used (%)")
    ax2.set_xlabel("simulated time (s)")
    ax2.set_ylim(0, 105)
    ax2.grid(alpha=0.3)
    return axes


MAX_REPLICA_LINES = 16


def _thin(table: dict, limit: int = 4000) -> dict[str, np.ndarray]:
    """Every k-th step (kind as its names): plotting each of 10^5 steps adds nothing a
    reader can see."""
    n = len(table["t_start"])
    every = n // limit if n > limit else 1
    cols = {c: np.asarray(table[c][::every]) for c in ("t_start", "num_seqs", "kv_tokens",
                                                        "kv_blocks_used")}  # (spilled: read thin)
    cols["prefill"] = np.asarray(table["kind"].codes[::every]) == 0
    return cols


def _timeline_one(table: dict, kv, axes) -> None:
    st = _thin(table)
    ax1, ax2 = axes
    dec, pre = ~st["prefill"], st["prefill"]
    ax1.step(st["t_start"][dec], st["num_seqs"][dec], where="post", lw=0.7,
             label="sequences per decode step")
    ax1.plot(st["t_start"][pre], st["num_seqs"][pre], ".", ms=2, alpha=0.5,
             label="sequences per prefill step")
    ax1.legend(loc="upper right")
    ax2.step(st["t_start"], st["kv_tokens"] / kv.capacity_tokens * 100, where="post", lw=1.5,
             label="holding tokens")
    ax2.step(st["t_start"], st["kv_blocks_used"] / kv.num_blocks * 100, where="post", lw=0.8,
             ls="--", color="k", label="allocated")
    ax2.legend(loc="upper right")


def _timeline_fleet(tables: list[dict], reps, axes) -> None:
    ax1, ax2 = axes
    shown = reps[:MAX_REPLICA_LINES]
    for r, table in zip(shown, tables, strict=False):
        st = _thin(table, 4000 // len(shown) + 50)
        label = f"{r.name} ({r.role})" if r.role != "both" else r.name
        line = ax1.step(st["t_start"], st["num_seqs"], where="post", lw=0.6, label=label)[0]
        ax2.step(st["t_start"], st["kv_blocks_used"] / r.kv.num_blocks * 100, where="post",
                 lw=0.8, color=line.get_color(), label=label)
    title = "sequences per step, by replica"
    if len(reps) > len(shown):
        title += f" (first {len(shown)} of {len(reps)})"
    ax1.set_title(title, fontsize=9)
    ax2.set_title("KV blocks allocated, by replica", fontsize=9)
    ax1.legend(loc="upper right", fontsize=6, ncol=2)


def autoscaling(out, axes) -> None:
    """Offered rate and ready replicas over time; per window p99 TTFT and TPOT (against
    the scenario's SLOs), SLO attainment and the fleet's mean power."""
    a = out.summary["autoscale"]
    ws = a["windows"]
    win = ws[1]["start_s"] - ws[0]["start_s"] if len(ws) > 1 else max(out.result.end_time, 1.0)
    t = np.array([w["start_s"] for w in ws])

    def col(key: str, scale: float = 1.0) -> list[float]:
        return [w[key] * scale if w.get(key) is not None else np.nan for w in ws]
    ax = axes[0]
    ax.step(t, [w["requests"] / win for w in ws], where="post", label="offered (req/s)")
    curve = np.array(a["ready_over_time"] + [[out.result.end_time, a["ready_over_time"][-1][1]]])
    ax.twinx().step(curve[:, 0], curve[:, 1], where="post", color="C1", label="ready replicas")
    ax.set_ylabel("requests/s (blue),\nready replicas (orange)")
    slo = out.scenario.slo
    for ax, key, bound, name in ((axes[1], "ttft_p99_s", slo.ttft_s if slo else None, "p99 TTFT (s)"),
                                 (axes[2], "tpot_p99_s", slo.tpot_s if slo else None, "p99 TPOT (s)")):
        ax.step(t, col(key), where="post")
        if bound is not None:
            ax.axhline(bound, color="r", linestyle=":")
        ax.set_ylabel(name)
    axes[3].step(t, col("slo_attainment"), where="post")
    axes[3].set_ylabel("SLO attainment\nper window")
    axes[4].step(t, col("power_w", 1e-3), where="post")
    axes[4].set_ylabel("fleet power (kW)")
    axes[4].set_xlabel("time (s)")


def plot_run(out, folder: Path) -> list[Path]:
    """Write latency_cdf.png and timeline.png (and autoscale.png) for one run into `folder`."""
    name = out.summary.get("scenario", "")
    paths = []
    scaled = (("autoscale.png", "offered rate, ready replicas, p99s, SLO attainment, power per window",
               (5, 1), (10, 12),
               autoscaling),) if out.summary.get("autoscale") else ()
    for fname, title, shape, size, draw in (
        ("latency_cdf.png", "latency CDFs", (2, 2), (10, 7), latency_cdfs),
        ("timeline.png", "batch size and KV cache over time", (2, 1), (10, 6), timeline),
        *scaled,
    ):
        fig = Figure(figsize=size)  # no pyplot: files are written whatever the backend
        axes = fig.subplots(*shape, sharex=shape[1] == 1)
        draw(out, axes)
        fig.suptitle(f"{name}: {title}")
        fig.tight_layout()
        paths.append(Path(folder) / fname)
        fig.savefig(paths[-1], dpi=110)
    return paths
