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
Percentiles use numpy's default (linear) method; ITL, kept in weighted form,
uses the inverted-CDF method on its weights.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from .batch import FINISHED
from .replica import RunResult

REQUEST_COLUMNS = [
    "id", "arrival_s", "prompt_tokens", "output_tokens", "status", "first_token_s", "finish_s",
    "ttft_s", "tpot_s", "e2e_s", "queue_s", "preemptions", "generated_tokens", "cached_tokens",
    "reject_reason", "replica",
]
LOG_COLUMNS = ["t_start", "t_end", "kind", "num_seqs", "num_tokens", "kv_blocks_used", "kv_tokens"]
STEP_COLUMNS = LOG_COLUMNS + ["replica"]
KIND_NAMES = np.array(["prefill", "decode", "verify", "mixed"])
PCTS = (50, 90, 99)


def requests_frame(res: RunResult) -> pd.DataFrame:
    seqs = res.seqs
    nan = float("nan")
    done = [s.state == FINISHED for s in seqs]
    df = pd.DataFrame({
        "id": [s.rid for s in seqs],
        "arrival_s": [s.arrival for s in seqs],
        "prompt_tokens": [s.prompt for s in seqs],
        "output_tokens": [s.output for s in seqs],
        "status": [s.state for s in seqs],
        "first_token_s": [s.first_token_t if s.first_token_t >= 0 else nan for s in seqs],
        "finish_s": [s.finish_t if ok else nan for s, ok in zip(seqs, done, strict=True)],
        "sched_s": [s.sched_t if s.sched_t >= 0 else nan for s in seqs],
        "preemptions": [s.preemptions for s in seqs],
        "generated_tokens": [s.generated for s in seqs],
        "cached_tokens": [s.cached_tokens for s in seqs],
        "reject_reason": [s.reject_reason for s in seqs],
    })
    names = np.array([r.name for r in res.replicas], dtype=object)
    df["replica"] = names[np.fromiter((s.replica for s in seqs), dtype=np.int64, count=len(seqs))]
    columns = REQUEST_COLUMNS
    if any(r.role == "prefill" for r in res.replicas):  # disaggregated: where the prefill ran
        pre = np.fromiter((s.prefill_replica for s in seqs), dtype=np.int64, count=len(seqs))
        df["prefill_replica"] = np.where(pre >= 0, names[np.maximum(pre, 0)], "")
        columns = REQUEST_COLUMNS + ["prefill_replica"]
    df["ttft_s"] = df.first_token_s - df.arrival_s
    df["e2e_s"] = df.finish_s - df.arrival_s
    multi = df.output_tokens > 1
    df["tpot_s"] = np.where(multi, (df.e2e_s - df.ttft_s) / (df.output_tokens - 1).clip(lower=1), nan)
    df["queue_s"] = df.sched_s - df.arrival_s
    return df[columns]


def steps_frame(res: RunResult) -> pd.DataFrame:
    """Every replica's iterations, replica by replica, with a `replica` column."""
    frames = []
    for r in res.replicas:
        log = r.steps
        cols = {c: np.frombuffer(getattr(log, c), dtype=float if c.startswith("t_") else np.int64)
                if len(getattr(log, c)) else np.zeros(0, dtype=float if c.startswith("t_") else np.int64)
                for c in LOG_COLUMNS}
        df = pd.DataFrame(cols)
        df["kind"] = KIND_NAMES[cols["kind"]] if len(df) else pd.Series(dtype=str)
        df["replica"] = r.name
        frames.append(df)
    return frames[0] if len(frames) == 1 else pd.concat(frames, ignore_index=True)


def _stats(x: np.ndarray) -> dict[str, float | None]:
    x = x[~np.isnan(x)]
    if len(x) == 0:
        return {"mean": None, **{f"p{p}": None for p in PCTS}}
    q = np.percentile(x, PCTS)
    return {"mean": float(x.mean()), **{f"p{p}": float(v) for p, v in zip(PCTS, q, strict=True)}}


def weighted_stats(values, weights) -> dict[str, float | None]:
    v = np.asarray(values, dtype=float)
    w = np.asarray(weights, dtype=float)
    keep = w > 0
    v, w = v[keep], w[keep]
    if len(v) == 0:
        return {"mean": None, **{f"p{p}": None for p in PCTS}}
    order = np.argsort(v, kind="stable")
    v, w = v[order], w[order]
    cum = np.cumsum(w)
    out: dict[str, float | None] = {"mean": float((v * w).sum() / cum[-1])}
    for p in PCTS:
        out[f"p{p}"] = float(v[min(np.searchsorted(cum, p / 100 * cum[-1]), len(v) - 1)])
    return out


def summarize(req: pd.DataFrame, steps: pd.DataFrame, res: RunResult, slo=None) -> dict:
    fin = req[req.status == FINISHED]
    n_fin = len(fin)
    start = float(req.arrival_s.min()) if len(req) else 0.0
    end = float(fin.finish_s.max()) if n_fin else start
    duration = max(end - start, 1e-12)
    dur = (steps.t_end - steps.t_start).to_numpy()
    busy = float(dur.sum())
    kv = _kv_figures(steps, res, dur)
    out_tokens = int(fin.output_tokens.sum())
    in_tokens = int(fin.prompt_tokens.sum())
    s = {
        "requests": {
            "total": int(len(req)),
            "finished": n_fin,
            "rejected": int((req.status == "rejected").sum()),
        },
        "duration_s": duration,
        "request_throughput": n_fin / duration,
        "output_token_throughput": out_tokens / duration,
        "total_token_throughput": (out_tokens + in_tokens) / duration,
        "ttft_s": _stats(fin.ttft_s.to_numpy(dtype=float)),
        "tpot_s": _stats(fin.tpot_s.to_numpy(dtype=float)),
        "itl_s": weighted_stats(res.itl_gaps, res.itl_weights),
        "e2e_s": _stats(fin.e2e_s.to_numpy(dtype=float)),
        "queue_s": _stats(fin.queue_s.to_numpy(dtype=float)),
        "gpu_busy_fraction": min(1.0, busy / duration / len(res.replicas)),
        "iterations": {
            "total": int(len(steps)),
            **{k: int(v) for k, v in steps.kind.value_counts().sort_index().items()},
        },
        "mean_batch_size": float((steps.num_seqs * dur).sum() / busy) if busy else 0.0,
        "preemptions": int(req.preemptions.sum()),
        "kv": kv,
    }
    s["goodput"] = goodput(fin, duration, slo)
    return s


