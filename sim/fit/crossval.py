"""Cross-validation of `llmsim fit-log` inside its own logs: fit on part, predict the rest.

A fit that reproduces the steps it was fitted to says little about steps it has not seen
(the live runtime's in-sample error is 1-3 %, its error on other runs of the same stack
-18..+10 % on TPOT). Each fold refits the mechanisms of sim/fit/logfit.py (per step, per
sequence, per new prompt shape, GPU scale per token's kernel time, decode levels by batch
band) on the fold's steps and prices the held-out steps with the refitted model (× its
decode levels), printing the held-out error beside the in-sample error:

    time      k blocked folds in log order (contiguous blocks of each kind's steps: the
              held-out block is a stretch of time the fit never saw, not interleaved
              steps whose neighbours it did)
    load      fit on the steps at or below the median running batch, predict those above
              (low load -> high load), and the reverse: extrapolation in load
    log       with several logs: leave one log out, predict it from the others

A step's load is its running batch (`running_seqs`): a decode step's sequences, a prefill
step's own plus the decode batch it interrupted.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sim.costmodel.runtime import RuntimeSpec
from sim.fit.logfit import (
    StepRows,
    errors_by_kind,
    fit_jitter,
    fit_rows,
    level_factors,
    predict_ms,
    running_seqs,
    subset,
)

TIME_FOLDS = 5
MIN_FIT_STEPS = 20  # a fold with fewer steps to fit to is skipped


@dataclass(frozen=True)
class Fold:
    name: str
    group: str  # time | load | log
    fit: np.ndarray  # mask of the steps fitted to; the rest are held out


@dataclass(frozen=True)
class FoldResult:
    fold: Fold
    in_sample: dict  # kind -> error stats (errors_by_kind) on the fitted steps
    held_out: dict  # the same on the held-out steps
    runtime: RuntimeSpec  # the fold's fitted runtime (with its jitter model)


def time_folds(kind: np.ndarray, k: int = TIME_FOLDS) -> list[Fold]:
    """k contiguous blocks in log order, cut within each step kind (a log's prefill steps
    bunch where requests arrive: blocks of all steps would hold them all out at once);
    block i of every kind is held out together."""
    held = [np.zeros(len(kind), bool) for _ in range(k)]
    for kd in np.unique(kind):
        idx = np.flatnonzero(kind == kd)
        edges = np.linspace(0, len(idx), k + 1).round().astype(int)
        for i in range(k):
            held[i][idx[edges[i]:edges[i + 1]]] = True
    return [Fold(f"time block {i + 1}/{k} held out", "time", ~h) for i, h in enumerate(held)]


def load_folds(load: np.ndarray) -> list[Fold]:
    """Low load -> high load and the reverse, split at the median running batch."""
    low = load <= np.median(load)
    if low.all() or not low.any():
        return []
    cut = float(np.median(load))
    return [Fold(f"fit batch <= {cut:g}, predict > {cut:g}", "load", low),
            Fold(f"fit batch > {cut:g}, predict <= {cut:g}", "load", ~low)]


def log_folds(log: np.ndarray, names: list[str] | None = None) -> list[Fold]:
    """Leave one log out (none with a single log)."""
    ids = np.unique(log)
    if len(ids) < 2:
        return []
    return [Fold(f"log {i + 1} ({names[i].split(' + ')[0] if names else i}) held out", "log",
                 log != i) for i in ids]


def default_folds(rows: StepRows, names: list[str] | None = None, k: int = TIME_FOLDS) -> list[Fold]:
    return (time_folds(rows.kind, k) + load_folds(running_seqs(rows))
            + log_folds(rows.log, names))


def cross_validate(base: RuntimeSpec, layers: int, rows: StepRows,
                   folds: list[Fold]) -> list[FoldResult]:
    """Each fold: fit on its steps (as fit-log does), then the error of the fitted model
    × its decode levels on the fitted steps and on the held-out ones."""
    out = []
    for fold in folds:
        if fold.fit.sum() < MIN_FIT_STEPS or fold.fit.all():
            continue
        rt, fitted, _ = fit_rows(base, layers, subset(rows, fold.fit), "cv")
        pred_in = predict_ms(rt, layers, fitted)
        jitter = fit_jitter(fitted, pred_in)
        held = subset(rows, ~fold.fit)
        pred_out = predict_ms(rt, layers, held) * level_factors(jitter, held)
        out.append(FoldResult(fold, errors_by_kind(fitted, pred_in * level_factors(jitter, fitted)),
                              errors_by_kind(held, pred_out), rt))
    return out


def held_out_errors(base: RuntimeSpec, layers: int, rows: StepRows, fold: Fold) -> np.ndarray:
    """Relative errors (modelled / measured - 1) of each held-out step of one fold."""
    rt, fitted, _ = fit_rows(base, layers, subset(rows, fold.fit), "cv")
    jitter = fit_jitter(fitted, predict_ms(rt, layers, fitted))
    held = subset(rows, ~fold.fit)
    return predict_ms(rt, layers, held) * level_factors(jitter, held) / held.measured_ms - 1


def summary(results: list[FoldResult]) -> dict[str, dict[str, float]]:
    """Per fold group and kind: step-weighted mean |error| in-sample and held out."""
    out: dict[str, dict[str, float]] = {}
    for group in dict.fromkeys(r.fold.group for r in results):
        for kind in ("prefill", "decode", "all"):
            sel = [r for r in results if r.fold.group == group and kind in r.held_out]
            if not sel:
                continue
            w_in = np.array([r.in_sample[kind]["steps"] if kind in r.in_sample else 0 for r in sel])
            w_out = np.array([r.held_out[kind]["steps"] for r in sel])
            m_in = np.array([r.in_sample[kind]["mean_abs"] if kind in r.in_sample else 0 for r in sel])
            m_out = np.array([r.held_out[kind]["mean_abs"] for r in sel])
            b_out = np.array([r.held_out[kind]["bias"] for r in sel])
            out[f"{group} {kind}"] = {
                "in_sample_mean_abs": float((w_in * m_in).sum() / max(w_in.sum(), 1)),
                "held_out_mean_abs": float((w_out * m_out).sum() / max(w_out.sum(), 1)),
                "held_out_bias": float((w_out * b_out).sum() / max(w_out.sum(), 1)),
                "held_out_steps": int(w_out.sum())}
    return out


def format_cv(results: list[FoldResult]) -> str:
    """The folds, held-out error beside in-sample error, then the per-group summary."""
    head = (f"{'cross-validation (fit on part, predict the rest)':52} {'kind':8} {'fit':>5} "
            f"{'held':>5} {'in-sample':>10} {'held-out':>9} {'held bias':>10}")
    lines = [head]
    for r in results:
        for kind in ("prefill", "decode"):
            if kind not in r.held_out:
                continue
            i = r.in_sample.get(kind, {"steps": 0, "mean_abs": float("nan")})
            o = r.held_out[kind]
            lines.append(f"{r.fold.name[:52]:52} {kind:8} {i['steps']:5d} {o['steps']:5d} "
                         f"{i['mean_abs']:10.1%} {o['mean_abs']:9.1%} {o['bias']:+10.1%}")
    lines.append("mean |error| by fold group (step-weighted), in-sample -> held-out:")
    for key, s in summary(results).items():
        lines.append(f"  {key:16} {s['in_sample_mean_abs']:6.1%} -> {s['held_out_mean_abs']:6.1%} "
                     f"(bias {s['held_out_bias']:+.1%}, {s['held_out_steps']} held-out steps)")
    return "\n".join(lines)
