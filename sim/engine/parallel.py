"""Parallel fleets: the replicas of a fleet whose router needs no feedback, simulated in
separate processes and merged, with the very results of the single-process run.

A router that never looks at the replicas' state (round robin, random: `FEEDBACK_FREE`)
sends each request where it would have sent it whatever happened on the replicas, so
every request's replica is decided up front, with the run's router object making the
same draws in the same order (`assign`). Each worker then simulates its share of the
replicas alone (`simulate_part`): it replays every arrival instant of the workload (the
arrivals process yields at each, as in the whole run, and dispatches only its own
requests), so the SimPy events of its replicas fall in the same order as in the whole
run, ties included. The parent merges the requests (by id), the replicas' results (by
index), their pooled inter-token gaps, the end time (the latest worker's clock) and the
step-time memos' use counts (the lookup provenance sums them exactly: math.fsum).
Workers spill their step logs into the parent's folder (sim/io/spill.py), so they run on
this machine: a process pool, or a local Ray (one this process starts, or one it is
already connected to on this host).

Everything else stays single-process (`refusal` says why, one line): routers that read
the replicas' load (least outstanding, least KV, power of two, affinity: their choices
feed back from the simulated state, stale reports included, since a report is the state
at its instant), disaggregated fleets (the decode router and KV links join replicas),
autoscaling (the scaler reads the fleet), closed loops (a client's next request waits
for its last answer) and speculative decoding (acceptance draws come from the run's
shared generator, in the order the replicas step).
"""

from __future__ import annotations

import logging
import sys

import numpy as np
import simpy

from sim.config.scenario import Scenario
from sim.engine.build import build_fleet
from sim.engine.closedloop import streamed
from sim.engine.prepare import prepare
from sim.engine.processes import (
    Clock,
    Fleet,
    check_accounted,
    leaping,
    make_seqs,
    prefix_views,
    replica,
    run_clock,
)
from sim.engine.recorder import StepRecorder, pooled_gaps, spill_logs
from sim.engine.replica import ReplicaResult, RunResult
from sim.io.spill import SpillDir
from sim.policies.router import make_router

NOTICES = logging.getLogger("llmsim")
# router policies that choose without looking at the replicas (the rest read their load)
# (`length`: its pools' `within` router may read load, and `assign` would need the pools:
# single process for now)
FEEDBACK_FREE = {"round_robin": True, "random": True, "least_outstanding": False,
                 "least_kv": False, "power_of_two": False, "affinity": False, "length": False}
EXECUTORS = ("process", "ray")
START_METHOD = "fork" if sys.platform != "win32" else "spawn"  # as sweeps start theirs


def refusal(sc: Scenario, configs: list, workload) -> str | None:
    """Why this run cannot be split across processes (None: it can)."""
    cluster = sc.cluster
    if cluster is None or len(configs) < 2:
        return "one replica"
    if cluster.autoscale is not None:
        return "autoscaling reads the whole fleet"
    if any(c.role != "both" for c in configs):
        return "a disaggregated fleet joins prefill and decode replicas"
    if workload.clients is not None:
        return "a closed loop's clients wait for their answers"
    if not FEEDBACK_FREE.get(cluster.router.policy, False):
        return (f"router {cluster.router.policy} chooses by the replicas' load (feedback); "
                f"only {', '.join(k for k, v in FEEDBACK_FREE.items() if v)} split")
    if any(c.scenario.speculative.method != "none" for c in configs):
        return "speculative decoding draws from the run's shared generator"
    if any(c.scenario.parallel.pipeline > 1 for c in configs):
        return "pipeline-parallel replicas run their own engine process (sim/engine/pipeline.py)"
    return None


def assign(sc: Scenario, workload, replicas: int) -> np.ndarray:
    """Each request's replica, as the run's router (sim/engine/build.py: its own generator
    seeded [seed, 2]) picks it for the requests in arrival order."""
    router = make_router(sc.cluster.router, np.random.default_rng([sc.seed, 2]))
    loads = [None] * replicas  # a feedback-free router reads only how many there are
    keys = workload.prefix_hashes
    return np.fromiter((router.choose(keys[i][0] if keys is not None and keys[i] else None, loads)
                        for i in range(len(workload))), dtype=np.int64, count=len(workload))


def parts(n: int, workers: int) -> list[list[int]]:
    """Replica indices dealt round-robin into `workers` groups (a round-robin or random
    router loads them alike, so any grouping balances)."""
    return [list(range(w, n, workers)) for w in range(min(workers, n))]


class _Preassigned:
    """A router that replays decided choices (local indices), one per dispatch."""

    uses_reports = False

    def __init__(self, choices):
        self.choices = iter(choices)

    def choose(self, key, loads) -> int:
        return next(self.choices)


def _arrivals(env: simpy.Environment, fleet: Fleet, arrival: list, mine: list, own: list):
    """sim/engine/processes.arrivals, yielding at every arrival instant of the workload
    but dispatching only this worker's requests (`own`, where `mine` is true)."""
    t = 0.0
    k = 0
    for a, m in zip(arrival, mine, strict=True):
        if a > t:
            yield env.timeout(a - t)
            t = a
        if m:
            fleet.dispatch(own[k])
            k += 1


class _NoNode:
    request_s = None


