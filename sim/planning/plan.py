"""`llmsim plan`: the cheapest fleet that serves a target rate within SLOs, validated.

```yaml
name: chat-8b
scenario: ../scenarios/quickstart.yaml    # model, runtime, lengths (relative to this file)
target_rate: 24                           # requests/s the fleet must serve
slo: {ttft_p99_s: 1.0, tpot_p99_s: 0.06}  # also e2e_p99_s, goodput_min, min_throughput_ratio
prices: null                              # default gpu_profiles/prices.yaml
search: {seeds: 2}                        # see SearchSpec: steady, margin, redundancy, ...
router: {policy: random}                  # the fleet check's load balancer (default random;
                                          # a cluster scenario's own router when not given)
arrival: auto                             # auto, poisson or trace (sim/planning/traffic.py)
candidates:                               # a grid; short names or dotted scenario fields
  gpu: [a100-80gb, h100-sxm, h200-sxm]
  tensor: [1, 2, 4]                       # parallel.tensor
  # expert: [1, 8]                       # parallel.expert; data: [1, 8] parallel.data (MoE
  #                                       #   layouts: EP over tensor x data GPUs, DP attention)
  policy: [continuous, chunked]           # scheduler.policy
  # pipeline: [1, 2]                      # parallel.pipeline (stages; plans/llama405b_pp.yaml)
  # over a cluster scenario's pools (sim/planning/poolkeys.py):
  # ratio: [aggregated, "1:1", "1:2"]     # prefill:decode replicas per unit, or colocated
  # prefill.tensor: [1, 2]                # decode.gpu, both.policy, prefill.count, ...
```

**The unit** (`sim/planning/units.py`): without a `cluster:` one replica (tensor x
pipeline GPUs); with one, the whole cluster as written — every group's replicas, each on
its own GPU and tensor degree, in its role — probed as itself and priced as the sum of
its pools (count x tensor x pipeline x the group's GPU price). `replicas` in a row
counts units; `unit`, `unit_gpus`, `unit_usd_per_hour` and `deployment` (aggregated /
disaggregated) describe one.

Per candidate (`sim/planning/estimate.py`; the search in `sim/planning/capacity.py`): the
highest rate one unit sustains with every seed meeting the SLOs in steady state, by
bisection, on the plan's arrival process
(`arrival:`: Poisson, the scenario's gamma, or its trace's own arrivals replayed at the
probed rate; each row's `arrival` and the plan's `arrival` entry say which); each probe
runs as long as the steady rule asks (`sim/planning/steady.py`: warm-up discarded, at
least 60 s of traffic, doubled up to 480 s until the halves of the measured window agree
and completions keep up; stopped early once it clearly fails). Then units =
ceil(target x (1 + search.margin) / that rate) (+1 with `search.redundancy: n+1`, never
under `search.min_replicas`), GPUs = units x the unit's GPUs, $/hour = units x the unit's
$/hour from the prices file, $/M output tokens = $/hour / (target x mean output tokens x
3600) x 1e6 (one mean for the whole plan: the plan scenario's workload as drawn, so a
fleet has one $/M figure whether estimated or checked), and p99 latencies of one unit at its share of the target (target / units,
every seed). The binding constraint is read from the first probe that broke the SLOs
(`binding`, `sim/planning/binding.py`). That is the *estimate*. Each figure has a 90 % prediction interval
(`*_interval90`; `sim/planning/uncertainty.py`: the seed spread widened by the step
model's 90 % error for what the run's step time stands on, `data/step_error_bands.yaml`,
its coverage checked by benchmarks/fidelity/interval_coverage.py) and the share of its
step time that rests on measurement; the recommendation's `robust` says how many
replicas the interval needs and whether its p99 intervals stay within the SLOs.

The candidates are then **checked as fleets** (`sim/planning/fleet.py`: the cluster engine,
behind `router`) at the target rate plus `search.margin` (10 % by default) for
`search.fleet_traffic_s` (600 s) of traffic on fresh seeds (none a probe used),
measured over the steady window, cheapest estimate first (ties: lower p99 TTFT):
a check moves the replica count until the fleet meets the SLOs for every seed and one
replica fewer does not, and prices that count. A check can raise a candidate's cost
above the next candidates' estimates, so the next candidate is checked too while its
estimated cost is at most the cheapest validated cost so far, up to
`search.fleet_checks` checks (default 3). The recommendation is the cheapest validated
fleet (ties on cost are listed in `recommended.ties` and go to more replicas, then lower
p99 TTFT); its `headroom` is the highest rate it still serves within the SLOs (a
bisection of steady fleet probes above the checked rate); every figure in `recommended` is that
fleet's (replicas, GPUs, $/hour, $/M output tokens from its runs' output tokens, p99s
measured in its check), with the per-replica estimate kept apart under
`recommended.estimate`. `fleet_checks` lists every check made, `fleet_check` the
recommended one's, and `unchecked_within` how many candidates estimated at or below the
recommended cost were left unchecked by the bound. The Pareto front is taken over each
candidate's validated point where it was checked, else its estimate. A fleet of N units
is the unit's groups with their counts multiplied by N (`units.fleet_cluster`). When the
candidates include a disaggregated unit, `deployments` holds the aggregated-vs-
disaggregated fronts over $/M output tokens, p99 TTFT and p99 TPOT
(`sim/planning/deployments.py`).

Candidates are checked before any run (`sim/planning/candidates.py`): a key that is no
scenario field or a value wrong on its own (an unknown GPU, model or runtime name, a
wrong type) refuses the plan with one line; a combination of known values the
scenario refuses (TP 3 for 32 heads, weights that do not fit) and a GPU with no price
are listed as skipped with the reason, and the plan goes on with the rest.

`router` is the mapping of a scenario's `cluster.router` (`sim/config/cluster.py` RouterSpec:
`policy`, `staleness_s`, `affinity_slack`, checked the same way) for the load balancer
the fleet will sit behind; only `policy` defaults differently: `random`. A random router
is the blind, conservative choice (it neither smooths arrivals like round robin nor
balances load like least outstanding on current counts; a router acting on stale
reports can still do worse), and behind it each replica sees an unbiased random
thinning of the fleet's arrivals, which is what the per-replica sizing at
target / replicas assumes. Behind another router that sizing is an estimate and the
fleet check, which moves the count either way, settles it."""

