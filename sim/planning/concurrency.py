"""`llmsim plan` by concurrency: the cheapest fleet whose SLOs hold for N closed-loop users.

```yaml
name: chat_users_8b
scenario: ../scenarios/closed_loop.yaml   # its workload.clients: think time, turns, lengths
target_users: 256                         # concurrent users the fleet must serve
slo: {ttft_p99_s: 0.5, tpot_p99_s: 0.05}
search: {seeds: 2}                        # SearchSpec: margin, redundancy, fleet_traffic_s, ...
probe_s: 120                              # each probe's measured window (s)
router: {policy: random}                  # the fleet check's router
candidates: {gpu: [a100-80gb, h100-sxm, h200-sxm], tensor: [1, 2]}
```

A closed loop sets its own rate: C users, each sending its next request when the
previous response ended plus a think time (`sim/workload/clients.py`), so the load a
replica sees is the number of users it holds, not a clock. Per candidate:

1. **Users one replica sustains**: the largest whole number of users whose closed loop
   meets the SLOs on every seed (`sim/planning/capacity.py: violations` on the run's
   measured requests), by doubling from `search.rate_start` users until a probe fails,
   then bisection on whole users until hi - lo <= max(1, lo x `search.rel_tol`). A probe
   is the scenario's clients at that concurrency (its own warm-up dropped) sending for
   `probe_s` seconds (`workload.duration_s`), measured over the steady rule's window
   of send times (`sim/planning/steady.py`: the first `warmup` share, 20 %, and the last
   `cooldown` share, 5 %, left out: the empty start and the thinning end). Closed-loop
   load cannot outgrow its server (a slow reply delays the next request), so the halves
   test is off and the SLOs decide; more users never lighten a replica's load.
2. **Sizing**: replicas = ceil(users x (1 + margin) / users per replica) (+1 with
   `search.redundancy: n+1`, never under `search.min_replicas`), $/hour from the prices.
3. **The check** (cheapest estimate first, up to `search.fleet_checks`, while an estimate
   is at most the cheapest checked cost): the fleet behind `router` with
   ceil(users x (1 + margin)) users for `search.fleet_traffic_s` (600 s) of measured
   sending on fresh seeds; the count moves until N holds on every seed and N - 1 does not
   (down one at a time from the estimate while it holds, else up). $/M output tokens
   divides the fleet's $/hour by its checked output-token throughput.

The plan keeps every probe as users vs latency (`probe_curves`: users, the worst seed's
p99s, the verdict) for its report's plot (sim/report/concurrency_page.py).
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sim.io.specload import SpecError, load_yaml
from sim.planning.capacity import SLO, Probe, probe, violations
from sim.planning.lifetime import pmap
from sim.planning.planspec import SearchSpec, built_plan, load_prices, plan_scenario
from sim.planning.steady import window, windowed_summary
from sim.policies.router import RouterSpec


@dataclass(frozen=True)
class ConcurrencyPlanSpec:
    scenario: str
    target_users: int = field(metadata={"ge": 1, "le": 10**6})
    slo: SLO
    candidates: dict[str, tuple[Any, ...]] = field(default_factory=dict)
    name: str = "plan"
    prices: str | None = None
    search: SearchSpec = SearchSpec()
    probe_s: float = field(default=120.0, metadata={"gt": 0, "le": 86400})
    router: RouterSpec = RouterSpec(policy="random")
    file: str = field(default="", init=False, compare=False)

MAX_DRAWN = 500_000  # requests drawn for one closed-loop run, at most (memory)


def is_concurrency_plan(file: str | Path) -> bool:
    """Whether a plan file sizes by concurrency (it has `target_users:`)."""
    data = load_yaml(Path(file))
    return isinstance(data, dict) and "target_users" in data


def load_concurrency_plan(file: str | Path) -> ConcurrencyPlanSpec:
    p = Path(file)
    data = load_yaml(p)
    if "target_rate" in data:
        raise SpecError(p, "target_rate", "a plan sizes by target_users or target_rate, not both")
    if isinstance(data.get("router"), dict):
        data = {**data, "router": {"policy": "random", **data["router"]}}
    return built_plan(ConcurrencyPlanSpec, data, p)


def closed_overrides(sc, users: int, seconds: float) -> dict:
    """Overrides that run scenario `sc` as `users` closed-loop clients sending for `seconds`:
    its own clients (think time, turns) at that concurrency, or plain clients over its
    lengths; no warm-up requests (the measured window leaves the start out instead);
    enough requests per user that none runs out before the window ends (a reply taking at
    least 0.1 s), up to MAX_DRAWN requests in all (past that, users run out early and the
    window is shorter)."""
    c = sc.workload.clients
    turns = sc.workload.multi_turn.turns if sc.workload.multi_turn is not None else 1
    think = c.think.mean_s if c is not None and c.think is not None else 0.0
    per_user = max(4, math.ceil(seconds / (think + 0.1)) + turns)
    per_user = max(turns, min(per_user, MAX_DRAWN // users))  # at most ~MAX_DRAWN requests drawn
    clients = {"concurrency": int(users), "requests_per_client": per_user, "warmup_requests": 0}
    if c is not None and c.think is not None:
        clients["think"] = dataclasses.asdict(c.think)
    return {"workload.clients": clients, "workload.duration_s": float(seconds),
            "workload.num_requests": None, "workload.arrival": None}


def run_users(spec: ConcurrencyPlanSpec, cand: dict, users: int, seed: int, seconds: float,
              replicas: int = 1) -> dict:
    """The summary of `replicas` replicas (a fleet behind the plan's router when > 1) of a
    candidate serving `users` closed-loop users for `seconds` of measured sending."""
    from sim.config.scenario import load_scenario, scenario_from_dict
    from sim.engine.runner import run
    from sim.planning.fleet import scenario_dict
    from sim.planning.units import fleet_cluster

    scen = plan_scenario(spec)
    base = {"slo": spec.slo.as_scenario_slo(), **cand}
    sc = load_scenario(scen, {**base, **closed_overrides(load_scenario(scen, base), users, seconds),
                              "seed": seed})
    if replicas > 1 or sc.cluster is not None:
        data = scenario_dict(sc)
        data["cluster"] = fleet_cluster(sc, replicas, spec.router)
        sc = scenario_from_dict(data, file=sc.file or None, base_dir=sc.base_dir or None)
    out = run(sc)
    rule = dataclasses.replace(spec.search.rule(), halves=False)
    n = len(out.requests)
    return windowed_summary(out.summary, window(out.requests, rule, spec.slo.bounds()), n,
                            n / max(float(out.requests.arrival_s.max()), 1e-9))


def max_users(run_at, slo: SLO, seeds: list[int], search: SearchSpec) -> tuple[int, int | None, list[Probe]]:
    """(most users passing, fewest failing or None, probes): doubling from rate_start, then
    bisection on whole users until hi - lo <= max(1, lo x rel_tol)."""
    need = search.need or len(seeds)
    lo, hi, probes = 0, None, []
    u = max(1, int(search.rate_start))
    cap = max(1, int(search.rate_max))
    while len(probes) < search.max_probes:
        p = probe(run_at, u, seeds, slo, need)
        probes.append(p)
        if p.passed:
            lo = max(lo, u)
        else:
            hi = u if hi is None else min(hi, u)
        if hi is None:
            if u * 2 > cap:
                break
            u *= 2
        elif lo == 0:
            if hi == 1:
                break
            u = hi // 2
        elif hi - lo <= max(1, int(lo * search.rel_tol)):
            break
        else:
            u = (lo + hi) // 2
    return lo, hi, probes


def probe_curve(probes: list[Probe]) -> list[dict]:
    """Users vs latency of one replica, from the user search's probes (fewest users
    first): the worst seed's p99s, the slowest seed's request rate, and the verdict."""
    out = []
    for p in sorted(probes, key=lambda p: p.rate):
        ss = p.summaries
        out.append({"users": int(p.rate), "passed": p.passed,
                    **{f"{k}_p99_s": max((x[f"{k}_s"]["p99"] for x in ss if x[f"{k}_s"]["p99"] is not None),
                                         default=None) for k in ("ttft", "tpot")},
                    "request_rate": min(x["request_throughput"] for x in ss)})
    return out


def replicas_for_users(users: int, per_replica: int, search: SearchSpec) -> int:
    """ceil(users x (1 + margin) / users per replica) (+1 with n+1), never under min_replicas."""
    extra = 1 if search.redundancy == "n+1" else 0
    return max(search.min_replicas, math.ceil(users * (1 + search.margin) / per_replica - 1e-9) + extra)


def evaluate(spec: ConcurrencyPlanSpec, cand: dict, prices: dict[str, float]) -> dict:
    from sim.config.scenario import load_scenario
    from sim.planning.candidates import label
    from sim.planning.estimate import unit_fields
    from sim.planning.units import unit_of

    row: dict[str, Any] = {"candidate": label(cand, None), **cand}
    try:
        sc = load_scenario(plan_scenario(spec), {"slo": spec.slo.as_scenario_slo(), **cand})
    except SpecError as e:
        return {**row, "status": "skipped", "note": f"refused by the scenario: {e.path}: {e.message}"}
    unit = unit_of(sc)
    if unit.unpriced(prices) is not None:
        return {**row, "status": "skipped", "note": f"no price for GPU '{unit.unpriced(prices)}' in the prices file"}
    s = spec.search
    seeds = [sc.seed + i for i in range(s.seeds)]

    def run_at(users: float, seed: int) -> dict:
        return run_users(spec, cand, int(users), seed, spec.probe_s)

    lo, hi, probes = max_users(run_at, spec.slo, seeds, s)
    fail = next((p for p in probes if p.rate == hi), None)
    row.update({"users_per_replica": lo, "fail_users": hi, "probes": len(probes),
                "broke": "; ".join(fail.broke) if fail else "", "probe_curve": probe_curve(probes)})
    if lo <= 0:
        return {**row, "status": "infeasible", "note": "SLOs broken even with one user"}
    replicas = replicas_for_users(spec.target_users, lo, s)
    if replicas > s.max_replicas:
        return {**row, "status": "infeasible", "note": f"needs {replicas} replicas > max_replicas"}
    at = next(p for p in probes if p.rate == lo)
    return {**row, "status": "ok", "note": "", **unit_fields(unit, prices), "replicas": replicas,
            "gpus": replicas * unit.gpus, "usd_per_hour": replicas * unit.usd_per_hour(prices),
            "ttft_p99_at_capacity_s": max(x["ttft_s"]["p99"] or math.inf for x in at.summaries),
            "tpot_p99_at_capacity_s": max(x["tpot_s"]["p99"] or math.inf for x in at.summaries),
            "request_rate_at_capacity": min(x["request_throughput"] for x in at.summaries)}


def check_fleet(spec: ConcurrencyPlanSpec, row: dict, cand: dict, unit_usd_h: float) -> dict:
    """The smallest count (from the estimate, one at a time) whose fleet meets the SLOs with
    ceil(target_users x (1 + margin)) users on every fresh seed while one fewer does not."""
    from sim.config.scenario import load_scenario

    s = spec.search
    base = load_scenario(plan_scenario(spec), {"slo": spec.slo.as_scenario_slo(), **cand}).seed
    seeds = [base + max(1000, s.seeds) + i for i in range(s.seeds)]
    users = math.ceil(spec.target_users * (1 + s.margin))
    extra = 1 if s.redundancy == "n+1" else 0
    checks: dict[int, dict] = {}

    def check(n: int) -> bool:
        if n < 1:
            return False
        if n not in checks:
            runs = [run_users(spec, cand, users, seed, s.fleet_traffic_s, replicas=n) for seed in seeds]
            broke = list(dict.fromkeys(v for r in runs for v in violations(r, spec.slo)))
            checks[n] = {"replicas": n, "passed": not broke, "broke": "; ".join(broke),
                         **{f"{k}_p99_s": max(r[f"{k}_s"]["p99"] or math.inf for r in runs)
                            for k in ("ttft", "tpot", "e2e")},
                         "request_throughput": min(r["request_throughput"] for r in runs),
                         "output_token_throughput": min(r["output_token_throughput"] for r in runs)}
        return checks[n]["passed"]

    n = max(1, row["replicas"] - extra)
    if check(n):
        while n > 1 and check(n - 1):
            n -= 1
    else:
        while n < s.max_replicas and not check(n + 1):
            n += 1
        n = min(n + 1, s.max_replicas)
    serving = max(s.min_replicas, min(n + extra, s.max_replicas))
    ok = check(n) and check(serving)
    at = checks[serving]
    usd_h = serving * unit_usd_h
    return {"candidate": row["candidate"], "replicas": serving, "needed": n, "estimated_replicas": row["replicas"],
            "holds": ok, "one_fewer_breaks": n == 1 or not checks.get(n - 1, {"passed": False})["passed"],
            "users": users, "seeds": seeds, "traffic_s": s.fleet_traffic_s, "margin": s.margin,
            "redundancy": s.redundancy, "router_label": f"{spec.router.policy} router",
            "usd_per_hour": usd_h, "gpus": serving * row["unit_gpus"],
            "usd_per_m_output_tokens": usd_h / max(at["output_token_throughput"] * 3600, 1e-12) * 1e6,
            **{k: at[k] for k in ("ttft_p99_s", "tpot_p99_s", "e2e_p99_s", "request_throughput")},
            "checks": [checks[k] for k in sorted(checks)]}


def run_concurrency_plan(spec: ConcurrencyPlanSpec, prices_path: str | None = None,
                         workers: int | None = None) -> dict:
    from sim.planning.candidates import candidate_grid, check_candidates

    prices = load_prices(prices_path or (str(Path(spec.file).resolve().parent / spec.prices)
                                         if spec.prices else None))
    check_candidates(spec.file, spec.candidates, plan_scenario(spec), {"slo": spec.slo.as_scenario_slo()})
    cands = candidate_grid(spec.candidates, None, spec.file) or [{}]
    workers = workers or max(1, min(os.cpu_count() or 1, len(cands)))
    rows = pmap(evaluate, [(spec, c, prices) for c in cands], workers)
    ranked = sorted((i for i, r in enumerate(rows) if r["status"] == "ok"),
                    key=lambda i: (rows[i]["usd_per_hour"], rows[i]["ttft_p99_at_capacity_s"]))
    done: list[tuple[int, dict]] = []
    for i in ranked:
        best = min((c["usd_per_hour"] for _, c in done if c["holds"]), default=math.inf)
        if rows[i]["usd_per_hour"] > best * (1 + 1e-9) or len(done) == spec.search.fleet_checks:
            break
        c = check_fleet(spec, rows[i], cands[i], rows[i]["unit_usd_per_hour"])
        rows[i].update({"fleet_replicas": c["replicas"], "fleet_usd_per_hour": c["usd_per_hour"],
                        "fleet_holds": c["holds"]})
        done.append((i, c))
    held = [(i, c) for i, c in done if c["holds"]]
    rec = None
    if held:
        i, c = min(held, key=lambda ic: (ic[1]["usd_per_hour"], -ic[1]["replicas"], ic[1]["ttft_p99_s"]))
        rec = {**c, **cands[i], "estimate": {k: rows[i][k] for k in ("replicas", "usd_per_hour",
                                                                      "users_per_replica")}}
    curves = [{"candidate": r["candidate"], **pt} for r in rows for pt in r.pop("probe_curve", [])]
    return {"name": spec.name, "kind": "concurrency", "target_users": spec.target_users,
            "slo": dataclasses.asdict(spec.slo), "probe_s": spec.probe_s, "candidates": rows,
            "probe_curves": curves,
            "fleet_checks": [c for _, c in done], "fleet_check": done[0][1] if done else None,
            "recommended": rec}


def concurrency_lines(result: dict) -> list[str]:
    """The plan's answer in lines (the CLI prints them)."""
    lines = [f"users one replica sustains within the SLOs (closed loop, {result['probe_s']:g} s probes):"]
    for r in result["candidates"]:
        if r["status"] == "ok":
            lines.append(f"  {r['candidate']}: {r['users_per_replica']} users ({r['request_rate_at_capacity']:.2f} "
                         f"req/s) -> {r['replicas']} replicas, ${r['usd_per_hour']:.2f}/hour (estimate)")
        else:
            lines.append(f"  {r['candidate']}: {r['status']}: {r.get('note', '')}")
    for c in result["fleet_checks"]:
        lines.append(f"fleet check: {c['replicas']} x {c['candidate']} with {c['users']} users for "
                     f"{c['traffic_s']:g} s, seeds {c['seeds']}: SLOs {'hold' if c['holds'] else 'DO NOT hold'}, "
                     f"TTFT99 {c['ttft_p99_s']:.3f} s, TPOT99 {c['tpot_p99_s']:.3f} s, "
                     f"{c['request_throughput']:.1f} req/s"
                     + (f"; with {c['replicas'] - 1} they break" if c["one_fewer_breaks"] and c["replicas"] > 1 else ""))
    rec = result["recommended"]
    lines.append("recommended: none: no fleet checked meets the SLOs" if rec is None else
                 f"recommended: {rec['candidate']} x {rec['replicas']} ({rec['gpus']} GPUs) for "
                 f"{result['target_users']} users, ${rec['usd_per_hour']:.2f}/hour, "
                 f"${rec['usd_per_m_output_tokens']:.3f}/M output tokens (its fleet check)")
    return lines
