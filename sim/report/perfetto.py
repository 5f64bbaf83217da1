"""A run as a Chrome / Perfetto trace (JSON trace-event format; open in ui.perfetto.dev).

One process per replica (pid = replica index + 1, named as the replica is in requests.csv
and steps.csv: `r0`, `decode-1`; "replica N" where no names are given), with:
* thread 1 "iterations": one complete event (`ph: X`) per iteration, named after its
  kind (prefill, decode, verify, mixed), args num_seqs, num_tokens, kv_blocks_used;
* counters (`ph: C`) "batch size" and "KV blocks used", one sample per iteration;
* per request an async track (`ph: b` / `e`, cat "request", id = request id) with
  nested spans "queued" (arrival -> first scheduled), "prefill" (-> first token) and
  "decode" (-> finish); rejected requests get an instant event (`ph: i`) "rejected";
* an instant event (`ph: i`, scope thread) per preemption at its time: "preempted"
  (recompute), "swapped out", "swapped in";
* thread 2 "KV link" of a disaggregated decode replica: one complete event per KV
  transfer into it ("kv transfer", args request and source replica);
* thread 3 "lifecycle" of an autoscaled replica (the summary's `autoscale.timeline`):
  per stint complete events "starting" (start -> ready: node start and weights),
  "serving" (ready -> draining, or its leaving) and "draining" (-> gone: no new
  request, finishing its own), cat "lifecycle"; a start cancelled before ready is
  "starting (cancelled)".
Timestamps are microseconds of simulated time. `replica_parts` splits a cluster run's
tables into one (steps, requests) pair per replica for `write_trace`.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd

EVENT_TYPES = ("M", "X", "C", "b", "e", "i")
US = 1e6


_MOVES = {"preempt": "preempted", "swap_out": "swapped out", "swap_in": "swapped in"}


def trace_events(steps: pd.DataFrame, requests: pd.DataFrame, replica: int = 0,
                 events: list | None = None, name: str | None = None,
                 lives: list[dict] | None = None) -> list[dict]:
    """The trace events of one replica; `events` are its `sim.engine.results.Event`s,
    `name` its name in the run's tables (default "replica N"), `lives` its stints under
    an autoscaler (timeline entries: start_s, ready_s, draining_s, gone_s)."""
    pid = replica + 1
    ev: list[dict] = [
        {"ph": "M", "pid": pid, "tid": 0, "name": "process_name",
         "args": {"name": name or f"replica {replica}"}},
        {"ph": "M", "pid": pid, "tid": 1, "name": "thread_name", "args": {"name": "iterations"}},
    ]
    for s in steps.itertuples(index=False):
        ts = s.t_start * US
        ev.append({"ph": "X", "pid": pid, "tid": 1, "name": s.kind, "cat": "iteration", "ts": ts,
                   "dur": (s.t_end - s.t_start) * US,
                   "args": {"num_seqs": int(s.num_seqs), "num_tokens": int(s.num_tokens),
                            "kv_blocks_used": int(s.kv_blocks_used)}})
        ev.append({"ph": "C", "pid": pid, "name": "batch size", "ts": ts, "args": {"seqs": int(s.num_seqs)}})
        ev.append({"ph": "C", "pid": pid, "name": "KV blocks used", "ts": ts,
                   "args": {"blocks": int(s.kv_blocks_used)}})
    for r in requests.itertuples(index=False):
        rid = f"{replica}-{r.id}"
        args = {"prompt_tokens": int(r.prompt_tokens), "output_tokens": int(r.output_tokens),
                "preemptions": int(r.preemptions)}
        if r.status == "rejected":
            ev.append({"ph": "i", "pid": pid, "tid": 1, "s": "t", "name": "rejected", "ts": r.arrival_s * US,
                       "args": {**args, "reason": str(r.reject_reason)}})
            continue
        sched = r.arrival_s + (0.0 if _nan(r.queue_s) else r.queue_s)
        spans = [("queued", r.arrival_s, sched), ("prefill", sched, r.first_token_s),
                 ("decode", r.first_token_s, r.finish_s)]
        end = r.finish_s if not _nan(r.finish_s) else r.first_token_s
        ev.append(_async("b", pid, rid, f"request {r.id}", r.arrival_s, args))
        for name, t0, t1 in spans:
            if _nan(t0) or _nan(t1):
                continue
            ev.append(_async("b", pid, rid, name, t0))
            ev.append(_async("e", pid, rid, name, t1))
        ev.append(_async("e", pid, rid, f"request {r.id}", end if not _nan(end) else r.arrival_s))
    link = False
    for e in events or ():
        if e.kind == "kv_transfer":
            if not link:
                ev.append({"ph": "M", "pid": pid, "tid": 2, "name": "thread_name",
                           "args": {"name": "KV link"}})
                link = True
            ev.append({"ph": "X", "pid": pid, "tid": 2, "name": "kv transfer", "cat": "kv",
                       "ts": e.t * US, "dur": e.seconds * US,
                       "args": {"request": e.rid, "from": e.peer}})
        else:
            ev.append({"ph": "i", "pid": pid, "tid": 1, "s": "t", "name": _MOVES[e.kind],
                       "ts": e.t * US, "args": {"request": e.rid}})
    ev += lifecycle_events(pid, lives or [])
    return ev


def lifecycle_events(pid: int, lives: list[dict]) -> list[dict]:
    """Thread 3 "lifecycle": starting, serving and draining spans of each stint."""
    if not lives:
        return []
    ev: list[dict] = [{"ph": "M", "pid": pid, "tid": 3, "name": "thread_name",
                       "args": {"name": "lifecycle"}}]
    for life in lives:
        start, ready, drain, gone = (life[k] for k in ("start_s", "ready_s", "draining_s", "gone_s"))
        spans = [("starting (cancelled)", start, gone)] if ready is None else \
            [("starting", start, ready), ("serving", ready, drain if drain is not None else gone)]
        if ready is not None and drain is not None:
            spans.append(("draining", drain, gone))
        for what, t0, t1 in spans:
            if what == "starting" and t1 <= t0:
                continue  # ready at the run's start
            ev.append({"ph": "X", "pid": pid, "tid": 3, "name": what, "cat": "lifecycle",
                       "ts": t0 * US, "dur": max(t1 - t0, 0.0) * US})
    return ev


def _async(ph: str, pid: int, rid: str, name: str, t: float, args: dict | None = None) -> dict:
    e = {"ph": ph, "pid": pid, "tid": 1, "cat": "request", "id": rid, "name": name, "ts": t * US}
    if args:
        e["args"] = args
    return e


def _nan(v) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v))


def replica_parts(steps: pd.DataFrame, requests: pd.DataFrame,
                  names: list[str] | None = None) -> list[tuple[pd.DataFrame, pd.DataFrame]]:
    """A run's tables split per replica (a cluster run has a `replica` column), in the
    order of `names` (default: as they first appear)."""
    if "replica" not in steps.columns or "replica" not in requests.columns:
        return [(steps, requests)]
    if names is None:
        names = list(dict.fromkeys(steps.replica.tolist() + requests.replica.tolist()))
    return [(steps[steps.replica == n], requests[requests.replica == n]) for n in names]


def write_trace(path: str | Path, replicas: list[tuple[pd.DataFrame, pd.DataFrame]],
                moves: list[list] | None = None, names: list[str] | None = None,
                timeline: list[dict] | None = None) -> Path:
    """Write the trace of one or more replicas' (steps, requests) tables; `moves`, one
    list per replica in the same order, are their preemption / swap / KV-transfer events,
    `names` their names in the run's tables (the trace's process names), `timeline` an
    autoscaled run's stints (`autoscale.timeline`, each naming its replica's index)."""
    lives: dict[int, list[dict]] = {}
    for life in timeline or ():
        lives.setdefault(int(life["replica"]), []).append(life)
    events = [e for i, (steps, req) in enumerate(replicas)
              for e in trace_events(steps, req, i, moves[i] if moves else None,
                                    names[i] if names else None, lives.get(i))]
    doc = {"traceEvents": events, "displayTimeUnit": "ms",
           "otherData": {"producer": "llmsim", "time": "simulated seconds x 1e6"}}
    from sim.io.outfile import write_file_atomically

    return write_file_atomically(path, json.dumps(doc, separators=(",", ":")))
