"""`llmsim plan` over a day: a plan whose scenario's workload has a time-varying rate
(`arrival: {kind: diurnal}` or `{kind: profile}`) and whose file has a `day:` section
(sim/planning/dayspec.py).

For each candidate of the plan's grid (GPU types, tensor degree, ...):

1. **one replica's sustained rate**: the highest Poisson rate at which one replica meets
   the plan's p99 SLOs in steady state, by the same bisection of steady-state probes as
   a static plan (sim/planning/capacity.py, steady.py), with the scenario's cluster left
   out;
2. **the lower bound** per window and **static peak provisioning** from that rate and
   the day's rate profile (sim/planning/daybound.py: analytic);
3. **fleets simulated over the whole day**: static peak provisioning itself (a schedule
   of one entry), and one autoscaled fleet per policy and threshold of `day.policies`
   (HPA on utilisation or queue, the SLO-attainment policy, and the bound's schedule led
   by the provisioning delay), each `day.seeds` days with the engine's autoscaler and
   the scenario's own `cluster.autoscale` settings (scrape, stabilisation,
   provisioning) where it has them. A fleet's figures are the day's: SLO attainment
   (the share of all requests meeting every per-request bound; the worst seed),
   GPU-hours and $ (replica-hours x the plan prices' $/hour), MWh and kWh per M output
   tokens (the power model), and per window its ready replicas, p99 TTFT and TPOT,
   attainment and power.

**The recommendation**: the cheapest fleet (in $ over the day) whose worst-seed SLO
attainment is at least `day.attainment` (a rejected request, e.g. a prompt over the
context window, counts as a miss; every request is accounted for by the engine's own
check); ties go to the higher attainment. Every figure of the plan says what it stands on.

Fleets are screened (`day.screen`, on by default; sim/planning/dayscreen.py): run
cheapest estimate first, each day stops once the fleet can no longer be the
recommendation (its attainment cannot reach the target, or its cost already passes the
best passing fleet's), with the same recommendation as running every whole day.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

from sim.config.cluster import AutoscaleSpec
from sim.config.scenario import Scenario, load_scenario
from sim.io.specload import SpecError
from sim.planning.candidates import check_candidates, label
from sim.planning.capacity import max_rate
from sim.planning.daybound import bound_schedule, lower_bound, static_peak, window_rates
from sim.planning.estimate import _base, _capacity_row, _runner
from sim.planning.lifetime import pmap
from sim.planning.planspec import PlanSpec, candidate_grid, load_prices, plan_groups, plan_scenario
from sim.planning.planspec import _resolve as _plan_path
from sim.planning.probestop import stopper
from sim.planning.traffic import steady_rule
from sim.planning.units import unit_of

TIME_VARYING = ("diurnal", "profile")


def day_profile(sc: Scenario, plan_file: Any = None):
    """(rate profile, duration) of a day plan's scenario; a one-line error otherwise."""
    from sim.workload.requests import rate_profile

    a = sc.workload.arrival
    if a is None or a.kind not in TIME_VARYING:
        raise SpecError(plan_file, "day", "needs a scenario whose workload.arrival is time-varying "
                        f"(allowed: kind {' or '.join(TIME_VARYING)})")
    if sc.workload.duration_s is None:
        raise SpecError(plan_file, "day", "needs the scenario's workload.duration_s (the day's length)")
    base = Path(sc.base_dir) if sc.base_dir else None
    prof = rate_profile(a, sc.workload.duration_s, base, sc.file or None, "workload")
    return prof, float(sc.workload.duration_s)


