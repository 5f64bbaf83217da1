"""A fleet simulated replica by replica that a screen may stop between replicas: a plan's
fleet check stopped as soon as its failure is certain (sim/planning/fleetstop.py).

Why between replicas. A feedback-free fleet is simulated one replica after another
(sim/engine/split.py), each replica to its end before the next begins, so no clock is
shared that a watcher (sim/engine/watch.py) could stop; what is known after each replica
is that replica's requests, final. A fleet that fails its SLOs by a wide margin shows it
in its first replica: behind a random router each replica serves an unbiased share of
the fleet's traffic, and one overloaded replica's requests over a bound are already
enough of the fleet's window requests to put the fleet's p99 over it.

`run_screened` does what `sim/engine/runner.py: run` does for such a fleet with one
process (`simulate_split` with `workers` 1: the replicas in index order, every one with
the run's generator, merged by `merge`, tabled and summarised by the runner's `_finish`),
asking `screen.replica(index, frame)` after each replica; a run the screen never stops
is that run, the same bytes (tests/test_fleetstop.py). A stopped one returns `Screened`:
what was simulated, and which requests were not.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from sim.engine.records import tpot_s
from sim.policies.batch import FINISHED

if TYPE_CHECKING:
    from sim.config.scenario import Scenario

NOT_SIMULATED = "not simulated"  # the status of a stopped fleet's requests never simulated


@dataclass
class Screened:
    """A fleet run stopped between replicas: every request of the fleet (those of the
    replicas never simulated with status NOT_SIMULATED and no times), how many replicas
    ran, and how many the fleet has."""
    requests: pd.DataFrame
    replicas_run: int
    replicas: int


def may_screen(sc: Scenario) -> bool:
    """Whether the scenario's run is a fleet that `run` would simulate replica by replica."""
    from sim.engine.splitrule import may_split

    return may_split(sc)


def run_screened(sc: Scenario, screen):
    """The scenario's fleet, replica by replica, each followed by `screen.replica(index,
    frame)` (frame: that replica's requests as `records_frame` makes them) -> why to stop,
    or None; `screen.begin(arrival_s)` first, with the whole fleet's arrival times.
    Returns the run's RunOutput (never stopped), a `Screened`, or None for a run `run`
    would simulate whole (`may_screen` reads the spec alone; the replicas may refuse)."""
    from sim.engine.parallel import assign, merge
    from sim.engine.prepare import prepare
    from sim.engine.runner import _finish
    from sim.engine.split import Setup, simulate_replicas
    from sim.engine.splitrule import refusal
    from sim.io.spill import SpillDir

    t0 = time.perf_counter()
    configs, wl, rng = prepare(sc)
    if refusal(sc, configs, wl) is not None:  # simulated whole: `run` with a watch instead
        return None
    n = len(configs)
    choice = assign(sc, wl, n)
    spill = SpillDir()
    setup = Setup(configs, wl, choice, min(c.max_model_len for c in configs))
    screen.begin(np.asarray(wl.arrival_s, dtype=float))
    t_sim = time.perf_counter()
    outs, frames = [], []
    for i in range(n):
        out = simulate_replicas(setup, [i], str(spill.path), rng, columns=True)
        frames.append(records_frame(out.pop("columns")[0]).assign(replica=i))
        outs.append(out)
        if screen.replica(i, frames[-1]) is not None:
            return Screened(_with_rest(frames, wl, choice, i + 1), i + 1, n)
    res = merge(outs, len(wl), choice, None, spill)
    return _finish(sc, configs, wl, t0, (res, time.perf_counter() - t_sim, None))


def records_frame(cols: dict) -> pd.DataFrame:
    """One replica's request records (sim/engine/records.py `columns_of`) as the columns of
    the request table a screen reads, computed as `metrics.request_table` computes them."""
    codes, names = cols["state"]
    status = np.array(names or ("",), dtype=object)[codes]
    arrival = np.asarray(cols["arrival"], dtype=float)
    first = np.where(cols["first_token_t"] < 0, np.nan, cols["first_token_t"])
    finish = np.where(status == FINISHED, cols["finish_t"], np.nan)
    sched = np.where(cols["sched_t"] < 0, np.nan, cols["sched_t"])
    output = np.asarray(cols["output"], dtype=np.int64)
    tpot = tpot_s(arrival, first, finish, output)
    return pd.DataFrame({"id": cols["rid"], "arrival_s": arrival, "output_tokens": output,
                         "status": status, "first_token_s": first, "finish_s": finish,
                         "ttft_s": first - arrival, "tpot_s": tpot,
                         "e2e_s": finish - arrival, "queue_s": sched - arrival})


def _with_rest(frames: list[pd.DataFrame], wl, choice: np.ndarray, ran: int) -> pd.DataFrame:
    """The simulated replicas' requests, then the others' (never simulated), in id order."""
    rest = np.flatnonzero(choice >= ran)
    nan = np.full(len(rest), np.nan)
    other = pd.DataFrame({"id": rest, "arrival_s": np.asarray(wl.arrival_s, dtype=float)[rest],
                          "output_tokens": np.asarray(wl.output_tokens, dtype=np.int64)[rest],
                          "status": NOT_SIMULATED, "first_token_s": nan, "finish_s": nan,
                          "ttft_s": nan, "tpot_s": nan, "e2e_s": nan, "queue_s": nan,
                          "replica": choice[rest]})
    return pd.concat([*frames, other], ignore_index=True).sort_values("id", kind="stable") \
        .reset_index(drop=True)
