"""A run that stops once a watcher says its outcome is decided (`llmsim plan`'s probes:
`sim/planning/probestop.py`).

`watch(now, seqs)` is asked every `watch.every_s` of simulated time (read again after
each check), from the start while a request is still to arrive, whether to stop: it
returns why (a string), or None to go on. It only reads the requests' state, so a
watched run is the run itself up to the stop (steps leap between checks as between any
two events: `processes.replica`). At a check, every step ending before it has run and
none after it: a finished request's times are final, an unfinished one finishes, and one
without its first token gets it, at `now` or later. The last check comes at least
`every_s` before the last arrival, so a check is never the run's last event and a run
that is never stopped ends at the same time, in the same state, as without a watch.

(An autoscaled run has its own watch, called at its scrapes, which ends the run with
nothing to show: `sim/engine/autoscale.py` SCRAPE_WATCH, for a day plan's screen. This
one, for any run simulated whole, keeps what was simulated up to the stop.)
"""

from __future__ import annotations


def checks(env, seqs: list, watch):
    """The watcher's process: its value is why it stopped the run, or None once no other
    request is left to arrive after the next check (the run then goes on unwatched)."""
    last = max((s.arrival for s in seqs), default=0.0)
    while True:
        why = watch(env.now, seqs)
        if why is not None:
            return why
        t = env.now + watch.every_s
        if t + watch.every_s > last:
            return None
        yield env.timeout_at(t)


def run_watched(env, seqs: list, watch) -> str | None:
    """Run the clock until `watch` stops it (its reason) or to the end (None)."""
    why = env.run(until=env.process(checks(env, seqs, watch)))
    if why is None:
        env.run()
    return why
