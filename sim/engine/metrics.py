"""Per-request and per-step tables and the run summary.

Definitions follow vLLM's benchmark (`benchmark_serving.py`):
* TTFT  = first token time - arrival time;
* TPOT  = (E2E - TTFT) / (output tokens - 1), for requests with more than one output token;
* ITL   = every gap between consecutive tokens of a request, pooled over all requests
          (a gap that spans a preemption counts as one long gap; the rare request
          dropped after it started, because it outgrew the whole KV cache, keeps
          the gaps it had);
* E2E   = finish time - arrival time;
* duration = last finish - first arrival; throughputs divide by it;
* goodput = finished requests per second that met every SLO given.
Closed-loop runs (`sim/workload/clients.py`) mark warm-up requests in a `warmup` column;
the summary then covers the measured requests only: duration = first measured send to
last measured finish (vLLM's `benchmark_duration`), step figures over the steps that end
inside it, and ITL without a drained warm-up's gaps.
Percentiles use numpy's default (linear) method; ITL, kept in weighted form,
uses the inverted-CDF method on its weights.

The tables are dicts of numpy columns (sim/io/tablefile.py), built without Python loops
over steps: a replica's step columns are views of its step log (no copy), and the
summary's step figures are sums per replica, so a fleet's 10^7 steps are never stacked
or masked per replica. `requests_frame` / `steps_frame` give pandas frames.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial
from operator import attrgetter

import numpy as np

from sim.engine import bigstats
from sim.engine.records import replica_table, tpot_s
from sim.engine.replica import ReplicaResult, RunResult
from sim.engine.reqsummary import request_figures
from sim.engine.steptally import StepTally
from sim.io.spill import Constant, is_lazy
from sim.io.tablefile import Labels, Table, frame, num_rows
from sim.policies.batch import FINISHED
from sim.policies.plan import LOGGED_KINDS

REQUEST_COLUMNS = [
    "id", "arrival_s", "prompt_tokens", "output_tokens", "status", "first_token_s", "finish_s",
    "ttft_s", "tpot_s", "e2e_s", "queue_s", "preemptions", "generated_tokens", "cached_tokens",
    "reject_reason", "replica",
]
LOG_COLUMNS = ["t_start", "t_end", "kind", "num_seqs", "num_tokens", "kv_blocks_used", "kv_tokens"]
STEP_COLUMNS = LOG_COLUMNS + ["replica"]
KIND_NAMES = tuple(k.label for k in LOGGED_KINDS)  # ("prefill", "decode", "verify", "mixed")
PCTS = (50, 90, 99)


def _seq_column(seqs: list, attr: str, dtype) -> np.ndarray:
    return np.fromiter(map(attrgetter(attr), seqs), dtype=dtype, count=len(seqs))


def request_table(res: RunResult) -> dict:
    """One row per request, in REQUEST_COLUMNS (+ prefill_replica when disaggregated)."""
    names = tuple(r.name for r in res.replicas)
    if res.records is not None:  # a fleet simulated replica by replica (sim/engine/records.py)
        return res.records.table(names)
    column = partial(_seq_column, res.seqs)
    arrival = column("arrival", float)
    first = column("first_token_t", float)
    first[first < 0] = np.nan
    status = column("state", object)
    finish = column("finish_t", float)
    finish[status != FINISHED] = np.nan
    sched = column("sched_t", float)
    sched[sched < 0] = np.nan
    output = column("output", np.int64)
    tpot = tpot_s(arrival, first, finish, output)
    table = {
        "id": column("rid", np.int64),
        "arrival_s": arrival,
        "prompt_tokens": column("prompt", np.int64),
        "output_tokens": output,
        "status": status,
        "first_token_s": first,
        "finish_s": finish,
        "ttft_s": first - arrival,
        "tpot_s": tpot,
        "e2e_s": finish - arrival,
        "queue_s": sched - arrival,
        "preemptions": column("preemptions", np.int64),
        "generated_tokens": column("generated", np.int64),
        "cached_tokens": column("cached_tokens", np.int64),
        "reject_reason": column("reject_reason", object),
        "replica": Labels(column("replica", np.int64), names),
    }
    if res.warmup is not None:  # closed loop: warm-up requests, left out of the summary
        table["warmup"] = np.asarray(res.warmup, dtype=bool)
    if any(r.role == "prefill" for r in res.replicas):  # disaggregated: where the prefill ran
        table["prefill_replica"] = Labels(column("prefill_replica", np.int64) + 1,
                                          ("",) + names)
    return table


def _log_column(log, name: str):
    """A numpy view of a step-log column, or a lazy DiskColumn once spilled (sim/io/spill.py)."""
    return log.column(name)


def step_tables(res: RunResult) -> list[dict] | None:
    """Each replica's iterations as a table in STEP_COLUMNS (views of its step log; lazy
    columns, read a block at a time, for a log spilled to disk); None when the replicas
    kept no rows (step_log: summary)."""
    if not keeps_rows(res):
        return None
    names = tuple(r.name for r in res.replicas)
    out = []
    for i, r in enumerate(res.replicas):
        cols = {c: _log_column(r.steps, c) for c in LOG_COLUMNS}
        n = len(cols["t_start"])
        cols["kind"] = Labels(cols["kind"], KIND_NAMES)
        cols["replica"] = Labels(Constant(i, n, np.int16) if is_lazy(cols["t_start"])
                                 else np.full(n, i, dtype=np.int16), names)
        out.append(cols)
    return out


def keeps_rows(res: RunResult) -> bool:
    """Whether the run's replicas logged their steps' rows (step_log: rows)."""
    return not any(isinstance(r.steps, StepTally) for r in res.replicas)


def requests_frame(res: RunResult):
    return frame(request_table(res))


def steps_frame(res: RunResult):
    """Every replica's iterations, replica by replica, with a `replica` column."""
    return frame(_rows(step_tables(res)))


