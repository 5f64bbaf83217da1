"""`llmsim validate SCENARIO --replay STEPS.csv REQUESTS.csv`: a real run's logs against
the simulator, without rerunning the engine.

The requests log gives the trace (arrival times, prompt and output lengths); the steps
log gives the KV pool size (free blocks after the first step plus what it holds). The
scenario gives everything else (model, GPU, runtime, scheduler, attention kernels);
its workload and `kv.num_blocks` are replaced. Each metric is computed from the logs
with the simulator's own definitions (sim/engine/metrics.py) and compared:
error = simulated / logged - 1. TTFT is also split in two, per request: the wait in the
queue (arrival to the start of the prefill step that admits it; the log's `admitted_s`)
and the rest (that prefill step, to its first token).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from sim.config.scenario import load_scenario
from sim.engine.runner import run
from sim.fit.servinglog import kv_blocks, prefill_lengths, read_requests_log, read_steps_log

METRICS = [("TTFT p50 (ms)", "ttft_s", "p50", 1e3), ("TTFT p90 (ms)", "ttft_s", "p90", 1e3),
           ("TTFT p99 (ms)", "ttft_s", "p99", 1e3), ("TPOT p50 (ms)", "tpot_s", "p50", 1e3),
           ("TPOT p99 (ms)", "tpot_s", "p99", 1e3), ("E2E p50 (s)", "e2e_s", "p50", 1.0),
           ("E2E p99 (s)", "e2e_s", "p99", 1.0), ("requests/s", "request_throughput", None, 1.0),
           ("output tokens/s", "output_token_throughput", None, 1.0),
           ("mean batch size", "mean_batch_size", None, 1.0),
           ("TTFT queue wait p50 (ms)", "queue_s", "p50", 1e3),
           ("TTFT queue wait mean (ms)", "queue_s", "mean", 1e3),
           ("TTFT after admission p50 (ms)", "admitted_to_first_s", "p50", 1e3),
           ("TTFT after admission mean (ms)", "admitted_to_first_s", "mean", 1e3)]


def request_metrics(ttft_s: np.ndarray, tpot_s: np.ndarray, e2e_s: np.ndarray,
                    queue_s: np.ndarray) -> dict:
    """Per-request figures as sim/engine/metrics.py computes them (numpy's linear percentiles;
    TPOT over requests with more than one output token, NaN otherwise), and TTFT's two
    parts: the queue wait and admission to first token."""
    def pcts(x: np.ndarray) -> dict:
        x = x[np.isfinite(x)]
        return {f"p{p}": float(v) if len(x) else None
                for p, v in zip((50, 90, 99), np.percentile(x, (50, 90, 99)) if len(x) else
                                (0, 0, 0), strict=True)}

    def stats(x: np.ndarray) -> dict:
        x = x[np.isfinite(x)]
        return {"p50": float(np.median(x)), "mean": float(x.mean())} if len(x) else \
            {"p50": None, "mean": None}

    return {"ttft_s": pcts(ttft_s), "tpot_s": pcts(tpot_s), "e2e_s": pcts(e2e_s),
            "queue_s": stats(queue_s), "admitted_to_first_s": stats(ttft_s - queue_s)}


def log_summary(requests: pd.DataFrame, steps: pd.DataFrame) -> dict:
    """The metrics of sim/engine/metrics.py, computed from a serving log."""
    duration = float(requests.finish_s.max() - requests.arrival_s.min())
    dur = (steps.t_end - steps.t_start).to_numpy(float)
    tpot = np.where(requests.output_tokens > 1, requests.tpot_s.to_numpy(float), np.nan)
    return {**request_metrics(requests.ttft_s.to_numpy(float), tpot, requests.e2e_s.to_numpy(float),
                              (requests.admitted_s - requests.arrival_s).to_numpy(float)),
            "request_throughput": len(requests) / duration,
            "output_token_throughput": float(requests.output_tokens.sum()) / duration,
            "mean_batch_size": float((steps.num_seqs.to_numpy(float) * dur).sum() / dur.sum())}


def replay(scenario: str | Path, steps_csv: str | Path, requests_csv: str | Path, *,
           runtime: str | None = None, overrides: dict | None = None,
           request_ids: np.ndarray | None = None) -> dict:
    """Simulate the logged trace under `scenario`; returns the report (rows per metric).
    `request_ids`: the per-request figures of these requests only (cross-validation;
    throughputs and the mean batch size stay the whole run's)."""
    steps, requests = read_steps_log(steps_csv), read_requests_log(requests_csv)
    blocks = kv_blocks(steps, prefill_lengths(steps, requests))
    sets = {**(overrides or {}), "kv.num_blocks": blocks,
            "workload": {"trace": {"path": str(Path(requests_csv).resolve()), "format": "csv"}}}
    if runtime:
        sets["runtime"] = runtime
    out = run(load_scenario(scenario, sets))
    logged, sim = log_summary(requests, steps), dict(out.summary)
    if request_ids is not None:
        logged.update(log_summary(requests[requests.id.isin(request_ids)], steps)
                      | {k: logged[k] for k in ("request_throughput", "output_token_throughput",
                                                "mean_batch_size")})
    simulated = out.requests if request_ids is None else \
        out.requests[out.requests.id.isin(request_ids)]
    sim.update(request_metrics(*(simulated[c].to_numpy(float)
                                 for c in ("ttft_s", "tpot_s", "e2e_s", "queue_s"))))
    rows = []
    for label, key, sub, scale in METRICS:
        a = logged[key] if sub is None else logged[key][sub]
        b = sim[key] if sub is None else sim[key][sub]
        rows.append({"metric": label, "logged": a * scale,
                     "simulated": None if b is None else b * scale,
                     "error": None if b is None or not a else b / a - 1})
    return {"scenario": out.scenario.name, "runtime": sim["runtime"], "steps_log": str(steps_csv),
            "requests_log": str(requests_csv), "requests": int(len(requests)),
            "compared_requests": int(len(simulated)),
            "kv_blocks": blocks, "logged_steps": int(len(steps)),
            "simulated_steps": int(sim["iterations"]["total"]), "metrics": rows}


def markdown(r: dict) -> str:
    lines = [f"# Replay of a serving log: {r['scenario']} (runtime `{r['runtime']}`)", "",
             f"`{r['requests_log']}` ({r['requests']} requests"
             + (f"; per-request figures of {r['compared_requests']} of them"
                if r.get("compared_requests", r["requests"]) != r["requests"] else "")
             + f") and `{r['steps_log']}` "
             f"({r['logged_steps']} steps; {r['kv_blocks']} KV blocks); "
             f"{r['simulated_steps']} simulated steps. Error = simulated / logged - 1.", "",
             "| metric | logged | simulated | error |", "|---|---:|---:|---:|"]
    for m in r["metrics"]:
        sim = "-" if m["simulated"] is None else f"{m['simulated']:.4g}"
        err = "-" if m["error"] is None else f"{m['error']:+.1%}"
        lines.append(f"| {m['metric']} | {m['logged']:.4g} | {sim} | {err} |")
    return "\n".join(lines) + "\n"


def write_report(r: dict, out: str | Path) -> Path:
    """replay.csv, replay.md and replay.json in an llmsim output folder (sim/io/outputs.py:
    marked, replaced atomically, never a folder llmsim did not make)."""
    from sim.io.outputs import write_atomically

    def write(folder: Path) -> None:
        pd.DataFrame(r["metrics"]).to_csv(folder / "replay.csv", index=False, float_format="%.6g")
        (folder / "replay.md").write_text(markdown(r))
        (folder / "replay.json").write_text(json.dumps(r, indent=2) + "\n")

    write_atomically(Path(out), write, {"kind": "replay"})
    return Path(out)
