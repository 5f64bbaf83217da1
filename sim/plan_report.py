"""The plan's report: recommendation, its simulated check, candidates, Pareto plot."""

from __future__ import annotations

import math

import pandas as pd
from matplotlib.figure import Figure

from .report import Report, Section, png

CANDIDATE_COLUMNS = ["candidate", "status", "sustained_rate", "seeds_passed_at_fail", "ttft_p99_spread_s",
                     "binding", "replicas", "gpus", "usd_per_hour", "usd_per_m_output_tokens",
                     "ttft_p99_at_target_s", "tpot_p99_at_target_s", "pareto", "note"]


def pareto_plot(rows: pd.DataFrame, best: str | None) -> Figure:
    fig = Figure(figsize=(8, 5), layout="constrained")
    ax = fig.subplots()
    ok = rows[rows.status == "ok"]
    ax.scatter(ok.usd_per_hour, ok.ttft_p99_at_target_s, color="C0", label="candidate")
    front = ok[ok.pareto].sort_values("usd_per_hour")
    ax.plot(front.usd_per_hour, front.ttft_p99_at_target_s, "-o", color="C1", label="Pareto front")
    for r in ok.itertuples():
        ax.annotate(r.candidate, (r.usd_per_hour, r.ttft_p99_at_target_s), fontsize=7,
                    xytext=(3, 3), textcoords="offset points")
    if best is not None and best in set(ok.candidate):
        b = ok[ok.candidate == best].iloc[0]
        ax.scatter([b.usd_per_hour], [b.ttft_p99_at_target_s], s=160, facecolors="none",
                   edgecolors="C3", label="recommended (before fleet check)")
    ax.set_xlabel("fleet cost at the target rate ($/hour)")
    ax.set_ylabel("p99 TTFT at each replica's share (s)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return fig


def _router(check: dict) -> str:
    """The router the fleet check ran behind (plans written before `router:` used random)."""
    return check.get("router_label") or "random router"


def plan_sections(plan: dict) -> Report:
    rows = pd.DataFrame(plan["candidates"])
    for c in CANDIDATE_COLUMNS:
        if c not in rows.columns:
            rows[c] = None
    rec, check = plan.get("recommended"), plan.get("fleet_check")
    slo = ", ".join(f"{k} {v}" for k, v in plan["slo"].items() if v is not None)
    secs = []
    if rec:
        verdict = ("<span class='ok'>holds</span>" if check["holds"] else "<span class='bad'>does NOT hold</span>")
        fewer = ("<span class='ok'>breaks them</span>" if check["one_fewer_breaks"]
                 else "<span class='bad'>still meets them</span>")
        text = [f"Recommended: <b>{rec['candidate']}</b> x <b>{rec['replicas']}</b> replicas "
                f"({rec['gpus']} GPUs), ${rec['usd_per_hour']:.2f}/hour, "
                f"${rec['usd_per_m_output_tokens']:.3f} per million output tokens.",
                f"Simulated as a fleet at {plan['target_rate']:g} req/s ({_router(check)}, seeds "
                f"{check['seeds']}): the SLOs {verdict} with {check['replicas']} replicas; one replica "
                f"fewer {fewer}. The per-replica estimate was {check['estimated_replicas']}."]
        secs.append(Section("recommendation", text, [("fleet check", pd.DataFrame(check["checks"]))]))
    else:
        secs.append(Section("recommendation", ["<span class='bad'>No candidate meets the SLOs.</span>"]))
    ok = rows[rows.status == "ok"]
    imgs = [("pareto", png(pareto_plot(rows, rec["candidate"] if rec else None)))] if len(ok) else []
    secs.append(Section("candidates", [
        "Sustained rate: the highest Poisson rate one replica serves with every seed meeting the SLOs "
        "(bisection on the rate). Binding: what ran out first at the first failing probe."],
        [("candidates", rows[CANDIDATE_COLUMNS])], imgs))
    keys = [("target", f"{plan['target_rate']:g} req/s"), ("SLOs", slo or "-")]
    if rec:
        keys += [("recommended", rec["candidate"]), ("replicas", str(rec["replicas"])),
                 ("$/hour", f"{rec['usd_per_hour']:.2f}"),
                 ("$/M output tokens", f"{rec['usd_per_m_output_tokens']:.3f}"
                  if not math.isnan(rec["usd_per_m_output_tokens"]) else "-")]
    return Report(f"llmsim plan: {plan['name']}", keys, secs)
