"""Command line: `llmsim run | compare | sweep | curve | plan | report | models | gpus` (also `python -m sim`)."""

from __future__ import annotations

import argparse
import math
import numbers
import os
import re
import signal
import sys
import threading
from pathlib import Path
from typing import NoReturn

import numpy as np

from .specload import SpecError, parse_cli_value

DEFAULT_SCENARIO = Path(__file__).resolve().parent.parent / "scenarios" / "quickstart.yaml"


def _parse_sets(pairs: list[str]) -> dict[str, object]:
    out = {}
    for p in pairs or []:
        if "=" not in p or not p.split("=", 1)[0].strip():
            raise SpecError("--set", p, "expected FIELD.PATH=VALUE (allowed: e.g. "
                            "workload.arrival.rate=3, cluster.groups.1.gpu=h100-sxm)")
        k, v = p.split("=", 1)
        out[k.strip()] = parse_cli_value(v, f"--set {k.strip()}")
    return out


def _num(v: float) -> str:
    """A figure for the tables: thousands with commas (28,302), below 1,000 three
    significant figures with their trailing zeros (9.00, 20.8, 0.0123); NaN is `-`."""
    if math.isnan(v):
        return "-"
    if abs(v) >= 999.5:  # rounds to 4+ digits: no exponent, commas instead
        return f"{v:,.0f}"
    text = f"{v:#.3g}"
    return text if "e" in text else text.rstrip(".")


def _set_origins(sets: dict) -> dict[str, str]:
    """Errors in a `--set` override name it, not the scenario file."""
    return dict.fromkeys(sets, "--set")


def _run_naming_sets(sc, sets: dict, **kw):
    """`run(sc)`; a bad input found once the model and GPU are read names its --set."""
    from .runner import run
    from .scenario import override_labels, relabel

    try:
        return run(sc, **kw)
    except SpecError as e:
        raise relabel(e, sc.file, override_labels(sets, _set_origins(sets))) from None


def _fmt(v, unit=""):
    """One table cell: None/NaN `-`, booleans as YAML writes them, integers with commas,
    other numbers as `_num` (`unit="ms"`: seconds shown in milliseconds)."""
    if v is None:
        return "-"
    if isinstance(v, bool | np.bool_):
        return "true" if v else "false"
    if isinstance(v, numbers.Integral):
        return f"{int(v):,}"
    if isinstance(v, numbers.Real):
        return _num(float(v) * (1e3 if unit == "ms" else 1.0))
    return str(v)


def _share(x: float | None) -> str:
    """A percentage that never rounds a non-zero share to 0 % or a partial one to 100 %;
    `-` where it is not modelled (None)."""
    if x is None:
        return "-"
    if 0 < x < 0.005:
        return "<1%"
    if 0.995 <= x < 1:
        return ">99%"
    return f"{x:.0%}"


# what a step time stands on: measured = an exact or interpolated measured point
PROVENANCE_CLASSES = (("measured", ("exact", "interpolated")), ("derived", ("derived",)),
                      ("extrapolated", ("extrapolated",)), ("analytic", ("analytic",)))


def provenance_shares(p: dict[str, float]) -> str:
    """Share of simulated step time by what it stands on, every class shown."""
    return " / ".join(_share(sum(p.get(t, 0.0) for t in tags)) for _, tags in PROVENANCE_CLASSES)