from __future__ import annotations

import math
import os
from pathlib import Path

from sim.config.scenario import load_scenario
from sim.io.specload import SpecError
from sim.planning.binding import binding
from sim.planning.candidates import ALIASES, check_candidates, label
from sim.planning.deployments import deployment_fronts
from sim.planning.estimate import _base, _usd_per_m, evaluate, output_tokens_per_request, screen
from sim.planning.fleet import headroom, validate_fleet
from sim.planning.lifetime import pmap
from sim.planning.planspec import (
    PlanSpec,
    SearchSpec,
    _resolve,
    candidate_grid,
    load_plan,
    load_prices,
    plan_scenario,
)
from sim.planning.traffic import describe
from sim.planning.uncertainty import (
    fleet_group,
    fleet_intervals,
    fleet_pool,
    interval_columns,
    p99_intervals,
    seed_pools,
)

__all__ = ["ALIASES", "PlanSpec", "SearchSpec", "binding", "candidate_grid", "evaluate", "label",
           "load_plan", "load_prices", "pareto", "run_plan", "validate_fleet", "write_plan"]


def pareto(rows: list[dict]) -> list[str]:
    """Candidates no other beats on both $/hour and p99 TTFT at the target: each
    candidate's validated point where it was checked as a fleet, else its estimate."""
    ok = [(r["candidate"], point(r)) for r in rows if r.get("status") == "ok"]
    return [name for name, a in ok
            if not any(b != a and b[0] <= a[0] and b[1] <= a[1] for _, b in ok)]


def point(row: dict) -> tuple[float, float]:
    """($/hour, p99 TTFT) of a candidate: its fleet check's where it has one, else the estimate."""
    if row.get("fleet_usd_per_hour") is not None:
        return row["fleet_usd_per_hour"], row["fleet_ttft_p99_s"]
    return row["usd_per_hour"], row["ttft_p99_at_target_s"]


