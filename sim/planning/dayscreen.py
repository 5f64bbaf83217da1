"""Screening a day plan's fleets (`day.screen`, on by default): the same recommendation as
simulating every fleet's whole day, with less simulated.

The recommendation (sim/planning/dayplan.py) is the cheapest fleet, in $ over the day
(the mean over `day.seeds` days of its replica-hours x the candidate's $ per
replica-hour), whose SLO attainment (the worst seed's) is at least `day.attainment`; ties
on $ go to the higher attainment. Two facts about a fleet are certain before its days end,
and either rules it out:

1. **It cannot reach the target.** At a scrape at time t of a seed's day, a request is a
   certain miss when it has ended and missed (rejected, or finished with TTFT, TPOT or
   E2E over its bound, computed as the request table computes them), or when it is still
   open and has waited past the TTFT bound with no first token, or past the E2E bound.
   With M certain misses of the day's N requests its attainment is at most (N - M) / N;
   once that is under the target (by more than the plan's own 1e-12 tolerance), the
   fleet misses whatever the rest of the day does, and the seed stops.
2. **It costs more than the best fleet found so far that meets the target.** A replica
   costs from its start to its end (sim/engine/autoscale.py), so a seed's replica-hours
   at t (every stint so far, an open one up to t) only grow. With the finished seeds'
   replica-hours, this seed's so far, and a floor for each seed still to run (the
   fewest replicas the fleet ever holds x its last arrival: a run ends no earlier),
   the fleet's $ is at least their mean x $ per replica-hour; once that is over the
   best passing fleet's $ (strictly, by 1e-9 relative), it cannot be recommended, not
   even on a tie. A fleet whose floors alone are over it is not simulated at all.

Fleets run cheapest estimate first (static peak and schedules by their schedule, the
reactive policies at the lower bound's cost), so a cheap passing fleet is found early and
the rest are measured against it; the order changes what is screened, never the pick.
A screened fleet's row says which rule stopped it and when (`status: screened`, no day
figures); `day.screen: false` simulates every fleet to the end. A worker is handed the
best $ known when it starts (a later, lower best only screens more).
"""

from __future__ import annotations

import math
from typing import Any

from sim.policies.batch import FINISHED, REJECTED

COST_TOL = 1e-9  # relative: a fleet is dearer only by more than this (never on a tie)
MEET_TOL = 1e-12  # the plan's own tolerance on the attainment target (dayplan.py)


class DayWatch:
    """The scrape watch of one seed's day (sim/engine/autoscale.py `watching`): raises
    `Stopped` once rule 1 or 2 above decides the fleet. `limit_h`: the most replica-hours
    this seed may reach before the fleet's $ is over the best (inf: no best yet)."""

    def __init__(self, slo: dict, attainment: float, limit_h: float):
        self.ttft, self.tpot, self.e2e = (slo.get(k) for k in ("ttft_s", "tpot_s", "e2e_s"))
        self.target, self.limit_h = attainment, limit_h
        self.next, self.open, self.misses = 0, [], 0

    def _ok(self, s) -> bool:
        """The request table's test of a finished request (sim/engine/metrics.py)."""
        if s.state != FINISHED:
            return False
        ttft, e2e = s.first_token_t - s.arrival, s.finish_t - s.arrival
        if (self.ttft is not None and ttft > self.ttft) or (self.e2e is not None and e2e > self.e2e):
            return False
        return self.tpot is None or s.output <= 1 or (e2e - ttft) / max(s.output - 1, 1) <= self.tpot

    def _late(self, s, now: float) -> bool:
        waited = now - s.arrival
        return ((self.ttft is not None and s.first_token_t < 0 and waited > self.ttft)
                or (self.e2e is not None and waited > self.e2e))

    def __call__(self, now: float, lc, seqs: list) -> None:
        from sim.engine.autoscale import Stopped

        while self.next < len(seqs) and seqs[self.next].arrival <= now:
            self.open.append(seqs[self.next])
            self.next += 1
        still = []
        for s in self.open:
            if s.state in (FINISHED, REJECTED):
                self.misses += not self._ok(s)
            elif self._late(s, now):
                self.misses += 1
            else:
                still.append(s)
        self.open = still
        n = len(seqs)
        if n and (n - self.misses) / n < self.target - MEET_TOL:
            raise Stopped(f"{self.misses:,} of {n:,} requests missed the SLOs by t = {now:.0f} s: "
                          f"attainment at most {(n - self.misses) / n:.4f} < {self.target:g}")
        used = sum((x.gone if x.gone is not None else max(now, x.start)) - x.start for x in lc.lives) / 3600
        if used > self.limit_h:
            raise Stopped(f"{used:.3f} replica-hours by t = {now:.0f} s: dearer than the best "
                          "passing fleet")


