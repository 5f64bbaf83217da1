"""A fleet of identical replicas behind a random router, simulated as independent runs.

`simulate_fleet(scenario, replicas, seed)` draws the scenario's whole workload once,
sends each request to a replica chosen uniformly at random (one seeded draw per
request), and runs each replica on its share. With identical replicas and no
feedback from replicas to the router this is exactly what a random router does: each
replica sees an independent 1/N thinning of the traffic (Poisson traffic stays
Poisson at rate/N). It stands in for the cluster engine (issue 8) until that lands:
swap the body, keep the signature and the `FleetResult` it returns.

Limits of the stand-in: a replica's share is replayed as a csv trace, so prefix-block
hashes (mooncake traces) are dropped and a share's `max_tokens` is its own largest
output (matters only to contiguous KV reserving max_tokens).
"""

from __future__ import annotations

import dataclasses
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from .batch import FINISHED
from .metrics import goodput
from .scenario import Scenario, scenario_from_dict

ROUTER_STREAM = 0x0F1EE7  # a second seed word, so routing draws differ from the workload's


@dataclass
class FleetResult:
    replicas: int
    requests: pd.DataFrame  # every request, with a `replica` column
    summary: dict  # same keys as a run summary where they apply (ttft_s.p99, ...)
    replica_summaries: list[dict]
    replica_steps: list[pd.DataFrame]  # each replica's iterations, on the fleet's clock


def simulate_fleet(scenario: Scenario, replicas: int, seed: int) -> FleetResult:
    """Simulate `replicas` copies of the scenario's deployment behind a random router."""
    from .runner import prepare, run

    if replicas < 1:
        raise ValueError("a fleet needs at least one replica")
    sc = dataclasses.replace(scenario, seed=seed)
    _copy_origin(scenario, sc)
    wl = prepare(sc).workload
    route = np.random.default_rng([seed, ROUTER_STREAM]).integers(0, replicas, size=len(wl))
    frames, summaries, steps = [], [], []
    with tempfile.TemporaryDirectory(prefix="llmsim-fleet-") as tmp:
        for i in range(replicas):
            mine = np.flatnonzero(route == i)
            if len(mine) == 0:
                continue
            share = pd.DataFrame({"arrival_s": wl.arrival_s[mine], "prompt_tokens": wl.prompt_tokens[mine],
                                  "output_tokens": wl.output_tokens[mine]})
            if wl.acceptance is not None:
                share["acceptance"] = wl.acceptance[mine]
            path = Path(tmp) / f"replica{i}.csv"
            share.to_csv(path, index=False, float_format="%.9f")
            out = run(_with_trace(sc, path, seed * 1009 + i))
            req = out.requests.copy()
            t0 = float(wl.arrival_s[mine[0]])  # a trace restarts at 0
            for col in ("arrival_s", "first_token_s", "finish_s"):
                req[col] += t0
            steps.append(out.steps.assign(t_start=out.steps.t_start + t0, t_end=out.steps.t_end + t0))
            req["replica"] = i
            req["id"] = mine[req["id"].to_numpy()]
            frames.append(req)
            summaries.append(out.summary)
    requests = pd.concat(frames, ignore_index=True).sort_values("id", kind="stable")
    return FleetResult(replicas, requests, fleet_summary(requests, sc, replicas), summaries, steps)


def fleet_summary(req: pd.DataFrame, sc: Scenario, replicas: int) -> dict:
    """Pooled latency percentiles, throughput and goodput over the fleet's requests."""
    fin = req[req.status == FINISHED]
    start = float(req.arrival_s.min())
    duration = max(float(fin.finish_s.max()) - start, 1e-12) if len(fin) else 1e-12

    def stats(col: str) -> dict:
        x = fin[col].to_numpy(dtype=float)
        x = x[~np.isnan(x)]
        if len(x) == 0:
            return {"p50": None, "p99": None}
        p50, p99 = np.percentile(x, [50, 99])
        return {"mean": float(x.mean()), "p50": float(p50), "p99": float(p99)}

    offered = (len(req) - 1) / max(float(req.arrival_s.max()) - start, 1e-12) if len(req) > 1 else 0.0
    return {
        "replicas": replicas,
        "requests": {"total": int(len(req)), "finished": int(len(fin)),
                     "rejected": int((req.status == "rejected").sum())},
        "duration_s": duration,
        "offered_rate": offered,
        "request_throughput": len(fin) / duration,
        "output_token_throughput": float(fin.output_tokens.sum()) / duration,
        "ttft_s": stats("ttft_s"), "tpot_s": stats("tpot_s"), "e2e_s": stats("e2e_s"),
        "queue_s": stats("queue_s"),
        "goodput": goodput(fin, duration, sc.slo),
        "preemptions": int(req.preemptions.sum()),
        "stands_on": "independent single-replica runs on random 1/N thinnings (sim/fleet.py)",
    }


def _with_trace(sc: Scenario, path: Path, seed: int) -> Scenario:
    data = scenario_dict(sc)
    data["seed"] = seed
    data["workload"] = {"trace": {"path": str(path), "format": "csv"}}
    if sc.workload.max_output_tokens is not None:
        data["workload"]["max_output_tokens"] = sc.workload.max_output_tokens
    return scenario_from_dict(data, file=sc.file or None, base_dir=sc.base_dir or None)


def scenario_dict(sc: Scenario) -> dict:
    """A scenario as the plain mapping its YAML would give (loader-set fields left out)."""
    data = dataclasses.asdict(sc)
    for name in ("file", "base_dir"):
        data.pop(name, None)
    return data


def _copy_origin(src: Scenario, dst: Scenario) -> None:
    object.__setattr__(dst, "file", src.file)
    object.__setattr__(dst, "base_dir", src.base_dir)
