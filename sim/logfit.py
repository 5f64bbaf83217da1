"""Fit a runtime profile to a live serving engine's per-iteration log (`llmsim fit-log`).

Input (docs/calibration.md, "Serving logs"): a steps log, one row per iteration,
`t_start,t_end,kind,num_seqs,num_tokens,sum_ctx,free_blocks`, and optionally a
requests log `id,arrival_s,prompt_tokens,output_tokens,admitted_s,first_token_s,...`.
A prefill step's per-sequence prompt lengths are not in the steps log; the requests
log gives them (the requests whose `admitted_s` is the step's `t_start`). Without it
a prefill step is taken as `num_seqs` equal prompts.

What is modelled for each logged step, with the simulator's own StepLatency for its
batch shape (decode: num_seqs, sum_ctx; prefill: the per-sequence lengths):

    step = max(host, gpu) + serial_ms_per_step + serial_ms_per_seq * seqs
           + serial_ms_per_new_prefill_shape * (prefill shapes not seen before in the run)
    host = the base runtime's host terms + host_ms_per_{prefill,decode}_seq * seqs
    gpu  = gpu_scale{,_decode} * kernel time

The base runtime (fitted to a warm grid over two model sizes) keeps its per-step and
per-layer terms: a one-model log cannot tell them apart. The live log then fixes,
by coarse-to-fine search minimising mean squared relative error (unbiased on average,
which throughput and TPOT depend on): decode's per-sequence host and serial terms, the
per-step serial term and decode's GPU scale (decode rows), then prefill's per-sequence
host term, GPU scale and the per-new-shape stall (prefill rows). The new-shape term is
the mechanism behind "live prefill costs more per sequence than warm grid steps": a warm
grid times each shape after a warm-up call of that shape, a live server meets a new
prompt length at almost every prefill and pays a one-off cost for it (a per-shape
execution plan or kernel specialisation), after which the same length is cheap.

A logged step's time is its cycle: from its start to the next step's start (the
duration plus the scheduler's gap before the next step; gaps over 1 ms are idle time
and count as the median gap). What the deterministic model leaves, measured / modelled
per step kind, becomes the runtime's jitter table (sim/jitter.py).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from .jitter import JitterSpec
from .latency import RuntimeSpec, StepLatency
from .models import ModelSpec
from .profiles import GPUProfile
from .runtime_fit import _search
from .specload import SpecError, is_file

STEP_LOG_COLUMNS = ["t_start", "t_end", "kind", "num_seqs", "num_tokens", "sum_ctx", "free_blocks"]
REQUEST_LOG_COLUMNS = ["id", "arrival_s", "prompt_tokens", "output_tokens", "admitted_s",
                       "first_token_s", "finish_s", "ttft_s", "e2e_s", "tpot_s", "preemptions"]
KINDS = ("prefill", "decode")
JITTER_POINTS = 41  # quantiles at probabilities 0, 1/40, ..., 1
IDLE_GAP_S = 1e-3


def _read(path: str | Path, columns: list[str]) -> pd.DataFrame:
    p = Path(path)
    if not is_file(p):
        raise SpecError(p, "", "file not found")
    try:
        df = pd.read_csv(p)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as e:
        raise SpecError(p, "", f"not a CSV log ({str(e).splitlines()[0]})") from None
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise SpecError(p, "header", f"missing columns {', '.join(missing)} "
                        f"(needed: {', '.join(columns)})")
    if df.empty:
        raise SpecError(p, "", "no rows after the header (allowed: a log with at least one row)")
    for c in columns:
        if c != "kind" and not pd.api.types.is_numeric_dtype(df[c]):
            bad = int(pd.to_numeric(df[c], errors="coerce").isna().to_numpy().argmax())
            raise SpecError(p, f"line {bad + 2}", f"{c}: {df[c].iloc[bad]!r} is not a number")
        if c != "kind":
            values = df[c].to_numpy(dtype=float)
            finite = np.isfinite(values)
            if not finite.all():
                bad = int((~finite).argmax())
                raise SpecError(p, f"line {bad + 2}", f"{c}: {df[c].iloc[bad]!r} is not finite "
                                "(allowed: finite numbers)")
    return df


def read_steps_log(path: str | Path) -> pd.DataFrame:
    df = _read(path, STEP_LOG_COLUMNS)
    bad = ~df.kind.isin(KINDS)
    if bad.any():
        i = int(bad.to_numpy().argmax())
        raise SpecError(path, f"line {i + 2}", f"kind: {df.kind.iloc[i]!r} (allowed: prefill, decode)")
    bad = (df.t_end < df.t_start) | (df.num_seqs < 1)
    if bad.any():
        i = int(bad.to_numpy().argmax())
        raise SpecError(path, f"line {i + 2}", "t_end before t_start, or num_seqs < 1")
    return df


def read_requests_log(path: str | Path) -> pd.DataFrame:
    return _read(path, REQUEST_LOG_COLUMNS)


def prefill_lengths(steps: pd.DataFrame, requests: pd.DataFrame | None) -> list[list[int]]:
    """Per-sequence prompt lengths of each prefill step ([] for decode steps)."""
    by_start: dict[float, list[int]] = {}
    if requests is not None:
        for t, p in zip(requests.admitted_s.round(6), requests.prompt_tokens, strict=True):
            by_start.setdefault(float(t), []).append(int(p))
    out = []
    for kind, t, n, tokens in zip(steps.kind, steps.t_start.round(6), steps.num_seqs,
                                  steps.num_tokens, strict=True):
        if kind != "prefill":
            out.append([])
            continue
        lens = by_start.get(float(t))
        if lens is None or len(lens) != n or sum(lens) != tokens:  # e.g. a re-prefill
            n, tokens = int(n), int(tokens)
            lens = [tokens // n + (i < tokens % n) for i in range(n)]
        out.append(sorted(lens))
    return out


def kv_blocks(steps: pd.DataFrame, lengths: list[list[int]], block_size: int = 16) -> int:
    """The log's KV pool size: free blocks after the first step plus what that step holds."""
    held = sum(-(-q // block_size) for q in lengths[0]) if steps.kind.iloc[0] == "prefill" else \
        -(-int(steps.sum_ctx.iloc[0]) // block_size)
    return int(steps.free_blocks.iloc[0]) + held


def cycle_ms(steps: pd.DataFrame) -> np.ndarray:
    """Each step's start to the next step's start (idle gaps count as the median gap)."""
    start, end = steps.t_start.to_numpy(float), steps.t_end.to_numpy(float)
    gap = np.append(start[1:] - end[:-1], np.nan)
    busy = (gap >= 0) & (gap <= IDLE_GAP_S)
    typical = float(np.median(gap[busy])) if busy.any() else 0.0
    gap = np.where(busy, gap, typical)
    return (end - start + gap) * 1e3


@dataclass
class StepRows:
    """The logged steps as model inputs (numpy arrays, one entry per step)."""

    kind: np.ndarray  # "prefill" / "decode"
    seqs: np.ndarray
    gpu_ms: np.ndarray  # kernel time at gpu scale 1
    new_shapes: np.ndarray  # prefill shapes first seen in this step
    measured_ms: np.ndarray


def step_rows(steps: pd.DataFrame, lengths: list[list[int]], model: ModelSpec,
              profile: GPUProfile, prefill_impl: str = "flash",
              decode_impl: str = "paged_reference") -> StepRows:
    kernels = StepLatency(model, profile, RuntimeSpec(name="kernels"), prefill_impl, decode_impl)
    seen: set[tuple[int, int]] = set()
    gpu, new = [], []
    for kind, n, sum_ctx, lens in zip(steps.kind, steps.num_seqs, steps.sum_ctx, lengths,
                                      strict=True):
        if kind == "prefill":
            chunks = [(q, 0) for q in lens]
            tokens, attn = kernels._per_sequence(chunks, kernels.prefill_attn_ms)
            gpu.append(attn + kernels.dense_ms(tokens) + kernels.lm_head_ms(len(chunks)))
            fresh = {c for c in chunks if c not in seen}
            new.append(len(fresh))
            seen |= fresh
        else:
            n = int(n)
            gpu.append(kernels.dense_ms(n) + kernels.lm_head_ms(n) + kernels.decode_attn_ms(n, int(sum_ctx)))
            new.append(0)
    return StepRows(steps.kind.to_numpy(str), steps.num_seqs.to_numpy(float), np.array(gpu),
                    np.array(new, dtype=float), cycle_ms(steps))


def predict_ms(rt: RuntimeSpec, layers: int, rows: StepRows) -> np.ndarray:
    """The deterministic model (StepLatency's combine, vectorised over logged steps)."""
    pf = rows.kind == "prefill"
    n = rows.seqs
    host = rt.host_ms_per_step + rt.host_ms_per_layer * layers + np.where(
        pf, (rt.host_ms_per_prefill_seq_layer * layers + rt.host_ms_per_prefill_seq) * n,
        rt.host_ms_per_layer_decode_extra * layers + rt.host_ms_per_decode_seq * n)
    gpu = rows.gpu_ms * np.where(pf, rt.gpu_scale, rt.gpu_scale_decode)
    step = host + gpu if rt.combine == "sum" else np.maximum(host, gpu)
    return (step + rt.serial_ms_per_step + rt.serial_ms_per_seq * n
            + rt.serial_ms_per_new_prefill_shape * rows.new_shapes)


def fit_runtime(base: RuntimeSpec, layers: int, rows: StepRows, name: str) -> RuntimeSpec:
    """The live terms on top of `base` (see the module docstring); jitter not included."""
    y, n, g, new = rows.measured_ms, rows.seqs, rows.gpu_ms, rows.new_shapes
    dec, pf = rows.kind == "decode", rows.kind == "prefill"
    b = base
    join = (lambda h, x: h + x) if b.combine == "sum" else np.maximum
    host0 = b.host_ms_per_step + b.host_ms_per_layer * layers
    hd, gd, ss, sq = 0.0, b.gpu_scale_decode, 0.0, 0.0
    if dec.any():
        hdec = host0 + b.host_ms_per_layer_decode_extra * layers

        def decode_err(hd, gd, ss, sq):
            pred = join(hdec + hd * n[dec], gd * g[dec]) + ss + sq * n[dec]
            return np.abs(pred / y[dec] - 1).mean(axis=1)

        hd, gd, ss, sq = _search(decode_err, [np.linspace(0, 0.4, 9), np.linspace(0.5, 2.0, 9),
                                              np.linspace(0, 10, 9), np.linspace(0, 0.2, 9)], 6)
    hp, gp, c = 0.0, b.gpu_scale, 0.0
    if pf.any():
        hpf = host0 + b.host_ms_per_prefill_seq_layer * layers * n[pf]

        def prefill_err(hp, gp, c):
            pred = join(hpf + hp * n[pf], gp * g[pf]) + ss + sq * n[pf] + c * new[pf]
            return np.abs(pred / y[pf] - 1).mean(axis=1)

        hp, gp, c = _search(prefill_err, [np.linspace(0, 8, 9), np.linspace(0.5, 2.5, 9),
                                          np.linspace(0, 200, 9)], 6)
    return replace(b, name=name, host_ms_per_decode_seq=round(hd, 5), gpu_scale_decode=round(gd, 4),
                   serial_ms_per_step=round(ss, 4), serial_ms_per_seq=round(sq, 5),
                   host_ms_per_prefill_seq=round(hp, 4), gpu_scale=round(gp, 4),
                   serial_ms_per_new_prefill_shape=round(c, 3), jitter=None)


def fit_jitter(rows: StepRows, pred_ms: np.ndarray, source: str = "") -> JitterSpec:
    """Measured / modelled per kind as an empirical quantile table."""
    p = np.linspace(0, 1, JITTER_POINTS)
    tables = {}
    for kind in KINDS:
        r = rows.measured_ms[rows.kind == kind] / pred_ms[rows.kind == kind]
        tables[kind] = tuple(round(float(v), 4) for v in np.quantile(r, p)) if len(r) else (1.0, 1.0)
    return JitterSpec(decode=tables["decode"], prefill=tables["prefill"], source=source)


def error_stats(measured: np.ndarray, pred: np.ndarray) -> dict[str, float]:
    e = pred / measured - 1
    return {"steps": int(len(e)), "mean_abs": float(np.abs(e).mean()),
            "median_abs": float(np.median(np.abs(e))), "bias": float(e.mean()),
            "measured_mean_ms": float(measured.mean()), "measured_median_ms": float(np.median(measured)),
            "model_mean_ms": float(pred.mean()), "model_median_ms": float(np.median(pred))}


def errors_by_kind(rows: StepRows, pred: np.ndarray) -> dict[str, dict[str, float]]:
    out = {k: error_stats(rows.measured_ms[rows.kind == k], pred[rows.kind == k])
           for k in KINDS if (rows.kind == k).any()}
    out["all"] = error_stats(rows.measured_ms, pred)
    return out


def runtime_yaml(rt: RuntimeSpec, header: str) -> str:
    """The runtime as YAML (loads with load_runtime), `header` as leading comments."""
    data = asdict(rt)
    if rt.jitter is not None:
        data["jitter"] = {k: list(v) if isinstance(v, tuple) else v for k, v in data["jitter"].items()}
    body = yaml.safe_dump(data, sort_keys=False, width=100, default_flow_style=None)
    comments = "".join(f"# {line}\n".replace("# \n", "#\n") for line in header.splitlines())
    return comments + body


@dataclass
class LogFit:
    runtime: RuntimeSpec  # with its jitter table
    base_errors: dict  # the base runtime on the logged steps
    errors: dict  # the fitted deterministic model
    jittered_mean_bias: dict  # per kind: model x mean jitter factor / measured mean - 1
    kv_blocks: int
    lengths_from_requests: bool


def fit_log(steps_csv: str | Path, requests_csv: str | Path | None, model: ModelSpec,
            profile: GPUProfile, base: RuntimeSpec, name: str, prefill_impl: str = "flash",
            decode_impl: str = "paged_reference") -> LogFit:
    steps = read_steps_log(steps_csv)
    requests = read_requests_log(requests_csv) if requests_csv else None
    lengths = prefill_lengths(steps, requests)
    rows = step_rows(steps, lengths, model, profile, prefill_impl, decode_impl)
    rt = fit_runtime(base, model.layers, rows, name)
    pred = predict_ms(rt, model.layers, rows)
    jitter = fit_jitter(rows, pred, f"measured / modelled step time on {Path(steps_csv).name}")
    rt = replace(rt, jitter=jitter, description=f"{base.description} (live: fitted to a serving log)",
                 source=(
        f"fitted by llmsim fit-log to {Path(steps_csv).name}"
        + (f" + {Path(requests_csv).name}" if requests_csv else "")
        + f" on {profile.name}, on top of {base.name} ({base.source})"))
    bias = {}
    for kind in KINDS:
        sel = rows.kind == kind
        if sel.any():
            table = np.asarray(getattr(jitter, kind))
            mean_factor = float(np.trapezoid(table, np.linspace(0, 1, len(table))))
            bias[kind] = float(pred[sel].mean() * mean_factor / rows.measured_ms[sel].mean() - 1)
    return LogFit(rt, errors_by_kind(rows, predict_ms(base, model.layers, rows)),
                  errors_by_kind(rows, pred), bias, kv_blocks(steps, lengths), requests is not None)


def format_fit(f: LogFit) -> str:
    rt = f.runtime
    lines = [f"{'':16}{'steps':>6} {'mean|err|':>10} {'median|err|':>12} {'bias':>7} "
             f"{'meas mean/median ms':>20} {'model mean/median ms':>21}"]
    for label, errs in ((f"base {rt.source.split('on top of ')[-1].split(' (')[0]}", f.base_errors),
                        ("fitted", f.errors)):
        lines.append(label)
        for kind, e in errs.items():
            lines.append(f"  {kind:14}{e['steps']:6d} {e['mean_abs']:10.1%} {e['median_abs']:12.1%} "
                         f"{e['bias']:+7.1%} {e['measured_mean_ms']:9.1f} / {e['measured_median_ms']:<8.1f}"
                         f"{e['model_mean_ms']:10.1f} / {e['model_median_ms']:<8.1f}")
    lines.append("fitted x jitter: mean bias " + ", ".join(
        f"{k} {v:+.1%}" for k, v in f.jittered_mean_bias.items()))
    lines.append(f"live terms: serial {rt.serial_ms_per_step:g} ms/step + {rt.serial_ms_per_seq:g} ms/seq, "
                 f"{rt.serial_ms_per_new_prefill_shape:g} ms per new prefill shape; host "
                 f"+{rt.host_ms_per_prefill_seq:g} ms/prefill seq, +{rt.host_ms_per_decode_seq:g} "
                 f"ms/decode seq; gpu scale {rt.gpu_scale:g} (prefill), {rt.gpu_scale_decode:g} (decode)")
    lines.append(f"KV pool in the log: {f.kv_blocks} blocks; prefill lengths from "
                 + ("the requests log" if f.lengths_from_requests else "equal splits (no requests log)"))
    return "\n".join(lines)


def write_serving_log(folder: str | Path, requests: pd.DataFrame, steps: pd.DataFrame,
                      sum_ctx: list[int], num_blocks: int) -> None:
    """Write a run (simulator frames of sim/metrics.py) in the serving-log format:
    `serving_steps.csv` and `serving_requests.csv` (the reference engine's runs)."""
    folder = Path(folder)
    log = steps[["t_start", "t_end", "kind", "num_seqs", "num_tokens"]].copy()
    log["sum_ctx"] = np.where(log.kind == "decode", sum_ctx, 0)
    log["free_blocks"] = num_blocks - steps.kv_blocks_used
    log.to_csv(folder / "serving_steps.csv", index=False, float_format="%.6f")
    req = requests.assign(admitted_s=requests.arrival_s + requests.queue_s)
    req[REQUEST_LOG_COLUMNS].to_csv(folder / "serving_requests.csv", index=False, float_format="%.6f")