def _rows(tables: list[dict] | None) -> list[dict]:
    """`tables`, or a ValueError saying that the run kept none (step_log: summary)."""
    if tables is None:
        raise ValueError("step_log: summary keeps no step rows (allowed: step_log: rows)")
    return tables


def itl_table(res: RunResult) -> dict:
    """Weighted inter-token gaps: columns gap_s, count (lazy columns once spilled)."""
    if is_lazy(res.itl_gaps):
        return {"gap_s": res.itl_gaps, "count": res.itl_weights}
    return {"gap_s": np.frombuffer(res.itl_gaps, dtype=float) if len(res.itl_gaps)
            else np.zeros(0),
            "count": np.frombuffer(res.itl_weights, dtype=np.int64) if len(res.itl_weights)
            else np.zeros(0, dtype=np.int64)}


def percentiles(x: np.ndarray, pcts=PCTS) -> np.ndarray:
    """np.percentile(x, pcts) (its default linear method, the same arithmetic), without
    the np.unique call that imports numpy.ma (20 ms at start-up)."""
    xs = np.sort(x)
    virt = (len(xs) - 1) * (np.asarray(pcts) / 100)
    lo = np.floor(virt).astype(np.intp)
    gamma = virt - lo
    a, b = xs[lo], xs[np.minimum(lo + 1, len(xs) - 1)]
    diff = b - a
    return np.where(gamma >= 0.5, b - diff * (1 - gamma), a + diff * gamma)


def _stats(x: np.ndarray) -> dict[str, float | None]:
    x = x[~np.isnan(x)]
    if len(x) == 0:
        return {"mean": None, **{f"p{p}": None for p in PCTS}}
    q = percentiles(x)
    return {"mean": float(x.mean()), **{f"p{p}": float(v) for p, v in zip(PCTS, q, strict=True)}}


# columns longer than this select their percentiles by binning (sim/engine/bigstats.py: the
# same floats) instead of one argsort: 38 M gaps (a 64-replica hour) take 2.6 s CPU
# instead of 12.5 s, and the selection reads them a block at a time
SELECT_ROWS = 1 << 20


