"""Command line: `llmsim run | compare | sweep | curve | plan | report | models | gpus | runtimes`
(also `python -m sim`)."""

from __future__ import annotations

import argparse
import gc
import logging
import os
import re
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import NoReturn

from sim.cli.argtypes import parse_sets, workers_or_auto
from sim.io.specload import SpecError

DEFAULT_SCENARIO = Path(__file__).resolve().parents[2] / "scenarios" / "quickstart.yaml"


def _set_origins(sets: dict) -> dict[str, str]:
    """Errors in a `--set` override name it, not the scenario file."""
    return dict.fromkeys(sets, "--set")


def _run_naming_sets(sc, sets: dict, **kw):
    """`run(sc)`; a bad input found once the model and GPU are read names its --set."""
    from sim.config.scenario import override_labels, relabel
    from sim.engine.runner import run

    try:
        return run(sc, **kw)
    except SpecError as e:
        raise relabel(e, sc.file, override_labels(sets, _set_origins(sets))) from None


def _rows_readers(sc, a, sets: dict, origins: dict[str, str]) -> None:
    """A scenario that keeps no step rows (step_log: summary) with a flag that draws from
    them: one line naming both, before anything is simulated."""
    if sc.step_log != "summary":
        return
    flag = "--plots" if a.plots else "--trace-out" if getattr(a, "trace_out", None) else None
    if flag is not None:
        from sim.config.scenario import override_labels, relabel

        what = "the timeline plot is" if flag == "--plots" else "the trace's steps are"
        raise relabel(SpecError(sc.file or None, "step_log", f"'summary' keeps no step rows, "
                                f"and {flag} needs them ({what} drawn from them; allowed: "
                                f"rows, or no {flag})"), sc.file, override_labels(sets, origins))


def _check_format(a) -> None:
    if a.format == "parquet":
        from sim.io.tablefile import parquet_available

        if not parquet_available():
            raise SpecError("--format", "parquet", "needs pyarrow (pip install pyarrow; "
                            "or --format csv)")


def _is_llmsim_trace(path: Path) -> bool:
    """A Perfetto trace llmsim wrote ends with its producer mark (sim/report/perfetto.py)."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.path.getsize(path) - 256))
            return b'"producer":"llmsim"' in f.read()
    except OSError:
        return False


@contextmanager
def _collector_off() -> Iterator[None]:
    """The cyclic garbage collector held off while a command imports its modules, loads its
    scenario and simulates it (the engine holds it off anyway), then the objects made so far
    frozen out of its passes (gc.freeze): tens of thousands of objects that live as long as
    the command and no garbage cycles, which every pass would walk again (~0.08 s of
    `llmsim run` on the Azure hour, 5 %)."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if collecting:
            gc.enable()


