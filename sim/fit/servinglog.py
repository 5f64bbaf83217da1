"""The serving-log format (docs/calibration.md, "Serving logs"): reading it, rebuilding
each step's batch from it, and writing a run in it.

A steps log has one row per iteration, `t_start,t_end,kind,num_seqs,num_tokens,sum_ctx,
free_blocks`; an optional requests log has one row per request,
`id,arrival_s,prompt_tokens,output_tokens,admitted_s,first_token_s,...`. A prefill
step's per-sequence prompt lengths are not in the steps log; the requests log gives them
(the requests whose `admitted_s` is the step's `t_start`). Without it a prefill step is
taken as `num_seqs` equal prompts. `llmsim fit-log` (sim/fit/logfit.py) fits a runtime to
such a log; `llmsim validate --replay` (sim/fit/replay.py) compares one with the simulator.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from sim.io.specload import SpecError, is_file

STEP_LOG_COLUMNS = ["t_start", "t_end", "kind", "num_seqs", "num_tokens", "sum_ctx", "free_blocks"]
REQUEST_LOG_COLUMNS = ["id", "arrival_s", "prompt_tokens", "output_tokens", "admitted_s",
                       "first_token_s", "finish_s", "ttft_s", "e2e_s", "tpot_s", "preemptions"]
KINDS = ("prefill", "decode")


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
            raise SpecError(p, f"line {bad + 2}", f"{c}: not a number")
        if c != "kind":
            values = df[c].to_numpy(dtype=float)
            finite = np.isfinite(values)
            if not finite.all():
                bad = int((~finite).argmax())
                raise SpecError(p, f"line {bad + 2}", f"{c}: not finite "
                                "(allowed: finite numbers)")
    return df


def read_steps_log(path: str | Path) -> pd.DataFrame:
    df = _read(path, STEP_LOG_COLUMNS)
    bad = ~df.kind.isin(KINDS)
    if bad.any():
        i = int(bad.to_numpy().argmax())
        raise SpecError(path, f"line {i + 2}", "kind: not a step kind (allowed: prefill, decode)")
    _check_rows(path, [
        (df.t_end < df.t_start, "t_end before t_start"),
        (df.num_seqs < 1, "num_seqs < 1 (allowed: a whole number >= 1)"),
        *_counts(df, ("num_seqs", "num_tokens", "sum_ctx", "free_blocks"))])
    return df


def read_requests_log(path: str | Path) -> pd.DataFrame:
    df = _read(path, REQUEST_LOG_COLUMNS)
    _check_rows(path, [
        (df.prompt_tokens < 1, "prompt_tokens < 1 (allowed: a whole number >= 1)"),
        (df.first_token_s < df.arrival_s, "first_token_s before arrival_s"),
        (df.finish_s < df.first_token_s, "finish_s before first_token_s"),
        *_counts(df, ("prompt_tokens", "output_tokens", "preemptions"))])
    return df


def _counts(df: pd.DataFrame, columns: tuple[str, ...]) -> list[tuple[pd.Series, str]]:
    """Rules that token, sequence and block counts are whole numbers >= 0."""
    return [((df[c] < 0) | (df[c] != np.floor(df[c])), f"{c} is not a whole number >= 0")
            for c in columns]


def _check_rows(path: str | Path, rules: list[tuple[pd.Series, str]]) -> None:
    """The first row (by line) that breaks a rule, as one line."""
    broken = [(int(bad.to_numpy().argmax()), message) for bad, message in rules if bad.any()]
    if broken:
        i, message = min(broken)
        raise SpecError(path, f"line {i + 2}", message)


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


def decode_max_ctx(steps: pd.DataFrame, requests: pd.DataFrame | None) -> np.ndarray:
    """Each decode step's longest context, rebuilt from the requests log (a request decodes
    in every decode step from its first token to its finish; its context after its k-th
    decode step is prompt + k, as `sum_ctx` counts it); 0 where the log does not say
    (no requests log, preemptions, or a step whose rebuilt batch does not match its row)."""
    out = np.zeros(len(steps))
    if requests is None or requests.preemptions.any():
        return out
    dec = np.flatnonzero(steps.kind.to_numpy() == "decode")
    start, end = steps.t_start.to_numpy(float)[dec], steps.t_end.to_numpy(float)[dec]
    count, total, longest = np.zeros(len(dec)), np.zeros(len(dec)), np.zeros(len(dec))
    for prompt, first, finish in zip(requests.prompt_tokens, requests.first_token_s,
                                     requests.finish_s, strict=True):
        a, b = np.searchsorted(start, first - 1e-9), np.searchsorted(end, finish + 1e-9)
        ctx = prompt + np.arange(1, b - a + 1)
        count[a:b] += 1
        total[a:b] += ctx
        longest[a:b] = np.maximum(longest[a:b], ctx)
    match = (count == steps.num_seqs.to_numpy()[dec]) & (total == steps.sum_ctx.to_numpy()[dec])
    out[dec] = np.where(match, longest, 0)
    return out


def write_serving_log(folder: str | Path, requests: pd.DataFrame, steps: pd.DataFrame,
                      sum_ctx: list[int], num_blocks: int) -> None:
    """Write a run (simulator frames of sim/engine/metrics.py) in the serving-log format:
    `serving_steps.csv` and `serving_requests.csv` (the reference engine's runs)."""
    folder = Path(folder)
    log = steps[["t_start", "t_end", "kind", "num_seqs", "num_tokens"]].copy()
    log["sum_ctx"] = np.where(log.kind == "decode", sum_ctx, 0)
    log["free_blocks"] = num_blocks - steps.kv_blocks_used
    log.to_csv(folder / "serving_steps.csv", index=False, float_format="%.6f")
    req = requests.assign(admitted_s=requests.arrival_s + requests.queue_s)
    req[REQUEST_LOG_COLUMNS].to_csv(folder / "serving_requests.csv", index=False, float_format="%.6f")
