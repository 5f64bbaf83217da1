"""A feedback-free fleet as independent simulations, one per replica, each holding only
its own arrivals: a replica's leaps (sim/engine/processes.py `replica`) then run to its
own next event instead of stopping at every other replica's step and every arrival of
the fleet. Merged, the results are the single-process run's, byte for byte.

Why this is exact. A router that never looks at the replicas (sim/engine/parallel.py
`FEEDBACK_FREE`) sends each request where it would have sent it whatever happened, so
each request's replica is decided up front (`assign`). Nothing else joins the replicas
of such a fleet: step-time jitter draws from each replica's own generator
(`[seed, 1, index]`, sim/costmodel/jitter.py); what a server has compiled (`seen`) is
its own; the shared step-time memos hold exact keys (their use counts, read by the
lookup provenance, add up the same in any order: math.fsum); gaps and step logs are
per replica; no router report runs (feedback-free routers use none); speculative
acceptance draws would come from the run's one generator in the order the replicas
step, so speculating fleets are refused (sim/engine/parallel.py `refusal`).

What is left is SimPy's order of events at the same instant. A replica's state changes
only at its own events: its steps' ends, the arrivals dispatched to it (and, with a
runtime's request latency, their entry into its queue), its wake-ups. Events at one
instant fire in the order they were scheduled. Every one of those events is scheduled
while one of the replica's own events is processed, so alone they come in the order
they came in the fleet, with one exception: the arrivals process schedules its next
instant while processing the fleet's previous one, which alone is the replica's own
previous one. Two measures make that harmless:

* an own arrival fires at the very float time it fired in the fleet (`instants`: SimPy
  adds each gap to the clock, so the clock at an arrival is a running sum over the
  fleet's arrival instants, not the arrival time itself), scheduled with
  `Clock.timeout_at`;
* an arrival can only be ordered differently from a replica event at the same instant
  that the replica scheduled earlier: a step's end, a request's entry into the queue,
  a static batch's deadline. After each replica's run `ties` looks for an own arrival
  instant among its step ends and queue entries; a replica with one (floats equal to
  the last bit: rare), or with static batching (its deadline timeouts are not logged),
  is simulated again replaying every arrival instant of the fleet, as the fleet's
  arrivals process yields at each (`every`: sim/engine/parallel.py's first method,
  exact but without the longer leaps).

Requests leave each replica's simulation as record columns (sim/engine/records.py), so
the fleet never holds its requests as objects. `simulate_split` runs the replicas one
after another in this process, or `workers` processes at a time (sim/engine/parallel.py).
"""

from __future__ import annotations

from operator import itemgetter

import numpy as np

from sim.engine.bigstats import first_level
from sim.engine.build import build_replica
from sim.engine.closedloop import streamed
from sim.engine.feed import Feed, fed_replica, feedable, instants
from sim.engine.metrics import StepSums, replica_requests
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
from sim.engine.recorder import spill_logs
from sim.engine.records import RequestRecords, columns_of, spill_records
from sim.engine.replica import ReplicaResult
from sim.engine.splitrule import FEEDBACK_FREE, may_split
from sim.engine.steptally import StepTally
from sim.io.spill import SpillDir, blocks


def _own_arrivals(env: Clock, fleet: Fleet, seqs: list, clock: list, group: list):
    """The fleet's arrivals process, for this replica's requests only: each dispatched at
    the clock time, and in the order, of the fleet's run."""
    last = -1
    for s, t, g in zip(seqs, clock, group, strict=True):
        if g != last:
            last = g
            yield env.timeout_at(t)
        fleet.dispatch(s)


def _every_arrival(env: Clock, fleet: Fleet, arrival: list, mine: np.ndarray, seqs: list):
    """The fleet's arrivals process itself, yielding at every arrival instant of the fleet
    (the same timeouts, so the same order at every instant), dispatching only `seqs`
    (the requests where `mine` is true)."""
    t = 0.0
    k = 0
    for a, m in zip(arrival, mine.tolist(), strict=True):
        if a > t:
            yield env.timeout(a - t)
            t = a
        if m:
            fleet.dispatch(seqs[k])
            k += 1


