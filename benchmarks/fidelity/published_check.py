"""llmsim's step model against published measurements of real serving stacks.

Each row of data/published/published_measurements.csv (sources in its README) is a
figure a serving stack's own documentation published: a first-token latency, a per-token
latency, a static batch's request latency or its throughput. Each is expressed as the
steps llmsim would run for it and costed by `StepLatency` with the row's GPU, model,
tensor degree, number formats, runtime, all-reduce and decode kernel:

    prefill_ms                  one prefill step of `batch` prompts of `input_len` tokens
    first_token_after_decode_ms a prefill of input_len - 1 tokens, then one decode step over
                                the prompt's last token, which emits the first token
    decode_step_ms              one decode step of `batch` sequences at `context` tokens each
    request_latency_ms          a static batch: one prefill, then output_len - 1 decode steps
    static_throughput_tok_s_gpu batch x output_len tokens over that same time, per GPU

The error is simulated / published - 1 on the row's own metric; `time_error` states it
on time (for throughput rows published / simulated - 1), so a negative time error always
means the simulator is faster than the stack. Summaries use the time error.

    python benchmarks/fidelity/published_check.py                 # the table and summaries
    python benchmarks/fidelity/published_check.py --markdown      # the same as Markdown tables
    python benchmarks/fidelity/published_check.py --runtime cuda-graph   # kernels only, every row
    python benchmarks/fidelity/published_check.py --decode contiguous    # one decode kernel, every row
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
from dataclasses import dataclass, fields, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from sim.costmodel.latency import StepLatency  # noqa: E402
from sim.costmodel.models import load_model  # noqa: E402
from sim.costmodel.parallel import DTypeSpec, with_dtypes  # noqa: E402
from sim.costmodel.profiles import load_profile  # noqa: E402
from sim.costmodel.runtime import load_runtime  # noqa: E402

DATA = ROOT / "data" / "published" / "published_measurements.csv"
WITHIN = 0.25  # the share of rows within this |time error| is reported


@dataclass(frozen=True)
class Row:
    """One published figure and the configuration it was measured in."""

    id: str
    source: str       # a key of the README's source list
    stack: str
    gpu: str          # a gpu_profiles/ name
    model: str        # a models/ name
    tp: int
    weights: str      # bf16 | fp8 (fp16 rows are bf16 here: same bytes, same tensor-core rate)
    kv_cache: str
    batch: int
    input_len: int
    output_len: int
    context: int | None  # decode_step_ms: tokens each sequence attends over
    metric: str
    value: float
    runtime: str      # the gpu_profiles/runtimes/ profile of the stack's class
    meaning: str
    all_reduce: str = ""  # nccl | custom: what the stack ran; empty: the runtime's own
    decode: str = "paged"  # the decode attention kernel the stack ran (sim/costmodel/profiles.py IMPLS)


@dataclass(frozen=True)
class Result:
    row: Row
    simulated: float
    kernels_only: float  # the same with the `cuda-graph` runtime (no host cost)

    @property
    def error(self) -> float:
        return self.simulated / self.row.value - 1

    @property
    def time_error(self) -> float:
        return time_error(self.row.metric, self.simulated, self.row.value)

    @property
    def kernels_time_error(self) -> float:
        return time_error(self.row.metric, self.kernels_only, self.row.value)


def time_error(metric: str, simulated: float, measured: float) -> float:
    if metric.startswith("static_throughput"):
        return measured / simulated - 1
    return simulated / measured - 1


def read_rows(path: Path = DATA) -> list[Row]:
    types = {f.name: f.type for f in fields(Row)}
    rows = []
    with open(path, newline="") as fh:
        for raw in csv.DictReader(fh):
            vals = {}
            for name, text in raw.items():
                kind = types[name]
                if kind == "int":
                    vals[name] = int(text)
                elif kind == "float":
                    vals[name] = float(text)
                elif kind == "int | None":
                    vals[name] = int(text) if text else None
                else:
                    vals[name] = text
            if vals["metric"] not in METRICS:
                raise ValueError(f"{path}: row {vals['id']}: unknown metric {vals['metric']!r} "
                                 f"(known: {', '.join(METRICS)})")
            if vals.get("all_reduce", "") not in ALL_REDUCE:
                raise ValueError(f"{path}: row {vals['id']}: unknown all_reduce "
                                 f"{vals['all_reduce']!r} (known: nccl, custom, or empty)")
            rows.append(Row(**vals))
    return rows


ALL_REDUCE = {"": None, "nccl": False, "custom": True}  # -> RuntimeSpec.custom_all_reduce


def step_latency(row: Row, runtime: str, decode: str | None = None) -> StepLatency:
    """A fresh step model for the row's configuration: flash prefill, the row's decode
    kernel (or `decode`), and the runtime with the all-reduce the row's stack ran."""
    profile = load_profile(row.gpu)
    dtype = DTypeSpec(weights=row.weights, kv_cache=row.kv_cache)
    model = with_dtypes(load_model(row.model), dtype, profile)
    rt = load_runtime(runtime)
    custom = ALL_REDUCE[row.all_reduce]
    if custom is not None:
        rt = replace(rt, custom_all_reduce=custom)
    return StepLatency(model, profile, rt, "flash", decode or row.decode,
                       tensor=row.tp, fp8_weights=dtype.fp8_weights)


def _prefill_ms(row: Row, lat: StepLatency) -> float:
    return lat.prefill([(row.input_len, 0)] * row.batch) * 1e3


