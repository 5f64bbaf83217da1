"""`llmsim plan`: the cheapest fleet that serves a target rate within SLOs, validated.

```yaml
name: chat-8b
scenario: ../scenarios/quickstart.yaml    # model, runtime, lengths (relative to this file)
target_rate: 24                           # requests/s the fleet must serve
slo: {ttft_p99_s: 1.0, tpot_p99_s: 0.06}  # also e2e_p99_s, goodput_min, min_throughput_ratio
prices: null                              # default gpu_profiles/prices.yaml
search: {seeds: 2, requests: 300}         # see SearchSpec
router: {policy: random}                  # the fleet check's load balancer (default random)
candidates:                               # a grid; short names or dotted scenario fields
  gpu: [a100-80gb, h100-sxm, h200-sxm]
  tensor: [1, 2, 4]                       # parallel.tensor
  policy: [continuous, chunked]           # scheduler.policy
```

Per candidate (`sim/capacity.py`): the highest Poisson rate one replica (one TP group)
sustains with every seed meeting the SLOs, by bisection; then replicas =
ceil(target / that rate), GPUs = replicas x TP, $/hour from the prices file, $/M output
tokens = $/hour / (target x mean output tokens x 3600) x 1e6, and p99 latencies of one
replica at its share of the target (target / replicas). The binding constraint is read
from the first probe that broke the SLOs (`binding`). The cheapest candidate (ties:
lower p99 TTFT) is then checked as a fleet (`sim/fleet.py`: the cluster engine, behind
`router`) at the target rate: the replica count moves until the fleet meets the SLOs
for every seed and one replica fewer does not; that validated count is the
recommendation.

`router` is the mapping of a scenario's `cluster.router` (`sim/cluster.py` RouterSpec:
`policy`, `staleness_s`, `affinity_slack`, checked the same way) for the load balancer
the fleet will sit behind; only `policy` defaults differently: `random`. A random router
is the blind, conservative choice (it neither smooths arrivals like round robin nor
balances load like least outstanding on current counts; a router acting on stale
reports can still do worse), and behind it each replica sees an unbiased random
thinning of the fleet's arrivals, which is what the per-replica sizing at
target / replicas assumes. Behind another router that sizing is an estimate and the
fleet check, which moves the count either way, settles it."""

from __future__ import annotations

import dataclasses
import itertools
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .capacity import SLO, Capacity, max_rate, rate_overrides, violations
from .cluster import RouterSpec
from .scenario import Scenario, load_scenario
from .specload import ROOT, SpecError, build, load_yaml

ALIASES = {"gpu": "gpu", "tensor": "parallel.tensor", "policy": "scheduler.policy",
           "chunk_tokens": "scheduler.max_num_batched_tokens", "block_size": "kv.block_size",
           "max_num_seqs": "scheduler.max_num_seqs", "speculative": "speculative"}
DEFAULT_PRICES = ROOT / "gpu_profiles" / "prices.yaml"


@dataclass(frozen=True)
class SearchSpec:
    seeds: int = field(default=2, metadata={"ge": 1})  # seeds per probe
    need: int | None = field(default=None, metadata={"ge": 1})  # seeds that must pass; default all
    requests: int = field(default=300, metadata={"ge": 20})  # requests per replica per run
    rate_start: float = field(default=4.0, metadata={"gt": 0})
    rate_min: float = field(default=0.05, metadata={"gt": 0})
    rate_max: float = field(default=1024.0, metadata={"gt": 0})
    rel_tol: float = field(default=0.1, metadata={"gt": 0})  # stop when hi/lo <= 1 + rel_tol
    max_probes: int = field(default=14, metadata={"ge": 2})
    max_replicas: int = field(default=256, metadata={"ge": 1})


@dataclass(frozen=True)
class PlanSpec:
    scenario: str
    target_rate: float = field(metadata={"gt": 0})
    slo: SLO
    candidates: dict[str, tuple[Any, ...]] = field(default_factory=dict)
    name: str = "plan"
    prices: str | None = None
    search: SearchSpec = SearchSpec()
    router: RouterSpec = RouterSpec(policy="random")  # the fleet check's router
    file: str = field(default="", init=False, compare=False)