def _kv_figures(steps: pd.DataFrame, res: RunResult, dur: np.ndarray) -> dict:
    """KV use over the run, time-weighted; a fleet's figures pool its replicas (each step
    weighed against its own replica's capacity)."""
    kvs = [r.kv for r in res.replicas]
    used = steps.kv_blocks_used.to_numpy(dtype=float)
    toks = steps.kv_tokens.to_numpy(dtype=float)
    if len(kvs) == 1:
        cap = np.full(len(steps), float(kvs[0].num_blocks))
        block = np.full(len(steps), float(kvs[0].block_size))
    else:
        index = {r.name: i for i, r in enumerate(res.replicas)}
        which = steps.replica.map(index).to_numpy(dtype=np.int64)
        cap = np.array([k.num_blocks for k in kvs], dtype=float)[which]
        block = np.array([k.block_size for k in kvs], dtype=float)[which]
    busy = float(dur.sum())
    wsum = max(float((used * block * dur).sum()), 1e-12)
    return {
        "manager": kvs[0].kind,
        "block_size": kvs[0].block_size,
        "capacity_tokens": int(sum(k.capacity_tokens for k in kvs)),
        "util_mean": float((used / cap * dur).sum() / busy) if busy else 0.0,
        "util_peak": float((used / cap).max()) if len(used) else 0.0,
        "reserved_unused_share": float(1.0 - (toks * dur).sum() / wsum) if busy else 0.0,
        "swap_gib": res.swap_bytes / 1024**3,
        **({"transfer_gib": sum(r.transfer_bytes for r in res.replicas) / 1024**3}
           if any(r.role != "both" for r in res.replicas) else {}),
    }


def per_replica(req: pd.DataFrame, steps: pd.DataFrame, res: RunResult) -> list[dict]:
    """Each replica's share of the run: requests served, latency, busy time, KV use."""
    start = float(req.arrival_s.min()) if len(req) else 0.0
    fin_all = req[req.status == FINISHED]
    end = float(fin_all.finish_s.max()) if len(fin_all) else start
    duration = max(end - start, 1e-12)
    by_req = dict(tuple(req.groupby("replica", sort=False)))
    by_step = dict(tuple(steps.groupby("replica", sort=False)))
    out = []
    for r in res.replicas:
        rq = by_req.get(r.name, req.iloc[:0])
        st = by_step.get(r.name, steps.iloc[:0])
        fin = rq[rq.status == FINISHED]
        dur = (st.t_end - st.t_start).to_numpy()
        busy = float(dur.sum())
        used = st.kv_blocks_used.to_numpy(dtype=float) / r.kv.num_blocks
        out.append({
            "replica": r.name, "group": r.group, "role": r.role, "gpu": r.gpu,
            "requests": int(len(rq)), "finished": int(len(fin)),
            **({"prefills": int((req.prefill_replica == r.name).sum())}
               if "prefill_replica" in req else {}),
            "rejected": int((rq.status == "rejected").sum()),
            "request_throughput": len(fin) / duration,
            "output_token_throughput": float(fin.output_tokens.sum()) / duration,
            "ttft_s": _stats(fin.ttft_s.to_numpy(dtype=float)),
            "tpot_s": _stats(fin.tpot_s.to_numpy(dtype=float)),
            "e2e_s": _stats(fin.e2e_s.to_numpy(dtype=float)),
            "gpu_busy_fraction": min(1.0, busy / duration),
            "mean_batch_size": float((st.num_seqs * dur).sum() / busy) if busy else 0.0,
            "iterations": int(len(st)),
            "preemptions": int(rq.preemptions.sum()),
            "kv_util_mean": float((used * dur).sum() / busy) if busy else 0.0,
            "kv_util_peak": float(used.max()) if len(used) else 0.0,
            "kv_capacity_tokens": int(r.kv.capacity_tokens),
        })
    return out


def goodput(fin: pd.DataFrame, duration: float, slo) -> dict | None:
    if slo is None or all(v is None for v in (slo.ttft_s, slo.tpot_s, slo.e2e_s)):
        return None
    ok = np.ones(len(fin), dtype=bool)
    for col, limit in (("ttft_s", slo.ttft_s), ("tpot_s", slo.tpot_s), ("e2e_s", slo.e2e_s)):
        if limit is not None:
            v = fin[col].to_numpy(dtype=float)
            ok &= np.isnan(v) | (v <= limit)
    return {
        "slo": {k: v for k, v in (("ttft_s", slo.ttft_s), ("tpot_s", slo.tpot_s), ("e2e_s", slo.e2e_s)) if v is not None},
        "requests_per_s": float(ok.sum() / duration),
        "fraction_met": float(ok.mean()) if len(ok) else 0.0,
    }
