"""Fit a runtime profile to a live serving engine's per-iteration log (`llmsim fit-log`).

Input: a serving log (docs/calibration.md, "Serving logs"), a steps log and optionally a
requests log, read by sim/fit/servinglog.py, which also rebuilds each prefill step's
per-sequence prompt lengths and each decode step's longest context from them.

What is modelled for each logged step, with the simulator's own StepLatency for its
batch shape (decode: num_seqs, sum_ctx and the longest context, rebuilt from the
requests log as the simulator charges for it; prefill: the per-sequence lengths):

    step = max(host, gpu) + serial_ms_per_step + serial_ms_per_seq * seqs
           + serial_ms_per_new_prefill_shape * (prefill shapes not seen before in the run)
    host = the base runtime's host terms + host_ms_per_{prefill,decode}_seq * seqs
    gpu  = gpu_scale{,_decode} * kernel time

The base runtime (fitted to a warm grid over two model sizes) keeps its per-step and
per-layer terms: a one-model log cannot tell them apart. The live log then fixes,
by coarse-to-fine search minimising mean absolute relative error (the typical step;
the jitter model carries the rest, its mean included): decode's per-sequence host and serial terms, the
per-step serial term and decode's GPU scale (decode rows), then prefill's per-sequence
host term, GPU scale and the per-new-shape stall (prefill rows). A GPU scale the rows cannot tell (every step
host-bound, as decode steps of a few sequences are) stays the base runtime's (a 0.1 %
tie-break, `tie_break`), rather than sliding to the search's edge and mispricing the
larger batches the fit did not see. The new-shape term is
the mechanism behind "live prefill costs more per sequence than warm grid steps": a warm
grid times each shape after a warm-up call of that shape, a live server meets a new
prompt length at almost every prefill and pays a one-off cost for it (a per-shape
execution plan or kernel specialisation), after which the same length is cheap.

A prefill step far below the model (measured / modelled < e^-0.35, beyond any step's
noise in the shared log) met "new" lengths that were warm already (lengths the stack
met before logging); the fit counts them as seen (as many as the deficit says, in
whole stalls) and fits again, so they neither pull the stall down nor sit in the
jitter table, where they would shorten whole multi-sequence steps.

A logged step's time is its cycle: from its start to the next step's start (the
duration plus the scheduler's gap before the next step; gaps over 1 ms are idle time
and count as the median gap). What the deterministic model leaves, measured / modelled,
becomes the runtime's jitter model (sim/costmodel/jitter.py): decode levels by batch-size band
(medians per power-of-two band, bands of under 30 steps merged), a quantile table per
step kind of what the levels leave, and each kind's persistence fitted to the
autocorrelation of the ranks of consecutive steps' factors at lags 1-20 (least squares,
share² · stay^k; none unless the kind has 200 steps or more and its lag-1
autocorrelation is above the white-noise band 2 / sqrt(steps)).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from sim.costmodel.jitter import JitterSpec, decode_levels, fit_persistence, mean_factor
from sim.costmodel.latency import StepLatency
from sim.costmodel.models import ModelSpec
from sim.costmodel.profiles import GPUProfile
from sim.costmodel.runtime import RuntimeSpec
from sim.fit.runtime_fit import _search
from sim.fit.servinglog import (
    KINDS,
    decode_max_ctx,
    kv_blocks,
    prefill_lengths,
    read_requests_log,
    read_steps_log,
)

JITTER_POINTS = 41  # quantiles at probabilities 0, 1/40, ..., 1
IDLE_GAP_S = 1e-3
WARM_LOG = -0.35  # log(measured / modelled) of a prefill step whose "new" shapes were warm
MIN_GPU_SCALE = 0.05  # a fit that explains a kind by host terms alone (its search reaches 0)


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
    log: np.ndarray | None = None  # which log each step came from (several logs at once)

    def __post_init__(self) -> None:
        if self.log is None:
            self.log = np.zeros(len(self.kind), dtype=int)


def concat(parts: list[StepRows]) -> StepRows:
    """Several logs' rows as one (each log's new prefill shapes counted within that log)."""
    return StepRows(*(np.concatenate([getattr(p, f) for p in parts]) for f in
                      ("kind", "seqs", "gpu_ms", "new_shapes", "measured_ms")),
                    log=np.concatenate([np.full(len(p.kind), i) for i, p in enumerate(parts)]))


def running_seqs(rows: StepRows) -> np.ndarray:
    """The load at each step: a decode step's batch; a prefill step's own sequences plus the
    batch of the log's last decode step before it (what was running when it was scheduled)."""
    out = np.zeros(len(rows.kind))
    last, log = 0.0, -1
    for i, (kind, n, g) in enumerate(zip(rows.kind, rows.seqs, rows.log, strict=True)):
        if g != log:
            last, log = 0.0, g
        if kind == "decode":
            last = n
            out[i] = n
        else:
            out[i] = last + n
    return out