def run_plan(spec: PlanSpec, prices_path: str | Path | None = None, workers: int | None = None,
             progress: bool = False) -> dict:
    """Check every candidate, evaluate the runnable ones (in parallel), then check the
    cheapest as fleets and recommend the cheapest validated one."""
    prices = load_prices(prices_path or (_resolve(spec, spec.prices) if spec.prices else None))
    scen = plan_scenario(spec)
    # a bad scenario, or arrival: trace without a trace, fails before any run
    arrival = describe(load_scenario(scen), spec.arrival, spec.file)
    check_candidates(spec.file, spec.candidates, scen, _base(spec))  # a typo fails before any run
    cands = candidate_grid(spec)
    rows: list[dict | None] = [screen(spec, c, prices) for c in cands]
    todo = [i for i, r in enumerate(rows) if r is None]
    if not todo:
        first = rows[0]
        raise SpecError(spec.file, "candidates", f"every candidate is skipped, e.g. {first['candidate']}: "
                        f"{first['note']}")
    for i, r in zip(todo, pmap(evaluate, [(spec, cands[i], prices) for i in todo],
                               workers or os.cpu_count() or 1, progress, "plan", "candidate"), strict=True):
        rows[i] = r
    result = {"name": spec.name, "target_rate": spec.target_rate, "slo": spec.slo.__dict__,
              "max_replicas": spec.search.max_replicas,
              "scenario": spec.scenario, "arrival": arrival, "candidates": rows, "recommended": None,
              "fleet_check": None, "fleet_checks": [], "unchecked_within": 0,
              "output_tokens_per_request": output_tokens_per_request(spec)}
    by_row = [r.pop("seed_groups", []) for r in rows]  # kept out of plan.json and the CSV
    groups = [g for gs in by_row for g in gs]
    result.update(_fleet_checks(spec, rows, cands, groups))
    pools = result.pop("seed_pool", None) or seed_pools(groups)
    result["seed_pool"] = pools
    for r, gs in zip(rows, by_row, strict=True):  # each candidate's p99s at its share, pooled
        if gs and r.get("status") == "ok":
            share = gs[-1]
            r.update(p99_intervals({k: share["values"][f"{k}_p99"] for k in ("ttft", "tpot", "e2e")},
                                   r["latency_interval90_model"], pools["unit"]))
    front = set(pareto(rows))
    for r in rows:
        r["pareto"] = r["candidate"] in front
    fronts = deployment_fronts(rows)
    if fronts is not None:
        result["deployments"] = fronts
    return result


def _fleet_checks(spec: PlanSpec, rows: list[dict], cands: list[dict], groups: list[dict] | None = None) -> dict:
    """Check candidates as fleets, cheapest estimate first, while one's estimate is at most
    the cheapest validated cost so far (at most `search.fleet_checks`); recommend the
    cheapest validated fleet (ties: lower p99 TTFT in its check). `groups`: the
    candidates' seed groups; with every count checked (`fleet_groups`) they make the
    pooled seed term of the recommendation's intervals (`seed_pool` in the answer)."""
    ranked = sorted((i for i, r in enumerate(rows) if r["status"] == "ok"),
                    key=lambda i: (rows[i]["usd_per_hour"], rows[i]["ttft_p99_at_target_s"] or math.inf))
    done: list[tuple[int, dict]] = []
    out_per_req = output_tokens_per_request(spec)["per_request"]

    def cheapest() -> float:
        return min((c["usd_per_hour"] for _, c in done if c["holds"]), default=math.inf)

    for i in ranked:
        if rows[i]["usd_per_hour"] > cheapest() * (1 + 1e-9):
            break
        if len(done) == spec.search.fleet_checks:
            break
        row = rows[i]
        check = validate_fleet(spec, row, cands[i])
        at_n = next(c for c in check["checks"] if c["replicas"] == check["replicas"])
        unit_gpus, unit_usd_h = row["gpus"] / row["replicas"], row["usd_per_hour"] / row["replicas"]
        usd_h = check["replicas"] * unit_usd_h  # the unit's price: the sum of its pools'
        check.update({"tp": row["tp"], "gpus": round(check["replicas"] * unit_gpus), "usd_per_hour": usd_h,
                      **{k: row[k] for k in ("unit", "unit_replicas") if k in row},
                      "usd_per_m_output_tokens": _usd_per_m(usd_h, spec.target_rate, out_per_req),
                      **{k: at_n[k] for k in ("ttft_p99_s", "tpot_p99_s", "e2e_p99_s", "goodput")}})
        row.update({"fleet_replicas": check["replicas"], "fleet_usd_per_hour": usd_h,
                    "fleet_ttft_p99_s": at_n["ttft_p99_s"], "fleet_holds": check["holds"],
                    "fleet_gpus": check["gpus"], "fleet_tpot_p99_s": at_n["tpot_p99_s"],
                    "fleet_usd_per_m_output_tokens": check["usd_per_m_output_tokens"]})
        done.append((i, check))
    if not done:
        return {}
    groups = [*(groups or []), *(g for _, c in done for g in fleet_groups(c))]
    held = [(i, c) for i, c in done if c["holds"]]
    if not held:  # no fleet checked met the SLOs: nothing is recommended
        return {"recommended": None, "fleet_check": done[0][1], "fleet_checks": [c for _, c in done],
                "unchecked_within": 0, "seed_pool": seed_pools(groups)}
    # ties on cost are shown, and broken toward more replicas (one down hurts less), then p99 TTFT
    i, check = min(held, key=lambda ic: (ic[1]["usd_per_hour"], -ic[1]["replicas"], ic[1]["ttft_p99_s"]))
    ties = [c["candidate"] for _, c in held if c is not check
            and c["usd_per_hour"] <= check["usd_per_hour"] * (1 + 1e-9)]
    checked = {j for j, _ in done}
    unchecked = sum(1 for j in ranked if j not in checked
                    and rows[j]["usd_per_hour"] <= check["usd_per_hour"] * (1 + 1e-9))
    rec = _recommended(rows[i], cands[i], check, spec, groups)
    rec["ties"] = ties
    return {"recommended": rec, "fleet_check": check, "fleet_checks": [c for _, c in done],
            "unchecked_within": unchecked, "seed_pool": seed_pools([*groups, *headroom_groups(rec["headroom"])])}


