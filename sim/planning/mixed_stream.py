"""The workload a mixed-fleet plan (`sim/planning/mixed.py`) sizes to: its length mix, the
sub-workload each length class receives, and the traffic of its fleet checks.

**Which process.** `arrival: auto` (the default) plans on the scenario's own arrival
process: Poisson (or constant, which becomes Poisson, as in the rate plans) stays
Poisson at the probed rate — each length class then receives Poisson at its share of the
rate, since a length-independent split of Poisson is Poisson, and only its lengths are
written (a lengths CSV). Any other process — a trace's timestamps, gamma (bursty)
arrivals, a time-varying `profile` or `diurnal` rate — is **replayed**: the scenario's
own request stream is drawn once (its seed, at least `search.requests` x 20 requests:
its own `num_requests` / `duration_s` when they give more) and written as a trace (time,
prompt, output); each length class receives the sub-stream of its own requests, with the
gaps the router would leave between them (a thinned stream, not a fresh Poisson one),
written as its own trace. `arrival: poisson` forces the Poisson path on any scenario.

**Replay at a rate** (`sim/planning/traffic.py: probe_overrides`, process `trace`): a
probe of n requests replays n consecutive rows of the stream, time-scaled so their mean
rate is the probed rate (seed i: the i-th window); the steady rule drops the halves test
and the throughput ratio (a recorded stream is not stationary), the SLOs decide. Scaling
time keeps a burst's shape and the inter-arrival CV. A fleet check replays the whole
stream's window of its seed, time-scaled to the target plus the margin, through the
fleet's length router: the recommended mix and the best single type see the same
requests at the same times. A time-varying stream's window holds its local shape, its
mean scaled to the rate: a static mixed fleet sized on it meets the SLOs over the
stretch replayed; to size against a day's peak, plan the day (`day:`, a rate plan).

What a replayed stream keeps: arrival times and lengths. Prefix hashes, shared prefixes
and multi-turn sessions are not carried (nor on the Poisson path's lengths CSV): a
closed loop (`workload.clients`) is refused — it sets its own rate; plan it by users.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from sim.io.specload import SpecError
from sim.planning.mixedspec import MixedPlanSpec, _base, spans
from sim.planning.planspec import plan_scenario
from sim.planning.traffic import interarrival_cv

TIME_VARYING = ("profile", "diurnal")


def stream_process(sc, spec: MixedPlanSpec) -> str:
    """'poisson' (lengths only; arrivals Poisson at the probed rate) or 'replay' (the
    scenario's own request stream); a closed loop is refused in one line."""
    w = sc.workload
    if w.clients is not None:
        raise SpecError(spec.file, "scenario", "its workload is a closed loop (workload.clients), which "
                        "sets its own rate (allowed: an open-loop workload; size users with target_users)")
    if spec.arrival == "poisson":
        return "poisson"
    if w.trace is not None and (w.arrival is None or w.arrival.kind == "trace"):
        return "replay"
    if w.arrival is not None and (w.arrival.kind == "gamma" or w.arrival.kind in TIME_VARYING):
        return "replay"
    return "poisson"


def class_spans(thresholds, classes: int) -> list[tuple[int, int | None]]:
    """Every length class (lo, hi] a mix of up to `classes` classes may have, cut at the
    thresholds: with 2 classes the two ends (0, T] and (T, inf) of each T; with 3 or
    more every (Ti, Tj] too. The whole range (0, inf) is the single type's ('all')."""
    edges = [0, *sorted(thresholds), None]
    out = []
    for i, lo in enumerate(edges[:-1]):
        for hi in edges[i + 1:]:
            if (lo, hi) != (0, None) and (classes > 2 or lo == 0 or hi is None):
                out.append((lo, hi))
    return out


def length_mix(spec: MixedPlanSpec, folder: Path) -> dict:
    """The drawn workload's share in each length class, and each class's requests
    written in `folder` (a lengths CSV on the Poisson path, a trace on a replay); the
    whole stream too, as `all`."""
    from sim.config.scenario import load_scenario
    from sim.workload.requests import generate

    sc = load_scenario(plan_scenario(spec), _base(spec))
    kind = stream_process(sc, spec)
    n = spec.search.requests * 20
    if kind == "poisson":
        wl_spec = dataclasses.replace(sc.workload, num_requests=n, duration_s=None)
    else:  # the scenario's own stream, at least n requests of it
        wl_spec = sc.workload if _own_count(sc) >= n else dataclasses.replace(
            sc.workload, num_requests=n, duration_s=None)
    wl = generate(wl_spec, np.random.default_rng(sc.seed), file=sc.file or None, path="workload",
                  base_dir=sc.base_dir or None)
    prompt, output = np.asarray(wl.prompt_tokens), np.asarray(wl.output_tokens)
    length = prompt + output if spec.mixed.length_by == "total" else prompt
    if kind == "poisson":
        frame = pd.DataFrame({"num_prefill_tokens": prompt, "num_decode_tokens": output})
    else:
        frame = pd.DataFrame({"arrival_s": np.asarray(wl.arrival_s, dtype=float), "prompt_tokens": prompt,
                              "output_tokens": output})
    files = {"all": folder / "all.csv"}
    _write(frame, files["all"])
    shares, cv = {}, {"all": interarrival_cv(frame.arrival_s.to_numpy()) if kind == "replay" else 1.0}
    for lo, hi in class_spans(spec.mixed.thresholds, spec.mixed.classes):
        mine = (length > lo) & (length <= hi if hi is not None else True)
        shares[(lo, hi)] = float(mine.mean())
        if 0 < mine.sum() < len(mine) and (kind == "poisson" or mine.sum() >= 3):
            files[(lo, hi)] = folder / f"class_{lo}_{hi}.csv"
            _write(frame[mine], files[(lo, hi)])
            if kind == "replay":
                cv[(lo, hi)] = interarrival_cv(frame.arrival_s[mine].to_numpy())
    return {"requests": len(frame), "seed": sc.seed, "process": kind, "shares": shares, "files": files,
            "interarrival_cv": cv, "mean_output_tokens": float(output.mean()),
            "arrival": _describe(sc, kind)}


def _own_count(sc) -> int:
    """Requests the scenario's own workload would draw (an estimate for a duration)."""
    w = sc.workload
    if w.num_requests:
        return int(w.num_requests)
    if w.duration_s and w.arrival is not None and w.arrival.rate:
        return int(w.duration_s * w.arrival.rate)
    return 0


def _write(frame: pd.DataFrame, path: Path) -> None:
    if "arrival_s" in frame:  # a trace's time starts at its first request
        frame = frame.assign(arrival_s=frame.arrival_s - float(frame.arrival_s.iloc[0]))
    frame.to_csv(path, index=False)


def _describe(sc, kind: str) -> dict:
    w = sc.workload
    if kind == "poisson":
        return {"process": "poisson", "label": "Poisson at the probed rate (each class at its share)"}
    src = (f"trace {w.trace.path}" if w.trace is not None and (w.arrival is None or w.arrival.kind == "trace")
           else f"{w.arrival.kind} arrivals" + (f" (CV {w.arrival.cv:g})" if w.arrival.kind == "gamma" else ""))
    return {"process": "replay", "source": src,
            "label": f"the workload's own stream replayed ({src}), time-scaled to each probed rate"}


def stream_overrides(path: Path, kind: str) -> dict:
    """Scenario overrides that make `path` (a class's or the whole stream's file) the
    workload: its lengths (Poisson path) or its trace (replay)."""
    if kind == "poisson":
        return {"workload.lengths": {"path": str(path)}, "workload.prompt": None,
                "workload.output": None, "workload.trace": None}
    return {"workload.trace": {"path": str(path), "format": "csv"}, "workload.arrival": None,
            "workload.lengths": None, "workload.prompt": None, "workload.output": None}


def traffic(sc, kind: str, rate: float, requests: int, window: int = 0) -> dict[str, Any]:
    """Overrides that drive `sc` (already on a stream's file) at `rate` for `requests`."""
    from sim.planning.traffic import probe_overrides

    return probe_overrides(sc, "trace" if kind == "replay" else "poisson", rate, requests, window)


def steady_for(rule, sc, kind: str):
    from sim.planning.traffic import steady_rule

    return steady_rule(rule, sc, "trace" if kind == "replay" else "poisson")


def split_shares(shares: dict, cuts: tuple[int, ...]) -> list[float]:
    """The share of each class a split at `cuts` makes (from the per-class shares)."""
    return [shares[s] for s in spans(cuts)]