ROWS = [
    ("requests finished", lambda s: f"{_fmt(s['requests']['finished'])}/{_fmt(s['requests']['total'])}"),
    ("rejected", lambda s: _fmt(s["requests"]["rejected"])),
    ("duration (s)", lambda s: _fmt(s["duration_s"])),
    ("requests/s", lambda s: _fmt(s["request_throughput"])),
    ("output tokens/s", lambda s: _fmt(s["output_token_throughput"])),
    ("TTFT p50 / p99 (ms)", lambda s: f"{_fmt(s['ttft_s']['p50'], 'ms')} / {_fmt(s['ttft_s']['p99'], 'ms')}"),
    ("TPOT p50 / p99 (ms)", lambda s: f"{_fmt(s['tpot_s']['p50'], 'ms')} / {_fmt(s['tpot_s']['p99'], 'ms')}"),
    ("ITL p50 / p99 (ms)", lambda s: f"{_fmt(s['itl_s']['p50'], 'ms')} / {_fmt(s['itl_s']['p99'], 'ms')}"),
    ("E2E p50 / p99 (s)", lambda s: f"{_fmt(s['e2e_s']['p50'])} / {_fmt(s['e2e_s']['p99'])}"),
    ("mean batch size", lambda s: _fmt(s["mean_batch_size"])),
    ("busy: steps / GPU kernels", lambda s: f"{s['gpu_busy_fraction']:.0%} / {_share(s['gpu_kernel_fraction'])}"),
    ("KV capacity (tokens)", lambda s: f"{s['kv']['capacity_tokens']:,}"),
    ("KV used mean / peak", lambda s: f"{s['kv']['util_mean']:.0%} / {s['kv']['util_peak']:.0%}"),
    ("KV reserved but unused", lambda s: f"{s['kv']['reserved_unused_share']:.1%}"),
    ("preemptions", lambda s: _fmt(s["preemptions"])),
    ("spec. tokens/round", lambda s: f"{s['speculative']['tokens_per_round']:.2f}" if s.get("speculative") else "-"),
    ("spec. speed-up vs decode", lambda s: f"{s['speculative']['speedup_vs_decode']:.2f}x" if s.get("speculative") else "-"),
    ("prefix cache hit rate (tokens)", lambda s: f"{s['prefix_cache']['hit_rate']:.1%}" if s.get("prefix_cache") else "-"),
    ("goodput (req/s)", lambda s: _fmt(s["goodput"]["requests_per_s"]) if s.get("goodput") else "-"),
    ("step time: measured/derived/extrap./analytic",
     lambda s: provenance_shares(s["lookup_provenance"])),
    ("wall time (s)", lambda s: f"{s['wall_s']:.2f}"),
]


def _yaml_scalar(v) -> str:
    """An input value as a scenario YAML spells it (true, null, 0.5)."""
    if v is None:
        return "null"
    if isinstance(v, bool | np.bool_):
        return "true" if v else "false"
    if isinstance(v, numbers.Integral):
        return str(int(v))
    if isinstance(v, numbers.Real):
        return "-" if math.isnan(v) else f"{float(v):g}"
    return str(v)


def frame_text(frame, inputs: list[str]) -> str:
    """A results frame (sweep, curve) as text: the `inputs` columns as the YAML spells
    them, the other columns as the summary table's cells (`-` where there is no value)."""
    import pandas as pd

    cells = {c: [_yaml_scalar(v) if c in inputs else _fmt(v) for v in frame[c]] for c in frame.columns}
    return pd.DataFrame(cells, columns=list(frame.columns)).to_string(index=False)