def weighted_stats(values, weights, first=None) -> dict[str, float | None]:
    """Mean, percentiles and maximum of values repeated by integer weights (ITL's gaps: the
    maximum is the longest gap, the stall the percentiles can miss); one sort, a few
    temporaries the size of the input (lazy or long columns: selected block by block,
    the same floats; `first`: their first level of bins, if counted already)."""
    if is_lazy(values) or (isinstance(values, np.ndarray) and values.dtype == np.float64
                           and len(values) > SELECT_ROWS):
        return bigstats.weighted_stats(values, weights, first)
    v = np.asarray(values, dtype=float)
    w = np.asarray(weights)
    if len(w) and w.min() <= 0:
        keep = w > 0
        v, w = v[keep], w[keep]
    if len(v) == 0:
        return {"mean": None, **{f"p{p}": None for p in PCTS}, "max": None}
    total = float(w.sum())
    out: dict[str, float | None] = {"mean": float((v * w).sum() / total)}
    order = np.argsort(v)  # ties need no order: a percentile picks among equal values
    cum = w[order]
    np.cumsum(cum, out=cum)
    for p in PCTS:
        out[f"p{p}"] = float(v[order[min(np.searchsorted(cum, p / 100 * cum[-1]), len(v) - 1)]])
    out["max"] = float(v[order[-1]])
    return out


def _col(table, name: str, dtype=float) -> np.ndarray:
    """A numeric column of a table or a pandas frame, as a numpy array."""
    return np.asarray(table[name], dtype=dtype)


def _replica_codes(req, res: RunResult, name: str = "replica") -> np.ndarray:
    """Each request's replica index (-1: none) from a table's Labels or a frame's names."""
    col = req[name]
    if isinstance(col, Labels):
        shift = 1 if col.names[:1] == ("",) else 0
        return col.codes - shift
    index = {r.name: i for i, r in enumerate(res.replicas)}
    return np.fromiter((index.get(v, -1) for v in np.asarray(col, dtype=object)),
                       dtype=np.int64, count=len(col))


class StepSums:
    """One replica's step figures, summed from its step log a block of rows at a time
    (numpy, no copy of the log; temporaries bounded by BLOCK rows), or taken from a log
    that kept only these sums (step_log: summary, sim/engine/steptally.py: the same
    figures within its TOLERANCE)."""

    BLOCK = 1 << 20

    def __init__(self, rep: ReplicaResult, t0: float | None = None):
        """`t0`: only the steps that end after it (a closed loop's measured window)."""
        log = rep.steps
        self.num_blocks = rep.kv.num_blocks
        self.block_size = rep.kv.block_size
        if isinstance(log, StepTally):
            if t0 is not None and not log.covers(t0):
                raise ValueError(f"step_log: summary keeps no rows to leave out the steps "
                                 f"that ended by {t0} s (allowed: step_log: rows)")
            self.n, self.by_kind = log.n, np.array(log.by_kind, dtype=np.int64)
            self.busy, self.seqs_dur, self.used_dur, self.toks_dur = (
                log.busy, log.seqs_dur, log.used_dur, log.toks_dur)
            self.used_peak = float(log.used_peak)
            return
        cols = {c: _log_column(log, c) for c in LOG_COLUMNS}
        first = 0 if t0 is None else int(np.searchsorted(np.asarray(cols["t_end"]), t0,
                                                          side="right"))
        self.n = len(cols["t_start"]) - first
        self.by_kind = np.zeros(len(KIND_NAMES), dtype=np.int64)
        self.busy = self.seqs_dur = self.used_dur = self.toks_dur = self.used_peak = 0.0
        for lo in range(first, first + self.n, self.BLOCK):
            part = {c: np.asarray(v[lo:lo + self.BLOCK]) for c, v in cols.items()}
            self.by_kind += np.bincount(part["kind"], minlength=len(KIND_NAMES))
            dur = part["t_end"] - part["t_start"]
            self.busy += float(dur.sum())
            self.seqs_dur += float((part["num_seqs"] * dur).sum())
            self.used_dur += float((part["kv_blocks_used"] * dur).sum())  # block-seconds
            self.toks_dur += float((part["kv_tokens"] * dur).sum())
            self.used_peak = max(self.used_peak, float(part["kv_blocks_used"].max()))


def step_sums(res: RunResult, t0: float | None = None) -> list[StepSums]:
    """Each replica's StepSums (from `t0` on), the ones its simulation summed already reused
    (they cover the whole log: only when `t0` is None)."""
    return [r.sums if t0 is None and r.sums is not None else StepSums(r, t0)
            for r in res.replicas]


