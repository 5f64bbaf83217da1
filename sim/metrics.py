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
    "reject_reason",
]
STEP_COLUMNS = ["t_start", "t_end", "kind", "num_seqs", "num_tokens", "kv_blocks_used", "kv_tokens"]
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
    df["ttft_s"] = df.first_token_s - df.arrival_s
    df["e2e_s"] = df.finish_s - df.arrival_s
    multi = df.output_tokens > 1
    df["tpot_s"] = np.where(multi, (df.e2e_s - df.ttft_s) / (df.output_tokens - 1).clip(lower=1), nan)
    df["queue_s"] = df.sched_s - df.arrival_s
    return df[REQUEST_COLUMNS]


def steps_frame(res: RunResult) -> pd.DataFrame:
    log = res.steps
    df = pd.DataFrame({c: getattr(log, c) for c in STEP_COLUMNS})
    df["kind"] = KIND_NAMES[df["kind"].to_numpy(dtype=int)] if len(df) else pd.Series(dtype=str)
    return df


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
    kv = res.kv
    cap_slots = kv.num_blocks
    used = steps.kv_blocks_used.to_numpy(dtype=float)
    toks = steps.kv_tokens.to_numpy(dtype=float)
    slot_tokens = used * kv.block_size
    wsum = max(float((slot_tokens * dur).sum()), 1e-12)
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
        "gpu_busy_fraction": min(1.0, busy / duration),
        "iterations": {
            "total": int(len(steps)),
            **{k: int(v) for k, v in steps.kind.value_counts().sort_index().items()},
        },
        "mean_batch_size": float((steps.num_seqs * dur).sum() / busy) if busy else 0.0,
        "preemptions": int(req.preemptions.sum()),
        "kv": {
            "manager": kv.kind,
            "block_size": kv.block_size,
            "capacity_tokens": kv.capacity_tokens,
            "util_mean": float((used * dur).sum() / busy / cap_slots) if busy else 0.0,
            "util_peak": float(used.max() / cap_slots) if len(used) else 0.0,
            "reserved_unused_share": float(1.0 - (toks * dur).sum() / wsum) if busy else 0.0,
            "swap_gib": res.swap_bytes / 1024**3,
        },
    }
    s["goodput"] = goodput(fin, duration, slo)
    return s


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
