"""The engine's SimPy clock: an environment that can schedule at an exact float time, and
the run loop with the cyclic garbage collector off."""

from __future__ import annotations

import gc

import simpy

from sim.engine.watch import run_watched


class Clock(simpy.Environment):
    """SimPy's environment, able to schedule a timeout at an exact time: a leap's end is
    the float sum of its steps' seconds, which env.now + a delay cannot always reach (its
    rounding can skip the one float between two neighbours)."""

    @property
    def queue(self) -> list:
        """SimPy's heap of scheduled events, (time, priority, id, event) (`peek` reads its
        first time): the same list for the whole run, for a loop to hold."""
        return self._queue

    def timeout_at(self, t: float) -> simpy.Timeout:
        """A timeout firing at `t` (>= now), ordered as any event scheduled now."""
        now = self._now
        self._now = t  # Timeout schedules itself at env._now + its delay, here t + 0.0 = t
        try:
            return self.timeout(0.0)
        finally:
            self._now = now


def run_clock(env: Clock, seqs: list | None = None, watch=None) -> str | None:
    """Run the simulation to its end, or until `watch` stops it (then why, a line:
    sim/engine/watch.py, which looks at the requests `seqs`). The run makes no cyclic
    garbage (SimPy drops a processed event's callbacks; a run of the Azure hour leaves 14
    unreachable objects), so the cyclic collector would only re-walk the live requests
    again and again: off while the clock runs, as it was after."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        if watch is not None:
            return run_watched(env, seqs, watch)
        env.run()
        return None
    finally:
        if collecting:
            gc.enable()
