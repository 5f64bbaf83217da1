"""The report of a plan by concurrency (sim/planning/concurrency.py): the recommendation,
users vs latency (one replica's probes per candidate, and the fleet checks at their
users per replica), the fleet checks and the candidates. Every value is escaped by the
page writer (sim/report/document.py): text through `markup`, table cells as text, plot
labels with mathtext off."""

from __future__ import annotations

import pandas as pd
from matplotlib.figure import Figure

from sim.report.document import Report, Section, fmt_cell, markup, plot_value, png

CANDIDATE_COLUMNS = ["candidate", "status", "users_per_replica", "fail_users", "request_rate_at_capacity",
                     "ttft_p99_at_capacity_s", "tpot_p99_at_capacity_s", "replicas", "gpus", "usd_per_hour",
                     "fleet_replicas", "fleet_usd_per_hour", "broke", "note"]
CHECK_COLUMNS = ["candidate", "users", "estimated_replicas", "replicas", "usd_per_hour", "usd_per_m_output_tokens",
                 "ttft_p99_s", "tpot_p99_s", "request_throughput", "holds", "one_fewer_breaks"]


def users_plot(plan: dict) -> Figure:
    """p99 TTFT and TPOT against users: one replica's probes per candidate (filled: met
    the SLOs on every seed), the fleet checks at users / replicas (diamonds), the SLOs."""
    fig = Figure(figsize=(9, 4.2), layout="constrained")
    axes = fig.subplots(1, 2)
    pts = pd.DataFrame(plan.get("probe_curves") or [])
    slo = plan.get("slo") or {}
    names = list(dict.fromkeys(pts.candidate)) if len(pts) else []
    for i, name in enumerate(names):
        mine = pts[pts.candidate == name].sort_values("users")
        for ax, key in zip(axes, ("ttft_p99_s", "tpot_p99_s"), strict=True):
            ys = [plot_value(v) for v in mine[key]]
            ax.plot(list(mine.users), ys, "-", color=f"C{i}", label=str(name))
            ok = mine.passed.astype(bool).to_list()
            ax.scatter([u for u, g in zip(mine.users, ok, strict=True) if g],
                       [y for y, g in zip(ys, ok, strict=True) if g], color=f"C{i}")
            ax.scatter([u for u, g in zip(mine.users, ok, strict=True) if not g],
                       [y for y, g in zip(ys, ok, strict=True) if not g], facecolors="none",
                       edgecolors=f"C{i}")
    for c in plan.get("fleet_checks") or []:
        i = names.index(c.get("candidate")) if c.get("candidate") in names else len(names)
        for row in c.get("checks") or []:
            per = plot_value(c.get("users")) / max(plot_value(row.get("replicas")), 1)
            for ax, key in zip(axes, ("ttft_p99_s", "tpot_p99_s"), strict=True):
                ax.scatter([per], [plot_value(row.get(key))], marker="D", color=f"C{i}", alpha=0.6)
    for ax, key, name in ((axes[0], "ttft_p99_s", "p99 TTFT (s)"), (axes[1], "tpot_p99_s", "p99 TPOT (s)")):
        if slo.get(key) is not None:
            ax.axhline(plot_value(slo[key]), color="r", linestyle=":", label="SLO")
        ys = [v for line in ax.lines for v in line.get_ydata() if v == v and v > 0]
        if ys and max(ys) > 20 * min(ys):  # a knee that runs away: log scale keeps the SLO in view
            ax.set_yscale("log")
        ax.set_xlabel("concurrent users per replica")
        ax.set_ylabel(name)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    for t in axes[0].get_legend().get_texts() if axes[0].get_legend() else []:
        t.set_parse_math(False)  # a candidate's name is text, never mathtext
    fig.suptitle("users vs latency: one replica (dots: met the SLOs; rings: broke them); "
                 "diamonds: fleet checks", fontsize=9)
    return fig


def concurrency_sections(plan: dict) -> Report:
    rec = plan.get("recommended")
    users = plan.get("target_users")
    if rec:
        text = [markup("Recommended: <b>{}</b> x <b>{}</b> ({} GPUs) for {} users, ${}/hour, ${} per million "
                       "output tokens, p99 TTFT {} s, p99 TPOT {} s (its fleet check).",
                       rec.get("candidate"), rec.get("replicas"), rec.get("gpus"), users,
                       fmt_cell(rec.get("usd_per_hour")), fmt_cell(rec.get("usd_per_m_output_tokens")),
                       fmt_cell(rec.get("ttft_p99_s")), fmt_cell(rec.get("tpot_p99_s")))]
        est = rec.get("estimate") or {}
        text.append(markup("Estimate before the check: {} replicas at {} users each, ${}/hour.",
                           est.get("replicas"), est.get("users_per_replica"), fmt_cell(est.get("usd_per_hour"))))
    else:
        text = [markup("<span class='bad'>No fleet checked meets the SLOs for {} users.</span>", users)]
    text.append(markup("Closed loop: each user sends its next request when the previous reply ends (plus its "
                       "think time), so load is users, not a rate. One replica's users: the most whole users "
                       "whose {} s probes meet the SLOs on every seed (doubling, then bisection). Fleet checks "
                       "run the users plus the margin behind the plan's router on fresh seeds.",
                       fmt_cell(plan.get("probe_s"))))
    images = [("users vs latency", png(users_plot(plan)))] if plan.get("probe_curves") else []
    checks = plan.get("fleet_checks") or []
    rows = pd.DataFrame(plan.get("candidates") or [])
    for c in CANDIDATE_COLUMNS:
        if c not in rows.columns:
            rows[c] = None
    tried = pd.DataFrame([{"candidate": c.get("candidate"), **k} for c in checks for k in c.get("checks") or []])
    secs = [Section("users vs latency", text,
                    [("fleet checks", pd.DataFrame([{k: c.get(k) for k in CHECK_COLUMNS} for c in checks],
                                                   columns=CHECK_COLUMNS)),
                     ("fleet counts tried", tried)], images),
            Section("candidates", ["One row per candidate: users one replica sustains, the first failing "
                                   "count, the fleet that takes (estimate) and its check where one ran."],
                    [("candidates", rows[CANDIDATE_COLUMNS]),
                     ("probes", pd.DataFrame(plan.get("probe_curves") or []))])]
    slo = ", ".join(f"{k} {v}" for k, v in (plan.get("slo") or {}).items() if v is not None)
    keys = [("target", f"{fmt_cell(users)} users"), ("SLOs", slo or "-")]
    if rec:
        keys += [("recommended", f"{rec.get('candidate')} x {rec.get('replicas')}"),
                 ("$/hour", fmt_cell(rec.get("usd_per_hour")))]
    return Report(f"llmsim plan (users): {plan.get('name')}", keys, secs)
