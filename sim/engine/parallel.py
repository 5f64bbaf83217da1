"""Fleets split by replica: the replicas of a fleet whose router needs no feedback,
simulated apart (sim/engine/split.py: each alone with its own requests, so its leaps run
to its own next event), one after another in this process or spread over processes, and
merged, with the very results of the single-process run.

A router that never looks at the replicas' state (round robin, random: `FEEDBACK_FREE`)
sends each request where it would have sent it whatever happened on the replicas, so
every request's replica is decided up front, with the run's router object making the
same draws in the same order (`assign`). (No router hashes a fixed key: `affinity` keeps
a key's replica but moves it when that replica is busier, which is feedback.) The parent
merges the requests (records, by id: sim/engine/records.py), the replicas' results (by
index), their pooled inter-token gaps, the end time (the latest replica's clock) and,
from workers, the step-time memos' use counts (the lookup provenance sums them exactly:
math.fsum). Replicas spill their step logs and request records into the parent's
folder (sim/io/spill.py), so workers run on this machine: a process pool, or a local Ray
(one this process starts, or one it is already connected to on this host).

What each worker costs beyond its replicas: forked workers (the process pool on Linux and
macOS) inherit the run as this process resolved it (configs with their step-time memos,
warm from the step cache; the workload; the routes), so nothing is resolved again or
pickled to them; Ray's workers (and spawned ones) get the workload and routes through the
object store (or a pickle) and the parent's memos, and resolve only the configs. Forked
or on Ray, this process simulates the first group itself meanwhile. Each worker still prices
the step shapes the parent had not met (its memos start as the parent's) and sends its
replicas' results back. `workers="auto"` (`llmsim run`'s default) takes one process per
core for runs large enough to repay that (`auto_workers`), else simulates here.

Everything else is simulated whole, in one process (`refusal` says why, one line):
routers that read the replicas' load (least outstanding, least KV, power of two,
affinity: their choices feed back from the simulated state, stale reports included,
since a report is the state at its instant), disaggregated fleets (the decode router and
KV links join replicas), autoscaling (the scaler reads the fleet), closed loops (a
client's next request waits for its last answer), speculative decoding (acceptance
draws come from the run's shared generator, in the order the replicas step) and
pipeline-parallel replicas (their own engine process).
"""

from __future__ import annotations

import logging
import resource
import sys
import time
from typing import NamedTuple

import numpy as np

from sim.config.scenario import Scenario
from sim.engine.bigstats import first_level, merged
from sim.engine.build import replica_configs
from sim.engine.prepare import prepare
from sim.engine.recorder import StepRecorder, pooled_gaps
from sim.engine.records import SeqView
from sim.engine.replica import RunResult
from sim.engine.split import Setup, records_of, simulate_replicas
from sim.engine.splitrule import (  # noqa: F401  (part of this interface)
    AUTO_MIN_REQUESTS,
    FEEDBACK_FREE,
    auto_workers,
    cores,
    refusal,
)
from sim.io.spill import SpillDir, is_lazy
from sim.policies.router import make_router

NOTICES = logging.getLogger("llmsim")
EXECUTORS = ("process", "ray")
START_METHOD = "fork" if sys.platform != "win32" else "spawn"  # as sweeps start theirs


class Usage(NamedTuple):
    """What one worker's task cost: CPU seconds (resolving the scenario again included,
    where it did) and the worker process's peak resident memory, GiB."""
    cpu_s: float
    peak_rss_gib: float


def _peak_rss() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def assign(sc: Scenario, workload, replicas: int) -> np.ndarray:
    """Each request's replica, as the run's router (sim/engine/build.py: its own generator
    seeded [seed, 2]) picks it for the requests in arrival order."""
    router = make_router(sc.cluster.router, np.random.default_rng([sc.seed, 2]))
    if hasattr(router, "choices"):  # one that reads no key either: all at once
        return router.choices(len(workload), replicas)
    loads = [None] * replicas  # a feedback-free router reads only how many there are
    keys = workload.prefix_hashes
    return np.fromiter((router.choose(keys[i][0] if keys is not None and keys[i] else None, loads)
                        for i in range(len(workload))), dtype=np.int64, count=len(workload))


def parts(n: int, workers: int) -> list[list[int]]:
    """Replica indices dealt round-robin into `workers` groups (a round-robin or random
    router loads them alike, so any grouping balances)."""
    return [list(range(w, n, workers)) for w in range(min(workers, n))]