def _duration(arrival: np.ndarray, finish: np.ndarray, done: np.ndarray) -> tuple[float, float]:
    start = float(arrival.min()) if len(arrival) else 0.0
    end = float(finish[done].max()) if done.any() else start
    return start, max(end - start, 1e-12)


def _measured(req) -> tuple[np.ndarray | None, float | None]:
    """(measured rows, window start) of a closed loop with warm-up; (None, None) otherwise."""
    if "warmup" not in req:
        return None, None
    keep = ~np.asarray(req["warmup"], dtype=bool)
    arrival = _col(req, "arrival_s")[keep]
    return keep, (float(arrival.min()) if len(arrival) else None)


def summarize(req, steps, res: RunResult, slo=None, sums: list[StepSums] | None = None) -> dict:
    """The run summary. `req`: the request table (or frame); the step figures are summed
    from each replica's step log in `res` (the rows of `steps`, which is not read again),
    or taken from `sums` (step_sums of the same run and window).
    A table of request records on disk (sim/engine/records.py) is read a block at a time
    (sim/engine/reqsummary.py: the same floats)."""
    del steps
    keep, t0 = _measured(req)
    if keep is None and res.records is not None and is_lazy(req["arrival_s"]):
        fig = request_figures(req, slo, res.records.spill, FINISHED)
    else:
        fig = _request_figures(req if keep is None else {
            k: np.asarray(req[k])[keep] for k in ("status", "arrival_s", "finish_s",
            "output_tokens", "prompt_tokens", "ttft_s", "tpot_s", "e2e_s", "queue_s",
            "preemptions")}, slo)
    duration = fig["duration_s"]
    sums = step_sums(res, t0) if sums is None else sums
    busy = sum(s.busy for s in sums)
    by_kind = sum(s.by_kind for s in sums)
    s = {
        **{k: fig[k] for k in ("requests", "duration_s", "request_throughput",
                               "output_token_throughput", "total_token_throughput",
                               "ttft_s", "tpot_s")},
        "itl_s": weighted_stats(*itl_table(res).values(), res.itl_first),
        "e2e_s": fig["e2e_s"],
        "queue_s": fig["queue_s"],
        "gpu_busy_fraction": min(1.0, busy / duration / len(res.replicas)),
        "gpu_kernel_fraction": _fraction(sum(r.kernel_busy_s for r in res.replicas)
                                         / duration / len(res.replicas)),
        "iterations": {
            "total": sum(s.n for s in sums),
            **{KIND_NAMES[k]: int(by_kind[k]) for k in sorted(range(len(KIND_NAMES)),
                                                              key=KIND_NAMES.__getitem__)
               if by_kind[k]},
        },
        "mean_batch_size": sum(s.seqs_dur for s in sums) / busy if busy else 0.0,
        "preemptions": fig["preemptions"],
        "kv": _kv_figures(sums, res),
    }
    s["goodput"] = fig["goodput"]
    return s


def _request_figures(req, slo) -> dict:
    """summarize's request figures from a table (or frame) in memory."""
    status = np.asarray(req["status"], dtype=object)
    done = status == FINISHED
    n_fin = int(done.sum())
    arrival = _col(req, "arrival_s")
    _, duration = _duration(arrival, _col(req, "finish_s"), done)
    out_tokens = int(_col(req, "output_tokens", np.int64)[done].sum())
    in_tokens = int(_col(req, "prompt_tokens", np.int64)[done].sum())
    return {
        "requests": {
            "total": len(arrival),
            "finished": n_fin,
            "rejected": int((status == "rejected").sum()),
        },
        "duration_s": duration,
        "request_throughput": n_fin / duration,
        "output_token_throughput": out_tokens / duration,
        "total_token_throughput": (out_tokens + in_tokens) / duration,
        **{k: _stats(_col(req, k)[done]) for k in ("ttft_s", "tpot_s", "e2e_s", "queue_s")},
        "preemptions": int(_col(req, "preemptions", np.int64).sum()),
        "goodput": goodput({k: _col(req, k)[done] for k in ("ttft_s", "tpot_s", "e2e_s")},
                           duration, slo),
    }