def capacity(spec: PlanSpec, cand: dict, prices: dict[str, float]) -> dict:
    """One replica's sustained rate and price for a candidate (a skipped row on refusal)."""
    row: dict[str, Any] = {"candidate": label(cand, plan_groups(spec)), **cand}
    try:
        scen = plan_scenario(spec)
        base = {**_base(spec), **cand, "cluster": None}
        sc = load_scenario(scen, base)
        unit = unit_of(sc)
        gpu = unit.unpriced(prices)
        if gpu is not None:
            return {**row, "status": "skipped", "note": f"no price for GPU '{gpu}' in the prices file"}
        s = spec.search
        rule = steady_rule(dataclasses.replace(s.rule(), min_requests=s.rule().min_requests),
                           sc, spec.arrival)
        run_at = _runner(scen, base, sc, rule, spec.slo.bounds(), spec.arrival,
                         stopper(rule, spec.slo.bounds(), spec.slo.goodput_min) if s.stop_early else None)
        seeds = [sc.seed + i for i in range(s.seeds)]
        cap = max_rate(run_at, spec.slo, seeds, s.need, s.rate_start, s.rate_min, s.rate_max,
                       s.rel_tol, s.max_probes, s.lazy_seeds)
    except SpecError as e:
        return {**row, "status": "skipped", "note": f"refused by the scenario: {e.path}: {e.message}"}
    out = {**row, **_capacity_row(cap, unit.pools[0].gpu), "gpus_per_replica": unit.gpus,
           "usd_per_replica_hour": unit.usd_per_hour(prices), "status": "ok", "note": ""}
    if cap.rate <= 0:
        out.update(status="infeasible", note="SLOs broken even at the lowest rate tried")
    return out


def simulate_day(scen: str, overrides: dict, seeds: list[int], screen: dict | None = None) -> dict:
    """The day's figures of one fleet over `seeds` (a worker's job: small results only).
    `screen` (sim/planning/dayscreen.py): {attainment, usd_per_replica_hour, best_usd,
    floors_h}: stop as soon as the fleet cannot be the recommendation."""
    from sim.engine.autoscale import Stopped, watching
    from sim.engine.runner import run
    from sim.planning.dayscreen import DayWatch, screened_row, seed_limit

    days: list[dict] = []
    for j, seed in enumerate(seeds):
        try:
            sc = load_scenario(scen, {**overrides, "seed": seed})
            if screen is None:
                out = run(sc)
            else:
                limit = seed_limit(screen["best_usd"], screen["usd_per_replica_hour"], len(seeds),
                                   [d["replica_hours"] for d in days], screen["floors_h"][j + 1:])
                if limit < screen["floors_h"][j]:
                    return screened_row("dearer than the best passing fleet before its day is run "
                                        "(its fewest replicas x each day's last arrival)")
                slo = {k: getattr(sc.slo, k) for k in ("ttft_s", "tpot_s", "e2e_s")} if sc.slo else {}
                with watching(DayWatch(slo, screen["attainment"], limit)):
                    out = run(sc)
        except SpecError as e:
            return {"status": "skipped", "note": f"refused by the scenario: {e.path}: {e.message}"}
        except Stopped as e:
            return screened_row(f"seed {seed}: {e.args[0]}")
        days.append(_day_figures(seed, out))
    return _fleet_figures(days, seeds)


def _day_figures(seed: int, out) -> dict:
    s = out.summary
    a, e = s["autoscale"], s["energy"]
    return {"seed": seed, "requests": s["requests"]["total"],
            "rejected": s["requests"]["rejected"], "slo_attainment": a["slo_attainment"],
            "gpu_hours": a["gpu_hours"], "replica_hours": a["replica_hours"],
            "peak_ready": a["peak_ready"], "end_s": out.result.end_time,
            "delay_s": a["provisioning"]["delay_s"],
            "energy_mwh": e["energy_j"] / 3.6e9 if e.get("available") else None,
            "kwh_per_m_output_tokens": e.get("kwh_per_m_output_tokens"),
            "output_tokens": int(out.request_table["generated_tokens"].sum()),
            "ttft_p99_s": s["ttft_s"]["p99"], "tpot_p99_s": s["tpot_s"]["p99"],
            "windows": a["windows"], "timeline": len(a["timeline"])}


def _fleet_figures(days: list[dict], seeds: list[int]) -> dict:
    worst = min(days, key=lambda d: d["slo_attainment"] if d["slo_attainment"] is not None else -1)
    mean = {k: sum(d[k] for d in days) / len(days) for k in ("gpu_hours", "replica_hours")}
    energy = [d["energy_mwh"] for d in days]
    return {"status": "ok", "note": "", "seeds": seeds, **mean,
            "slo_attainment": worst["slo_attainment"],
            "slo_attainment_by_seed": [d["slo_attainment"] for d in days],
            "rejected": sum(d["rejected"] for d in days), "requests": days[0]["requests"],
            "peak_ready": max(d["peak_ready"] for d in days), "delay_s": days[0]["delay_s"],
            "energy_mwh": sum(energy) / len(energy) if None not in energy else None,
            "kwh_per_m_output_tokens": days[0]["kwh_per_m_output_tokens"],
            "ttft_p99_s": max(d["ttft_p99_s"] or 0.0 for d in days),
            "tpot_p99_s": max(d["tpot_p99_s"] or 0.0 for d in days),
            "windows": days[0]["windows"], "stints": days[0]["timeline"]}


