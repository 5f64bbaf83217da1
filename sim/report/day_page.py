"""The report of a plan over a day (sim/planning/dayplan.py): the recommendation, the
day's totals against the lower bound and static peak, every fleet simulated, and plots
over the day (offered rate, ready replicas and the bound; p99 TTFT and TPOT per window
against the SLOs; SLO attainment per window; fleet power). Every value is escaped by the
page writer (sim/report/document.py): text and table cells as text, plots as PNGs."""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from sim.report.document import Report, Section, fmt_cell, markup, png

FLEET_COLUMNS = ["candidate", "fleet", "status", "slo_attainment", "rejected", "gpu_hours", "usd",
                 "usd_over_bound", "energy_mwh", "kwh_per_m_output_tokens", "peak_ready",
                 "ttft_p99_s", "tpot_p99_s", "meets", "note"]


def _num(v) -> float:
    return float("nan") if v is None else float(v)


def day_plot(plan: dict, fleets: list[dict]) -> Figure:
    """Five panels over the day for `fleets` (the recommended one and static peak) of one
    candidate, with that candidate's lower bound."""
    fig = Figure(figsize=(10, 12), layout="constrained")
    axes = fig.subplots(5, 1, sharex=True)
    win = float(plan["day"]["window_s"])
    rates = plan["rates"]
    t_rate = np.array([w["start_s"] for w in rates] + [rates[-1]["end_s"]])
    ax = axes[0]
    ax.stairs([w["rate"] for w in rates], t_rate, label="offered rate, profile (req/s)", color="C0")
    ax.set_ylabel("requests/s")
    ax2 = ax.twinx()
    cand = next((c for c in plan["candidates"] if c["capacity"]["candidate"] == fleets[0]["candidate"]), None)
    if cand is not None and "bound" in cand:
        ax2.stairs([w["replicas"] for w in cand["bound"]["windows"]], t_rate, color="k", linestyle="--",
                   label="lower bound (replicas)")
    slo = plan["slo"]
    for i, f in enumerate(fleets):
        ws = f["windows"]
        t = np.array([w["start_s"] for w in ws])
        c = f"C{i + 1}"
        ax2.step(t, [w["mean_ready"] for w in ws], where="post", color=c, label=f"{f['fleet']}: ready")
        axes[1].step(t, [_num(w["ttft_p99_s"]) for w in ws], where="post", color=c, label=f["fleet"])
        axes[2].step(t, [_num(w["tpot_p99_s"]) for w in ws], where="post", color=c, label=f["fleet"])
        axes[3].step(t, [_num(w["slo_attainment"]) for w in ws], where="post", color=c, label=f["fleet"])
        axes[4].step(t, [_num(w["power_w"]) / 1000 for w in ws], where="post", color=c, label=f["fleet"])
        if i == 0:
            ax.step(t, [w["requests"] / win for w in ws], where="post", color="C0", alpha=0.4,
                    label="offered, simulated (req/s)")
    ax2.set_ylabel("replicas")
    lines = ax.get_legend_handles_labels()
    lines2 = ax2.get_legend_handles_labels()
    ax.legend(lines[0] + lines2[0], lines[1] + lines2[1], fontsize=7, loc="upper left")
    for ax, key, name in ((axes[1], "ttft_p99_s", "p99 TTFT (s)"), (axes[2], "tpot_p99_s", "p99 TPOT (s)")):
        if slo.get(key) is not None:
            ax.axhline(slo[key], color="r", linestyle=":", label="SLO")
        ax.set_ylabel(name)
        ax.legend(fontsize=7)
    axes[3].axhline(plan["day"]["attainment"], color="r", linestyle=":", label="target")
    axes[3].set_ylabel("SLO attainment\nper window")
    axes[3].legend(fontsize=7)
    axes[4].set_ylabel("fleet power (kW)")
    axes[4].set_xlabel("time of day (s)")
    axes[4].legend(fontsize=7)
    fig.suptitle(f"{fleets[0]['candidate']}: the day, window {win:g} s")
    return fig