def _memo_uses(lats: list) -> list[dict]:
    return [{k: e[2] for k, e in lat._memo.items()} for lat in lats]


def _distinct(configs: list) -> list:
    """The distinct step-latency models of a fleet's configs."""
    return list({id(c.latency): c.latency for c in configs}.values())


def simulate_part(sc: Scenario, part: list[int], choice: np.ndarray, spill_path: str,
                  workload=None, rng: np.random.Generator | None = None,
                  memos: list | None = None) -> dict:
    """A worker that is not a fork of the run (Ray, or a platform without fork): replicas
    `part` of the scenario's fleet, each alone with its requests (`choice`: each request's
    replica; sim/engine/split.py), with the step-time lookups it made (the parent adds
    them to its own memos). It resolves the replicas' configs again, and the workload
    too unless given (with the generator as the run left it); `memos`: the parent's
    step-time memos, one per distinct latency model, to start from warm."""
    c0 = time.process_time()
    if workload is None:
        configs, workload, rng = prepare(sc)
    else:
        configs = replica_configs(sc)
    for lat, memo in zip(_distinct(configs), memos or [], strict=False):
        memo.update(lat._memo)  # what it already holds stays (as sim/costmodel/stepcache.py)
        lat._memo = memo
    return _run_part(Setup(configs, workload, choice, min(c.max_model_len for c in configs)),
                     rng, part, spill_path, c0)


# In a forked worker only: the parent's Setup and generator, inherited with the process
# (copy on write: never pickled, the workload's arrays shared), set by the pool's
# initializer before any task, and gone with the worker.
_INHERITED: tuple | None = None


def _inherit(setup: Setup, rng: np.random.Generator) -> None:
    global _INHERITED
    _INHERITED = (setup, rng)


def _simulate_inherited(part: list[int], spill_path: str) -> dict:
    """A forked worker: replicas `part` of the parent's run, on the parent's configs (their
    step-time memos as warm as the parent's) and workload, with nothing resolved again."""
    setup, rng = _INHERITED
    return _run_part(setup, rng, part, spill_path, time.process_time())


def _run_part(setup: Setup, rng, part: list[int], spill_path: str, c0: float) -> dict:
    lats = _distinct(setup.configs)
    before = _memo_uses(lats)
    out = simulate_replicas(setup, part, spill_path, rng)
    out["memos"] = []
    for lat, old in zip(lats, before, strict=True):
        out["memos"].append({k: [e[0], e[1], e[2] - old.get(k, 0), *e[3:]]
                             for k, e in lat._memo.items() if e[2] != old.get(k, 0)})
    out["usage"] = Usage(time.process_time() - c0, _peak_rss())
    return out


def merge(outs: list[dict], n_requests: int, choice: np.ndarray, lats: list | None,
          spill: SpillDir) -> RunResult:
    """One RunResult of the workers' outputs, as the single-process run returns it (the
    requests as records); the workers' step-time lookups counted into `lats` (the
    parent's latency models; None: made in this process, already counted)."""
    results, recs = [], []
    for out in outs:
        for r, (spilled, gaps, weights) in zip(out["results"], out["gaps"], strict=True):
            if r.steps.spilled or spilled:
                r.steps.spill = spill
            rec = StepRecorder()
            rec.log, rec.gaps, rec.weights, rec.gaps_spilled = r.steps, gaps, weights, spilled
            results.append(r)
            recs.append(rec)
        for lat, memo in zip(lats or [], out.get("memos", [{}] * len(lats or [])), strict=True):
            for k, e in memo.items():
                mine = lat._memo.get(k)
                if mine is None:
                    lat._memo[k] = e
                else:
                    mine[2] += e[2]
    records = records_of(outs, n_requests, choice, spill)
    order = sorted(range(len(results)), key=lambda i: results[i].index)
    results = [results[i] for i in order]
    gaps, weights = pooled_gaps([recs[i] for i in order], [0] * len(order))
    end = max((e for o in outs for e in o["ends"]), default=0.0)
    itl = None
    if is_lazy(gaps):  # the workers counted their spilled replicas' bins; the rest, here
        levels = [lv for o in outs for lv in o["itl"]]
        itl = merged([first_level(*recs[i].gap_columns()) if levels[i] is None else levels[i]
                      for i in order])
    return RunResult(SeqView(records), results, gaps, weights, end, None, records, itl)