def _fleets(spec: PlanSpec, cand: dict, cap: dict, rates: list[dict], auto: AutoscaleSpec,
            router: dict, delay_s: float, static: dict) -> list[tuple[dict, dict]]:
    """(row, scenario overrides) of every fleet to simulate for one candidate."""
    day = spec.day
    r = cap["sustained_rate"]
    ceiling = day.max_replicas or max(2 * static["replicas"], static["replicas"] + 1)
    ceiling = min(ceiling, spec.search.max_replicas, 4096)
    common = {k: v for k, v in dataclasses.asdict(auto).items()
              if k not in ("policy", "target", "schedule", "min_replicas", "max_replicas")}
    common["window_s"] = day.window_s
    first = max(1, min(ceiling, lower_bound(rates[:1], r, 1, 0.0)["windows"][0]["replicas"]))
    lead = delay_s + auto.scrape_s
    out = []

    def fleet(policy: str, target: float | None, name: str, count: int, lo: int, hi: int,
              schedule=None) -> None:
        scale = {**common, "policy": policy, "target": target, "schedule": schedule,
                 "min_replicas": lo, "max_replicas": hi}
        cluster = {"router": router, "groups": [{"name": "pool", "count": count}], "autoscale": scale}
        row = {"candidate": cap["candidate"], "fleet": name, "policy": policy, "threshold": target,
               "max_replicas": hi}
        if schedule is not None:
            row["schedule"] = schedule
        out.append((row, {**_base(spec), **cand, "cluster": cluster}))

    n = static["replicas"]
    fleet("schedule", None, "static peak", n, n, n, [[0.0, n]])
    for policy, values in day.policies.items():
        for v in values:
            if policy == "schedule":
                sched = bound_schedule(rates, r, v, lead)
                hi = max(int(k) for _, k in sched)
                fleet("schedule", None, f"bound schedule x{v:g}", int(sched[0][1]), 1, min(hi, 4096),
                      sched)
                out[-1][0]["threshold"] = v
            else:
                fleet(policy, float(v), f"{policy} {v:g}", first, 1, ceiling)
    return out