def load_plan(file: str | Path) -> PlanSpec:
    p = Path(file)
    data = load_yaml(p)
    if isinstance(data.get("router"), dict):  # a plan's router is random unless it says otherwise
        data = {**data, "router": {"policy": "random", **data["router"]}}
    spec = build(PlanSpec, data, file=p)
    object.__setattr__(spec, "file", str(p))
    for k, values in spec.candidates.items():
        if not values:
            raise SpecError(p, f"candidates.{k}", "empty list (allowed: one or more values)")
    return spec


def _resolve(spec: PlanSpec, rel: str) -> Path:
    q = Path(rel)
    return q if q.is_absolute() else (Path(spec.file).resolve().parent / q)


def load_prices(path: str | Path | None) -> dict[str, float]:
    p = Path(path) if path else DEFAULT_PRICES
    gpus = load_yaml(p).get("gpus")
    if not isinstance(gpus, dict):
        raise SpecError(p, "gpus", "missing (allowed: a mapping gpu -> {usd_per_hour, source})")
    out = {}
    for name, rec in gpus.items():
        v = rec.get("usd_per_hour") if isinstance(rec, dict) else None
        if not isinstance(v, int | float) or v <= 0:
            raise SpecError(p, f"gpus.{name}.usd_per_hour", f"expected a positive number, got {v!r}")
        out[str(name)] = float(v)
    return out


def candidate_grid(spec: PlanSpec) -> list[dict]:
    """Every candidate as scenario overrides (short names expanded)."""
    names = [ALIASES.get(k, k) for k in spec.candidates]
    return [dict(zip(names, combo, strict=True)) for combo in itertools.product(*spec.candidates.values())]


def label(cand: dict) -> str:
    short = {v: k for k, v in ALIASES.items()}
    parts = []
    for k, v in cand.items():
        name = short.get(k, k.split(".")[-1])
        parts.append(str(v) if name in ("gpu", "policy") else f"{'tp' if name == 'tensor' else name + '='}{v}")
    return " ".join(parts) or "base"


def tp_supported() -> bool:
    return "parallel" in Scenario.__dataclass_fields__


def evaluate(spec: PlanSpec, cand: dict, prices: dict[str, float]) -> dict:
    """One candidate: sustained rate, fleet size, cost, latency at its share, binding."""
    row: dict[str, Any] = {"candidate": label(cand), **cand}
    over = dict(cand)
    if "parallel.tensor" in over and not tp_supported():
        if over["parallel.tensor"] != 1:
            return {**row, "status": "skipped", "note": "tensor parallelism is not in this build's scenario spec"}
        over.pop("parallel.tensor")
    scen = str(_resolve(spec, spec.scenario))
    base = {"slo": spec.slo.as_scenario_slo(), **over}
    try:
        sc = load_scenario(scen, base)
    except SpecError as e:
        return {**row, "status": "skipped", "note": f"invalid combination: {e.path}: {e.message}"}
    gpu, tp = sc.gpu, sc.parallel.tensor if tp_supported() else 1
    if gpu not in prices:
        return {**row, "status": "skipped", "note": f"no price for GPU '{gpu}' in the prices file"}
    s = spec.search
    run_at = _runner(scen, base, sc, s.requests)
    seeds = [sc.seed + i for i in range(s.seeds)]
    cap = max_rate(run_at, spec.slo, seeds, s.need, s.rate_start, s.rate_min, s.rate_max,
                   s.rel_tol, s.max_probes)
    row.update(_capacity_row(cap, gpu))
    if cap.rate <= 0:
        return {**row, "status": "infeasible", "note": "SLOs broken even at the lowest rate tried"}
    replicas = math.ceil(spec.target_rate / cap.rate - 1e-9)
    if replicas > s.max_replicas:
        return {**row, "status": "infeasible", "note": f"needs {replicas} replicas > max_replicas"}
    at_share = run_at(spec.target_rate / replicas, sc.seed)
    out_per_req = at_share["output_token_throughput"] / max(at_share["request_throughput"], 1e-12)
    usd_h = replicas * tp * prices[gpu]
    return {**row, "status": "ok", "note": "", "tp": tp, "replicas": replicas, "gpus": replicas * tp,
            "usd_per_hour": usd_h,
            "usd_per_m_output_tokens": usd_h / (spec.target_rate * out_per_req * 3600) * 1e6,
            "ttft_p99_at_target_s": at_share["ttft_s"]["p99"],
            "tpot_p99_at_target_s": at_share["tpot_s"]["p99"],
            "e2e_p99_at_target_s": at_share["e2e_s"]["p99"]}


