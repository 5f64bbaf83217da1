"""Fit a runtime (host-overhead) profile to measured whole-iteration latencies.

A measured grid (`model,kind,batch,new_tokens,ctx,ms`: prefill steps of
`batch` prompts of `new_tokens`, decode steps of `batch` sequences at context
`ctx`, verify steps of `new_tokens` per sequence over `ctx`) is compared with
the step model's GPU time for the same steps; the host parameters of
`RuntimeSpec` are chosen to minimise the mean absolute relative error of

    step = max(host_ms_per_step + host_ms_per_layer * L + host_ms_per_layer_decode_extra * L * [decode]
               + (host_ms_per_prefill_seq_layer * P + host_ms_per_verify_seq_layer * V) * L,
               (gpu_scale_decode if decode else gpu_scale) * gpu_ms)

(P, V = sequences in a prefill or verify row: their attention is launched per sequence).
`python -m sim.cli.maintain runtime-fit GRID.csv --gpu h200-sxm --name NAME` prints the
error table and writes `gpu_profiles/runtimes/NAME.yaml`.
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

from sim.costmodel.latency import StepLatency
from sim.costmodel.models import load_model
from sim.costmodel.profiles import load_profile
from sim.costmodel.runtime import RuntimeSpec
from sim.io.specload import SpecError

# model names used by measured grids -> models/ specs
GRID_MODELS = {"llama3-8b": "llama-3-8b", "llama3-1b": "llama-3.2-1b"}


def read_grid(path: str | Path) -> list[dict]:
    rows = []
    with open(path, newline="") as f:
        for i, r in enumerate(csv.DictReader(f), start=2):
            try:
                rows.append({
                    "model": GRID_MODELS.get(r["model"], r["model"]), "kind": r["kind"],
                    "batch": int(r["batch"]), "new_tokens": int(r["new_tokens"]),
                    "ctx": int(r["ctx"]), "ms": float(r["ms"]),
                })
            except (KeyError, ValueError) as e:
                raise SpecError(path, f"line {i}", f"bad row ({e})") from None
    return rows


def gpu_times(rows: list[dict], gpu: str, prefill_impl="flash", decode_impl="paged_reference",
              verify_impl="paged_gather", elementwise="unfused") -> np.ndarray:
    """Kernel times of the grid's steps; `elementwise`: the kernels its stack ran (an eager
    reference model runs RMSNorm, SiLU*mul and adds as PyTorch ops: unfused)."""
    profile = load_profile(gpu)
    zero = RuntimeSpec(name="kernels", elementwise=elementwise)
    lats: dict[str, StepLatency] = {}
    out = []
    for r in rows:
        m = r["model"]
        if m not in lats:
            lats[m] = StepLatency(load_model(m), profile, zero, prefill_impl, decode_impl,
                                  verify_impl=verify_impl)
        out.append(lats[m].gpu_ms(r["kind"], r["batch"], r["new_tokens"], r["ctx"]))
    return np.array(out)


def _join(host, gpu, combine: str):
    return host + gpu if combine == "sum" else np.maximum(host, gpu)


def predict(spec: RuntimeSpec, gpu_ms: np.ndarray, layers: np.ndarray, prefill_seqs: np.ndarray,
            verify_seqs: np.ndarray) -> np.ndarray:
    decode = (prefill_seqs + verify_seqs) == 0
    host = spec.host_ms_per_step + spec.host_ms_per_layer * layers
    host = host + spec.host_ms_per_layer_decode_extra * decode * layers
    host = host + (spec.host_ms_per_prefill_seq_layer * prefill_seqs
                   + spec.host_ms_per_verify_seq_layer * verify_seqs) * layers
    scale = np.where(decode, spec.gpu_scale_decode, spec.gpu_scale)
    return _join(host, scale * gpu_ms, spec.combine)


def _search(model, ranges: list[np.ndarray], rounds: int = 5) -> tuple[float, ...]:
    """Coarse-to-fine grid search minimising mean squared relative error (unbiased on
    average, which is what TPOT and throughput depend on)."""
    best: tuple[float, tuple[float, ...]] = (np.inf, ())
    for _round in range(rounds):
        cols = [x.ravel()[:, None] for x in np.meshgrid(*ranges, indexing="ij")]
        err = model(*cols)
        i = int(err.argmin())
        if err[i] < best[0]:
            best = (float(err[i]), tuple(float(c[i, 0]) for c in cols))
        ranges = [np.linspace(max(0.0, v - 2 * (r[1] - r[0])), v + 2 * (r[1] - r[0]), 9)
                  for v, r in zip(best[1], ranges, strict=True)]
    return best[1]


def fit(rows: list[dict], gpu: str, name: str, kinds=("prefill", "decode", "verify"),
        combine: str = "max", **impls) -> tuple[RuntimeSpec, list[dict]]:
    """Prefill and verify rows fix the shared host terms; decode rows then fit decode's own
    extra host cost and GPU scale. `combine`: max (a GPU) or sum (a CPU; see RuntimeSpec)."""
    rows = [r for r in rows if r["kind"] in kinds]
    g = gpu_times(rows, gpu, **impls)
    L = np.array([load_model(r["model"]).layers for r in rows], dtype=float)
    P = np.array([r["batch"] if r["kind"] == "prefill" else 0 for r in rows], dtype=float)
    V = np.array([r["batch"] if r["kind"] == "verify" else 0 for r in rows], dtype=float)
    y = np.array([r["ms"] for r in rows])
    dec = (P + V) == 0
    nd = ~dec if (~dec).any() else dec

    ranges = {"a": np.linspace(0, 5, 11), "b": np.linspace(0, 1.5, 16), "c": np.linspace(0, 0.2, 5),
              "d": np.linspace(0, 0.4, 9), "s": np.linspace(0.5, 2.0, 16)}
    # a per-sequence term with no rows of its kind changes no prediction: not searched, 0
    # (the value the full search settles on, its first among equal errors)
    fixed = {k: 0.0 for k, seqs in (("c", P[nd]), ("d", V[nd])) if not seqs.any()}
    free = [k for k in ranges if k not in fixed]

    def multi(*values):
        t = {**fixed, **dict(zip(free, values, strict=True))}
        pred = _join(t["a"] + t["b"] * L[nd] + (t["c"] * P[nd] + t["d"] * V[nd]) * L[nd],
                     t["s"] * g[nd], combine)
        return ((pred / y[nd] - 1) ** 2).mean(axis=1)

    found = {**fixed, **dict(zip(free, _search(multi, [ranges[k] for k in free]), strict=True))}
    a, b, c, d, s = (found[k] for k in "abcds")
    e, sd = 0.0, s
    if dec.any():
        def decode(e, sd):
            pred = _join(a + (b + e) * L[dec], sd * g[dec], combine)
            return ((pred / y[dec] - 1) ** 2).mean(axis=1)

        e, sd = _search(decode, [np.linspace(0, 0.2, 21), np.linspace(0.5, 2.0, 16)])
    spec = RuntimeSpec(name=name, host_ms_per_step=round(a, 4), host_ms_per_layer=round(b, 4),
                       host_ms_per_layer_decode_extra=round(e, 5),
                       host_ms_per_prefill_seq_layer=round(c, 5),
                       host_ms_per_verify_seq_layer=round(d, 5), gpu_scale=round(s, 4),
                       gpu_scale_decode=round(sd, 4), combine=combine,
                       elementwise=impls.get("elementwise", "unfused"))
    pred = predict(spec, g, L, P, V)
    table = [{**r, "gpu_ms": gi, "pred_ms": p, "err": p / r["ms"] - 1}
             for r, gi, p in zip(rows, g, pred, strict=True)]
    return spec, table


def error_summary(table: list[dict]) -> dict[str, dict[str, float]]:
    out = {}
    for key in sorted({(t["model"], t["kind"]) for t in table}):
        e = np.array([t["err"] for t in table if (t["model"], t["kind"]) == key])
        out[f"{key[0]} {key[1]}"] = _err_stats(e)
    out["all"] = _err_stats(np.array([t["err"] for t in table]))
    return out


def _err_stats(e: np.ndarray) -> dict[str, float]:
    return {"rows": len(e), "mape": float(np.abs(e).mean()), "bias": float(e.mean()),
            "max": float(np.abs(e).max())}


def format_table(table: list[dict]) -> str:
    lines = [f"{'model':14} {'kind':8} {'batch':>5} {'new':>5} {'ctx':>5} {'measured':>9} "
             f"{'gpu':>8} {'model':>8} {'error':>7}"]
    for t in table:
        lines.append(f"{t['model']:14} {t['kind']:8} {t['batch']:5d} {t['new_tokens']:5d} "
                     f"{t['ctx']:5d} {t['ms']:9.2f} {t['gpu_ms']:8.2f} {t['pred_ms']:8.2f} "
                     f"{t['err']:+7.1%}")
    return "\n".join(lines)