def _memo_uses(lats: list) -> list[dict]:
    return [{k: e[2] for k, e in lat._memo.items()} for lat in lats]


def simulate_part(sc: Scenario, part: list[int], choice: np.ndarray,
                  spill_path: str | None) -> dict:
    """Simulate replicas `part` of the scenario's fleet with their requests (`choice`: each
    request's replica); what the parent merges."""
    configs, wl, rng = prepare(sc)
    fleet_setup = build_fleet(sc, configs, rng, acceptance=wl.acceptance,
                              prefix_tokens=wl.block_tokens if wl.prefix_hashes is not None
                              else None)
    everyone = fleet_setup.replicas
    lats = list({id(c.latency): c.latency for c in configs}.values())
    before = _memo_uses(lats)
    reps = [everyone[i] for i in part]
    local = np.full(len(everyone), -1, dtype=np.int64)
    local[part] = np.arange(len(part))
    mine = local[choice] >= 0
    if spill_path is not None:  # the parent's folder; each replica its own files
        spill_logs(reps, SpillDir(spill_path), fleet_size=len(everyone))
    own = make_seqs(wl, min(r.st.max_model_len for r in everyone), np.flatnonzero(mine))
    prefix_views(wl, reps)
    env = Clock()  # a leap's end at an exact time (sim/engine/processes.py)
    fleet = Fleet(env, reps, _Preassigned(local[choice[mine]].tolist()))
    env.process(_arrivals(env, fleet, np.asarray(wl.arrival_s, dtype=float).tolist(),
                          mine.tolist(), own))
    for node in fleet.nodes:
        env.process(replica(env, node, leap=leaping()))
    run_clock(env)
    check_accounted(reps, len(own))
    nodes: list = [_NoNode()] * len(everyone)
    for node in fleet.nodes:
        nodes[node.rep.index] = node
    streamed(own, nodes)
    results = [ReplicaResult.of(r) for r in reps]
    for r in results:
        r.steps.spill, r.steps.then = None, None  # the parent points them at its folder
    gaps = [(r.rec.gaps_spilled, r.rec.gaps, r.rec.weights) for r in reps]
    memos = []
    for lat, old in zip(lats, before, strict=True):
        memos.append({k: [e[0], e[1], e[2] - old.get(k, 0), *e[3:]]
                      for k, e in lat._memo.items() if e[2] != old.get(k, 0)})
    return {"seqs": own, "results": results, "gaps": gaps, "end": env.now, "memos": memos}


def merge(outs: list[dict], n_requests: int, lats: list, spill: SpillDir) -> RunResult:
    """One RunResult of the workers' outputs, as the single-process run returns it; the
    workers' step-time lookups counted into `lats` (the parent's latency models)."""
    seqs: list = [None] * n_requests
    results, recs = [], []
    for out in outs:
        for s in out["seqs"]:
            seqs[s.rid] = s
        for r, (spilled, gaps, weights) in zip(out["results"], out["gaps"], strict=True):
            if r.steps.spilled or spilled:
                r.steps.spill = spill
            rec = StepRecorder()
            rec.log, rec.gaps, rec.weights, rec.gaps_spilled = r.steps, gaps, weights, spilled
            results.append(r)
            recs.append(rec)
        for lat, memo in zip(lats, out["memos"], strict=True):
            for k, e in memo.items():
                mine = lat._memo.get(k)
                if mine is None:
                    lat._memo[k] = e
                else:
                    mine[2] += e[2]
    if any(s is None for s in seqs):
        raise RuntimeError("a parallel run lost requests in the merge")
    order = sorted(range(len(results)), key=lambda i: results[i].index)
    results = [results[i] for i in order]
    gaps, weights = pooled_gaps([recs[i] for i in order], [0] * len(order))
    return RunResult(seqs, results, gaps, weights, max(o["end"] for o in outs), None)


def simulate_parallel(sc: Scenario, configs: list, workload, workers: int,
                      executor: str = "process") -> tuple[RunResult, SpillDir]:
    """The run's RunResult, its replicas simulated `workers` processes at a time."""
    n = len(configs)
    choice = assign(sc, workload, n)
    spill = SpillDir()
    groups = parts(n, workers)
    args = [(sc, g, choice, str(spill.path)) for g in groups]
    if executor == "ray":
        outs = _on_ray(args, workers)
    elif executor == "process":
        import concurrent.futures as cf
        import multiprocessing as mp

        with cf.ProcessPoolExecutor(max_workers=len(groups),
                                    mp_context=mp.get_context(START_METHOD)) as pool:
            outs = list(pool.map(simulate_part, *zip(*args, strict=True)))
    else:
        raise ValueError(f"executor {executor!r} (known: {', '.join(EXECUTORS)})")
    lats = list({id(c.latency): c.latency for c in configs}.values())
    return merge(outs, len(workload), lats, spill), spill


def _on_ray(args: list, workers: int) -> list[dict]:
    try:
        import ray
    except ImportError:
        raise ValueError("executor 'ray': ray is not installed (pip install 'llmsim[ray]')") \
            from None
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=workers, include_dashboard=False, log_to_driver=False)
    try:
        remote = ray.remote(simulate_part)
        return ray.get([remote.remote(*a) for a in args])
    finally:
        if started:
            ray.shutdown()
