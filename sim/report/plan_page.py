"""The plan's report: recommendation, the fleet checks, candidates, Pareto plot.

A plan.json written before the fleet checks were re-ranked (one `fleet_check`, no
`fleet_checks`, the recommended figures partly the estimate's) still renders."""

from __future__ import annotations

import math

import pandas as pd
from matplotlib.figure import Figure

from sim.planning.traffic import label as arrival_label
from sim.report.deploy_page import deployment_section
from sim.report.document import Markup, Report, Section, markup, png

CANDIDATE_COLUMNS = ["candidate", "unit", "status", "sustained_rate", "seeds_passed_at_fail", "ttft_p99_spread_s",
                     "binding", "replicas", "gpus", "usd_per_hour", "usd_per_m_output_tokens",
                     "ttft_p99_at_target_s", "tpot_p99_at_target_s", "fleet_replicas", "fleet_usd_per_hour",
                     "fleet_ttft_p99_s", "pareto", "note"]
CHECK_COLUMNS = ["candidate", "estimated_replicas", "replicas", "gpus", "usd_per_hour", "usd_per_m_output_tokens",
                 "ttft_p99_s", "tpot_p99_s", "e2e_p99_s", "holds", "one_fewer_breaks"]


def pareto_plot(rows: pd.DataFrame, best: str | None) -> Figure:
    """Each candidate's estimate; where it was checked as a fleet, an arrow to its
    validated point; the recommended fleet ringed at its validated point."""
    fig = Figure(figsize=(8, 5), layout="constrained")
    ax = fig.subplots()
    ok = rows[rows.status == "ok"]
    ax.scatter(ok.usd_per_hour, ok.ttft_p99_at_target_s, color="C0", label="estimate (per-replica sizing)")
    checked = ok[ok.fleet_usd_per_hour.notna()] if "fleet_usd_per_hour" in ok else ok.iloc[:0]
    for r in checked.itertuples():
        ax.annotate("", (r.fleet_usd_per_hour, r.fleet_ttft_p99_s), (r.usd_per_hour, r.ttft_p99_at_target_s),
                    arrowprops={"arrowstyle": "->", "color": "C2", "alpha": 0.7})
    if len(checked):
        ax.scatter(checked.fleet_usd_per_hour, checked.fleet_ttft_p99_s, marker="D", color="C2",
                   label="fleet check (validated)")
    x, y = _points(ok)
    front = pd.DataFrame({"x": x, "y": y})[ok.pareto.astype(bool).to_numpy()].sort_values("x")
    ax.plot(front.x, front.y, "-", color="C1", label="Pareto front")
    for name, xi, yi, k in zip(ok.candidate, x, y, _stack_ranks(x, y), strict=True):
        ax.annotate(str(name), (xi, yi), fontsize=LABEL_PT, xytext=(3, 3 + LABEL_STEP_PT * k),
                    textcoords="offset points",
                    parse_math=False)  # a name is text, never mathtext: `$` in it must not fail
    if best is not None and best in set(ok.candidate):
        i = list(ok.candidate).index(best)
        validated = len(checked) and best in set(checked.candidate)
        ax.scatter([x[i]], [y[i]], s=160, facecolors="none", edgecolors="C3",
                   label="recommended (fleet check)" if validated else "recommended (estimate)")
    ax.set_xlabel("fleet cost at the target rate ($/hour)")
    ax.set_ylabel("p99 TTFT (s): fleet check, else one replica at its share")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return fig


LABEL_PT, LABEL_STEP_PT = 7, 9  # label font size; the rise between labels sharing a cost