def _kv_figures(sums: list[StepSums], res: RunResult) -> dict:
    """KV use over the run, time-weighted; a fleet's figures pool its replicas (each step
    weighed against its own replica's capacity)."""
    kvs = [r.kv for r in res.replicas]
    busy = sum(s.busy for s in sums)
    wsum = max(sum(s.used_dur * s.block_size for s in sums), 1e-12)
    return {
        "manager": kvs[0].kind,
        "block_size": kvs[0].block_size,
        "capacity_tokens": int(sum(k.capacity_tokens for k in kvs)),
        "util_mean": sum(s.used_dur / s.num_blocks for s in sums) / busy if busy else 0.0,
        "util_peak": max((s.used_peak / s.num_blocks for s in sums if s.n), default=0.0),
        "reserved_unused_share": 1.0 - sum(s.toks_dur for s in sums) / wsum if busy else 0.0,
        "swap_gib": res.swap_bytes / 1024**3,
        **({"transfer_gib": sum(r.transfer_bytes for r in res.replicas) / 1024**3}
           if any(r.role != "both" for r in res.replicas) else {}),
    }


def _groups(codes: np.ndarray, count: int) -> tuple[np.ndarray, np.ndarray]:
    """(order, bounds): rows of group g are order[bounds[g]:bounds[g + 1]], in row order."""
    order = np.argsort(codes, kind="stable")
    bounds = np.searchsorted(codes[order], np.arange(count + 1), side="left")
    return order, bounds


@dataclass(frozen=True)
class ReplicaRequests:
    """One replica's request figures for per_replica, from its own records alone (summed
    where it ran: a split fleet's worker, sim/engine/split.py), as per_replica computes
    them from its rows of the request table: the same floats."""
    requests: int
    finished: int
    rejected: int
    output_tokens: float  # of its finished requests (float sum, in request order)
    preemptions: int
    stats: dict  # ttft_s, tpot_s, e2e_s: _stats of its finished requests
    first_arrival: float | None  # None: no requests
    last_finish: float | None  # None: none finished


def replica_requests(cols: dict) -> ReplicaRequests:
    """ReplicaRequests of one replica's records (sim/engine/records.py columns_of)."""
    t = replica_table(cols)
    done = t["status"] == FINISHED
    fin = np.flatnonzero(done)
    arrival = t["arrival_s"]
    return ReplicaRequests(
        len(arrival), len(fin), int((t["status"] == "rejected").sum()),
        float(t["output_tokens"].astype(float)[fin].sum()), int(t["preemptions"].sum()),
        {k: _stats(t[k][fin]) for k in ("ttft_s", "tpot_s", "e2e_s")},
        float(arrival.min()) if len(arrival) else None,
        float(t["finish_s"][done].max()) if done.any() else None)


def _shared_per_replica(res: RunResult, sums: list[StepSums]) -> list[dict]:
    """per_replica of a run whose replicas all brought their ReplicaRequests."""
    figs = [r.requests for r in res.replicas]
    arrivals = [f.first_arrival for f in figs if f.first_arrival is not None]
    start = min(arrivals) if arrivals else 0.0
    ends = [f.last_finish for f in figs if f.last_finish is not None]
    duration = max((max(ends) if ends else start) - start, 1e-12)  # _duration's
    return [_replica_entry(r, f.requests, f.finished, None, f.rejected, f.output_tokens,
                           f.stats, f.preemptions, sums[i], duration)
            for i, (r, f) in enumerate(zip(res.replicas, figs, strict=True))]


def _replica_entry(r, requests: int, finished: int, prefills, rejected: int, output: float,
                   stats: dict, preemptions: int, steps_i: StepSums, duration: float) -> dict:
    busy = steps_i.busy
    return {
        "replica": r.name, "group": r.group, "role": r.role, "gpu": r.gpu,
        "requests": requests, "finished": finished,
        **({"prefills": prefills, "prefill_throughput": prefills / duration}
           if prefills is not None else {}),
        "rejected": rejected,
        "request_throughput": finished / duration,
        "output_token_throughput": output / duration,
        **stats,
        "gpu_busy_fraction": min(1.0, busy / duration),
        "gpu_kernel_fraction": _fraction(r.kernel_busy_s / duration),
        "mean_batch_size": steps_i.seqs_dur / busy if busy else 0.0,
        "iterations": steps_i.n,
        "preemptions": preemptions,
        "kv_util_mean": steps_i.used_dur / r.kv.num_blocks / busy if busy else 0.0,
        "kv_util_peak": steps_i.used_peak / r.kv.num_blocks,
        "kv_capacity_tokens": int(r.kv.capacity_tokens),
    }