def cmd_run(a) -> int:
    with _collector_off():
        from sim.config.scenario import load_scenario
        from sim.costmodel.stepcache import default_folder
        from sim.io.foldernames import safe_folder_name
        from sim.io.outfile import check_out_file
        from sim.io.outputs import check_out_dir
        from sim.report.text import replica_table, stage_table, table

        _check_format(a)
        sets = parse_sets(a.set)
        origins = _set_origins(sets)
        if a.step_log is not None:
            sets["step_log"], origins["step_log"] = a.step_log, "--step-log"
        sc = load_scenario(a.scenario, sets, origins=origins)
        _rows_readers(sc, a, sets, origins)
        dest = Path(a.out) if a.out else Path("runs") / safe_folder_name(sc.name)
        check_out_dir(dest)  # before the simulation, not after it
        if a.trace_out:
            check_out_file(a.trace_out, flag="--trace-out", ours=_is_llmsim_trace)
        out = _run_naming_sets(sc, sets, progress=not a.no_progress and sys.stderr.isatty(),
                               workers=a.workers, executor=a.executor, split=not a.no_split,
                               step_cache=default_folder())
    out.write(dest, plots=a.plots, fmt=a.format)
    if a.trace_out:
        from sim.report.perfetto import replica_parts, write_trace

        reps = out.result.replicas
        names = [r.name for r in reps]  # as requests.csv and steps.csv name them
        write_trace(a.trace_out, replica_parts(out.steps, out.requests, names),
                    [r.events for r in reps], names,
                    (out.summary.get("autoscale") or {}).get("timeline"))
    print(table([out.scenario.name], [out.summary]))
    if out.summary.get("per_replica"):
        print("\n" + replica_table(out.summary["per_replica"]))
    if out.engine != "single process":
        print(f"\nengine: {out.engine}")
    if out.summary.get("pipeline"):
        print("\n" + stage_table(out.summary["pipeline"]))
    if a.interval:
        print("\n" + _interval_lines(out, sc, sets, a.interval))
    steps = f"steps.{a.format}, " if out.step_tables is not None else ""
    print(f"\nwrote {dest}/ (requests.{a.format}, {steps}summary.json"
          + (", latency_cdf.png, timeline.png" if a.plots else "; --plots adds the plots") + ")"
          + (f" and {a.trace_out}" if a.trace_out else "")
          + ("; no steps table: step_log summary kept only its sums" if not steps else ""))
    return 0


def _interval_lines(out, sc, sets: dict, seeds: int) -> str:
    """The run's figures with 90 % prediction intervals: the spread over `seeds` seeds (the
    run's seed and the next ones) widened by the step model's 90 % error by provenance."""
    from dataclasses import replace

    from sim.planning.uncertainty import interval_band, run_intervals, stands_on

    summaries = [out.summary] + [_run_naming_sets(replace(sc, seed=sc.seed + k), sets).summary
                                 for k in range(1, seeds)]
    prov = out.summary.get("lookup_provenance")
    lines = [f"90 % prediction intervals (seed spread over {seeds} seed(s) + the step model's "
             f"90 % error ±{interval_band(prov):.0%}; lookups: {stands_on(prov)}; "
             "data/step_error_bands.yaml interval90, coverage checked by benchmarks/fidelity/interval_coverage.py):"]
    for name, (v, lo, hi) in run_intervals(summaries).items():
        lines.append(f"  {name:14} {v:10.4g}   [{lo:.4g}, {hi:.4g}]")
    return "\n".join(lines)


def _run_and_print(names: list[str], scenarios: list, a) -> int:
    """Run scenarios (all validated already), optionally write each into its own folder
    under --out, print one table."""
    from sim.io.outputs import check_out_dir, write_many
    from sim.report.text import table

    _check_format(a)
    if a.out:
        check_out_dir(a.out)
    outs = [_run_naming_sets(sc, parse_sets(a.set)) for sc in scenarios]
    folders = write_many(a.out, [(name, lambda folder, o=o: o.write(folder, a.plots, a.format))
                                 for name, o in zip(names, outs, strict=True)], {}) if a.out else []
    print(table(names, [o.summary for o in outs]))
    if a.out:
        print(f"\nwrote {a.out}/ ({', '.join(f + '/' for f in folders)})")
    return 0


def cmd_compare(a) -> int:
    from sim.config.scenario import load_scenario

    sets = parse_sets(a.set)
    scs = [load_scenario(f, sets, origins=_set_origins(sets)) for f in a.scenarios]  # validate all first
    for sc in scs:
        _rows_readers(sc, a, sets, _set_origins(sets))
    return _run_and_print([sc.name for sc in scs], scs, a)


def cmd_models(a) -> int:
    from sim.costmodel.models import known_models, load_model

    print(f"{'model':16} {'params':>8} {'weights GiB':>12} {'KV KiB/token':>13}")
    for name in known_models():
        m = load_model(name)
        print(f"{name:16} {m.params / 1e9:7.2f}B {m.weight_bytes / 2**30:12.1f} {m.kv_bytes_per_token / 1024:13.0f}")
    return 0


