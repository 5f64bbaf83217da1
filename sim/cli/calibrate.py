"""`llmsim calibrate` and `llmsim validate` (PyTorch is imported only when they run).

    llmsim calibrate --models llama-3-8b,llama-3.2-1b --device auto \\
        --out gpu_profiles/my-gpu --budget-s 600
    llmsim validate tests/fixtures/calibrate/tiny.yaml --profile gpu_profiles/my-gpu \\
        --out reports/my-gpu

Exit status: 0 done (also when a time budget cut the run short, or shapes too large
for free memory were skipped); 2 an error, with one line on stderr (no PyTorch, no
such device, a bad scenario, a shape that ran out of memory — recorded, skipped and
the profile still written — or out of memory in the reference engine); 130
interrupted (the partial profile is kept).
"""

from __future__ import annotations

import sys
from pathlib import Path

from sim.cli.argtypes import positive_seconds, whole_number
from sim.io.outputs import check_out_dir

NO_TORCH = "llmsim: error: calibrate needs PyTorch: pip install 'llmsim[calibrate]'"


def _need_torch() -> bool:
    try:
        import torch  # noqa: F401
    except ImportError:
        print(NO_TORCH, file=sys.stderr)
        return False
    return True


def _fail(msg: str) -> int:
    print(f"llmsim: error: {msg}", file=sys.stderr)
    return 2


def check_profile_folder(out: Path) -> None:
    """`calibrate` replaces its own named files in a profile folder: refuse, before
    measuring, a non-empty folder that an earlier `llmsim calibrate` did not write (a
    user's folder, or a shipped profile such as gpu_profiles/h200-sxm, whose tables were
    measured elsewhere). calibrate writes calibration.json first thing, so its folders,
    interrupted ones included, carry it."""
    from sim.io.outputs import JUNK, OutputError

    if not out.is_dir():
        return
    entries = [p.name for p in out.iterdir() if p.name not in JUNK]
    if entries and not _written_by_calibrate(out):
        raise OutputError("--out", out, "is a folder llmsim calibrate did not write (allowed: a "
                          "new or empty folder, or one an earlier llmsim calibrate wrote)")


def _written_by_calibrate(out: Path) -> bool:
    import json

    meta, profile = out / "calibration.json", out / "profile.yaml"
    try:
        json.loads(meta.read_text())
        return not profile.exists() or profile.read_text().startswith(
            "# Written by llmsim calibrate")
    except (OSError, ValueError, UnicodeDecodeError):
        return False


def cmd_calibrate(a) -> int:
    if not _need_torch():
        return 2
    from sim.calibrate.calibrate import calibrate
    from sim.calibrate.device import DeviceError

    out = Path(a.out)
    check_out_dir(out, adds_to=True)  # where, before measuring (it adds to a profile folder)
    check_profile_folder(out)
    models = [m.strip() for m in a.models.split(",") if m.strip()]
    argv = ["calibrate", f"--models {a.models}", f"--device {a.device}", f"--dtype {a.dtype}",
            f"--out {a.out}"] + ([f"--budget-s {a.budget_s:g}"] if a.budget_s else []) \
        + (["--quick"] if a.quick else []) + ([f"--threads {a.threads}"] if a.threads else [])
    try:
        res = calibrate(models, out, device=a.device, dtype=a.dtype, quick=a.quick,
                        budget_s=a.budget_s, progress=not a.no_progress and sys.stderr.isatty(), threads=a.threads,
                        argv=argv)
    except DeviceError as e:
        return _fail(str(e))
    except KeyboardInterrupt:
        print(f"llmsim: interrupted: kept the partial profile in {out}/ "
              "(see calibration.json for what was measured)", file=sys.stderr)
        return 130
    rows = ", ".join(f"{t} {n}" for t, n in res.rows.items())
    print(f"wrote {out}/ in {res.seconds:.0f} s: {res.measured}/{res.total} points ({rows})")
    if res.skipped:
        print(f"  {res.skipped} shapes skipped (too large or out of memory): {out}/skipped.csv")
    if res.stopped == "budget":
        missing = [t for t in ("gemm", "attn_decode", "attn_prefill", "elementwise", "sampling",
                               "iter_grid_eager") if t not in res.rows]
        print(f"  the {a.budget_s:g} s budget ran out (most important points first); "
              + (f"not reached: {', '.join(missing)}" if missing else "every table has rows")
              + ("" if res.runtimes else "; no runtime fitted (no whole-iteration rows)"))
    for mode, errs in res.runtimes.items():
        e = errs["all"]
        print(f"  runtime-{mode}.yaml: fit to {e['rows']} steps, mean |error| {e['mape']:.1%}, "
              f"max {e['max']:.1%}")
    if res.oom:  # the size check let them through: worth a look, so not a clean exit
        return _fail(f"{res.oom} shapes ran out of memory and were skipped "
                     f"({out}/skipped.csv); the profile was written without them")
    return 0