def per_replica(req, steps, res: RunResult, sums: list[StepSums] | None = None) -> list[dict]:
    """Each replica's share of the run: requests served, latency, busy time, KV use (one
    grouping of the requests; step figures summed per replica from its log, or taken
    from `sums`, as summarize takes them). A split fleet's replicas bring their request
    figures (ReplicaRequests): the table is not read."""
    del steps
    keep, t0 = _measured(req)
    if keep is None and res.replicas and all(r.requests is not None for r in res.replicas):
        return _shared_per_replica(res, step_sums(res, t0) if sums is None else sums)
    status = np.asarray(req["status"], dtype=object)
    done = status == FINISHED
    rejected = status == "rejected"
    if keep is not None:  # closed loop: warm-up rows count nowhere
        done, rejected = done & keep, rejected & keep
    arrival = _col(req, "arrival_s")
    _, duration = _duration(arrival if keep is None else arrival[keep], _col(req, "finish_s"), done)
    n = len(res.replicas)
    codes = _replica_codes(req, res)
    order, bounds = _groups(codes, n)
    prefills = None
    if "prefill_replica" in req:
        pre = _replica_codes(req, res, "prefill_replica")
        prefills = np.bincount(pre[pre >= 0], minlength=n)
    cols = {k: _col(req, k) for k in ("ttft_s", "tpot_s", "e2e_s")}
    output = _col(req, "output_tokens")
    preempt = _col(req, "preemptions", np.int64)
    sums = step_sums(res, t0) if sums is None else sums
    out = []
    for i, r in enumerate(res.replicas):
        rows = order[bounds[i]:bounds[i + 1]]
        rows = rows if keep is None else rows[keep[rows]]
        fin = rows[done[rows]]
        out.append(_replica_entry(
            r, int(len(rows)), int(len(fin)), int(prefills[i]) if prefills is not None else None,
            int(rejected[rows].sum()), float(output[fin].sum()),
            {k: _stats(cols[k][fin]) for k in ("ttft_s", "tpot_s", "e2e_s")},
            int(preempt[rows].sum()), sums[i], duration))
    return out


def _fraction(x: float) -> float | None:
    """A share of the run's time, at most 1; None when not modelled (NaN: a measured run's
    reference engine has no kernel time of its own)."""
    return None if math.isnan(x) else min(1.0, x)


def goodput(fin, duration: float, slo) -> dict | None:
    """`fin`: the finished requests' ttft_s, tpot_s, e2e_s (a table or a frame)."""
    if slo is None or all(v is None for v in (slo.ttft_s, slo.tpot_s, slo.e2e_s)):
        return None
    ok = np.ones(len(_col(fin, "ttft_s")), dtype=bool)
    for col, limit in (("ttft_s", slo.ttft_s), ("tpot_s", slo.tpot_s), ("e2e_s", slo.e2e_s)):
        if limit is not None:
            v = _col(fin, col)
            ok &= np.isnan(v) | (v <= limit)
    return {
        "slo": {k: v for k, v in (("ttft_s", slo.ttft_s), ("tpot_s", slo.tpot_s), ("e2e_s", slo.e2e_s)) if v is not None},
        "requests_per_s": float(ok.sum() / duration),
        "fraction_met": float(ok.mean()) if len(ok) else 0.0,
    }


__all__ = ["REQUEST_COLUMNS", "STEP_COLUMNS", "LOG_COLUMNS", "KIND_NAMES", "Table", "num_rows",
           "request_table", "step_tables", "keeps_rows", "itl_table", "requests_frame", "steps_frame",
           "summarize", "per_replica", "ReplicaRequests", "replica_requests", "goodput", "weighted_stats", "step_sums"]
