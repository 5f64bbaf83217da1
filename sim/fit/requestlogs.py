"""What serving stacks emit without a per-iteration log, read as load points.

`llmsim fit-log` fits a runtime to per-step logs (sim/fit/servinglog.py). vLLM and SGLang do
not write those; they emit request-level and aggregate records. Each format here is read
into the same two things:

* `LoadPoint`: a measured decode operating point — mean running batch, mean context per
  sequence, mean time between a running request's tokens (ms) — what sim/fit/requestfit.py
  fits the per-step, per-sequence and per-token (GPU scale) decode terms to;
* `RequestRecord`s (per-request formats only): prompt length, output length, TTFT, mean
  ITL — whose TTFT at low load fits the per-request latency outside the step loop.

Formats (docs/calibration.md, "Request-level and aggregate inputs", says how to produce
each; test fixtures in tests/fixtures/requestlogs/ are written by hand in these formats):

    vllm-bench   vLLM `benchmark_serving.py` / `vllm bench serve` result JSON saved with
                 --save-result --save-detailed: per-request `input_lens`, `output_lens`,
                 `ttfts` (s), `itls` (list of s per request), `errors`; the run's
                 `max_concurrency` (closed loop) or per-request `start_times` give the batch
    aiperf       aiperf `profile_export.jsonl` (one record per line: `metrics` with
                 time_to_first_token, inter_token_latency, input_sequence_length,
                 output_sequence_length as {value, unit}; `metadata` request_start_ns /
                 request_end_ns), or an aggregate `profile_export_aiperf.json` /
                 genai-perf `profile_export_genai_perf.json` ({metric: {unit, avg, ...}})
    prometheus   vLLM `/metrics` scrapes in the Prometheus text format, one file per scrape
                 in time order (consecutive scrapes give an interval's means; one scrape gives
                 the means since the server started): vllm:time_per_output_token_seconds (or
                 vllm:inter_token_latency_seconds), vllm:time_to_first_token_seconds,
                 vllm:iteration_tokens_total histograms, vllm:num_requests_running gauge,
                 vllm:request_prompt_tokens / vllm:request_generation_tokens histograms
    server-log   a server log with periodic batch logging: SGLang's `Decode batch.
                 #running-req: N, #token: T, ... gen throughput (token/s): G` lines, or vLLM's
                 `Avg generation throughput: G tokens/s, Running: N reqs` stats lines; each
                 gives a point with step time N / G

Every time between a request's tokens includes whatever else its steps ran (prefill chunks
mixed into the same steps, or whole prefill steps between decode steps), so a point's
step time is the stack's decode step *at that load and traffic mix*, not a pure decode
step; fits from these carry that interference on average.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from sim.io.specload import SpecError, is_file

FORMATS = ("vllm-bench", "aiperf", "prometheus", "server-log")
UNIT_S = {"s": 1.0, "sec": 1.0, "seconds": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}


@dataclass(frozen=True)
class LoadPoint:
    source: str  # file (and interval) it came from
    batch: float  # mean running sequences
    ctx: float  # mean context per running sequence (tokens; nan: unknown)
    step_ms: float  # mean time between a running request's tokens
    weight: float  # tokens (or intervals) behind the mean


@dataclass(frozen=True)
class RequestRecord:
    input_len: int
    output_len: int
    ttft_s: float
    itl_s: float  # mean time between its tokens (nan for one-token outputs)
    start_s: float = math.nan
    end_s: float = math.nan


@dataclass(frozen=True)
class RequestLog:
    """One input file, read."""

    path: str
    format: str
    points: list[LoadPoint]
    requests: list[RequestRecord]  # empty for aggregate formats
    concurrency: float | None = None  # closed-loop users, where the file says


def _text(path: str | Path) -> str:
    p = Path(path)
    if not is_file(p):
        raise SpecError(p, "", "file not found")
    try:
        return p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise SpecError(p, "", f"unreadable ({e.__class__.__name__})") from None


def _json(path: str | Path, text: str):
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise SpecError(path, f"line {e.lineno}", f"not JSON ({e.msg})") from None


def detect(path: str | Path, text: str) -> str:
    """The format of a file, from its content."""
    head = text.lstrip()[:4000]
    if head.startswith("{") and '"ttfts"' in text:
        return "vllm-bench"
    if head.startswith("{") and ('"metrics"' in head or '"time_to_first_token"' in text):
        return "aiperf"
    if re.search(r"^vllm:\w+", text, re.M) or "# TYPE vllm:" in text:
        return "prometheus"
    if "#running-req:" in text or "Avg generation throughput:" in text:
        return "server-log"
    if head.startswith("{"):
        _json(path, text)  # a JSON error is reported as such
    raise SpecError(path, "", "not a known serving-output format (allowed: " + ", ".join(FORMATS)
                    + "; see docs/calibration.md, Request-level and aggregate inputs)")


def read(path: str | Path, fmt: str = "auto") -> RequestLog:
    text = _text(path)
    fmt = detect(path, text) if fmt == "auto" else fmt
    if fmt not in FORMATS:
        raise SpecError(path, "--format", f"{fmt!r} (allowed: auto, {', '.join(FORMATS)})")
    return {"vllm-bench": read_vllm_bench, "aiperf": read_aiperf, "prometheus": read_prometheus,
            "server-log": read_server_log}[fmt](path, text)


def _number(path, where: str, v, whole: bool = False, positive: bool = False) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v < 0:
        raise SpecError(path, where, f"{v!r} is not a finite number >= 0")
    if whole and v != int(v):
        raise SpecError(path, where, f"{v!r} is not a whole number")
    if positive and v <= 0:
        raise SpecError(path, where, f"{v!r} must be > 0")
    return float(v)


def _overlap_batch(recs: list[RequestRecord]) -> float | None:
    """Mean requests in decode over the time some request decodes (from start/end times)."""
    spans = [(r.start_s + r.ttft_s, r.end_s) for r in recs
             if math.isfinite(r.start_s) and math.isfinite(r.end_s) and r.end_s > r.start_s + r.ttft_s]
    if len(spans) < 2:
        return None
    ev = sorted([(a, 1) for a, _ in spans] + [(b, -1) for _, b in spans])
    busy = area = 0.0
    n, t0 = 0, ev[0][0]
    for t, d in ev:
        if n > 0:
            busy += t - t0
            area += n * (t - t0)
        n, t0 = n + d, t
    return area / busy if busy > 0 else None


def _bench_point(path, recs: list[RequestRecord], batch: float | None) -> list[LoadPoint]:
    """The run's decode point: token-weighted mean ITL at the run's batch."""
    dec = [r for r in recs if r.output_len > 1 and math.isfinite(r.itl_s)]
    if batch is None or not dec:
        return []
    w = np.array([r.output_len - 1 for r in dec], float)
    itl = float(np.sum(w * [r.itl_s for r in dec]) / w.sum())
    ctx = float(np.mean([r.input_len + r.output_len / 2 for r in dec]))
    return [LoadPoint(Path(path).name, batch, ctx, itl * 1e3, float(w.sum()))]


def read_vllm_bench(path, text: str) -> RequestLog:
    data = _json(path, text)
    if not isinstance(data, dict):
        raise SpecError(path, "", "not a vLLM benchmark result (expected a JSON object)")
    keys = ("input_lens", "output_lens", "ttfts", "itls")
    for k in keys:
        if not isinstance(data.get(k), list):
            raise SpecError(path, k, "missing or not a list (save the result with --save-result "
                            "--save-detailed to keep per-request fields)")
    n = len(data["ttfts"])
    for k in keys:
        if len(data[k]) != n:
            raise SpecError(path, k, f"{len(data[k])} entries, ttfts has {n} (one per request)")
    errors = data.get("errors") or [""] * n
    starts = data.get("start_times") or [None] * n
    recs = []
    for i in range(n):
        if errors[i] if i < len(errors) else "":
            continue  # a failed request
        itls = data["itls"][i]
        if not isinstance(itls, list):
            raise SpecError(path, f"itls[{i}]", "not a list of seconds")
        vals = [_number(path, f"itls[{i}][{j}]", v) for j, v in enumerate(itls)]
        ttft = _number(path, f"ttfts[{i}]", data["ttfts"][i])
        start = _number(path, f"start_times[{i}]", starts[i]) if starts[i] is not None else math.nan
        recs.append(RequestRecord(
            int(_number(path, f"input_lens[{i}]", data["input_lens"][i], whole=True, positive=True)),
            int(_number(path, f"output_lens[{i}]", data["output_lens"][i], whole=True)), ttft,
            float(np.mean(vals)) if vals else math.nan, start, start + ttft + sum(vals)))
    if not recs:
        raise SpecError(path, "errors", "no successful request in the result")
    conc = data.get("max_concurrency")
    conc = _number(path, "max_concurrency", conc, positive=True) if conc is not None else None
    batch = _overlap_batch(recs) or conc
    return RequestLog(str(path), "vllm-bench", _bench_point(path, recs, batch), recs, conc)


def _metric_s(path, where: str, m) -> float:
    if not isinstance(m, dict) or "value" not in m:
        raise SpecError(path, where, "expected {value, unit}")
    unit = str(m.get("unit", "ms"))
    if unit not in UNIT_S:
        raise SpecError(path, f"{where}.unit", f"{unit!r} (allowed: {', '.join(UNIT_S)})")
    return _number(path, f"{where}.value", m["value"]) * UNIT_S[unit]


def _find(obj, key: str):
    """The first value of `key` anywhere in nested dicts (None if absent)."""
    if isinstance(obj, dict):
        if key in obj and isinstance(obj[key], int | float):
            return obj[key]
        for v in obj.values():
            found = _find(v, key)
            if found is not None:
                return found
    return None


def read_aiperf(path, text: str) -> RequestLog:
    try:
        whole = json.loads(text)
    except json.JSONDecodeError:
        whole = None  # JSON lines
    if isinstance(whole, dict) and "metrics" not in whole:  # one object of metrics: aggregate
        return _aiperf_aggregate(path, whole)
    recs = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            raise SpecError(path, f"line {lineno}", f"not a JSON record ({e.msg})") from None
        if not isinstance(rec, dict) or not isinstance(rec.get("metrics"), dict):
            raise SpecError(path, f"line {lineno}", "no 'metrics' object (an aiperf "
                            "profile_export.jsonl record)")
        if rec.get("error"):
            continue
        m, meta = rec["metrics"], rec.get("metadata") or {}
        for k in ("time_to_first_token", "input_sequence_length", "output_sequence_length"):
            if k not in m:
                raise SpecError(path, f"line {lineno}: metrics.{k}", "missing")
        isl = _number(path, f"line {lineno}: input_sequence_length", m["input_sequence_length"].get("value"), whole=True, positive=True)
        osl = _number(path, f"line {lineno}: output_sequence_length", m["output_sequence_length"].get("value"), whole=True)
        itl = _metric_s(path, f"line {lineno}: metrics.inter_token_latency",
                        m["inter_token_latency"]) if "inter_token_latency" in m else math.nan
        start = meta.get("request_start_ns")
        end = meta.get("request_end_ns")
        recs.append(RequestRecord(int(isl), int(osl), _metric_s(
            path, f"line {lineno}: metrics.time_to_first_token", m["time_to_first_token"]), itl,
            start * 1e-9 if isinstance(start, int | float) else math.nan,
            end * 1e-9 if isinstance(end, int | float) else math.nan))
    if not recs:
        raise SpecError(path, "", "no successful request record")
    return RequestLog(str(path), "aiperf", _bench_point(path, recs, _overlap_batch(recs)), recs)


def _aiperf_aggregate(path, data) -> RequestLog:
    if not isinstance(data, dict):
        raise SpecError(path, "", "expected a JSON object of metrics")
    for k in ("inter_token_latency", "input_sequence_length", "output_sequence_length"):
        if not isinstance(data.get(k), dict) or "avg" not in data[k]:
            raise SpecError(path, k, "missing or without 'avg' (an aggregate profile export)")
    itl = _number(path, "inter_token_latency.avg", data["inter_token_latency"]["avg"]) * UNIT_S.get(
        str(data["inter_token_latency"].get("unit", "ms")), 1e-3)
    isl = _number(path, "input_sequence_length.avg", data["input_sequence_length"]["avg"])
    osl = _number(path, "output_sequence_length.avg", data["output_sequence_length"]["avg"])
    conc = _find(data, "concurrency")
    points = [] if not conc else [LoadPoint(Path(path).name, float(conc), isl + osl / 2,
                                            itl * 1e3, 1.0)]
    return RequestLog(str(path), "aiperf", points, [], float(conc) if conc else None)


PROM_LINE = re.compile(r"^([a-zA-Z_:][\w:]*)(\{[^}]*\})?\s+(\S+)")


def parse_prometheus(path, text: str) -> dict[str, float]:
    """name (with _sum/_count/_bucket suffix; buckets keep their le) -> value summed over
    the other labels."""
    out: dict[str, float] = {}
    for lineno, line in enumerate(text.splitlines(), start=1):
        s = line.strip()
        if not s or s.startswith("#"):
            continue
        m = PROM_LINE.match(s)
        if not m:
            raise SpecError(path, f"line {lineno}", "not a Prometheus sample (name{labels} value)")
        name, labels, value = m.groups()
        try:
            v = float(value)
        except ValueError:
            raise SpecError(path, f"line {lineno}", f"{name}: value {value!r} is not a number") from None
        if name.endswith("_bucket"):
            le = re.search(r'le="([^"]*)"', labels or "")
            name = f"{name}[{le.group(1) if le else ''}]"
        out[name] = out.get(name, 0.0) + v
    return out


ITL_NAMES = ("vllm:time_per_output_token_seconds", "vllm:inter_token_latency_seconds")


def read_prometheus(path, text: str, previous: dict[str, float] | None = None) -> RequestLog:
    """One scrape; with `previous` (the scrape before), the interval's means."""
    now = parse_prometheus(path, text)
    prev = previous or {}
    itl = next((n for n in ITL_NAMES if f"{n}_count" in now), None)
    if itl is None or "vllm:num_requests_running" not in now:
        raise SpecError(path, "", "missing vllm:time_per_output_token_seconds (or "
                        "vllm:inter_token_latency_seconds) or vllm:num_requests_running")

    def delta(name: str) -> float:
        return now.get(name, 0.0) - prev.get(name, 0.0)

    count = delta(f"{itl}_count")
    if count < 0:
        raise SpecError(path, f"{itl}_count", "lower than the previous scrape's (a restart?)")
    points = []
    if count > 0:
        running = now["vllm:num_requests_running"]
        if previous and "vllm:num_requests_running" in prev:
            running = (running + prev["vllm:num_requests_running"]) / 2
        ctx = math.nan
        pc, gc = delta("vllm:request_prompt_tokens_count"), delta("vllm:request_generation_tokens_count")
        if pc > 0 and gc > 0:
            ctx = delta("vllm:request_prompt_tokens_sum") / pc + delta(
                "vllm:request_generation_tokens_sum") / gc / 2
        if running > 0:
            points.append(LoadPoint(Path(path).name, running, ctx,
                                    delta(f"{itl}_sum") / count * 1e3, count))
    return RequestLog(str(path), "prometheus", points, [])


