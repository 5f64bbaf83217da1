"""Fit a runtime to request-level and aggregate serving outputs (sim/fit/requestlogs.py).

What these can fit, and what they cannot (they carry no per-step times):

* **decode terms from load points**: each point is a mean decode step (the mean time
  between a running request's tokens) at a mean running batch and context. Over points at
  several batch sizes the decode model of sim/fit/logfit.py (host per decode sequence,
  GPU scale of decode's kernel time — the per-token term —, serial per step and per
  sequence) is fitted to them as to logged decode steps. One point fixes one number: with
  fewer than MIN_POINTS_FULL points only the per-step term and the GPU scale are fitted,
  the per-sequence terms stay the base runtime's. Prefill interference is inside each
  point (see requestlogs), so the fitted terms hold for similar traffic mixes.
* **per-request latency from TTFT at low load**: with at most LOW_LOAD_BATCH requests
  running, a request's TTFT is its per-request cost outside the step loop plus one
  prefill step of its prompt; TTFT minus the modelled prefill, fitted as a + k x prompt
  (least squares, both >= 0), gives `request.receive_ms` (a: HTTP, scheduling, first-chunk
  streaming together; a TTFT cannot separate receive from chunk) and
  `request.tokenize_us_per_prompt_token` (k). Needs per-request records at low load.
* **not fittable** from these: prefill's own terms (no prefill step is timed alone), the
  per-new-shape stall, jitter tables and their persistence, per-TP-rank terms (one TP
  degree per run).

Each fit is cross-validated by leaving one load point out (the held-out point predicted
from the others), printed beside the in-sample error.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from sim.costmodel.latency import StepLatency
from sim.costmodel.models import ModelSpec
from sim.costmodel.profiles import GPUProfile
from sim.costmodel.runtime import RequestLatencySpec, RuntimeSpec, Sourced
from sim.fit.logfit import StepRows, predict_ms
from sim.fit.requestlogs import LoadPoint, RequestLog
from sim.fit.runtime_fit import _search
from sim.io.specload import SpecError

MIN_POINTS_FULL = 6
LOW_LOAD_BATCH = 1.5  # a closed loop of one user (no other request to wait behind)


@dataclass
class RequestFit:
    runtime: RuntimeSpec
    points: list[LoadPoint]
    in_sample: np.ndarray  # relative error per point, fitted model
    held_out: np.ndarray  # leave-one-point-out relative error per point (nan: too few)
    base_error: np.ndarray  # the base runtime per point
    full: bool  # all four decode terms fitted (else per-step + GPU scale)
    ttft_requests: int  # low-load requests behind the request latency (0: not fitted)
    ttft_residual_ms: float  # their median TTFT minus modelled prefill


def decode_rows(points: list[LoadPoint], model: ModelSpec, profile: GPUProfile,
                base: RuntimeSpec, context: float | None, decode_impl: str) -> StepRows:
    kernels = StepLatency(model, profile, RuntimeSpec(name="kernels", elementwise=base.elementwise),
                          "flash", decode_impl)
    gpu, seqs = [], []
    for p in points:
        ctx = p.ctx if math.isfinite(p.ctx) else context
        if ctx is None:
            raise SpecError(p.source, "", "context per sequence unknown for this format "
                            "(pass --context TOKENS: mean prompt + half the mean output)")
        n = max(1, int(round(p.batch)))
        c = max(1, int(round(ctx)))
        gpu.append(kernels.dense_ms(n) + kernels.lm_head_ms(n) + kernels.decode_attn_ms(n, n * c, c))
        seqs.append(n)
    k = len(points)
    return StepRows(np.array(["decode"] * k), np.array(seqs, float), np.array(gpu),
                    np.zeros(k), np.array([p.step_ms for p in points]))


def fit_decode(base: RuntimeSpec, layers: int, rows: StepRows, weights: np.ndarray,
               full: bool) -> RuntimeSpec:
    """Decode terms minimising the weighted mean |relative error| over the points."""
    y, n, g = rows.measured_ms, rows.seqs, rows.gpu_ms
    w = weights / weights.sum()
    hdec = base.host_ms_per_step + (base.host_ms_per_layer + base.host_ms_per_layer_decode_extra) * layers
    join = (lambda h, x: h + x) if base.combine == "sum" else np.maximum

    b = base

    def pull(gd, ss=b.serial_ms_per_step, hd=b.host_ms_per_decode_seq, sq=b.serial_ms_per_seq):
        """A tie-break toward the base runtime where the points cannot tell (e.g. the GPU
        scale of a host-bound step): 0.1 % of error per unit of relative change."""
        return 1e-3 * (np.abs(gd / b.gpu_scale_decode - 1) + np.abs(ss - b.serial_ms_per_step) / 10
                       + np.abs(hd - b.host_ms_per_decode_seq) + np.abs(sq - b.serial_ms_per_seq))

    if full:
        def err(hd, gd, ss, sq):
            pred = join(hdec + hd * n, gd * g) + ss + sq * n
            return (np.abs(pred / y - 1) * w).sum(axis=1) + pull(gd, ss, hd, sq).ravel()

        hd, gd, ss, sq = _search(err, [np.linspace(0, 0.4, 9), np.linspace(0.3, 3.0, 10),
                                       np.linspace(0, 20, 9), np.linspace(0, 0.4, 9)], 6)
    else:
        hd, sq = base.host_ms_per_decode_seq, base.serial_ms_per_seq

        def err2(gd, ss):
            pred = join(hdec + hd * n, gd * g) + ss + sq * n
            return (np.abs(pred / y - 1) * w).sum(axis=1) + pull(gd, ss).ravel()

        gd, ss = _search(err2, [np.linspace(0.3, 3.0, 10), np.linspace(0, 20, 9)], 6)
    return replace(base, host_ms_per_decode_seq=round(hd, 5), gpu_scale_decode=round(max(gd, 0.05), 4),
                   serial_ms_per_step=round(ss, 4), serial_ms_per_seq=round(sq, 5), jitter=None)


def request_latency(logs: list[RequestLog], lat: StepLatency) -> tuple[RequestLatencySpec | None, int, float]:
    """(spec, requests used, median residual ms) from TTFT at low load (module docstring)."""
    recs = [r for log in logs for p in log.points[:1] if p.batch <= LOW_LOAD_BATCH
            for r in log.requests]
    if len(recs) < 3:
        return None, 0, math.nan
    x = np.array([r.input_len for r in recs], float)
    resid = np.array([r.ttft_s - lat.prefill([(r.input_len, 0)]) for r in recs]) * 1e3
    if np.ptp(x) > 0:
        k, a = np.polyfit(x, resid, 1)
    else:
        k, a = 0.0, float(np.mean(resid))
    if k < 0:
        k, a = 0.0, float(np.mean(resid))
    a = max(a, 0.0)
    src = (f"llmsim fit-log: TTFT minus the modelled prefill of {len(recs)} requests at <= "
           f"{LOW_LOAD_BATCH:g} running (least squares a + k x prompt)")
    spec = RequestLatencySpec(receive_ms=Sourced(round(float(a), 3), src),
                              tokenize_us_per_prompt_token=Sourced(round(float(k) * 1e3, 4), src))
    return spec, len(recs), float(np.median(resid))


def fit_request_logs(logs: list[RequestLog], model: ModelSpec, profile: GPUProfile,
                     base: RuntimeSpec, name: str, context: float | None = None,
                     decode_impl: str = "paged_reference") -> RequestFit:
    points = [p for log in logs for p in log.points]
    if not points:
        raise SpecError(logs[0].path if logs else None, "", "no load point (a run's batch is "
                        "unknown: per-request start times, --max-concurrency, or a running gauge)")
    rows = decode_rows(points, model, profile, base, context, decode_impl)
    w = np.array([p.weight for p in points], float)
    full = len(points) >= MIN_POINTS_FULL
    rt = fit_decode(base, model.layers, rows, w, full)
    pred = predict_ms(rt, model.layers, rows)
    held = np.full(len(points), np.nan)
    if len(points) >= 3:
        for i in range(len(points)):
            keep = np.arange(len(points)) != i
            sub = StepRows(rows.kind[keep], rows.seqs[keep], rows.gpu_ms[keep], rows.new_shapes[keep],
                           rows.measured_ms[keep])
            f = fit_decode(base, model.layers, sub, w[keep], len(points) - 1 >= MIN_POINTS_FULL)
            one = StepRows(rows.kind[i:i + 1], rows.seqs[i:i + 1], rows.gpu_ms[i:i + 1],
                           rows.new_shapes[i:i + 1], rows.measured_ms[i:i + 1])
            held[i] = predict_ms(f, model.layers, one)[0] / rows.measured_ms[i] - 1
    lat = StepLatency(model, profile, rt, "flash", decode_impl)
    req, used, resid = request_latency(logs, lat)
    files = ", ".join(sorted({log.path.rsplit("/", 1)[-1] for log in logs}))
    rt = replace(rt, name=name, request=req if req is not None else base.request,
                 description=f"{base.description} (decode terms fitted to request-level outputs)",
                 source=f"fitted by llmsim fit-log to {files} ({', '.join(sorted({lg.format for lg in logs}))}) "
                 f"on {profile.name}, on top of {base.name} ({base.source})")
    return RequestFit(rt, points, pred / rows.measured_ms - 1, held,
                      predict_ms(base, model.layers, rows) / rows.measured_ms - 1, full, used, resid)


def format_request_fit(f: RequestFit) -> str:
    rt = f.runtime
    lines = [f"{'load point':34} {'batch':>7} {'ctx':>7} {'measured ms':>12} {'base':>8} "
             f"{'fitted':>8} {'held-out':>9}"]
    for p, b, e, h in zip(f.points, f.base_error, f.in_sample, f.held_out, strict=True):
        lines.append(f"{p.source[:34]:34} {p.batch:7.1f} {p.ctx:7.0f} {p.step_ms:12.2f} {b:+8.1%} "
                     f"{e:+8.1%} " + ("        -" if math.isnan(h) else f"{h:+9.1%}"))
    ok = ~np.isnan(f.held_out)
    lines.append(f"mean |error| over {len(f.points)} points: base {np.abs(f.base_error).mean():.1%}, "
                 f"fitted (in-sample) {np.abs(f.in_sample).mean():.1%}, leave-one-point-out "
                 + (f"{np.abs(f.held_out[ok]).mean():.1%}" if ok.any() else "- (needs 3 points)"))
    lines.append(("fitted: " if f.full else f"fitted (fewer than {MIN_POINTS_FULL} points: per-step "
                  "and GPU scale only): ")
                 + f"serial {rt.serial_ms_per_step:g} ms/step + {rt.serial_ms_per_seq:g} ms/seq, "
                 f"host +{rt.host_ms_per_decode_seq:g} ms/decode seq, decode gpu scale {rt.gpu_scale_decode:g}")
    if f.ttft_requests:
        r = rt.request
        lines.append(f"per-request latency from TTFT at low load ({f.ttft_requests} requests, "
                     f"median TTFT - modelled prefill {f.ttft_residual_ms:.1f} ms): receive "
                     f"{r.receive_ms.value:g} ms + {r.tokenize_us_per_prompt_token.value:g} us/prompt token")
    else:
        lines.append("per-request latency: not fitted (needs per-request records from a run with "
                     f"<= {LOW_LOAD_BATCH:g} requests running)")
    lines.append("not fittable from request-level data: prefill terms, the new-shape stall, jitter, "
                 "per-TP-rank terms")
    return "\n".join(lines)
