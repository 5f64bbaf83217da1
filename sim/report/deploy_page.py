"""The plan report's aggregated-vs-disaggregated section (plan.json `deployments`,
`sim/planning/deployments.py`): each deployment's cheapest candidate, the points and
fronts, and a plot of $/M output tokens against p99 TTFT and p99 TPOT."""

from __future__ import annotations

import pandas as pd
from matplotlib.figure import Figure

from sim.report.document import Section, markup, png

COLOURS = {"aggregated": "C0", "disaggregated": "C3"}


def deployment_plot(points: pd.DataFrame, fronts: dict[str, list[str]]) -> Figure:
    """Two panels ($/M output tokens vs p99 TTFT, vs p99 TPOT), one colour per deployment,
    each deployment's front drawn through its points; open markers: estimates."""
    fig = Figure(figsize=(10, 4.5), layout="constrained")
    axes = fig.subplots(1, 2)
    for ax, metric, name in zip(axes, ("ttft_p99_s", "tpot_p99_s"), ("p99 TTFT (s)", "p99 TPOT (s)"),
                                strict=True):
        for kind, grp in points.groupby("deployment"):
            colour = COLOURS.get(str(kind), "C7")
            checked = grp.checked.astype(bool)
            if checked.any():
                ax.scatter(grp.usd_per_m_output_tokens[checked], grp[metric][checked], color=colour,
                           marker="D", label=f"{kind} (fleet check)")
            if (~checked).any():
                ax.scatter(grp.usd_per_m_output_tokens[~checked], grp[metric][~checked],
                           facecolors="none", edgecolors=colour, label=f"{kind} (estimate)")
            on = grp[grp.candidate.isin(fronts.get(str(kind), []))].sort_values("usd_per_m_output_tokens")
            ax.plot(on.usd_per_m_output_tokens, on[metric], "-", color=colour, alpha=0.5)
        ax.set_xlabel("$ per million output tokens at the target rate")
        ax.set_ylabel(name)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    return fig


def deployment_section(plan: dict) -> Section | None:
    dep = plan.get("deployments")
    if not dep:
        return None
    points = pd.DataFrame(dep["points"])
    text = ["Aggregated (every GPU runs prefill and decode) against disaggregated (separate prefill and "
            "decode pools) at the target rate; points: " + str(dep["stands_on"]) + ". A candidate "
            "is on a front when no other is at least as good on $/M output tokens, p99 TTFT and p99 TPOT."]
    for kind, d in dep["by_deployment"].items():
        c = d["cheapest"]
        text.append(markup("Cheapest {}: <b>{}</b>, ${}/M output tokens, ${}/hour on {} GPUs, "
                           "p99 TTFT {} s, p99 TPOT {} s ({}); {} candidate(s), {} on its front.",
                           kind, c["candidate"], f"{c['usd_per_m_output_tokens']:.3f}",
                           f"{c['usd_per_hour']:.2f}", c["gpus"], f"{c['ttft_p99_s']:.3g}",
                           f"{c['tpot_p99_s']:.3g}", "fleet check" if c["checked"] else "estimate",
                           d["candidates"], len(d["front"])))
    table = points.assign(on_front=points.candidate.isin(dep["front"]))
    fronts = {k: d["front"] for k, d in dep["by_deployment"].items()}
    return Section("aggregated vs disaggregated", text, [("deployments", table)],
                   [("deployments", png(deployment_plot(points, fronts)))])