def table(names: list[str], summaries: list[dict]) -> str:
    """A side-by-side text table of summaries (one column per run)."""
    cols = [[label] + [str(f(s)) for s in summaries] for label, f in ROWS]
    header = [""] + names
    widths = [max(len(r[i]) for r in [header] + cols) for i in range(len(header))]
    lines = ["  ".join(h.ljust(w) if i == 0 else h.rjust(w) for i, (h, w) in enumerate(zip(header, widths, strict=True)))]
    lines.append("  ".join("-" * w for w in widths))
    for r in cols:
        lines.append("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True))))
    return "\n".join(lines)


def replica_table(rows: list[dict]) -> str:
    """One line per replica of a fleet: where its requests went and how it fared. A
    prefill replica's `requests` and `req/s` count the prefills it ran (none finish there)."""
    head = (f"{'replica':16} {'gpu':10} {'role':7} {'requests':>8} {'req/s':>6} "
            f"{'TTFT p50/p99 ms':>16} {'TPOT p50 ms':>11} {'busy':>5} {'kernels':>7} {'KV mean':>7}")
    lines = [head, "-" * len(head)]
    for r in rows:
        prefill = r["role"] == "prefill"
        n = r.get("prefills", r["requests"]) if prefill else r["requests"]
        rate = r.get("prefill_throughput", r["request_throughput"]) if prefill else r["request_throughput"]
        ttft = f"{_fmt(r['ttft_s']['p50'], 'ms')}/{_fmt(r['ttft_s']['p99'], 'ms')}"
        lines.append(f"{r['replica'][:16]:16} {r['gpu'][:10]:10} {r['role']:7} {n:8d} "
                     f"{_fmt(rate):>6} {ttft:>16} "
                     f"{_fmt(r['tpot_s']['p50'], 'ms'):>11} {r['gpu_busy_fraction']:5.0%} "
                     f"{_share(r['gpu_kernel_fraction']):>7} {r['kv_util_mean']:7.0%}")
    if any(r["role"] == "prefill" for r in rows):
        lines.append("(prefill rows: requests and req/s count prefills run; "
                     "other rows: requests routed there, finishes per second)")
    return "\n".join(lines)


def _check_format(a) -> None:
    if a.format == "parquet":
        from .tablefile import parquet_available

        if not parquet_available():
            raise SpecError("--format", "parquet", "needs pyarrow (pip install pyarrow; "
                            "or --format csv)")


def _is_llmsim_trace(path: Path) -> bool:
    """A Perfetto trace llmsim wrote ends with its producer mark (sim/perfetto.py)."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.path.getsize(path) - 256))
            return b'"producer":"llmsim"' in f.read()
    except OSError:
        return False


def cmd_run(a) -> int:
    from .foldernames import safe_folder_name
    from .outfile import check_out_file
    from .outputs import check_out_dir
    from .scenario import load_scenario

    _check_format(a)
    sets = _parse_sets(a.set)
    sc = load_scenario(a.scenario, sets, origins=_set_origins(sets))
    dest = Path(a.out) if a.out else Path("runs") / safe_folder_name(sc.name)
    check_out_dir(dest)  # before the simulation, not after it
    if a.trace_out:
        check_out_file(a.trace_out, flag="--trace-out", ours=_is_llmsim_trace)
    out = _run_naming_sets(sc, sets, progress=not a.no_progress and sys.stderr.isatty())
    out.write(dest, plots=a.plots, fmt=a.format)
    if a.trace_out:
        from .perfetto import replica_parts, write_trace

        reps = out.result.replicas
        write_trace(a.trace_out, replica_parts(out.steps, out.requests, [r.name for r in reps]),
                    [r.events for r in reps])
    print(table([out.scenario.name], [out.summary]))
    if out.summary.get("per_replica"):
        print("\n" + replica_table(out.summary["per_replica"]))
    print(f"\nwrote {dest}/ (requests.{a.format}, steps.{a.format}, summary.json"
          + (", latency_cdf.png, timeline.png" if a.plots else "; --plots adds the plots") + ")"
          + (f" and {a.trace_out}" if a.trace_out else ""))
    return 0


def _run_and_print(names: list[str], scenarios: list, a) -> int:
    """Run scenarios (all validated already), optionally write each into its own folder
    under --out, print one table."""
    from .outputs import check_out_dir, write_many

    _check_format(a)
    if a.out:
        check_out_dir(a.out)
    outs = [_run_naming_sets(sc, _parse_sets(a.set)) for sc in scenarios]
    folders = write_many(a.out, [(name, lambda folder, o=o: o.write(folder, a.plots, a.format))
                                 for name, o in zip(names, outs, strict=True)], {}) if a.out else []
    print(table(names, [o.summary for o in outs]))
    if a.out:
        print(f"\nwrote {a.out}/ ({', '.join(f + '/' for f in folders)})")
    return 0


def cmd_compare(a) -> int:
    from .scenario import load_scenario

    sets = _parse_sets(a.set)
    scs = [load_scenario(f, sets, origins=_set_origins(sets)) for f in a.scenarios]  # validate all first
    return _run_and_print([sc.name for sc in scs], scs, a)


def cmd_models(a) -> int:
    from .models import known_models, load_model

    print(f"{'model':16} {'params':>8} {'weights GiB':>12} {'KV KiB/token':>13}")
    for name in known_models():
        m = load_model(name)
        print(f"{name:16} {m.params / 1e9:7.2f}B {m.weight_bytes / 2**30:12.1f} {m.kv_bytes_per_token / 1024:13.0f}")
    return 0


def cmd_gpus(a) -> int:
    from .profiles import known_profiles, load_profile

    for name in known_profiles():
        p = load_profile(name)
        f = p.facts
        kind = "measured" if f.analytic is False else ("analytic" if f.analytic is True else "partly measured")
        print(f"{name:12} {f.memory_gib:6.1f} GiB  {kind}")
        capped = {t: n for t, n in p.capped.items() if n}
        if capped:  # table rows faster than the GPU's peak, raised to it at load
            rows = ", ".join(f"{t} {n}" for t, n in capped.items())
            print(f"{'':12} capped at the GPU's peak: {rows} rows")
        if p.timing_note:  # tables timed with the L2 flushed, corrected at load
            print(f"{'':12} {p.timing_note}")
        if p.summary()["derived_decode"]:
            print(f"{'':12} paged decode derived from the contiguous table "
                  f"(+{f.efficiency.paged_decode_overhead:.0%})")
    return 0


class OneLineParser(argparse.ArgumentParser):
    """A usage error (unknown flag, missing argument, bad choice) is one line on stderr,
    `llmsim: error: [<subcommand>: ]<what>`, and exit status 2; `--help` is unchanged."""

    def error(self, message: str) -> NoReturn:
        where = self.prog.split(" ", 1)[1] + ": " if " " in self.prog else ""
        self.exit(2, f"llmsim: error: {where}{' '.join(message.split())}\n")


def build_parser() -> argparse.ArgumentParser:
    ap = OneLineParser(prog="llmsim", description="Simulate LLM inference serving.")
    # every parser made from `sub` (here and in the add_parsers of other modules) is one
    sub = ap.add_subparsers(dest="cmd", required=True, parser_class=OneLineParser)
    def common(p, out_help: str) -> None:
        p.add_argument("--set", action="append", metavar="FIELD=VALUE",
                       help="override a scenario field (repeatable)")
        p.add_argument("--out", help=out_help)
        p.add_argument("--plots", action=argparse.BooleanOptionalAction, default=False,
                       help="also write latency_cdf.png and timeline.png (default: no)")
        p.add_argument("--format", choices=("csv", "parquet"), default="csv",
                       help="requests and steps tables as CSV (default) or Parquet (pyarrow)")

    r = sub.add_parser("run", help="simulate one scenario and write its outputs")
    r.add_argument("scenario", nargs="?", default=str(DEFAULT_SCENARIO),
                   help="scenario YAML (default: the package's scenarios/quickstart.yaml)")
    common(r, "output folder (default runs/<scenario name>)")
    r.add_argument("--no-progress", action="store_true")
    r.add_argument("--trace-out", metavar="TRACE.json", help="also write a Perfetto/Chrome trace")
    r.set_defaults(fn=cmd_run)
    c = sub.add_parser("compare", help="simulate several scenarios and print them side by side")
    c.add_argument("scenarios", nargs="+")
    common(c, "also write each run's outputs under this folder")
    c.set_defaults(fn=cmd_compare)
    from .planning_cli import add_parsers as add_planning_parsers

    add_planning_parsers(sub)  # sweep, curve, plan, report
    from .calibrate.cli import add_parsers as add_calibrate_parsers

    add_calibrate_parsers(sub)  # calibrate, validate (torch imported only when they run)
    sub.add_parser("models", help="list model specs").set_defaults(fn=cmd_models)
    sub.add_parser("gpus", help="list GPU profiles").set_defaults(fn=cmd_gpus)
    return ap


def _terminated(signum, frame):  # SIGTERM ends a run the way Ctrl-C does
    raise KeyboardInterrupt


def _attach_negative_lists(argv: list[str]) -> list[str]:
    """`--rates -1,2` as `--rates=-1,2`: argparse takes `-1,2` for a flag, and the value's
    own check then says what is allowed."""
    out, i = [], 0
    while i < len(argv):
        if (argv[i] in ("--rates", "--values") and i + 1 < len(argv)
                and re.fullmatch(r"-[\d.][\d.,eE+-]*", argv[i + 1])):
            out.append(f"{argv[i]}={argv[i + 1]}")
            i += 2
        else:
            out.append(argv[i])
            i += 1
    return out


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(_attach_negative_lists(sys.argv[1:] if argv is None else argv))
    main_thread = threading.current_thread() is threading.main_thread()
    before = signal.signal(signal.SIGTERM, _terminated) if main_thread else None
    try:
        return args.fn(args)
    except SpecError as e:
        print(f"llmsim: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("llmsim: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `llmsim ... | head`
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115
        return 0
    finally:
        if before is not None:
            signal.signal(signal.SIGTERM, before)


if __name__ == "__main__":
    sys.exit(main())
