"""Plots of one run: latency CDFs, and batch size and KV use over time.

`latency_cdfs` and `timeline` draw into axes you pass (a notebook's, say) or open a
pyplot figure; `plot_run` writes PNG files without touching pyplot or its backend."""

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
    req = out.requests[out.requests.status == "finished"]
    if ax_grid is None:
        import matplotlib.pyplot as plt  # interactive use: the caller's backend

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
    """Running batch size (decode steps), prefill steps, and KV-cache use over time."""
    st = out.steps
    if len(st) > 4000:  # plotting every one of 10^5 steps adds nothing a reader can see
        st = st.iloc[:: len(st) // 4000]
    kv = out.result.kv
    if axes is None:
        import matplotlib.pyplot as plt  # interactive use: the caller's backend

        fig, axes = plt.subplots(2, 1, figsize=(10, 6), sharex=True)
    ax1, ax2 = axes
    dec = st[st.kind != "prefill"]
    pre = st[st.kind == "prefill"]
    ax1.step(dec.t_start, dec.num_seqs, where="post", lw=0.7, label="sequences per decode step")
    ax1.plot(pre.t_start, pre.num_seqs, ".", ms=2, alpha=0.5, label="sequences per prefill step")
    ax1.set_ylabel("sequences in step")
    ax1.legend(loc="upper right")
    ax1.grid(alpha=0.3)
    ax2.step(st.t_start, st.kv_tokens / kv.capacity_tokens * 100, where="post", lw=1.5,
             label="holding tokens")
    ax2.step(st.t_start, st.kv_blocks_used / kv.num_blocks * 100, where="post", lw=0.8,
             ls="--", color="k", label="allocated")
    ax2.set_ylabel("KV cache used (%)")
    ax2.set_xlabel("simulated time (s)")
    ax2.set_ylim(0, 105)
    ax2.legend(loc="upper right")
    ax2.grid(alpha=0.3)
    return axes


def plot_run(out, folder: Path) -> list[Path]:
    """Write latency_cdf.png and timeline.png for one run into `folder`."""
    name = out.summary.get("scenario", "")
    paths = []
    for fname, title, shape, size, draw in (
        ("latency_cdf.png", "latency CDFs", (2, 2), (10, 7), latency_cdfs),
        ("timeline.png", "batch size and KV cache over time", (2, 1), (10, 6), timeline),
    ):
        fig = Figure(figsize=size)  # no pyplot: files are written whatever the backend
        axes = fig.subplots(*shape, sharex=shape == (2, 1))
        draw(out, axes)
        fig.suptitle(f"{name}: {title}")
        fig.tight_layout()
        paths.append(Path(folder) / fname)
        fig.savefig(paths[-1], dpi=110)
    return paths
