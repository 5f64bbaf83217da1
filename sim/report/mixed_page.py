"""The report of a mixed-fleet plan (sim/planning/mixed.py): the recommendation, the
best mix against the best single type (estimate and fleet check side by side, each with
its 90 % interval, and as a plot), the length mix, one replica's capacity per class, and
every option. Every value is escaped by the page writer (sim/report/document.py): text
through `markup`, table cells as text, plot labels with mathtext off."""

from __future__ import annotations

import math

import pandas as pd
from matplotlib.figure import Figure

from sim.report.document import Report, Section, fmt_cell, markup, plot_value, png

OPTION_COLUMNS = ["label", "kind", "thresholds", "usd_per_hour", "usd_per_hour_interval90"]
SHOWN_OPTIONS = 40  # the cheapest options in the page's table (options.csv holds them all)


def _rng(r, fmt: str = "{:.3g}") -> str:
    if not r or any(v is None or (isinstance(v, float) and math.isnan(v)) for v in r):
        return "-"
    lo, hi = r
    return fmt.format(lo) if lo == hi else f"{fmt.format(lo)} - {fmt.format(hi)}"


def _pct(v) -> str:
    """A half-width b as '±9%' ('-' when missing)."""
    b = plot_value(v)
    return "-" if math.isnan(b) else f"±{b:.0%}"


def comparison_plot(plan: dict) -> Figure:
    """$/hour of the best mix and the best single type: the estimate and the fleet check's
    cost side by side, each with its 90 % interval."""
    fig = Figure(figsize=(7, 3.6), layout="constrained")
    ax = fig.subplots()
    names, checks = [], plan.get("checks") or {}
    for i, key in enumerate(("best_mix", "best_single")):
        o = plan.get(key)
        if not o:
            continue
        checked = (checks.get(key) or {}).get("fleet")
        names.append((i, ("best mix" if key == "best_mix" else "best single type") + f"\nestimate {o.get('label')}"
                      + (f"\nchecked {checked}" if checked and checked != o.get("label") else "")))
        for dx, src, color, what in ((-0.15, o, "C0", "estimate"), (0.15, checks.get(key), "C2", "fleet check")):
            if not src:
                continue
            y = plot_value(src.get("usd_per_hour"))
            lo, hi = (list(map(plot_value, src["usd_per_hour_interval90"])) if src.get("usd_per_hour_interval90")
                      else (y, y))
            ax.bar(i + dx, y, width=0.28, color=color, alpha=0.8, label=what)
            if not (math.isnan(lo) or math.isnan(hi)):
                ax.errorbar(i + dx, y, yerr=[[max(y - lo, 0)], [max(hi - y, 0)]], color="k", capsize=4)
    ax.set_xticks([i for i, _ in names], [n for _, n in names], fontsize=7)
    for t in ax.get_xticklabels():
        t.set_parse_math(False)  # a GPU or plan name is text, never mathtext
    ax.set_ylabel("$/hour (bar: figure; whisker: 90 % interval)")
    handles, labels = ax.get_legend_handles_labels()
    seen = dict(zip(labels, handles, strict=True))
    ax.legend(seen.values(), seen.keys(), fontsize=8)
    ax.grid(alpha=0.3, axis="y")
    return fig


def _check_row(key: str, c: dict) -> dict:
    return {"fleet": f"{key.replace('_', ' ')}: {c.get('fleet')}", "holds": c.get("holds"),
            "usd_per_hour": c.get("usd_per_hour"),
            "usd_per_hour_interval90": _rng(c.get("usd_per_hour_interval90"), "{:.2f}"),
            "ttft_p99_s": c.get("ttft_p99_s"), "ttft_p99_interval90_s": _rng(c.get("ttft_p99_interval90_s")),
            "tpot_p99_s": c.get("tpot_p99_s"), "tpot_p99_interval90_s": _rng(c.get("tpot_p99_interval90_s")),
            "interval90_model": _pct(c.get("interval90_model")), "fleets_run": c.get("fleets_run"),
            "estimate": c.get("option")}


