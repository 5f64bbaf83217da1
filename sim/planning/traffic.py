"""The arrival process a plan sizes to: Poisson at a rate, or a trace's own, replayed at
a scaled rate.

A plan's `arrival:` chooses (`PlanSpec.arrival`):

- `auto` (default): a scenario whose arrivals are a trace's timestamps (`workload.trace`
  with no `arrival`, or `arrival: {kind: trace}`) is planned on **the trace's own
  arrival process**; any other keeps its kind (Poisson, or gamma with its `cv`) at the
  probed rate, and constant arrivals become Poisson — what the plan always did;
- `poisson`: Poisson at the probed rate whatever the scenario says (a trace then lends
  its lengths, in order) — the memoryless baseline to compare a trace's plan with;
- `trace`: the trace's arrival process (the scenario must name a trace).

**Trace replay at a rate.** A probe of `requests` requests at `rate` req/s replays a
window of `requests` consecutive rows of the scenario's trace (from its `start_s`, within
its `limit`) with `time_scale` set so the window's mean rate is `rate`:
time_scale = ((requests - 1) / the window's recorded span) / rate. Bursts keep their
shape and size and are stretched or squeezed in time with the rest; the window's
inter-arrival CV is unchanged by the scaling. Seed i of a probe replays the i-th window
(the windows tile the trace, wrapping), so seeds sample different stretches of it; a
probe longer than the trace replays all of it. A fleet check replays the first window
at the target rate (a fleet of N units sees one trace, each unit a random 1/N of it
behind a random router).

Sizing a bursty trace as if it were Poisson underestimates the fleet: a burst of k
requests within a second queues on whichever replicas it reaches, where Poisson at the
same mean rate would spread them out. `describe` puts the process used, and the trace's
burstiness (inter-arrival CV: 1 for Poisson), in the plan's output.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from sim.config.scenario import Scenario
from sim.io.specload import SpecError
from sim.workload.traces import Trace, resolve, trace_window

ARRIVALS = ("auto", "poisson", "trace")


def replays_trace(sc: Scenario) -> bool:
    """Whether the scenario's arrivals are its trace's timestamps."""
    w = sc.workload
    return w.trace is not None and (w.arrival is None or w.arrival.kind == "trace")


def process(sc: Scenario, choice: str, plan_file: Any = None) -> str:
    """The process a plan's `arrival:` choice resolves to: 'trace', 'poisson' or 'gamma'."""
    if choice == "trace" and sc.workload.trace is None:
        raise SpecError(plan_file, "arrival", "'trace' needs a scenario with workload.trace "
                        "(allowed here: auto, poisson)")
    if choice == "trace" or (choice == "auto" and replays_trace(sc)):
        return "trace"
    if choice == "auto" and sc.workload.arrival is not None and sc.workload.arrival.kind == "gamma":
        return "gamma"
    return "poisson"


def _trace(sc: Scenario) -> Trace:
    """The scenario's trace window (its start_s and limit applied; times unscaled)."""
    ts, file = sc.workload.trace, sc.file or None
    base = Path(sc.base_dir) if sc.base_dir else None
    return trace_window(ts, resolve(ts.path, base, file, "workload.trace.path"), file, "workload.trace")


def steady_rule(rule, sc: Scenario, choice: str):
    """The steady rule for a probe on this process. A trace replay is judged on its whole
    measured window without the halves test and the throughput ratio: a recorded trace is
    not stationary (its bursts keep two halves of any window apart, and completions lag
    a burst by its service time), so neither settles; the clear-failure tests (a p99 over
    `fail_factor` x its bound, a rejection) and the SLOs still decide."""
    import dataclasses

    if process(sc, choice) != "trace":
        return rule
    return dataclasses.replace(rule, halves=False, min_ratio=0.0)


def probe_overrides(sc: Scenario, choice: str, rate: float, requests: int, window: int = 0) -> dict:
    """Overrides that run `sc` at `rate` req/s for `requests` requests on the process
    `choice` resolves to; `window` picks the trace window a trace replay uses."""
    kind = process(sc, choice)
    if kind != "trace":
        spec: dict[str, Any] = {"kind": kind, "rate": float(rate)}
        if kind == "gamma":
            spec["cv"] = sc.workload.arrival.cv
        return {"workload.arrival": spec, "workload.num_requests": int(requests), "workload.duration_s": None}
    t = _trace(sc).t
    n = max(2, min(int(requests), len(t)))
    starts = max(len(t) - n + 1, 1)
    i0 = (window * n) % starts
    span = float(t[i0 + n - 1] - t[i0])
    scale = ((n - 1) / span) / rate if span > 0 else 1.0
    over: dict[str, Any] = {"workload.trace.start_s": float(t[i0]),
                            "workload.trace.limit": n, "workload.trace.time_scale": scale,
                            "workload.num_requests": n, "workload.duration_s": None}
    if sc.workload.arrival is not None:
        over["workload.arrival"] = {"kind": "trace"}
    return over


def interarrival_cv(t: np.ndarray) -> float | None:
    """std / mean of the gaps between arrivals (1 for Poisson; None under 3 arrivals)."""
    gaps = np.diff(np.asarray(t, dtype=float))
    if len(gaps) < 2 or gaps.mean() <= 0:
        return None
    return float(gaps.std() / gaps.mean())


def describe(sc: Scenario, choice: str, plan_file: Any = None) -> dict:
    """The plan's `arrival` entry: the choice, the process used, and how it was driven."""
    kind = process(sc, choice, plan_file)
    out: dict[str, Any] = {"choice": choice, "process": kind}
    if kind == "trace":
        t = _trace(sc).t
        out.update({"trace": sc.workload.trace.path, "rows": int(len(t)),
                    "recorded_rate": float((len(t) - 1) / (t[-1] - t[0])) if t[-1] > t[0] else None,
                    "interarrival_cv": interarrival_cv(t),
                    "how": "the trace's own arrival times, each probe a window of consecutive rows "
                           "time-scaled to average the probed rate (seed i: the i-th window)"})
    elif kind == "gamma":
        out.update({"interarrival_cv": sc.workload.arrival.cv, "how": "gamma gaps at the probed rate"})
    else:
        out.update({"interarrival_cv": 1.0, "how": "Poisson at the probed rate"
                    + (" (the trace lends its lengths, in order)" if sc.workload.trace is not None else "")})
    return out


def label(info: dict) -> str:
    """'trace replay (data/traces/azure_2023_code.csv, inter-arrival CV 13)' or 'Poisson'."""
    if info["process"] == "trace":
        cv = info.get("interarrival_cv")
        return f"trace replay ({info['trace']}" + (f", inter-arrival CV {cv:.3g})" if cv else ")")
    if info["process"] == "gamma":
        return f"gamma (CV {info['interarrival_cv']:g})"
    return "Poisson"