def _runner(scen: str, base: dict, sc: Scenario, requests: int):
    from .capacity import steady_throughput
    from .runner import run

    def run_at(rate: float, seed: int) -> dict:
        out = run(scen, {**base, **rate_overrides(sc.workload.arrival, rate, requests), "seed": seed})
        return {**out.summary, "steady": steady_throughput(out.requests)}
    return run_at


def _capacity_row(cap: Capacity, gpu: str) -> dict:
    spread = cap.spread("ttft_s")
    fail = cap.at_fail
    return {"sustained_rate": cap.rate, "fail_rate": cap.fail_rate,
            "seeds_passed_at_fail": f"{fail.seeds_passed}/{fail.seeds_run}" if fail else "",
            "ttft_p99_spread_s": f"{spread[0]:.3g}-{spread[1]:.3g}" if spread else "",
            "broke": "; ".join(fail.broke) if fail else "",
            "binding": binding(fail.summaries[-1], gpu) if fail else "none up to rate_max",
            "probes": len(cap.probes), "runs": sum(p.seeds_run for p in cap.probes)}


def binding(summary: dict, gpu: str) -> str:
    """What ran out first at the first failing probe (derived from its summary):
    KV capacity when requests were preempted or rejected or the cache peaked >= 95 %;
    else, when steps ran >= 85 % of the time: host overhead when under half of that was
    GPU kernels (the serving loop's CPU work paced it), else compute or memory bandwidth
    by a roofline test: mean tokens per iteration (~FLOPs per weight byte at bf16)
    against the GPU's FLOP/byte ridge; else queueing (idle time, requests waited)."""
    from .profiles import load_profile

    kv = summary["kv"]
    if summary["preemptions"] or summary["requests"]["rejected"] or kv["util_peak"] >= 0.95:
        return "KV capacity"
    busy = summary["gpu_busy_fraction"]
    if busy >= 0.85:
        if summary["gpu_kernel_fraction"] < 0.5 * busy:
            return "host overhead"
        f = load_profile(gpu).facts
        ridge = (f.peak_tflops or f.datasheet_tflops) / (f.mem_bw_tbs or f.datasheet_mem_bw_tbs)
        iters = max(summary["iterations"]["total"], 1)
        per_iter = summary["total_token_throughput"] * summary["duration_s"] / iters
        return "compute" if per_iter >= ridge else "memory bandwidth"
    return "queueing"


def pareto(rows: list[dict]) -> list[str]:
    """Candidates no other beats on both $/hour and p99 TTFT at the target."""
    ok = [r for r in rows if r.get("status") == "ok"]
    front = []
    for r in ok:
        a = (r["usd_per_hour"], r["ttft_p99_at_target_s"])
        if not any((o["usd_per_hour"], o["ttft_p99_at_target_s"]) != a and o["usd_per_hour"] <= a[0]
                   and o["ttft_p99_at_target_s"] <= a[1] for o in ok):
            front.append(r["candidate"])
    return front


def validate_fleet(spec: PlanSpec, row: dict, cand: dict) -> dict:
    """Move the replica count until N meets the SLOs (all seeds) and N - 1 does not
    (assumes more replicas never hurt: down by bisection from the estimate, else up),
    each fleet behind the plan's router."""
    from .fleet import router_label, simulate_fleet

    over = {k: v for k, v in cand.items() if tp_supported() or k != "parallel.tensor"}
    scen = str(_resolve(spec, spec.scenario))
    base_sc = load_scenario(scen, {"slo": spec.slo.as_scenario_slo(), **over})
    seeds = [base_sc.seed + 100 + i for i in range(spec.search.seeds)]
    checks: dict[int, dict] = {}

    def check(n: int) -> bool:
        if n < 1:
            return False
        if n not in checks:
            sc = load_scenario(scen, {"slo": spec.slo.as_scenario_slo(), **over, **rate_overrides(
                base_sc.workload.arrival, spec.target_rate, spec.search.requests * n)})
            runs = [simulate_fleet(sc, n, seed, spec.router).summary for seed in seeds]
            broke = [v for s in runs for v in violations(s, spec.slo)]
            checks[n] = {"replicas": n, "passed": not broke, "broke": "; ".join(dict.fromkeys(broke)),
                         "ttft_p99_s": max(s["ttft_s"]["p99"] or math.inf for s in runs),
                         "tpot_p99_s": max(s["tpot_s"]["p99"] or math.inf for s in runs),
                         "goodput": min((s["goodput"] or {}).get("fraction_met", 1.0) for s in runs)}
        return checks[n]["passed"]

    n = row["replicas"]
    if check(n):  # bisect down to the smallest passing count (0 replicas always fail)
        lo, hi = 0, n
        guess = math.ceil(spec.target_rate / row["fail_rate"]) if row.get("fail_rate") else 1
        for mid in (guess, guess - 1):  # the likely answer and its neighbour first
            if lo < mid < hi:
                lo, hi = (lo, mid) if check(mid) else (mid, hi)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if check(mid) else (mid, hi)
        n = hi
    else:
        while n < spec.search.max_replicas and not check(n + 1):
            n += 1
        n += 1
    ok = check(n)
    fewer = check(n - 1) if n > 1 else False
    return {"candidate": row["candidate"], "replicas": n, "estimated_replicas": row["replicas"],
            "holds": ok, "one_fewer_breaks": not fewer, "seeds": seeds,
            "router": dataclasses.asdict(spec.router), "router_label": router_label(spec.router),
            "checks": [checks[k] for k in sorted(checks)]}