def run_day_plan(spec: PlanSpec, prices_path: str | Path | None = None, workers: int | None = None,
                 progress: bool = False) -> dict:
    """The day plan: capacities, bounds, every fleet simulated over the day, the pick."""
    prices = load_prices(prices_path or (_plan_path(spec, spec.prices) if spec.prices else None))
    scen = plan_scenario(spec)
    sc = load_scenario(scen, _base(spec))
    profile, duration = day_profile(sc, spec.file)
    auto = sc.cluster.autoscale if sc.cluster is not None and sc.cluster.autoscale else AutoscaleSpec()
    router = dataclasses.asdict(spec.router)
    check_candidates(spec.file, spec.candidates, scen, {**_base(spec), "cluster": None})
    cands = candidate_grid(spec)
    workers = workers or os.cpu_count() or 1
    caps = pmap(capacity, [(spec, c, prices) for c in cands], workers, progress, "capacity")
    rates = window_rates(profile, duration, spec.day.window_s)
    per_cand, jobs = [], []
    for cand, cap in zip(cands, caps, strict=True):
        entry: dict[str, Any] = {"capacity": cap}
        per_cand.append(entry)
        if cap["status"] != "ok":
            continue
        r, g, usd = cap["sustained_rate"], cap["gpus_per_replica"], cap["usd_per_replica_hour"]
        entry["bound"] = lower_bound(rates, r, g, usd)
        entry["static"] = static_peak(profile, rates, duration, r, g, usd)
        delay = _delay(scen, {**_base(spec), **cand, "cluster": None}, auto, sc.file or None)
        entry["delay_s"] = delay
        for row, over in _fleets(spec, cand, cap, rates, auto, router, delay, entry["static"]):
            jobs.append((len(per_cand) - 1, row, over))
    seeds = [sc.seed + i for i in range(spec.day.seeds)]
    if spec.day.screen:
        results = _screened(spec, scen, jobs, per_cand, seeds, duration, workers, progress)
    else:
        results = pmap(simulate_day, [(scen, over, seeds) for _, _, over in jobs], workers, progress, "day")
    fleets = []
    for (k, row, _), res in zip(jobs, results, strict=True):
        cap = per_cand[k]["capacity"]
        f = {**row, **res}
        if res["status"] == "ok":  # (a screened fleet has no day figures: dayscreen.py)
            f["usd"] = res["replica_hours"] * cap["usd_per_replica_hour"]
            f["meets"] = (res["slo_attainment"] is not None
                          and res["slo_attainment"] >= spec.day.attainment - 1e-12)
            f["usd_over_bound"] = f["usd"] / per_cand[k]["bound"]["usd"] if per_cand[k]["bound"]["usd"] else None
        fleets.append(f)
    ok = [f for f in fleets if f.get("meets")]
    rec = min(ok, key=lambda f: (f["usd"], -f["slo_attainment"])) if ok else None
    return {"name": spec.name, "kind": "day", "scenario": spec.scenario, "slo": spec.slo.__dict__,
            "day": dataclasses.asdict(spec.day),
            "target": f"SLO attainment over the day >= {spec.day.attainment:.4g} (worst seed; "
                      "a rejected request counts as a miss)",
            "profile": {"kind": sc.workload.arrival.kind, "duration_s": duration,
                        "mean_rate": float(profile.integral(duration)) / duration,
                        "peak_rate": max(w["peak_rate"] for w in rates),
                        "trough_rate": min(w["rate"] for w in rates)},
            "rates": rates, "candidates": per_cand, "fleets": fleets,
            "recommended": rec,
            "stands_on": "sustained rate: steady-state probes (simulated); bound and static peak: "
                         "analytic over it; fleets: whole days simulated with the autoscaler"}


def _screened(spec: PlanSpec, scen: str, jobs: list, per_cand: list[dict], seeds: list[int],
              duration: float, workers: int, progress: bool) -> list[dict]:
    """Every fleet's day, screened (sim/planning/dayscreen.py): cheapest estimate first,
    each stopped once it can no longer be the recommendation."""
    from sim.planning.dayscreen import estimate_usd, fewest_replicas, floor_hours, run_screened

    last = _last_arrivals(spec, scen, seeds)
    todo = []
    for k, row, over in jobs:
        usd_h = per_cand[k]["capacity"]["usd_per_replica_hour"]
        todo.append({"args": (scen, over, seeds),
                     "estimate": estimate_usd(row, per_cand[k]["bound"]["usd"], usd_h, duration),
                     "screen": {"attainment": spec.day.attainment, "usd_per_replica_hour": usd_h,
                                "floors_h": floor_hours(fewest_replicas(row), last, len(seeds))}})
    return run_screened(simulate_day, todo, workers, progress)


def _last_arrivals(spec: PlanSpec, scen: str, seeds: list[int]) -> list[float] | None:
    """Each seed's last arrival over the day (every fleet of the plan replays the same
    requests: its candidate changes no workload field); None when a candidate does."""
    import numpy as np

    from sim.workload.requests import generate

    if any(k.startswith(("workload", "seed")) for k in spec.candidates):
        return None
    out = []
    for seed in seeds:
        sc = load_scenario(scen, {**_base(spec), "seed": seed})
        wl = generate(sc.workload, np.random.default_rng(sc.seed), file=sc.file or None,
                      path="workload", base_dir=sc.base_dir or None)
        out.append(float(wl.arrival_s[-1]) if len(wl) else 0.0)
    return out


def _delay(scen: str, over: dict, auto: AutoscaleSpec, file) -> float:
    """The provisioning delay of one replica of this candidate (sim/engine/autoscale.py)."""
    from sim.engine.autoscale import provisioning_delay
    from sim.engine.build import replica_configs

    cfg = replica_configs(load_scenario(scen, over))[0]
    return provisioning_delay(auto, cfg.budget.weight_bytes, file=file)["delay_s"]