def cmd_gpus(a) -> int:
    from sim.costmodel.profiles import known_profiles, load_profile

    def rate(x: float | None) -> str:
        return f"{x:,.0f}" if x else "-"

    print(f"{'gpu':12} {'GiB':>6} {'HBM TB/s':>8} {'bf16 TF':>8} {'fp8 TF':>7} {'fp4 TF':>7} "
          f"{'link GB/s':>9} {'domain':>6}  kernel times")
    for name in known_profiles():
        p = load_profile(name)
        f = p.facts
        if f.derived_from:
            kind = f"derived from {f.derived_from}'s measured tables"
        else:
            kind = {False: "measured", True: "analytic"}.get(f.analytic, "partly measured")
        link = f.interconnect
        print(f"{name:12} {f.memory_gib:6.1f} {f.datasheet_mem_bw_tbs:8.2f} {rate(f.datasheet_tflops):>8} "
              f"{rate(f.datasheet_fp8_tflops):>7} {rate(f.datasheet_fp4_tflops):>7} "
              f"{rate(link.datasheet_gbs if link else None):>9} {link.gpus_per_node if link else 1:>6}  {kind}")
        if f.provenance:  # how each number was obtained (profile.yaml `provenance:`)
            counts = ", ".join(f"{t} {n}" for t, n in f.provenance_counts().items())
            extra = f"; FP4 {'/'.join(f.fp4_formats)} recorded, not used" if f.fp4_formats else ""
            print(f"{'':12} numbers: {counts}{extra}" + (f"; network {f.network}" if f.network else ""))
        capped = {t: n for t, n in p.capped.items() if n}
        if capped:  # table rows faster than the GPU's peak, raised to it at load
            rows = ", ".join(f"{t} {n}" for t, n in capped.items())
            print(f"{'':12} capped at the GPU's peak: {rows} rows")
        if p.timing_note and not f.derived_from:  # tables timed with the L2 flushed, corrected at load
            print(f"{'':12} {p.timing_note}")
        if f.tables_from:  # tables of its own missing, scaled from a measured GPU's
            tabs = ", ".join(f"{t} from {g}" for t, g in sorted(f.tables_from.items()))
            print(f"{'':12} derived tables (measured rows x roofline ratio): {tabs}")
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