def step_rows(steps: pd.DataFrame, lengths: list[list[int]], model: ModelSpec,
              profile: GPUProfile, prefill_impl: str = "flash",
              decode_impl: str = "paged_reference", max_ctx: np.ndarray | None = None,
              elementwise: str = "as_measured") -> StepRows:
    """`max_ctx`: each decode step's longest context (0: unknown, priced as equal lengths),
    which the simulator's decode kernels charge for as it does (sim/costmodel/latency.py);
    `elementwise`: the base runtime's kernel class (fused or unfused norms)."""
    kernels = StepLatency(model, profile, RuntimeSpec(name="kernels", elementwise=elementwise),
                          prefill_impl, decode_impl)
    seen: set[tuple[int, int]] = set()
    gpu, new = [], []
    longest = np.zeros(len(steps)) if max_ctx is None else max_ctx
    for kind, n, sum_ctx, lens, top in zip(steps.kind, steps.num_seqs, steps.sum_ctx, lengths,
                                           longest, strict=True):
        if kind == "prefill":
            chunks = [(q, 0) for q in lens]
            tokens, attn = kernels._per_sequence(chunks, kernels.prefill_attn_ms)
            gpu.append(attn + kernels.dense_ms(tokens) + kernels.lm_head_ms(len(chunks)))
            fresh = {c for c in chunks if c not in seen}
            new.append(len(fresh))
            seen |= fresh
        else:
            n = int(n)
            gpu.append(kernels.dense_ms(n) + kernels.lm_head_ms(n)
                       + kernels.decode_attn_ms(n, int(sum_ctx), int(top)))
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


TIE_BREAK = 1e-3  # error per unit of relative change of a GPU scale from the base's


def tie_break(scale: np.ndarray, base: float) -> np.ndarray:
    """A GPU scale the steps cannot tell (every step host-bound: max(host, gpu) = host, as
    at small decode batches) stays at the base runtime's (fitted to the warm grid's
    kernels) instead of sliding to the search's edge: 0.1 % of error per unit of relative
    change, far below any step's noise, so where the steps do tell it the data decide."""
    return TIE_BREAK * np.abs(np.asarray(scale).ravel() / base - 1)


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
            return np.abs(pred / y[dec] - 1).mean(axis=1) + tie_break(gd, b.gpu_scale_decode)

        hd, gd, ss, sq = _search(decode_err, [np.linspace(0, 0.4, 9), np.linspace(0.5, 2.0, 9),
                                              np.linspace(0, 10, 9), np.linspace(0, 0.2, 9)], 6)
    hp, gp, c = 0.0, b.gpu_scale, 0.0
    if pf.any():
        hpf = host0 + b.host_ms_per_prefill_seq_layer * layers * n[pf]

        def prefill_err(hp, gp, c):
            pred = join(hpf + hp * n[pf], gp * g[pf]) + ss + sq * n[pf] + c * new[pf]
            return np.abs(pred / y[pf] - 1).mean(axis=1) + tie_break(gp, b.gpu_scale)

        hp, gp, c = _search(prefill_err, [np.linspace(0, 8, 9), np.linspace(0.5, 2.5, 9),
                                          np.linspace(0, 200, 9)], 6)
    return replace(b, name=name, host_ms_per_decode_seq=round(hd, 5), gpu_scale_decode=round(max(gd, MIN_GPU_SCALE), 4),
                   serial_ms_per_step=round(ss, 4), serial_ms_per_seq=round(sq, 5),
                   host_ms_per_prefill_seq=round(hp, 4), gpu_scale=round(max(gp, MIN_GPU_SCALE), 4),
                   serial_ms_per_new_prefill_shape=round(c, 3), jitter=None)