def simulate_split(sc: Scenario, configs: list, workload, rng: np.random.Generator,
                   workers: int = 1, executor: str = "process") -> tuple[RunResult, int, list]:
    """The run's RunResult, its replicas simulated apart (sim/engine/split.py): one after
    another here (`workers` 1), or `workers` processes at a time; how many replicas had to
    replay every arrival instant (an arrival tied with one of their own events); and each
    worker's Usage (none when simulated here)."""
    n = len(configs)
    choice = assign(sc, workload, n)
    spill = SpillDir()
    setup = Setup(configs, workload, choice, min(c.max_model_len for c in configs))
    if workers <= 1:
        outs = [simulate_replicas(setup, list(range(n)), str(spill.path), rng)]
        res = merge(outs, len(workload), choice, None, spill)
        return res, sum(outs[0]["every"]), []
    groups = parts(n, workers)
    if executor == "ray":
        outs = _on_ray(sc, setup, rng, groups, str(spill.path))
    elif executor == "process":
        outs = _on_processes(sc, setup, rng, groups, str(spill.path))
    else:
        raise ValueError(f"executor {executor!r} (known: {', '.join(EXECUTORS)})")
    res = merge(outs, len(workload), choice, _distinct(configs), spill)
    return res, sum(sum(o["every"]) for o in outs), [o["usage"] for o in outs if "usage" in o]


def _on_processes(sc: Scenario, setup: Setup, rng, groups: list, spill_path: str) -> list[dict]:
    """Groups of replicas in processes. Forked workers inherit the parent's Setup (the
    configs with their step-time memos as warm as the parent's, the workload, the routes):
    nothing is pickled to them or resolved again, and this process simulates the first
    group itself meanwhile (one fork, one trip back and one set of cold step-time lookups
    fewer; its memos' uses are counted here, the workers' added by `merge`). Elsewhere
    (spawn) every group has its own process, which resolves the scenario again."""
    import concurrent.futures as cf
    import multiprocessing as mp

    ctx = mp.get_context(START_METHOD)
    if START_METHOD != "fork":
        memos = _memos(setup.configs)
        with cf.ProcessPoolExecutor(max_workers=len(groups), mp_context=ctx) as pool:
            return list(pool.map(simulate_part, *zip(*[
                (sc, g, setup.choice, spill_path, None, None, memos) for g in groups],
                strict=True)))
    with cf.ProcessPoolExecutor(max_workers=len(groups) - 1, mp_context=ctx,
                                initializer=_inherit, initargs=(setup, rng)) as pool:
        theirs = [pool.submit(_simulate_inherited, g, spill_path) for g in groups[1:]]
        mine = simulate_replicas(setup, groups[0], spill_path, rng)
        return [mine, *(f.result() for f in theirs)]


def split_engine(replicas: int, router: str, workers: int, executor: str, every: int) -> str:
    """How a split run was simulated, in words (`llmsim run` prints it)."""
    where = (f"on {min(workers, replicas)} processes ({executor})" if workers > 1
             else "one after another")
    again = (f"; {every} replayed every arrival instant (an arrival tied with one of "
             f"their own events, or static batching)" if every else "")
    return (f"{replicas} replicas simulated apart, {where} (router {router} needs no "
            f"feedback){again}")


def _memos(configs: list) -> list[dict]:
    """The distinct latency models' step-time memos, as they are now (to pickle)."""
    return [dict(lat._memo) for lat in _distinct(configs)]


def _on_ray(sc: Scenario, setup: Setup, rng, groups: list, spill_path: str) -> list[dict]:
    """One Ray task per group but the first, which this process simulates itself meanwhile
    (as `_on_processes` does: one worker, one trip through the object store and one set of
    cold step-time lookups fewer). The workload and the routes go to Ray's object store
    once (their arrays shared, not copied, by the workers on this host), with the run's
    generator and its warm step-time memos as they were before this process simulated
    anything; each task resolves only the replicas' configs again."""
    try:
        import ray
    except ImportError:
        raise ValueError("executor 'ray': ray is not installed (pip install 'llmsim[ray]')") \
            from None
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=max(1, len(groups) - 1), include_dashboard=False, log_to_driver=False)
    try:
        remote = ray.remote(simulate_part)
        wl, choice, gen, memos = (ray.put(x) for x in (setup.workload, setup.choice, rng,
                                                        _memos(setup.configs)))
        theirs = [remote.remote(sc, g, choice, spill_path, wl, gen, memos) for g in groups[1:]]
        mine = simulate_replicas(setup, groups[0], spill_path, rng)
        return [mine, *ray.get(theirs)]
    finally:
        if started:
            ray.shutdown()