_OWN = ("run", "compare")  # subcommands made here; the others' modules load only when named


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The whole command line, or with `command` one of `_OWN`, only the parsers made here
    (so `llmsim run` does not import the planning, calibrate and models commands)."""
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
    r.add_argument("--workers", type=workers_or_auto, default="auto", metavar="N",
                   help="a fleet behind a feedback-free router (round_robin, random) is "
                        "simulated replica by replica, same results: spread them over N "
                        "processes; other runs stay single-process and say why (default "
                        "auto: one per core when the fleet splits and has at least 2,500 "
                        "requests per process, else 1)")
    r.add_argument("--no-split", action="store_true",
                   help="simulate a feedback-free fleet whole, in one engine, not replica by "
                        "replica (the same results, slower)")
    r.add_argument("--executor", choices=("process", "ray"), default="process",
                   help="where --workers run: a local process pool (default) or Ray")
    r.add_argument("--step-log", choices=("rows", "summary"), default=None,
                   help="what each replica keeps of its steps: rows (steps.csv) or summary "
                        "(the summary's sums only: no steps table, plot or trace; for long "
                        "runs; default: the scenario's step_log, rows)")
    r.add_argument("--interval", type=int, nargs="?", const=1, default=0, metavar="SEEDS",
                   help="also print 90 %% prediction intervals of the headline figures: the "
                   "step model's error by provenance, plus the spread over SEEDS seeds "
                   "(default 1: the run's own; more seeds run the scenario again)")
    r.set_defaults(fn=cmd_run)
    c = sub.add_parser("compare", help="simulate several scenarios and print them side by side")
    c.add_argument("scenarios", nargs="+")
    common(c, "also write each run's outputs under this folder")
    c.set_defaults(fn=cmd_compare)
    if command in _OWN:
        return ap
    from sim.cli.planning import add_parsers as add_planning_parsers

    add_planning_parsers(sub)  # sweep, curve, plan, report
    from sim.cli.calibrate import add_parsers as add_calibrate_parsers

    add_calibrate_parsers(sub)  # calibrate, validate (torch imported only when they run)
    models = sub.add_parser("models", help="list model specs; `models import` reads a config.json")
    models.set_defaults(fn=cmd_models)
    from sim.cli.models import add_parser as add_models_import

    add_models_import(models.add_subparsers(dest="models_cmd", parser_class=OneLineParser))
    sub.add_parser("gpus", help="list GPU profiles").set_defaults(fn=cmd_gpus)
    from sim.cli.runtimes import add_parser as add_runtimes

    add_runtimes(sub)  # runtimes [NAME]
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


class _Notices(logging.Handler):
    """The library's notices (logger `llmsim`) as `llmsim: ...` lines on stderr, whichever
    stream sys.stderr is when the notice comes."""

    def emit(self, record: logging.LogRecord) -> None:
        print(f"llmsim: {record.getMessage()}", file=sys.stderr)


def _notices_on_stderr() -> None:
    log = logging.getLogger("llmsim")
    if not any(isinstance(h, _Notices) for h in log.handlers):
        log.addHandler(_Notices())
        log.propagate = False


# OpenBLAS reads the first of these that is set (a user's choice is kept)
BLAS_THREAD_VARIABLES = ("OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS", "OMP_NUM_THREADS")
TIMING_COMMANDS = ("calibrate", "validate")  # time kernels (PyTorch): BLAS threads left as they are


def one_blas_thread() -> None:
    """Have numpy's OpenBLAS start one thread in a process whose command line is llmsim's.
    With one per core it starts them all when numpy is imported, and they spin: about
    0.06 s of CPU on every `llmsim` command (half of importing numpy; ~7 % of `llmsim run`
    on the Azure hour) that buys nothing, as llmsim multiplies no large matrices (its one
    least-squares fit is 3 columns wide: sim/costmodel/l2flush.py). Worker processes
    inherit it; TIMING_COMMANDS do not call it. Nothing is set where numpy is imported
    already (too late) or where any of BLAS_THREAD_VARIABLES is set (the user's choice)."""
    if "numpy" not in sys.modules and not any(v in os.environ for v in BLAS_THREAD_VARIABLES):
        os.environ["OPENBLAS_NUM_THREADS"] = "1"


def main(argv: list[str] | None = None) -> int:
    frozen, ending = gc.get_freeze_count(), argv is None  # `run` freezes its objects ...
    _notices_on_stderr()
    argv = _attach_negative_lists(sys.argv[1:] if argv is None else argv)
    if ending and not (argv and argv[0] in TIMING_COMMANDS):  # the process is llmsim's
        one_blas_thread()
    args = build_parser(argv[0] if argv else None).parse_args(argv)
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
    except OSError as e:  # an I/O error no command turned into its own line (stdout on a full disk)
        where = f"{e.filename}: " if e.filename else ""
        print(f"llmsim: error: {where}{(e.strerror or str(e)).lower()}", file=sys.stderr)
        return 1
    except MemoryError:  # past the estimate checked before the run (sim/engine/hostmem.py)
        print("llmsim: error: out of memory (allowed: fewer requests; see LLMSIM_MEMORY_LIMIT_GIB)",
              file=sys.stderr)
        return 1
    finally:
        if before is not None:
            signal.signal(signal.SIGTERM, before)
        if ending:  # ... kept so in the process this command ends, whose last collection
            gc.freeze()  # would walk them all (~0.04 s)
        elif not frozen:  # thawed for an in-process caller
            gc.unfreeze()


if __name__ == "__main__":
    sys.exit(main())