def cmd_validate(a) -> int:
    if a.replay:
        return cmd_replay(a)
    if not a.profile:
        return _fail("validate: --profile is required (or --replay STEPS.csv REQUESTS.csv)")
    if not _need_torch():
        return 2
    from sim.calibrate.device import DeviceError, TooLarge, is_oom
    from sim.calibrate.validate import markdown, validate

    try:
        report = validate(a.scenario, a.profile, a.out, device=a.device, dtype=a.dtype,
                          runtime=a.runtime, runs=a.runs, threads=a.threads)
    except DeviceError as e:
        return _fail(str(e))
    except TooLarge as e:
        return _fail(f"reference engine: {e} (set a smaller kv.num_blocks in the scenario)")
    except (RuntimeError, MemoryError) as e:
        if not is_oom(e):
            raise
        return _fail("out of memory in the reference engine: "
                     + str(e).splitlines()[0][:160] + " (lower kv.num_blocks or the model size)")
    except KeyboardInterrupt:
        print("llmsim: interrupted: no report written", file=sys.stderr)
        return 130
    print(markdown(report))
    print(f"wrote {a.out}/ (report.md, report.json, real-1/, real-2/, sim/)")
    return 0


def cmd_replay(a) -> int:
    """`validate SCENARIO --replay STEPS REQUESTS`: a serving log against the simulator."""
    from sim.fit.replay import markdown, replay, write_report
    from sim.io.outputs import check_out_dir

    check_out_dir(a.out)  # before replaying, not after
    report = replay(a.scenario, a.replay[0], a.replay[1], runtime=a.runtime)
    print(markdown(report))
    print(f"wrote {write_report(report, a.out)}/ (replay.md, replay.csv, replay.json)")
    return 0


def cmd_fit_log(a) -> int:
    """`fit-log STEPS... [--requests R...]`: a runtime profile fitted to serving logs, with
    its cross-validated (held-out) error beside the in-sample one."""
    from sim.costmodel.models import load_model
    from sim.costmodel.profiles import load_profile
    from sim.costmodel.runtime import load_runtime
    from sim.fit.crossval import cross_validate, default_folds, format_cv
    from sim.fit.logfit import fit_log, format_fit, read_logs, runtime_yaml
    from sim.io.outfile import check_out_file, write_file_atomically

    out = check_out_file(a.out, flag="--out", ours=_is_fitted_runtime)  # before fitting
    if a.requests and len(a.requests) != len(a.steps):
        print(f"llmsim: error: --requests: {len(a.requests)} logs for {len(a.steps)} steps logs "
              "(allowed: one requests log per steps log, in the same order)", file=sys.stderr)
        return 2
    name = a.name or out.stem
    model = load_model(a.model, file="--model", path="")
    gpu = load_profile(a.gpu, file="--gpu", path="")
    base = load_runtime(a.base_runtime, file="--base-runtime", path="")
    if a.format != "steps" and (a.format != "auto" or not _is_steps_log(a.steps[0])):
        return _fit_request_level(a, out, name, model, gpu, base)
    steps = a.steps if len(a.steps) > 1 else a.steps[0]
    requests = a.requests if a.requests and len(a.requests) > 1 else (a.requests or [None])[0]
    fit = fit_log(steps, requests, model, gpu, base, name, a.prefill_attention, a.decode_attention)
    report = format_fit(fit)
    if not a.no_cv:
        logs = read_logs(steps, requests, model, gpu, a.prefill_attention, a.decode_attention,
                         base.elementwise)
        report += "\n" + format_cv(cross_validate(base, model.layers, logs.rows,
                                                  default_folds(logs.rows, logs.names)))
    print(report)
    text = runtime_yaml(fit.runtime, f"{FIT_LOG_MARK} (sim/fit/logfit.py).\n"
                        f"Fit error on the log's own steps (in-sample), then held out:\n{report}")
    write_file_atomically(out, text)  # sim/io/outfile.py
    print(f"wrote {a.out}")
    return 0


FIT_LOG_MARK = "Runtime fitted by llmsim fit-log"


def _is_steps_log(path: str) -> bool:
    """A per-iteration steps log (its CSV header starts with t_start)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.readline().startswith("t_start")
    except OSError:
        return True  # let the steps reader report it


def _fit_request_level(a, out: Path, name: str, model, gpu, base) -> int:
    """fit-log on request-level or aggregate outputs (sim/fit/requestlogs.py)."""
    from sim.fit.logfit import runtime_yaml
    from sim.fit.requestfit import fit_request_logs, format_request_fit
    from sim.fit.requestlogs import read, read_prometheus_series
    from sim.io.outfile import write_file_atomically

    fmt = a.format
    if fmt == "prometheus" or (fmt == "auto" and all(_is_prometheus(p) for p in a.steps)):
        logs = read_prometheus_series(a.steps)
    else:
        logs = [read(p, fmt) for p in a.steps]
    fit = fit_request_logs(logs, model, gpu, base, name, a.context, a.decode_attention)
    report = format_request_fit(fit)
    print(report)
    write_file_atomically(out, runtime_yaml(fit.runtime, f"{FIT_LOG_MARK} (sim/fit/requestfit.py).\n"
                                            f"Fit error on the load points, then held out:\n{report}"))
    print(f"wrote {a.out}")
    return 0


def _is_prometheus(path: str) -> bool:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            head = f.read(20000)
    except OSError:
        return False
    return "# TYPE vllm:" in head or head.lstrip().startswith("vllm:")


def _is_fitted_runtime(path: Path) -> bool:
    """A runtime YAML that `llmsim fit-log` wrote (its first line says so): replaceable."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.readline().startswith("# " + FIT_LOG_MARK)
    except OSError:
        return False