def read_prometheus_series(paths: list[str | Path]) -> list[RequestLog]:
    """Scrapes in time order: one point per interval (the first scrape alone: since start)."""
    out, prev = [], None
    for p in paths:
        text = _text(p)
        out.append(read_prometheus(p, text, prev))
        prev = parse_prometheus(p, text)
    return out


SGLANG = re.compile(r"#running-req: (\d+), #token: (\d+),.*?gen throughput \(token/s\): ([\d.]+)")
VLLM = re.compile(r"Avg generation throughput: ([\d.]+) tokens/s, Running: (\d+) reqs")


def read_server_log(path, text: str) -> RequestLog:
    points = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        m = SGLANG.search(line)
        if m and "Decode batch" in line:
            n, tokens, g = int(m.group(1)), int(m.group(2)), float(m.group(3))
            if n > 0 and g > 0:
                points.append(LoadPoint(f"{Path(path).name}:{lineno}", n, tokens / n, n / g * 1e3, 1.0))
            continue
        m = VLLM.search(line)
        if m:
            g, n = float(m.group(1)), int(m.group(2))
            if n > 0 and g > 0:
                points.append(LoadPoint(f"{Path(path).name}:{lineno}", n, math.nan, n / g * 1e3, 1.0))
    if not points:
        raise SpecError(path, "", "no batch-logging line with running requests and a generation "
                        "throughput (SGLang 'Decode batch.' or vLLM 'Avg generation throughput')")
    return RequestLog(str(path), "server-log", points, [])