class Setup:
    """What every replica's simulation of one run shares: the workload and its clock
    times, each request's replica, the fleet's shortest context window."""

    def __init__(self, configs: list, workload, choice: np.ndarray, max_len: int):
        self.configs, self.workload, self.choice, self.max_len = configs, workload, choice, max_len
        self.clock, group = instants(workload.arrival_s)
        # each request's instant, as int32 where that holds them (half the bytes, in the
        # parent and in every forked worker that reads them)
        self.group = group.astype(np.int32) if len(group) < 1 << 31 else group
        self.arrival = np.asarray(workload.arrival_s, dtype=float)
        # an instant whose gap the clock's rounding swallowed fires at the time it was
        # scheduled: alone, it would not be ordered as in the fleet
        g = self.group
        self.flat = np.zeros(len(g), dtype=bool)
        if len(g) > 1:
            starts = np.flatnonzero(np.diff(g) > 0) + 1
            self.flat[starts] = self.clock[starts] == self.clock[starts - 1]


def simulate_one(setup: Setup, index: int, rng, spill: SpillDir | None,
                 every: bool = False) -> tuple:
    """Replica `index` alone with its own requests: (its result, its recorder, its
    requests' record columns, the clock at its end, whether it was replayed over every
    instant). Replays over every instant itself when `ties` finds the short way unsafe."""
    rows = np.flatnonzero(setup.choice == index)
    every = every or setup.configs[index].scenario.scheduler.policy == "static" or bool(
        setup.flat[rows].any())
    rep, node, seqs, env = _run(setup, index, rng, spill, rows, every)
    if not every and ties(rep, node, setup.clock[rows], seqs):
        # again, over every instant (its spilled files are rewritten), the short way's
        # lookups not counted in the step-time memo's uses (the lookup provenance)
        memo = setup.configs[index].latency._memo
        once = list(map(itemgetter(2), memo.values()))
        _forget(rep, spill)
        _run(setup, index, rng, spill, rows, False)  # the same lookups, counted twice
        _forget(rep, spill)
        _uncount(memo, once)
        every = True
        rep, node, seqs, env = _run(setup, index, rng, spill, rows, True)
    streamed(seqs, [node] * len(setup.configs))  # (it finds a request's node by its replica)
    return ReplicaResult.of(rep), rep.rec, columns_of(seqs), env.now, every


def _run(setup: Setup, index: int, rng, spill: SpillDir | None, rows: np.ndarray,
         every: bool) -> tuple:
    """One simulation of replica `index` with its requests (`rows`): (the replica, its
    node, its requests, the clock); over every arrival instant of the fleet if `every`."""
    cfg = setup.configs[index]
    wl = setup.workload
    rep = build_replica(cfg, rng, acceptance=wl.acceptance,
                        prefix_tokens=wl.block_tokens if wl.prefix_hashes is not None
                        else None, index=index)
    if spill is not None:
        spill_logs([rep], spill, fleet_size=len(setup.configs))
    if not every and isinstance(rep.rec.log, StepTally):  # no rows for `ties` to read
        rep.rec.log.watch(np.unique(setup.clock[rows]).tolist())
    seqs = make_seqs(wl, setup.max_len, rows)
    prefix_views(wl, [rep])
    env = Clock()
    fleet = Fleet(env, [rep], None)
    node = fleet.nodes[0]
    leap = leaping()
    if not every and feedable(fleet, node, leap):  # own arrivals at its step ends
        env.process(fed_replica(env, node, Feed(fleet, seqs, setup.clock[rows],
                                                setup.group[rows])))
    else:
        if every:
            env.process(_every_arrival(env, fleet, setup.arrival.tolist(),
                                       setup.choice == index, seqs))
        else:
            env.process(_own_arrivals(env, fleet, seqs, setup.clock[rows].tolist(),
                                      setup.group[rows].tolist()))
        env.process(replica(env, node, leap=leap))
    run_clock(env)
    check_accounted([rep], len(seqs))
    return rep, node, seqs, env