def _stack_ranks(x: list[float], y: list[float]) -> list[int]:
    """Each label's rank among the candidates at its cost (equal $/hour to 0.1 %), lowest
    p99 first: label k of a cost rises k steps above its point, so labels of candidates
    that share a cost never sit on one another (each is at least a step above the last)."""
    ranks = [0] * len(x)
    order = sorted(range(len(x)), key=lambda i: (x[i], y[i]))
    for j, i in enumerate(order[1:], start=1):
        prev = order[j - 1]
        if math.isclose(x[i], x[prev], rel_tol=1e-3):
            ranks[i] = ranks[prev] + 1
    return ranks


def _points(ok: pd.DataFrame) -> tuple[list[float], list[float]]:
    """Each candidate's point: its fleet check's where it has one, else its estimate."""
    fx = ok.fleet_usd_per_hour if "fleet_usd_per_hour" in ok else pd.Series([None] * len(ok), index=ok.index)
    fy = ok.fleet_ttft_p99_s if "fleet_ttft_p99_s" in ok else fx
    x = [e if pd.isna(f) else f for e, f in zip(ok.usd_per_hour, fx, strict=True)]
    y = [e if pd.isna(f) else f for e, f in zip(ok.ttft_p99_at_target_s, fy, strict=True)]
    return x, y