def warm_shapes(rows: StepRows, pred_ms: np.ndarray, stall_ms: float) -> np.ndarray:
    """Per step, how many of its new prefill shapes ran warm (see the module docstring)."""
    if stall_ms <= 0:
        return np.zeros(len(pred_ms))
    far = (rows.kind == "prefill") & (np.log(rows.measured_ms / pred_ms) < WARM_LOG)
    k = np.clip(np.round((pred_ms - rows.measured_ms) / stall_ms), 0, rows.new_shapes)
    return np.where(far, k, 0.0)


def level_factors(spec: JitterSpec, rows: StepRows) -> np.ndarray:
    """Each logged step's decode level factor (1 for prefill steps)."""
    table = np.asarray(spec.level_by_seqs())
    idx = np.minimum(rows.seqs.astype(int), len(table) - 1)
    return np.where(rows.kind == "decode", table[idx], 1.0)


def fit_jitter(rows: StepRows, pred_ms: np.ndarray, source: str = "") -> JitterSpec:
    """Decode levels, then per kind a quantile table of what they leave and its persistence."""
    p = np.linspace(0, 1, JITTER_POINTS)
    ratio = rows.measured_ms / pred_ms
    dec = rows.kind == "decode"
    spec = JitterSpec(decode_levels=decode_levels(rows.seqs[dec], ratio[dec]), source=source)
    ratio = ratio / level_factors(spec, rows)
    parts = {}
    for kind in KINDS:
        r = ratio[rows.kind == kind]
        parts[kind] = tuple(round(float(v), 4) for v in np.quantile(r, p)) if len(r) else (1.0, 1.0)
        parts[f"{kind}_persistence"] = fit_persistence(r)
    return replace(spec, **parts)


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
    if rt.request is None:
        del data["request"]
    if rt.jitter is not None:
        data["jitter"] = {k: list(v) if isinstance(v, tuple) else v for k, v in data["jitter"].items()}
    body = yaml.safe_dump(data, sort_keys=False, width=100, default_flow_style=None)
    comments = "".join(f"# {line}\n".replace("# \n", "#\n") for line in header.splitlines())
    return comments + body


@dataclass
class LogFit:
    runtime: RuntimeSpec  # with its jitter model
    base_errors: dict  # the base runtime on the logged steps
    errors: dict  # the fitted deterministic model
    level_errors: dict  # the fitted model x its decode levels
    jittered_mean_bias: dict  # per kind: model x levels x mean jitter factor / measured mean - 1
    kv_blocks: int
    lengths_from_requests: bool
    warm_shapes: int  # "new" prefill shapes that ran warm (met before logging)
    new_shapes: int
    fitted_steps: int  # steps the fit used (all, or a subset: cross-validation)
    rebuilt_decode: tuple[int, int] = (0, 0)  # decode steps priced at their longest context, of all


def subset(rows: StepRows, mask: np.ndarray) -> StepRows:
    return StepRows(rows.kind[mask], rows.seqs[mask], rows.gpu_ms[mask], rows.new_shapes[mask],
                    rows.measured_ms[mask], rows.log[mask])