def write_day_plan(result: dict, out_dir: str | Path) -> Path:
    """plan.json (everything), fleets.csv (one row per fleet simulated) and bound.csv (per
    candidate and window: rate, peak rate, bound replicas) in an output folder."""
    import json

    import pandas as pd

    from sim.io.outdir import write_output

    def write(folder: Path) -> None:
        (folder / "plan.json").write_text(json.dumps(result, indent=2, default=str) + "\n")
        pd.DataFrame(fleet_rows(result)).to_csv(folder / "fleets.csv", index=False)
        rows = [{"candidate": c["capacity"]["candidate"], **w}
                for c in result["candidates"] if "bound" in c for w in c["bound"]["windows"]]
        pd.DataFrame(rows).to_csv(folder / "bound.csv", index=False)

    return write_output(out_dir, "plan", write, {"name": result["name"]})


FLEET_COLUMNS = ("candidate", "fleet", "status", "slo_attainment", "rejected", "gpu_hours", "usd",
                 "usd_over_bound", "energy_mwh", "kwh_per_m_output_tokens", "peak_ready",
                 "ttft_p99_s", "tpot_p99_s", "meets", "note")


def fleet_rows(result: dict) -> list[dict]:
    """Every fleet's row (FLEET_COLUMNS), then the bound's and static peak's as rows."""
    rows = [{k: f.get(k) for k in FLEET_COLUMNS} for f in result["fleets"]]
    for c in result["candidates"]:
        if "bound" in c:
            b = c["bound"]
            rows.append({"candidate": c["capacity"]["candidate"], "fleet": "lower bound",
                         "status": "analytic", "gpu_hours": b["gpu_hours"], "usd": b["usd"],
                         "usd_over_bound": 1.0, "note": b["stands_on"]})
    return rows


def day_lines(result: dict) -> list[str]:
    """The day plan in lines: per candidate its sustained rate, bound and static peak;
    every fleet's day; the recommendation."""
    p = result["profile"]
    lines = [f"day: {p['kind']} profile over {p['duration_s']:g} s, mean {p['mean_rate']:.3g} req/s, "
             f"peak {p['peak_rate']:.3g}, trough window {p['trough_rate']:.3g}; target: {result['target']}"]
    for c in result["candidates"]:
        cap = c["capacity"]
        if cap["status"] != "ok":
            lines.append(f"  {cap['candidate']}: {cap['status']}: {cap.get('note', '')}")
            continue
        b, s = c["bound"], c["static"]
        lines.append(f"  {cap['candidate']}: one replica sustains {cap['sustained_rate']:.3g} req/s "
                     f"({cap['binding']}); provisioning delay {c['delay_s']:.0f} s; lower bound "
                     f"{b['gpu_hours']:.2f} GPU-h ${b['usd']:.2f}; static peak {s['replicas']} replicas "
                     f"{s['gpu_hours']:.2f} GPU-h ${s['usd']:.2f}")
    lines.append("fleets simulated over the day (SLO attainment: worst seed):")
    for f in result["fleets"]:
        if f["status"] != "ok":
            lines.append(f"  {f['candidate']} {f['fleet']}: {f['status']}: {f['note']}")
            continue
        mwh = f"{f['energy_mwh'] * 1000:.2f} kWh" if f["energy_mwh"] is not None else "- kWh"
        lines.append(f"  {f['candidate']} {f['fleet']:<22} attainment {f['slo_attainment']:.4f}  "
                     f"{f['gpu_hours']:6.2f} GPU-h  ${f['usd']:8.2f} ({f['usd_over_bound']:.2f}x bound)  "
                     f"{mwh}  peak {f['peak_ready']}  {'meets' if f['meets'] else 'misses'}")
    rec = result["recommended"]
    if rec is None:
        lines.append("recommended: none: no fleet met the target")
    else:
        lines.append(f"recommended: {rec['candidate']} {rec['fleet']}: ${rec['usd']:.2f} over the day, "
                     f"{rec['gpu_hours']:.2f} GPU-hours, SLO attainment {rec['slo_attainment']:.4f} "
                     f"({rec['usd_over_bound']:.2f}x the lower bound)")
    return lines