def seed_limit(best_usd: float, usd_per_replica_hour: float, seeds: int, done_h: list[float],
               floors_later: list[float]) -> float:
    """The replica-hours the next seed may reach before the fleet's mean $ is over
    `best_usd` (rule 2), given the finished seeds' and the later seeds' floors."""
    if not math.isfinite(best_usd):
        return math.inf
    budget = best_usd * (1 + COST_TOL) * seeds / usd_per_replica_hour
    return budget - sum(done_h) - sum(floors_later)


def floor_hours(fewest: int, last_arrivals: list[float] | None, seeds: int) -> list[float]:
    """Per seed, the replica-hours a fleet holding at least `fewest` replicas all day
    reaches at least (a run ends no earlier than its last arrival); 0 when unknown."""
    if last_arrivals is None:
        return [0.0] * seeds
    return [fewest * t / 3600 for t in last_arrivals]


def fewest_replicas(row: dict) -> int:
    """The fewest replicas a fleet holds at any time: a schedule's smallest entry (the
    scaler keeps ready + starting at the schedule's count), else 1 (the last ready
    replica is never drained)."""
    sched = row.get("schedule")
    return max(1, min(int(n) for _, n in sched)) if sched else 1


REACTIVE_GUESS = 1.2  # a reactive fleet's $ guessed at this x the bound's (order only)


def estimate_usd(row: dict, bound_usd: float, usd_per_replica_hour: float, duration_s: float) -> float:
    """A fleet's $ guessed before its day (only the order of the runs reads it): a schedule's
    replica-hours as scheduled; a reactive policy at REACTIVE_GUESS x the lower bound's $,
    after the bound's own schedule (~1.1x, which usually meets the target: a cheap pass
    found first screens the most; plans/day_8b.yaml's reactive fleets cost 0.9-1.7x)."""
    sched = row.get("schedule")
    if not sched:
        return REACTIVE_GUESS * bound_usd
    times = [float(t) for t, _ in sched] + [duration_s]
    held = sum(int(n) * max(0.0, min(times[i + 1], duration_s) - times[i]) for i, (_, n) in enumerate(sched))
    return held / 3600 * usd_per_replica_hour


def screened_row(reason: str) -> dict[str, Any]:
    """The result of a fleet ruled out (its day figures are not measured)."""
    return {"status": "screened", "note": reason}


def passing_usd(res: dict, attainment: float, usd_per_replica_hour: float) -> float | None:
    """A simulated fleet's $ when it meets the target (the plan's own test), else None."""
    if res.get("status") != "ok" or res.get("slo_attainment") is None:
        return None
    if res["slo_attainment"] < attainment - MEET_TOL:
        return None
    return res["replica_hours"] * usd_per_replica_hour


def run_screened(fn, jobs: list[dict], workers: int, progress: bool = False) -> list[dict]:
    """`fn(*job["args"], screen)` for every job, cheapest `job["estimate"]` first, each
    handed the best passing $ known when it starts (`screen`: the job's `screen` mapping,
    {attainment, usd_per_replica_hour, floors_h}, plus `best_usd`); results in job order."""
    order = sorted(range(len(jobs)), key=lambda i: (jobs[i]["estimate"], i))
    results: list[dict | None] = [None] * len(jobs)
    best = math.inf

    def screen(i: int) -> dict:
        return {**jobs[i]["screen"], "best_usd": best}

    def done(i: int, res: dict) -> None:
        nonlocal best
        results[i] = res
        sc = jobs[i]["screen"]
        usd = passing_usd(res, sc["attainment"], sc["usd_per_replica_hour"])
        if usd is not None:
            best = min(best, usd)

    bar = _bar(len(jobs)) if progress else None
    if workers <= 1 or len(jobs) <= 1:
        for i in order:
            done(i, fn(*jobs[i]["args"], screen(i)))
            if bar:
                bar.update(1)
    else:
        _pool(fn, jobs, order, workers, screen, done, bar)
    if bar:
        bar.close()
    return results  # type: ignore[return-value]


def _pool(fn, jobs, order, workers, screen, done, bar) -> None:
    import concurrent.futures as cf

    from sim.planning.lifetime import worker_pool

    queue = list(order)
    with worker_pool(min(workers, len(jobs))) as pool:
        running = {}
        while queue or running:
            while queue and len(running) < workers:
                i = queue.pop(0)
                running[pool.submit(fn, *jobs[i]["args"], screen(i))] = i
            finished, _ = cf.wait(running, return_when=cf.FIRST_COMPLETED)
            for fut in finished:
                done(running.pop(fut), fut.result())
                if bar:
                    bar.update(1)


def _bar(total: int):
    from tqdm import tqdm

    return tqdm(total=total, desc="day", leave=False)