def fit_rows(base: RuntimeSpec, layers: int, rows: StepRows,
             name: str) -> tuple[RuntimeSpec, StepRows, np.ndarray]:
    """The live terms fitted to `rows`, steps whose "new" prefill shapes ran warm counted as
    seen (see the module docstring): (runtime without jitter, rows as fitted, warm per step)."""
    rt = fit_runtime(base, layers, rows, name)
    warm = warm_shapes(rows, predict_ms(rt, layers, rows), rt.serial_ms_per_new_prefill_shape)
    if warm.any():  # count them as seen, and fit again
        rows = replace(rows, new_shapes=rows.new_shapes - warm)
        rt = fit_runtime(base, layers, rows, name)
    return rt, rows, warm


@dataclass
class LogRows:
    """One or several serving logs as model inputs."""

    rows: StepRows
    kv_blocks: int  # the first log's KV pool
    lengths_from_requests: bool
    rebuilt_decode: tuple[int, int]
    names: list[str]  # each log as "steps.csv" or "steps.csv + requests.csv"


def read_logs(steps_csv, requests_csv, model: ModelSpec, profile: GPUProfile,
              prefill_impl: str = "flash", decode_impl: str = "paged_reference",
              elementwise: str = "as_measured") -> LogRows:
    """`steps_csv`: a steps log or a list of them; `requests_csv`: its requests log (or
    None), a list of the same length when `steps_csv` is a list."""
    many = isinstance(steps_csv, list | tuple)
    steps_list = list(steps_csv) if many else [steps_csv]
    req_list = list(requests_csv) if isinstance(requests_csv, list | tuple) else [requests_csv]
    if len(req_list) != len(steps_list):
        req_list = (req_list + [None] * len(steps_list))[:len(steps_list)]
    parts, kv, rebuilt, decodes = [], 0, 0, 0
    for i, (s_csv, r_csv) in enumerate(zip(steps_list, req_list, strict=True)):
        steps = read_steps_log(s_csv)
        requests = read_requests_log(r_csv) if r_csv else None
        lengths = prefill_lengths(steps, requests)
        longest = decode_max_ctx(steps, requests)
        parts.append(step_rows(steps, lengths, model, profile, prefill_impl, decode_impl,
                               longest, elementwise))
        if i == 0:
            kv = kv_blocks(steps, lengths)
        rebuilt += int((longest > 0).sum())
        decodes += int((steps.kind == "decode").sum())
    return LogRows(concat(parts) if many else parts[0], kv, all(r is not None for r in req_list),
                   (rebuilt, decodes), [Path(p).name + (f" + {Path(r).name}" if r else "")
                                        for p, r in zip(steps_list, req_list, strict=True)])


def fit_log(steps_csv, requests_csv, model: ModelSpec,
            profile: GPUProfile, base: RuntimeSpec, name: str, prefill_impl: str = "flash",
            decode_impl: str = "paged_reference", fit_steps: np.ndarray | None = None) -> LogFit:
    """`steps_csv`, `requests_csv`: one log (paths) or several (lists; see read_logs), fitted
    as one. `fit_steps`: a mask of the logs' steps to fit to (default all); the errors are
    those of the same steps. New shapes are counted over each whole log in order."""
    logs = read_logs(steps_csv, requests_csv, model, profile, prefill_impl, decode_impl,
                     base.elementwise)
    everything = logs.rows
    rows = everything if fit_steps is None else subset(everything, np.asarray(fit_steps, bool))
    rt, rows, warm = fit_rows(base, model.layers, rows, name)
    pred = predict_ms(rt, model.layers, rows)
    names = "; ".join(logs.names)
    steps_names = "; ".join(n.split(" + ")[0] for n in logs.names)
    jitter = fit_jitter(rows, pred, f"measured / modelled step time on {steps_names}")
    rt = replace(rt, jitter=jitter, description=f"{base.description} (live: fitted to a serving log)",
                 source=(
        f"fitted by llmsim fit-log to {names}"
        + f" on {profile.name}, on top of {base.name} ({base.source})"))
    leveled = pred * level_factors(jitter, rows)
    bias = {}
    for kind in KINDS:
        sel = rows.kind == kind
        if sel.any():
            mean = mean_factor(getattr(jitter, kind))
            bias[kind] = float(leveled[sel].mean() * mean / rows.measured_ms[sel].mean() - 1)
    return LogFit(rt, errors_by_kind(rows, predict_ms(base, model.layers, rows)),
                  errors_by_kind(rows, pred), errors_by_kind(rows, leveled), bias,
                  logs.kv_blocks, logs.lengths_from_requests, int(warm.sum()),
                  int(rows.new_shapes.sum() + warm.sum()), len(rows.kind), logs.rebuilt_decode)