def _uncount(memo: dict, once: list) -> None:
    """Each step-time memo entry's use count as before a run whose lookups were made
    twice since: `once` the counts (in the memo's order) after the first, the memo's now
    after the second. The memo only grows, keeping its order; the run is deterministic
    (its replica's own jitter stream, exact memo keys), so the second added no entry and
    counted each use of the first again: before = once - (now - once), 0 for an entry the
    first run added."""
    if len(memo) != len(once):
        raise RuntimeError("a replica's repeated run made other step-time lookups")
    for e, c in zip(memo.values(), once, strict=True):
        e[2] = 2 * c - e[2]


def ties(rep, node, clock: np.ndarray, seqs: list) -> bool:
    """Whether one of the replica's own arrival instants equals a time the replica had
    scheduled before it: a step's end or a request's entry into its queue. (A step log
    of sums (sim/engine/steptally.py) watched its step ends for these instants as they
    came: `StepTally.tied`.)"""
    own = np.unique(clock)
    if len(own) == 0:
        return False

    def hits(times: np.ndarray) -> bool:
        i = np.minimum(np.searchsorted(own, times), len(own) - 1)
        return bool((own[i] == times).any())

    log = rep.rec.log
    if isinstance(log, StepTally):
        if log.unwatch():
            return True
    else:
        for _, t_end in blocks(log.column("t_end")):
            if hits(t_end):
                return True
    if node.request_s is not None:
        receive, per_token = node.request_s[:2]
        prompt = np.fromiter((s.prompt for s in seqs), dtype=np.int64, count=len(seqs))
        if hits(clock + (receive + per_token * prompt)):
            return True
    return False


def _forget(rep, spill: SpillDir | None) -> None:
    """Remove the files a replica's first, discarded, simulation spilled."""
    log = rep.rec.log
    if spill is None or log.spill is None:
        return
    for f in spill.path.glob(f"{log.key}.*"):
        f.unlink()


def simulate_replicas(setup: Setup, indices: list[int], spill_path: str,
                      seed_rng=None, columns: bool = False) -> dict:
    """Replicas `indices` one after another (a worker's share, or all of them): what the
    parent merges (sim/engine/parallel.py `merge`). Each replica's request records go to
    the spill folder as soon as it has run (`records`: what was written; `columns`: True
    also keeps their columns, `columns`), so a worker holds one replica's requests at a
    time and sends back none of them; each replica's request figures (`requests`) and
    step sums are summed here, in parallel, not in the parent after the run."""
    spill = SpillDir(spill_path)
    out = {"results": [], "gaps": [], "itl": [], "records": [], "ends": [], "every": [],
           "columns": []}
    for i in indices:
        result, rec, records, end, every = simulate_one(setup, i, seed_rng, spill)
        # a spilled replica's first level of ITL bins, counted here, in parallel, while its
        # gaps are still in the page cache (sim/engine/bigstats.py FirstLevel)
        out["itl"].append(first_level(*rec.gap_columns()) if rec.gaps_spilled else None)
        result.sums = StepSums(result)
        result.requests = replica_requests(records)
        result.steps.spill, result.steps.then = None, None  # the parent points them at its folder
        out["results"].append(result)
        out["gaps"].append((rec.gaps_spilled, rec.gaps, rec.weights))
        out["records"].append(spill_records(spill, i, records))
        if columns:
            out["columns"].append(records)
        out["ends"].append(end)
        out["every"].append(every)
    return out


def records_of(outs: list[dict], n: int, choice: np.ndarray, spill: SpillDir) -> RequestRecords:
    """The run's records, in request order, of the replicas' files that the workers wrote."""
    recs = RequestRecords(n, choice, spill)
    for out in outs:
        for r, written in zip(out["results"], out["records"], strict=True):
            recs.adopt(r.index, written)
    return recs


__all__ = ["FEEDBACK_FREE", "may_split", "Setup", "instants", "simulate_one", "simulate_replicas", "records_of", "ties"]
