"""The summary's request figures (counts, duration, throughputs, TTFT / TPOT / E2E / queue
statistics, goodput) from a request table of lazy columns (sim/engine/records.py: a fleet
simulated replica by replica), read a block of requests at a time: the very floats
`sim/engine/metrics.py` computes on the whole columns in memory.

Counts, token sums, the first arrival and the last finish are exact block by block. A
latency column's finished, non-NaN values go to a file of the run's spill folder in
request order (the order numpy would hold them in); their mean is numpy's pairwise sum
replayed over the file (sim/engine/bigstats.py `pairwise_sum`) divided by their count,
and each percentile numpy's linear interpolation between the two order statistics
around it, each selected exactly from the file (`bigstats.select` with unit weights:
the smallest value with k + 1 values at or below it is the k-th of the sorted column).
Memory: a block of requests and the selection's bins, whatever the run's size; a column
of at most SORT_VALUES values is read back whole and sorted instead (faster, 32 MiB).
"""

from __future__ import annotations

import numpy as np

from sim.engine import bigstats
from sim.io import spill as spilling
from sim.io.spill import Coded, Constant, DiskColumn, SpillDir, blocks

PCTS = (50, 90, 99)
LATENCIES = ("ttft_s", "tpot_s", "e2e_s", "queue_s")
SORT_VALUES = 1 << 22  # a column of at most this many values (32 MiB) is sorted in memory


def _linear(col, m: int) -> dict[str, float | None]:
    """metrics._stats of the `m` values of `col` (no NaN): mean and linear percentiles
    (metrics.percentiles' arithmetic on the order statistics around each)."""
    if m == 0:
        return {"mean": None, **{f"p{p}": None for p in PCTS}}
    virt = (m - 1) * (np.asarray(PCTS) / 100)
    lo = np.floor(virt).astype(np.intp)
    gamma = virt - lo
    hi = np.minimum(lo + 1, m - 1)
    if m <= SORT_VALUES:  # small enough to sort: numpy's own mean and order on the column
        x = np.asarray(col[0:m])
        mean, xs = float(x.mean()), np.sort(x)
        a, b = xs[lo], xs[hi]
    else:
        mean = float(bigstats.pairwise_sum(lambda i, j: col[i:j], m) / m)
        ones = Constant(1, m, np.int64)
        vmax = max(float(np.max(v)) for _, v in blocks(col))
        ranks = sorted(set(lo.tolist()) | set(hi.tolist()))
        at = dict(zip(ranks, bigstats.select(col, ones, [float(i + 1) for i in ranks], vmax),
                      strict=True))
        a, b = np.array([at[i] for i in lo.tolist()]), np.array([at[i] for i in hi.tolist()])
    diff = b - a
    q = np.where(gamma >= 0.5, b - diff * (1 - gamma), a + diff * gamma)
    return {"mean": mean, **{f"p{p}": float(v) for p, v in zip(PCTS, q, strict=True)}}


def request_figures(req, slo, spill: SpillDir, finished: str) -> dict:
    """The request part of the summary (metrics.summarize's keys) of table `req`."""
    n = len(req["arrival_s"])
    n_fin = rejected = out_tokens = in_tokens = preempted = 0
    start, end = None, None
    kept = dict.fromkeys(LATENCIES, 0)
    limits = [(k, getattr(slo, k)) for k in ("ttft_s", "tpot_s", "e2e_s")
              if slo is not None and getattr(slo, k) is not None]
    met = 0
    rows = spilling.READ_ROWS
    col = req["status"]
    coded = isinstance(col, Coded)
    if coded:
        code_finished, code_rejected = col.code(finished), col.code("rejected")
    for lo in range(0, n, rows):
        hi = min(n, lo + rows)
        if coded:  # the status codes compared, not their strings
            status = col.codes(lo, hi)
            done = status == code_finished
            rejected += int((status == code_rejected).sum())
        else:
            status = np.asarray(col[lo:hi], dtype=object)
            done = status == finished
            rejected += int((status == "rejected").sum())
        n_fin += int(done.sum())
        arrival = np.asarray(req["arrival_s"][lo:hi])
        if len(arrival):
            start = float(arrival.min()) if start is None else min(start, float(arrival.min()))
        if done.any():
            last = float(np.asarray(req["finish_s"][lo:hi])[done].max())
            end = last if end is None else max(end, last)
        out_tokens += int(np.asarray(req["output_tokens"][lo:hi])[done].sum())
        in_tokens += int(np.asarray(req["prompt_tokens"][lo:hi])[done].sum())
        preempted += int(np.asarray(req["preemptions"][lo:hi]).sum())
        ok = np.ones(int(done.sum()), dtype=bool)
        for k in LATENCIES:
            v = np.asarray(req[k][lo:hi])[done]
            if any(k == name for name, _ in limits):
                ok &= np.isnan(v) | (v <= dict(limits)[k])
            v = v[~np.isnan(v)]
            spill.append(f"stats.{k}", np.ascontiguousarray(v))
            kept[k] += len(v)
        met += int(ok.sum())
    start = start if start is not None else 0.0
    duration = max((end if end is not None else start) - start, 1e-12)
    out = {
        "requests": {"total": n, "finished": n_fin, "rejected": rejected},
        "duration_s": duration,
        "request_throughput": n_fin / duration,
        "output_token_throughput": out_tokens / duration,
        "total_token_throughput": (out_tokens + in_tokens) / duration,
        "preemptions": preempted,
    }
    for k in LATENCIES:
        out[k] = _linear(DiskColumn(spill, f"stats.{k}", float, kept[k], np.zeros(0)), kept[k])
        spill.file(f"stats.{k}").unlink()
    out["goodput"] = None if not limits else {
        "slo": dict(limits), "requests_per_s": float(met / duration),
        "fraction_met": float(met / n_fin) if n_fin else 0.0}
    return out


__all__ = ["request_figures", "LATENCIES"]