def add_parsers(sub) -> None:
    """Register the calibration subcommands on the main parser's subparsers."""
    c = sub.add_parser("calibrate", help="measure a GPU profile (needs PyTorch)",
                       description="Measure kernel tables and whole-iteration latencies on this "
                       "machine's GPU (or CPU) and write a profile folder.")
    c.add_argument("--models", default="llama-3-8b,llama-3.2-1b",
                   help="comma-separated models/ names whose shapes to measure")
    c.add_argument("--device", default="auto", choices=["auto", "cuda", "cpu"])
    c.add_argument("--dtype", default="auto", choices=["auto", "bfloat16", "float16", "float32"],
                   help="auto: bfloat16 on CUDA, float32 on the CPU")
    c.add_argument("--out", required=True, help="profile folder to write, e.g. gpu_profiles/NAME")
    c.add_argument("--budget-s", type=positive_seconds, default=None,
                   help="stop after this many seconds, most important measurements first")
    c.add_argument("--quick", action="store_true", help="small grids (CI, trying it on a CPU)")
    c.add_argument("--threads", type=whole_number, help="CPU only: intra-op threads (default 1)")
    c.add_argument("--no-progress", action="store_true")
    c.set_defaults(fn=cmd_calibrate)
    v = sub.add_parser("validate", help="compare the simulator with the reference engine",
                       description="Replay a scenario's trace through the reference engine "
                       "(twice) and through the simulator with a measured profile; write a report.")
    v.add_argument("scenario", help="scenario YAML (its gpu is replaced by --profile)")
    v.add_argument("--profile", help="profile folder written by llmsim calibrate")
    v.add_argument("--runtime", help="runtime YAML (default PROFILE/runtime-eager.yaml; "
                   "with --replay: a runtime name or YAML replacing the scenario's)")
    v.add_argument("--replay", nargs=2, metavar=("STEPS.csv", "REQUESTS.csv"),
                   help="compare a real run's serving logs with the simulator instead "
                   "(no engine, no PyTorch): the scenario gives model, GPU, runtime, scheduler")
    v.add_argument("--out", required=True, help="report folder")
    v.add_argument("--device", default="auto", choices=["auto", "cuda", "cpu"])
    v.add_argument("--dtype", default="auto", choices=["auto", "bfloat16", "float16", "float32"])
    v.add_argument("--threads", type=whole_number,
                   help="CPU only: intra-op threads (default: the profile's, else 1)")
    v.add_argument("--runs", type=whole_number, default=2, help="real runs (the 2nd gives the spread)")
    v.set_defaults(fn=cmd_validate)
    f = sub.add_parser("fit-log", help="fit a runtime profile to a serving engine's logs",
                       description="Fit host terms, GPU scales, a per-new-prefill-shape stall and "
                       "a step-time jitter table to per-iteration serving logs "
                       "(docs/calibration.md, Serving logs), or decode and per-request terms to "
                       "request-level outputs (vLLM benchmark JSON, aiperf exports, Prometheus "
                       "scrapes, server logs); print the fit error in-sample and held out; write "
                       "the runtime.")
    f.add_argument("steps", nargs="+", help="per-iteration log(s) (t_start,t_end,kind,num_seqs,"
                   "num_tokens,sum_ctx,free_blocks); several are fitted as one")
    f.add_argument("--requests", nargs="+", help="per-request log(s), one per steps log in the "
                   "same order: each prefill step's prompt lengths")
    f.add_argument("--format", default="auto", choices=["auto", "steps", "vllm-bench", "aiperf",
                                                        "prometheus", "server-log"],
                   help="input format (auto: from the content); all but steps are request-level "
                   "or aggregate outputs that fit decode and per-request terms only")
    f.add_argument("--context", type=float, help="mean context per running sequence (tokens) "
                   "for formats that do not say it (vLLM stats lines)")
    f.add_argument("--no-cv", action="store_true", help="skip the cross-validation (time folds, "
                   "low -> high load, leave one log out) printed after the fit")
    f.add_argument("--model", required=True, help="models/ name or YAML")
    f.add_argument("--gpu", required=True, help="gpu_profiles/ name or folder")
    f.add_argument("--base-runtime", required=True,
                   help="runtime whose per-step and per-layer host terms are kept (a one-model "
                   "log cannot separate them), e.g. one fitted to a warm iteration grid")
    f.add_argument("--out", required=True, help="runtime YAML to write")
    f.add_argument("--name", help="runtime name (default: the --out file's stem)")
    f.add_argument("--prefill-attention", default="flash", choices=["flash", "naive"])
    f.add_argument("--decode-attention", default="paged_reference",
                   choices=["paged", "paged_reference", "paged_gather", "contiguous"])
    f.set_defaults(fn=cmd_fit_log)