def run_plan(spec: PlanSpec, prices_path: str | Path | None = None, workers: int | None = None,
             progress: bool = False) -> dict:
    """Evaluate every candidate (in parallel), pick and validate the cheapest."""
    prices = load_prices(prices_path or (_resolve(spec, spec.prices) if spec.prices else None))
    cands = candidate_grid(spec)
    load_scenario(_resolve(spec, spec.scenario))  # a bad scenario fails before any run
    rows = _map(spec, cands, prices, workers or os.cpu_count() or 1, progress)
    if rows and all(r["status"] == "skipped" for r in rows):  # a typo, not a combination
        raise SpecError(spec.file, "candidates", rows[0]["note"])
    front = set(pareto(rows))
    for r in rows:
        r["pareto"] = r["candidate"] in front
    ok = sorted((r for r in rows if r["status"] == "ok"),
                key=lambda r: (r["usd_per_hour"], r["ttft_p99_at_target_s"]))
    result = {"name": spec.name, "target_rate": spec.target_rate, "slo": spec.slo.__dict__,
              "scenario": spec.scenario, "candidates": rows, "recommended": None, "fleet_check": None}
    if ok:
        best = ok[0]
        cand = cands[rows.index(best)]
        check = validate_fleet(spec, best, cand)
        tp = best["tp"]
        price = prices[best["gpu_name"]] if "gpu_name" in best else best["usd_per_hour"] / best["gpus"]
        n = check["replicas"]
        result["recommended"] = {**best, "replicas": n, "gpus": n * tp, "usd_per_hour": n * tp * price,
                                 "usd_per_m_output_tokens": best["usd_per_m_output_tokens"] * n / best["replicas"]}
        result["fleet_check"] = check
    return result


def _map(spec, cands, prices, workers, progress) -> list[dict]:
    if workers <= 1 or len(cands) <= 1:
        return [evaluate(spec, c, prices) for c in cands]
    import concurrent.futures as cf
    import multiprocessing as mp

    from .sweep import _START_METHOD

    with cf.ProcessPoolExecutor(workers, mp_context=mp.get_context(_START_METHOD)) as pool:
        futs = [pool.submit(evaluate, spec, c, prices) for c in cands]
        if progress:
            from tqdm import tqdm

            for _ in tqdm(cf.as_completed(futs), total=len(futs), desc="plan", unit="candidate", leave=False):
                pass
        return [f.result() for f in futs]


def write_plan(result: dict, out_dir: str | Path) -> Path:
    """plan.json (everything), candidates.csv and fleet_check.csv in an output folder."""
    import json

    import pandas as pd

    from .outdir import write_output

    def write(folder: Path) -> None:
        (folder / "plan.json").write_text(json.dumps(result, indent=2, default=str) + "\n")
        pd.DataFrame(result["candidates"]).to_csv(folder / "candidates.csv", index=False)
        if result["fleet_check"]:
            pd.DataFrame(result["fleet_check"]["checks"]).to_csv(folder / "fleet_check.csv", index=False)

    return write_output(out_dir, "plan", write, {"name": result["name"]})