def _first_token_after_decode_ms(row: Row, lat: StepLatency) -> float:
    """LMDeploy TurboMind (v0.1): its prefill skips the prompt's last token, which the
    next decode step runs, and that step's token is the first one (a 1-token prompt has
    no prefill at all; data/published/README.md)."""
    s = lat.prefill([(row.input_len - 1, 0)] * row.batch) if row.input_len > 1 else 0.0
    return (s + lat.decode(row.batch, row.batch * row.input_len, row.input_len)) * 1e3


def _decode_step_ms(row: Row, lat: StepLatency) -> float:
    ctx = row.context or row.input_len
    return lat.decode(row.batch, row.batch * ctx, ctx) * 1e3


def _static_batch_s(row: Row, lat: StepLatency) -> float:
    """A static batch: one prefill of every prompt, then output_len - 1 decode steps
    (the first token comes from the prefill), each sequence one token longer per step."""
    s = lat.prefill([(row.input_len, 0)] * row.batch)
    for k in range(1, row.output_len):
        ctx = row.input_len + k
        s += lat.decode(row.batch, row.batch * ctx, ctx)
    return s


def _request_latency_ms(row: Row, lat: StepLatency) -> float:
    return _static_batch_s(row, lat) * 1e3


def _throughput_per_gpu(row: Row, lat: StepLatency) -> float:
    return row.batch * row.output_len / _static_batch_s(row, lat) / row.tp


METRICS = {
    "prefill_ms": _prefill_ms,
    "first_token_after_decode_ms": _first_token_after_decode_ms,
    "decode_step_ms": _decode_step_ms,
    "request_latency_ms": _request_latency_ms,
    "static_throughput_tok_s_gpu": _throughput_per_gpu,
}


def simulate(row: Row, runtime: str | None = None, decode: str | None = None) -> float:
    return METRICS[row.metric](row, step_latency(row, runtime or row.runtime, decode))


def check(rows: list[Row], runtime: str | None = None,
          decode: str | None = None) -> list[Result]:
    return [Result(r, simulate(r, runtime, decode), simulate(r, "cuda-graph", decode))
            for r in rows]


@dataclass(frozen=True)
class Summary:
    group: str
    rows: int
    median_abs: float   # median |time error|
    within: float       # share of rows with |time error| <= WITHIN
    mean: float         # mean signed time error (negative: the simulator is fast)
    worst: float        # the largest |time error|


def summarise(results: list[Result], key=lambda r: "all") -> list[Summary]:
    groups: dict[str, list[float]] = {}
    for res in results:
        groups.setdefault(key(res), []).append(res.time_error)
    out = []
    for name, errs in sorted(groups.items()):
        absn = [abs(e) for e in errs]
        out.append(Summary(name, len(errs), statistics.median(absn),
                           sum(a <= WITHIN for a in absn) / len(absn),
                           statistics.fmean(errs), max(absn)))
    return out


GROUPINGS = {
    "all": lambda r: "all",
    "gpu": lambda r: r.row.gpu,
    "model": lambda r: r.row.model,
    "metric": lambda r: r.row.metric,
    "source": lambda r: r.row.source,
    "tp": lambda r: f"tp{r.row.tp}",
    "weights": lambda r: r.row.weights,
}


def _fmt(v: float) -> str:
    return f"{v:,.1f}" if abs(v) < 1000 else f"{v:,.0f}"


def render(results: list[Result], markdown: bool = False) -> str:
    lines = []
    head = ["id", "gpu", "model", "tp", "dtype", "batch", "in/out", "decode / all-reduce",
            "metric", "published", "simulated", "error", "time error",
            "kernels-only time error"]
    body = []
    for res in results:
        r = res.row
        body.append([r.id, r.gpu, r.model, str(r.tp), r.weights, str(r.batch),
                     f"{r.input_len}/{r.output_len}", f"{r.decode} / {r.all_reduce or 'runtime'}",
                     r.metric, _fmt(r.value),
                     _fmt(res.simulated), f"{res.error:+.1%}", f"{res.time_error:+.1%}",
                     f"{res.kernels_time_error:+.1%}"])
    lines += _table(head, body, markdown)
    for name, key in GROUPINGS.items():
        lines.append("")
        sh = [name, "rows", "median |time error|", f"within {WITHIN:.0%}", "mean time error",
              "worst |time error|"]
        sb = [[s.group, str(s.rows), f"{s.median_abs:.1%}", f"{s.within:.0%}",
               f"{s.mean:+.1%}", f"{s.worst:.1%}"] for s in summarise(results, key)]
        lines += _table(sh, sb, markdown)
    return "\n".join(lines)


def _table(head: list[str], body: list[list[str]], markdown: bool) -> list[str]:
    if markdown:
        out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        return out + ["| " + " | ".join(b) + " |" for b in body]
    widths = [max(len(x) for x in col) for col in zip(head, *body, strict=True)]
    return ["  ".join(x.ljust(w) for x, w in zip(line, widths, strict=True))
            for line in [head, *body]]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--csv", type=Path, default=DATA)
    ap.add_argument("--runtime", help="cost every row with this runtime instead of its own")
    ap.add_argument("--decode",
                    help="decode attention kernel for every row (default: each row's own)")
    ap.add_argument("--rows", help="comma-separated row ids (default: all)")
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args(argv)
    rows = read_rows(args.csv)
    if args.rows:
        wanted = set(args.rows.split(","))
        rows = [r for r in rows if r.id in wanted]
    print(render(check(rows, args.runtime, args.decode), args.markdown))
    return 0


if __name__ == "__main__":
    sys.exit(main())