def format_fit(f: LogFit) -> str:
    rt, jit = f.runtime, f.runtime.jitter
    lines = [f"{'':16}{'steps':>6} {'mean|err|':>10} {'median|err|':>12} {'bias':>7} "
             f"{'meas mean/median ms':>20} {'model mean/median ms':>21}"]
    for label, errs in ((f"base {rt.source.split('on top of ')[-1].split(' (')[0]}", f.base_errors),
                        ("fitted", f.errors), ("fitted x decode levels", f.level_errors)):
        lines.append(label)
        for kind, e in errs.items():
            lines.append(f"  {kind:14}{e['steps']:6d} {e['mean_abs']:10.1%} {e['median_abs']:12.1%} "
                         f"{e['bias']:+7.1%} {e['measured_mean_ms']:9.1f} / {e['measured_median_ms']:<8.1f}"
                         f"{e['model_mean_ms']:10.1f} / {e['model_median_ms']:<8.1f}")
    rebuilt, decodes = f.rebuilt_decode
    if rebuilt < decodes:  # preemptions or no requests log: the rest priced as equal lengths
        lines.append(f"decode batches rebuilt from the requests log: {rebuilt} of {decodes} "
                     "(the others priced as equal lengths: no requests log, a preemption, "
                     "or a batch that does not match its row)")
    lines.append("fitted x levels x jitter: mean bias " + ", ".join(
        f"{k} {v:+.1%}" for k, v in f.jittered_mean_bias.items()))
    lines.append(f"live terms: serial {rt.serial_ms_per_step:g} ms/step + {rt.serial_ms_per_seq:g} ms/seq, "
                 f"{rt.serial_ms_per_new_prefill_shape:g} ms per new prefill shape; host "
                 f"+{rt.host_ms_per_prefill_seq:g} ms/prefill seq, +{rt.host_ms_per_decode_seq:g} "
                 f"ms/decode seq; gpu scale {rt.gpu_scale:g} (prefill), {rt.gpu_scale_decode:g} (decode)")
    lines.append("not fitted: per-TP-rank terms (a log at one TP degree cannot separate them "
                 "from the per-step terms; they need logs at two or more TP degrees)")
    lines.append(f"new prefill shapes that ran warm (met before logging; counted as seen, not "
                 f"modelled): {f.warm_shapes} of {f.new_shapes}")
    lines.append("decode levels (batch up to: factor): " + (", ".join(
        f"{b.max_seqs}: {b.factor:g}" for b in jit.decode_levels) or "none"))
    lines.append("persistence (stay, share): " + ", ".join(
        f"{k} {p.stay:g}, {p.share:g}" for k, p in (("decode", jit.decode_persistence),
                                                    ("prefill", jit.prefill_persistence))))
    lines.append(f"KV pool in the log: {f.kv_blocks} blocks; prefill lengths from "
                 + ("the requests log" if f.lengths_from_requests else "equal splits (no requests log)")
                 )
    return "\n".join(lines)
