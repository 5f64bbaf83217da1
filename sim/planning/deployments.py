"""Aggregated against disaggregated: the Pareto fronts of a plan's deployments.

Each candidate that met the SLOs is a point at the target rate: cost ($ per million
output tokens, and $ per hour) against the SLO metrics p99 TTFT and p99 TPOT — its
fleet check's figures where it was checked as a fleet, else its estimate (one unit at
its share of the target). A candidate is on the front when no other candidate is at
least as good on all three of $/M output tokens, p99 TTFT and p99 TPOT and better on
one. `deployment_fronts` gives the front over all candidates, each deployment's own
front (aggregated: every GPU runs prefill and decode; disaggregated: separate prefill
and decode pools, `sim/planning/units.py`) and each deployment's cheapest candidate, so
a planner sees what splitting prefill from decode buys, as NVIDIA's AIConfigurator
shows it.
"""

from __future__ import annotations

import math

METRICS = ("usd_per_m_output_tokens", "ttft_p99_s", "tpot_p99_s")
STANDS_ON = ("each candidate's fleet check at the target rate where it ran, else its estimate "
             "(one unit at its share of the target)")


def deployment_point(row: dict) -> dict:
    """A candidate's ($/hour, $/M output tokens, p99 TTFT, p99 TPOT): its fleet check's
    where it has one, else the estimate's; `checked` says which."""
    checked = row.get("fleet_usd_per_hour") is not None
    if checked:
        return {"usd_per_hour": row["fleet_usd_per_hour"],
                "usd_per_m_output_tokens": row.get("fleet_usd_per_m_output_tokens",
                                                   row["usd_per_m_output_tokens"]),
                "ttft_p99_s": row["fleet_ttft_p99_s"],
                "tpot_p99_s": row.get("fleet_tpot_p99_s", row["tpot_p99_at_target_s"]), "checked": True}
    return {"usd_per_hour": row["usd_per_hour"], "usd_per_m_output_tokens": row["usd_per_m_output_tokens"],
            "ttft_p99_s": row["ttft_p99_at_target_s"], "tpot_p99_s": row["tpot_p99_at_target_s"],
            "checked": False}


def _key(p: dict) -> tuple[float, ...]:
    return tuple(math.inf if p[m] is None or math.isnan(p[m]) else p[m] for m in METRICS)


def front(points: dict[str, dict]) -> list[str]:
    """Names no other point dominates on every metric of METRICS (lower is better)."""
    keys = {n: _key(p) for n, p in points.items()}
    return [n for n, a in keys.items()
            if not any(b != a and all(x <= y for x, y in zip(b, a, strict=True)) for b in keys.values())]


def deployment_fronts(rows: list[dict]) -> dict | None:
    """The fronts of the candidates that met the SLOs, over all and per deployment; None
    when the plan has a single deployment kind."""
    ok = [r for r in rows if r.get("status") == "ok" and r.get("deployment")]
    kinds = sorted({r["deployment"] for r in ok})
    if len(kinds) < 2 and "disaggregated" not in kinds:
        return None
    points = {r["candidate"]: {"deployment": r["deployment"], "gpus": r.get("fleet_gpus") or r["gpus"],
                               **deployment_point(r)} for r in ok}
    out = {"metrics": list(METRICS), "stands_on": STANDS_ON, "front": front(points), "by_deployment": {}}
    for kind in kinds:
        mine = {n: p for n, p in points.items() if p["deployment"] == kind}
        cheapest = min(mine, key=lambda n: (_key(mine[n])[0], mine[n]["usd_per_hour"], _key(mine[n])[1]))
        out["by_deployment"][kind] = {"candidates": len(mine), "front": front(mine),
                                      "cheapest": {"candidate": cheapest, **mine[cheapest]}}
    out["points"] = [{"candidate": n, **p} for n, p in points.items()]
    return out


def deployment_lines(dep: dict) -> list[str]:
    """The fronts in words: each deployment's cheapest candidate and its front."""
    lines = ["aggregated vs disaggregated ($/M output tokens, p99 TTFT, p99 TPOT at the target rate; "
             "fleet check where run, else estimate):"]
    for kind, d in dep["by_deployment"].items():
        c = d["cheapest"]
        lines.append(f"  {kind}: cheapest {c['candidate']}: ${c['usd_per_m_output_tokens']:.3f}/M tokens, "
                     f"${c['usd_per_hour']:.2f}/hour on {c['gpus']} GPUs, TTFT99 {c['ttft_p99_s']:.3f} s, "
                     f"TPOT99 {c['tpot_p99_s']:.3f} s ({'fleet check' if c['checked'] else 'estimate'}); "
                     f"front: {', '.join(d['front'])}")
    return lines