def mixed_sections(plan: dict) -> Report:
    rec, checks = plan.get("recommended"), plan.get("checks") or {}
    arrival = (plan.get("arrival") or {}).get("label", "Poisson at the probed rate")
    text = []
    if rec:
        text.append(markup("Recommended: <b>{}</b> ({}), ${}/hour (90 % interval ${}), ${} per million "
                           "output tokens (90 % interval ${}), p99 TTFT {} s (90 % interval {}), p99 TPOT "
                           "{} s (90 % interval {}): its fleet check.",
                           rec.get("fleet"), rec.get("kind"), fmt_cell(rec.get("usd_per_hour")),
                           _rng(rec.get("usd_per_hour_interval90"), "{:.2f}"),
                           fmt_cell(rec.get("usd_per_m_output_tokens")),
                           _rng(rec.get("usd_per_m_output_tokens_interval90"), "{:.3f}"),
                           fmt_cell(rec.get("ttft_p99_s")), _rng(rec.get("ttft_p99_interval90_s")),
                           fmt_cell(rec.get("tpot_p99_s")), _rng(rec.get("tpot_p99_interval90_s"))))
        single = checks.get("best_single")
        if single and single.get("holds") and rec.get("kind") == "mix":
            saved = 1 - plot_value(rec.get("usd_per_hour")) / plot_value(single.get("usd_per_hour"))
            text.append(markup("The mix saves {} against the best single type checked ({}, ${}/hour).",
                               f"{saved:.0%}", single.get("fleet"), fmt_cell(single.get("usd_per_hour"))))
        elif rec.get("kind") == "single":
            text.append("No mix checked beats the best single type: one GPU type for every length.")
    else:
        text.append(markup("<span class='bad'>No checked fleet meets the SLOs.</span>"))
    text += [markup("Arrivals: {}. Both fleets were simulated on the same traffic (the target plus the "
                    "margin, fresh seeds; the length router, each pool's own router within).", arrival),
             "90 % intervals (sim/planning/uncertainty.py): each figure's spread over seeds (a sustained "
             "rate's: the bisection's bracket) widened by b, the step model's 90 % error, the "
             "share-weighted interval90 of the lookup classes behind it (data/step_error_bands.yaml): a "
             "latency's [seed low / (1 + b), seed high / (1 - b)], a rate's [low x (1 - b), high x (1 + b)]; "
             "replicas and dollars follow from the rates' intervals."]
    if rec and rec.get("stands_on_lookups"):
        text.append(markup("The recommended fleet's step time stands on: {} (its 90 % error {}).",
                           rec["stands_on_lookups"], _pct(rec.get("interval90_model"))))
    table = pd.DataFrame([_check_row(k, c) for k, c in checks.items()])
    est = pd.DataFrame([{"option": f"{k.replace('_', ' ')}: {o.get('label')}", "usd_per_hour": o.get("usd_per_hour"),
                         "usd_per_hour_interval90": _rng(o.get("usd_per_hour_interval90"), "{:.2f}"),
                         **{f"pool {i + 1}": f"{p.get('replicas')} x {p.get('gpu')} ({plot_value(p.get('share')):.0%}, "
                            f"{plot_value(p.get('sustained_rate')):.3g} req/s each)"
                            for i, p in enumerate(o.get("pools") or [])}}
                        for k in ("best_mix", "best_single") if (o := plan.get(k))])
    images = [("mixed vs single", png(comparison_plot(plan)))] if plan.get("best_single") or plan.get("best_mix") else []
    secs = [Section("mixed vs single type", text, [("fleet checks", table), ("estimates", est)], images)]
    m = plan.get("mix") or {}
    shares = m.get("class_share") or m.get("short_share") or {}
    cvs = m.get("interarrival_cv") or {}
    mix_table = pd.DataFrame([{"class (tokens)": k, "share": v, "inter-arrival CV": cvs.get(k)}
                              for k, v in shares.items()])
    caps = pd.DataFrame([{k: c.get(k) for k in ("gpu", "workload", "rate", "fail_rate", "probes", "broke", "note")}
                         | {"sustained_rate_interval90": _rng(c.get("sustained_rate_interval90")),
                            "interval90_model": _pct(c.get("interval90_model"))}
                         for c in plan.get("capacity") or []])
    cost = plan.get("search_cost") or {}
    secs.append(Section("length mix and capacity", [
        markup("{} requests drawn (seed {}), by {} tokens; classes of up to {} pools. One replica's sustained "
               "rate: the highest rate it serves in steady state within the SLOs on the sub-workload its "
               "class receives. The search: {} capacity searches, {} options priced.",
               m.get("requests"), m.get("seed"), plan.get("length_by"), plan.get("classes", 2),
               cost.get("capacity_searches", "-"), cost.get("options", "-"))],
        [("length mix", mix_table), ("capacity", caps)]))
    opts = plan.get("options") or []
    rows = pd.DataFrame([{"option": o.get("label"), "kind": o.get("kind"),
                          "thresholds": " ".join(map(str, o.get("thresholds") or [o.get("threshold")])),
                          "usd_per_hour": o.get("usd_per_hour"),
                          "usd_per_hour_interval90": _rng(o.get("usd_per_hour_interval90"), "{:.2f}")}
                         for o in opts[:SHOWN_OPTIONS]])
    secs.append(Section("options", [f"The {min(len(opts), SHOWN_OPTIONS)} cheapest of {len(opts)} options "
                                    "(estimates from one replica's capacity; all in options.csv)."],
                        [("options", rows)]))
    slo = ", ".join(f"{k} {v}" for k, v in (plan.get("slo") or {}).items() if v is not None)
    keys = [("target", f"{fmt_cell(plan.get('target_rate'))} req/s"), ("SLOs", slo or "-"), ("arrivals", arrival)]
    if rec:
        keys += [("recommended", str(rec.get("fleet"))), ("$/hour", fmt_cell(rec.get("usd_per_hour")))]
    return Report(f"llmsim plan (mixed fleet): {plan.get('name')}", keys, secs)