def _n(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


def _router(check: dict) -> str:
    """The router the fleet check ran behind (plans written before `router:` used random)."""
    return check.get("router_label") or "random router"


def _recommendation(plan: dict, rec: dict, check: dict) -> Section:
    """Every value from plan.json goes in through `markup`, escaped (a plan is shared)."""
    verdict = "<span class='ok'>hold</span>" if check["holds"] else "<span class='bad'>do NOT hold</span>"
    fewer = ("<span class='ok'>breaks them</span>" if check["one_fewer_breaks"]
             else "<span class='bad'>still meets them</span>")
    checks = plan.get("fleet_checks") or [check]
    p99 = (f", p99 TTFT {rec['ttft_p99_s']:.3g} s, p99 TPOT {rec['tpot_p99_s']:.3g} s"
           if rec.get("ttft_p99_s") is not None else "")
    text = [markup("Recommended: <b>{}</b> x <b>{}</b> ({}), ${}/hour, ${} per million output tokens{}.",
                   rec["candidate"], _n(rec["replicas"], "replica"), _n(rec["gpus"], "GPU"),
                   f"{rec['usd_per_hour']:.2f}", f"{rec['usd_per_m_output_tokens']:.3f}", p99),
            markup("Simulated as a fleet at {} req/s ({}, seeds {}): the SLOs " + verdict + " with {}; "
                   "one replica fewer " + fewer + ". The per-replica estimate was {}.",
                   f"{plan['target_rate']:g}", _router(check), check["seeds"],
                   _n(check["replicas"], "replica"), check["estimated_replicas"])]
    est = rec.get("estimate")
    if est:
        text.append(f"Estimate before the fleet check (per-replica sizing): {_n(est['replicas'], 'replica')}, "
                    f"${est['usd_per_hour']:.2f}/hour, p99 TTFT {est['ttft_p99_at_target_s']:.3g} s at each "
                    f"replica's share.")
    if plan.get("fleet_checks") is not None:
        text.append(f"{len(checks)} candidate(s) checked as fleets, cheapest estimate first, while the "
                    "estimate was at most the cheapest validated cost; the cheapest validated fleet "
                    "is recommended.")
        if plan.get("unchecked_within"):
            text.append(markup("<span class='bad'>{} more candidate(s) estimated at or below ${}/hour "
                               "were not checked</span> (search.fleet_checks).",
                               plan["unchecked_within"], f"{rec['usd_per_hour']:.2f}"))
    table = pd.DataFrame([{k: c.get(k) for k in CHECK_COLUMNS} for c in checks])
    return Section("recommendation", text, [("fleet checks", table),
                                            ("fleet check", pd.DataFrame(check["checks"]))])


INTERVAL_COLUMNS = ["candidate", "sustained_rate", "sustained_rate_interval90", "replicas_interval90",
                    "usd_per_hour_interval90", "usd_per_m_output_tokens_interval90", "ttft_p99_interval90_s",
                    "tpot_p99_interval90_s", "interval90_model", "measured_share", "stands_on"]


def _pct(x) -> str:
    return "-" if x is None else f"{x:.0%}"


def _rng(r, fmt: str = "{:.3g}") -> str:
    if r is None or (isinstance(r, float) and math.isnan(r)):
        return "-"
    lo, hi = r
    return fmt.format(lo) if lo == hi else f"{fmt.format(lo)} - {fmt.format(hi)}"


def _confidence(plan: dict, rows: pd.DataFrame) -> Section | None:
    """How sure the figures are: the recommended fleet's 90 % intervals, how robust it is
    across them, what its step time stands on, its headroom and redundancy, ties; every
    candidate's intervals. Plans written before the intervals existed have no such section."""
    rec = plan.get("recommended")
    has_rows = "sustained_rate_interval90" in rows.columns
    if not has_rows and not (rec and "replicas_interval90" in rec):
        return None
    text = ["Every figure comes with a 90 % prediction interval: the spread over seeds (the "
            "bisection's bracket for sustained rates; for p99s the Student-t interval of one more "
            "seed, which is wider the fewer seeds ran) widened by the step model's own 90 % error, "
            "the share-weighted interval90 of each lookup class over the run's step time (measured "
            "= exact + interpolated, derived, extrapolated, analytic; data/step_error_bands.yaml, "
            "sized on held-out validation data and its coverage checked on data it was not sized "
            "on: docs/fidelity.md)."]
    if rec and "replicas_interval90" in rec:
        text.append(markup("Recommended fleet, 90 % intervals: replicas needed {}, ${}/hour, ${} per "
                           "million output tokens, p99 TTFT {} s, p99 TPOT {} s (over {} seed(s)). "
                           "<b>{} of its simulated step time rests on measurement</b> ({}); the step "
                           "model's 90 % error ±{}.",
                           _rng(rec["replicas_interval90"], "{:d}"), _rng(rec["usd_per_hour_interval90"], "{:.2f}"),
                           _rng(rec["usd_per_m_output_tokens_interval90"], "{:.3f}"),
                           _rng(rec["ttft_p99_interval90_s"]), _rng(rec["tpot_p99_interval90_s"]),
                           rec.get("seeds", "?"), _pct(rec["measured_share"]), rec["stands_on_lookups"],
                           _pct(rec["interval90_model"])))
        robust = rec["robust"]
        text.append(markup("<b>How robust:</b> {} x {}; " + ("{}." if robust["covers_interval"]
                                                            else "<span class='bad'>{}</span>."),
                           rec["replicas"], rec["candidate"], robust["words"]))
        head = rec.get("headroom")
        if head:
            text.append(f"Headroom: the SLOs still hold at {head['rate']:.3g} req/s, "
                        f"+{_pct(head['over_target'])} over the target"
                        + (f" (they break at +{_pct(head['fail_factor'] - 1)})." if head.get("fail_factor")
                           else " (no failing rate found in the rates tried)."))
        if rec.get("redundancy") == "n+1":
            text.append(markup("Redundancy n+1: the SLOs "
                               + ("hold" if rec.get("holds_one_down") else "<span class='bad'>do NOT hold</span>")
                               + " with one replica down."))
        elif rec.get("replicas") == 1:
            text.append(markup("<span class='bad'>No redundancy: one replica.</span> "
                               "Set search.redundancy: n+1 for a fleet that survives losing one."))
        if rec.get("ties"):
            text.append(f"Tied on cost with: {', '.join(rec['ties'])} (the tie goes to more replicas).")
    table = pd.DataFrame()
    if has_rows:
        ok = rows[(rows.status == "ok") & rows.sustained_rate_interval90.notna()]
        table = pd.DataFrame({c: ok[c] if c in ok else None for c in INTERVAL_COLUMNS})
        for c in ("sustained_rate_interval90", "usd_per_hour_interval90", "usd_per_m_output_tokens_interval90",
                  "ttft_p99_interval90_s", "tpot_p99_interval90_s"):
            table[c] = [_rng(v) for v in table[c]]
        table["replicas_interval90"] = [_rng(v, "{:d}") for v in table["replicas_interval90"]]
        table["interval90_model"] = [_pct(v) for v in table["interval90_model"]]
        table["measured_share"] = [_pct(v) for v in table["measured_share"]]
    return Section("how sure", text, [("90 % intervals", table)] if len(table) else [])


def _mixed(plan: dict) -> Report:
    from sim.report.mixed_page import mixed_sections

    return mixed_sections(plan)


def _users(plan: dict) -> Report:
    from sim.report.concurrency_page import concurrency_sections

    return concurrency_sections(plan)


OTHER_KINDS = {"mixed": _mixed, "concurrency": _users}


def plan_sections(plan: dict) -> Report:
    if plan.get("kind") == "day":  # a plan over a day (sim/planning/dayplan.py)
        from sim.report.day_page import day_sections

        return day_sections(plan)
    kind = plan.get("kind") or ("mixed" if "options" in plan and "checks" in plan else None)  # older mixed
    if kind in OTHER_KINDS:  # a mixed-fleet or closed-loop plan: its own page
        return OTHER_KINDS[kind](plan)
    rows = pd.DataFrame(plan["candidates"])
    for c in CANDIDATE_COLUMNS:
        if c not in rows.columns:
            rows[c] = None
    rec, check = plan.get("recommended"), plan.get("fleet_check")
    slo = ", ".join(f"{k} {v}" for k, v in plan["slo"].items() if v is not None)
    if rec:
        secs = [_recommendation(plan, rec, check)]
    else:
        checks = plan.get("fleet_checks") or ([check] if check else [])
        secs = [Section("recommendation", [Markup("<span class='bad'>No candidate meets the SLOs"
                                                  + (" as a fleet (the fleet checks below)" if checks else "")
                                                  + ".</span>")],
                        [("fleet checks", pd.DataFrame([{k: c.get(k) for k in CHECK_COLUMNS}
                                                        for c in checks]))] if checks else [])]
    sure = _confidence(plan, rows)
    if sure is not None:
        secs.append(sure)
    ok = rows[rows.status == "ok"]
    imgs = [("pareto", png(pareto_plot(rows, rec["candidate"] if rec else None)))] if len(ok) else []
    secs.append(Section("candidates", [
        "Sustained rate: the highest Poisson rate one replica serves with every seed meeting the SLOs "
        "(bisection on the rate). Binding: the SLO that broke first at the first failing probe, and "
        "what ran out (a p99 TTFT that is mostly the prefill itself: prefill time). "
        "replicas to TTFT/TPOT p99: the per-replica estimate; fleet_*: the fleet check, where one ran. "
        "Skipped: refused by the scenario, or no price."],
        [("candidates", rows[CANDIDATE_COLUMNS])], imgs))
    deployments = deployment_section(plan)  # aggregated vs disaggregated, when the plan has both
    secs += [deployments] if deployments else []
    keys = [("target", f"{plan['target_rate']:g} req/s"), ("SLOs", slo or "-")]
    if plan.get("arrival"):  # the arrival process the plan sized to (sim/planning/traffic.py)
        keys.append(("arrivals", arrival_label(plan["arrival"])))
    if rec:
        keys += [("recommended", rec["candidate"]), ("replicas", str(rec["replicas"])),
                 ("$/hour", f"{rec['usd_per_hour']:.2f}"),
                 ("$/M output tokens", f"{rec['usd_per_m_output_tokens']:.3f}"
                  if not math.isnan(rec["usd_per_m_output_tokens"]) else "-")]
    return Report(f"llmsim plan: {plan['name']}", keys, secs)