def fleet_groups(check: dict) -> list[dict]:
    """A fleet check's seed groups: one per replica count tried (passed: every seed met
    the SLOs)."""
    return [fleet_group(f"fleet {check['candidate']} x{c['replicas']}", c["passed"],
                        {k: c.get(f"{k}_p99_seeds_s") for k in ("ttft", "tpot", "e2e")})
            for c in check["checks"]]


def headroom_groups(head: dict | None) -> list[dict]:
    """The headroom search's fleet probes as seed groups (passed: every seed held)."""
    return [fleet_group(f"headroom x{t['factor']:.3g} of the target", t["passed"],
                        {k: t.get(f"{k}_p99_seeds_s") for k in ("ttft", "tpot", "e2e")})
            for t in (head or {}).get("tried", [])]


def _recommended(row: dict, cand: dict, check: dict, spec: PlanSpec, groups: list[dict] | None = None) -> dict:
    """The recommended fleet, every figure from its fleet check; the per-replica
    estimate apart under `estimate`."""
    estimate = {k: row[k] for k in ("replicas", "gpus", "usd_per_hour", "usd_per_m_output_tokens",
                                    "ttft_p99_at_target_s", "tpot_p99_at_target_s", "e2e_p99_at_target_s",
                                    "sustained_rate", "binding")}
    estimate["stands_on"] = ("per-replica sizing: one replica's sustained rate (bisection) and its p99s "
                             "at target / replicas")
    unit = {k: row[k] for k in ("deployment", "unit", "unit_replicas", "unit_gpus", "unit_usd_per_hour")
            if k in row}
    head = headroom(spec, cand, check["replicas"],
                    check["replicas"] * row["sustained_rate"] / spec.target_rate) \
        if check["holds"] and spec.search.headroom_probes else None
    return {"candidate": row["candidate"], **cand, "tp": row["tp"], **unit,
            **{k: check[k] for k in ("replicas", "gpus", "usd_per_hour", "usd_per_m_output_tokens",
                                     "ttft_p99_s", "tpot_p99_s", "e2e_p99_s", "goodput")},
            "holds": check["holds"], "redundancy": check.get("redundancy", "none"),
            "holds_one_down": check.get("holds_one_down", False), "headroom": head,
            **fleet_intervals(spec, row, check, head,
                              fleet_pool(seed_pools([*(groups or []), *headroom_groups(head)]))),
            "stands_on": f"fleet check: {check['replicas']} x {row['candidate']} behind a {check['router_label']} at "
                         f"{check.get('rate', spec.target_rate):g} req/s (target + {check.get('margin', 0):.0%} "
                         f"margin) for {check.get('traffic_s', '?')} s of traffic, seeds {check['seeds']} "
                         "(p99s: the worst seed)",
            "estimate": estimate}


def write_plan(result: dict, out_dir: str | Path) -> Path:
    """plan.json (everything), candidates.csv (each 90 % interval as its `_low`/`_high`
    columns) and fleet_check.csv (every fleet checked, one row per replica count tried)
    in an output folder."""
    import json

    import pandas as pd

    from sim.io.outdir import write_output

    checks = result.get("fleet_checks") or ([result["fleet_check"]] if result["fleet_check"] else [])

    def write(folder: Path) -> None:
        (folder / "plan.json").write_text(json.dumps(result, indent=2, default=str) + "\n")
        pd.DataFrame([interval_columns(r) for r in result["candidates"]]).to_csv(
            folder / "candidates.csv", index=False)
        if checks:
            pd.DataFrame([{"candidate": c["candidate"], **k} for c in checks for k in c["checks"]]).to_csv(
                folder / "fleet_check.csv", index=False)

    return write_output(out_dir, "plan", write, {"name": result["name"]})
