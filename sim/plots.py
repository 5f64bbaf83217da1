"""Plots of one run: latency CDFs, and batch size and KV use over time."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402


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
    req = out.requests[out.requests.status == "finished"]
    if ax_grid is None:
        fig, ax_grid = plt.subplots(2, 2, figsize=(10, 7))
    panels = (
        ("TTFT", req.ttft_s, None),
        ("TPOT", req.tpot_s, None),
        ("ITL", out.itl.gap_s, out.itl["count"]),
        ("E2E latency", req.e2e_s, None),
    )
    for ax, (title, v, w) in zip(np.ravel(ax_grid), panels, strict=True):
        _cdf(ax, v, w, label=label)
        ax.set_title(title)
        ax.set_xlabel("seconds")
        ax.set_ylabel("fraction of " + ("tokens" if title == "ITL" else "requests"))
        ax.grid(alpha=0.3)
    return ax_grid


def timeline(out, axes=None):
    """Batch size per iteration and KV-cache use over simulated time."""
    st = out.steps
    if len(st) > 4000:  # plotting every one of 10^5 steps adds nothing a reader can see
        st = st.iloc[:: len(st) // 4000]
    kv = out.result.kv
    if axes is None:
        fig, axes = plt.subplots(2, 1, figsize=(10, 6), sharex=True)
    ax1, ax2 = axes
    ax1.step(st.t_start, st.num_seqs, where="post", lw=0.6)
    ax1.set_ylabel("sequences in step")
    ax1.grid(alpha=0.3)
    ax2.step(st.t_start, st.kv_blocks_used / kv.num_blocks * 100, where="post", lw=0.6,
             label="allocated")
    ax2.step(st.t_start, st.kv_tokens / kv.capacity_tokens * 100, where="post", lw=0.6,
             label="holding tokens")
    ax2.set_ylabel("KV cache used (%)")
    ax2.set_xlabel("simulated time (s)")
    ax2.set_ylim(0, 105)
    ax2.legend(loc="upper right")
    ax2.grid(alpha=0.3)
    return axes


def plot_run(out, folder: Path) -> list[Path]:
    name = out.summary.get("scenario", "")
    fig, grid = plt.subplots(2, 2, figsize=(10, 7))
    latency_cdfs(out, grid)
    fig.suptitle(f"{name}: latency CDFs")
    fig.tight_layout()
    p1 = Path(folder) / "latency_cdf.png"
    fig.savefig(p1, dpi=110)
    plt.close(fig)
    fig, axes = plt.subplots(2, 1, figsize=(10, 6), sharex=True)
    timeline(out, axes)
    fig.suptitle(f"{name}: batch size and KV cache over time")
    fig.tight_layout()
    p2 = Path(folder) / "timeline.png"
    fig.savefig(p2, dpi=110)
    plt.close(fig)
    return [p1, p2]