def _totals(plan: dict) -> pd.DataFrame:
    """Per candidate: the lower bound, static peak (analytic and simulated) and its
    cheapest fleet meeting the target, over the day."""
    rows = []
    for c in plan["candidates"]:
        cap = c["capacity"]
        if "bound" not in c:
            continue
        b, s = c["bound"], c["static"]
        rows.append({"candidate": cap["candidate"], "fleet": "lower bound (analytic)",
                     "gpu_hours": b["gpu_hours"], "usd": b["usd"], "energy_mwh": None,
                     "kwh_per_m_output_tokens": None, "slo_attainment": None})
        rows.append({"candidate": cap["candidate"], "fleet": f"static peak ({s['replicas']} replicas)",
                     "gpu_hours": s["gpu_hours"], "usd": s["usd"], "energy_mwh": None,
                     "kwh_per_m_output_tokens": None, "slo_attainment": None})
        mine = [f for f in plan["fleets"] if f["candidate"] == cap["candidate"] and f.get("status") == "ok"]
        for f in mine:
            if f["fleet"] == "static peak" or f is min((x for x in mine if x.get("meets")),
                                                      key=lambda x: x["usd"], default=None):
                rows.append({"candidate": cap["candidate"], "fleet": f"{f['fleet']} (simulated)",
                             **{k: f.get(k) for k in ("gpu_hours", "usd", "energy_mwh",
                                                      "kwh_per_m_output_tokens", "slo_attainment")}})
    return pd.DataFrame(rows)


def day_sections(plan: dict) -> Report:
    rec = plan.get("recommended")
    p = plan["profile"]
    text = [markup("Target: <b>{}</b>. Day: {} profile over {} s, mean {} req/s, peak {} req/s.",
                   plan["target"], p["kind"], fmt_cell(p["duration_s"]), fmt_cell(p["mean_rate"]),
                   fmt_cell(p["peak_rate"])),
            "The lower bound is, per window, ceil(window mean rate / one replica's sustained rate) "
            "replicas: no fleet meeting the SLOs in steady state does with fewer, with no provisioning "
            "delay and no drain. Static peak: ceil(peak rate / sustained rate) replicas all day. "
            "Fleets: whole days simulated with the autoscaler; attainment is the worst seed's; "
            "$ is replica-hours x the plan prices; energy from the power model (idle + kernel time).",
            str(plan.get("stands_on", ""))]
    if rec is not None:
        text.insert(0, markup("Recommended: <b>{}</b>, <b>{}</b>: ${} over the day, {} GPU-hours, "
                              "SLO attainment {} ({}x the lower bound).", rec["candidate"], rec["fleet"],
                              f"{rec['usd']:.2f}", f"{rec['gpu_hours']:.3g}", f"{rec['slo_attainment']:.4f}",
                              f"{rec['usd_over_bound']:.2f}"))
    else:
        text.insert(0, markup("<span class='bad'>No fleet met the target.</span>"))
    fleets = pd.DataFrame([{k: f.get(k) for k in FLEET_COLUMNS} for f in plan["fleets"]],
                          columns=FLEET_COLUMNS)
    caps = pd.DataFrame([{k: c["capacity"].get(k) for k in ("candidate", "status", "sustained_rate",
                                                               "binding", "gpus_per_replica",
                                                               "usd_per_replica_hour", "note")}
                         | {"provisioning_delay_s": c.get("delay_s")} for c in plan["candidates"]])
    images = []
    shown = [f for f in plan["fleets"] if f.get("status") == "ok"]
    if shown:  # the recommended fleet (else the first simulated) beside its static peak
        lead = next((f for f in shown if rec is not None and f["candidate"] == rec["candidate"]
                     and f["fleet"] == rec["fleet"]), shown[0])
        pick = [lead] + [f for f in shown if f["candidate"] == lead["candidate"]
                         and f["fleet"] == "static peak" and f is not lead]
        images.append(("the day", png(day_plot(plan, pick))))
    secs = [Section("the day", text, [("totals", _totals(plan))], images),
            Section("fleets simulated", [], [("fleets", fleets)]),
            Section("one replica", ["Sustained rate: the highest Poisson rate one replica serves with "
                                    "every seed meeting the p99 SLOs in steady state (bisection)."],
                    [("capacity", caps)])]
    keys = [("target", f"attainment >= {plan['day']['attainment']:.4g}")]
    if rec is not None:
        keys += [("recommended", f"{rec['candidate']} {rec['fleet']}"), ("$ over the day", f"{rec['usd']:.2f}"),
                 ("GPU-hours", f"{rec['gpu_hours']:.3g}"),
                 ("x lower bound", f"{rec['usd_over_bound']:.2f}")]
        if rec.get("energy_mwh") is not None:
            keys.append(("MWh", f"{rec['energy_mwh']:.4g}"))
    return Report(f"llmsim plan (day): {plan['name']}", keys, secs)
