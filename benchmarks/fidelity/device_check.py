"""Issue 9's held-out device checks in one command, within a wall-clock budget.

    python benchmarks/fidelity/device_check.py --out DIR [--device cuda|cpu] [--quick] [--budget-s 480]

For a session lent an H200 for a few minutes (docs/calibration.md, "Device check").
Each step runs in its own process under a hard time limit, so a crash, a poisoned CUDA
context or a hang in one keeps the others' results:

1. `env`: Python, PyTorch (and whether it sees CUDA), Triton, simpy and the other
   packages; the check stops here (exit 2) when `--device cuda` finds no CUDA device or
   a package is missing.
2. `iterations`: the reference engine's whole steps over `llmsim calibrate`'s iteration
   grid (`sim.calibrate.itergrid`), decode points first (on CUDA each is timed eagerly
   and replayed from a CUDA graph) and the coarse tier first, stopped between points when
   its share of the budget is spent; writes `iter_grid_eager.csv`, `iter_grid_graphs.csv`,
   `skipped.csv` and `calibration.json` as calibrate does. No kernel tables: what is
   checked is the shipped profile, and the whole grid would not fit the budget.
3. here, without the device: the simulator's prediction of every measured step with the
   shipped profile `gpu_profiles/h200-sxm` — graph rows with the `cuda-graph` runtime
   (kernels only) and the reference model's kernels (`elementwise: unfused`, decode
   `paged_reference`), eager rows with `h200-eager-reference` (as the README's warm-grid
   table). Error = simulated / measured - 1.
4. `validate-NAME`: `llmsim validate SCENARIO --profile gpu_profiles/h200-sxm --runtime
   gpu_profiles/runtimes/h200-eager-live.yaml --runs 1` per held-out scenario, in order,
   each started only when the time left covers its estimate (a fixed start-up plus the
   simulator's own estimate of the run's length).

After every step DIR/device_check.md, device_check.json and device_check.tar.gz (the
work folder: grids, validation reports, each step's log; files over 4 MB left out) are
rewritten, so whatever stops the script, what was done is kept. Exit 0: every step that
ran succeeded (skips included); 1: a step failed or ran out of time; 2: this machine
cannot run the check.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import traceback
from dataclasses import asdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# the repository (sim) and this folder, first: a `benchmarks` or `sim` package installed on
# the machine must not shadow them
for _path in (str(Path(__file__).resolve().parent), str(ROOT)):
    if _path in sys.path:
        sys.path.remove(_path)
    sys.path.insert(0, _path)

import device_check_report as report  # noqa: E402 - after the path is set

FIXTURES = "tests/fixtures/calibrate"
PLANS = {  # per device: models measured, held-out scenarios validated in this order
    "cuda": {"models": "llama-3-8b,llama-3.2-1b",
             "scenarios": ["h200-llama-3-8b-r8-kv4096", "h200-llama-3-8b-r2", "h200-llama-3-8b"],
             "startup_s": 45.0},  # validate beyond its runs: imports, weights, warm-up, compiles
    "cpu": {"models": "tiny-llama", "scenarios": ["tiny"], "startup_s": 10.0},
}
ITER_SHARE = 0.4     # of the budget, for the iteration grid
STEP_SLACK_S = 60.0  # a step's hard limit beyond its own budget (start-up, the point under way)
RESERVE_S = 15.0     # kept for the comparisons, the summary and the archive
MAX_FILE_BYTES = 4 << 20
PACKAGES = ("numpy", "pandas", "yaml", "simpy", "tqdm", "torch", "triton")


# ---- steps run in their own process ----------------------------------------------------
def probe_env() -> dict:
    info: dict = {"python": platform.python_version(), "platform": platform.platform()}
    for name in PACKAGES:
        try:
            info[name] = getattr(importlib.import_module(name), "__version__", "present")
        except Exception as e:  # noqa: BLE001 - any import failure is the finding
            info[name] = f"missing ({type(e).__name__}: {str(e)[:80]})"
    if "torch" in sys.modules:
        import torch

        info["cuda_available"] = bool(torch.cuda.is_available())
        info["torch_cuda"] = torch.version.cuda
        if info["cuda_available"]:
            props = torch.cuda.get_device_properties(0)
            info["device_name"] = props.name
            info["device_memory_gib"] = round(props.total_memory / 2**30, 1)
    return info


def measure_iterations(models: list[str], out: Path, device: str, quick: bool,
                       budget_s: float) -> int:
    """calibrate's iteration points alone (decode first, coarse tier first), written as
    `llmsim calibrate` writes them; stops between points when `budget_s` is spent."""
    from sim.calibrate import itergrid
    from sim.calibrate.calibrate import metadata
    from sim.calibrate.device import Device, pick_device, pick_dtype, quiet_gc, set_threads
    from sim.calibrate.grids import GRIDS
    from sim.calibrate.output import TableWriter, write_meta
    from sim.costmodel.models import load_model

    t0 = time.perf_counter()
    specs = [load_model(m, file="--models", path="") for m in models]
    grid = "quick" if quick else "full"
    g = GRIDS[grid]
    dev_t = pick_device(device)
    set_threads(dev_t, None)
    dev = Device(dev_t, pick_dtype("auto", dev_t), warmup=g["warmup"], repeats=g["repeats"],
                 max_s_per_point=g["max_s_per_point"])
    resident = itergrid.Resident()
    points = sorted(itergrid.iteration_points(specs, g, resident),
                    key=lambda p: (" decode step " not in p.label, p.tier))
    meta = metadata(dev, models, grid, [])
    meta["command"] = " ".join(["benchmarks/fidelity/device_check.py", *sys.argv[1:]])
    if dev.cuda:
        meta["triton_paged_check"] = triton_check(dev)
    w = TableWriter(out)
    try:
        with quiet_gc():
            counts, stopped = run_points(points, dev, w, t0, budget_s)
    finally:
        resident.release(dev)
        w.close()
    meta.update(points=counts, stopped=stopped, timing=dict(dev.timing),
                seconds=round(time.perf_counter() - t0, 1))
    write_meta(w, meta)
    rows = {t: n for t, n in w.rows.items() if n}
    check = f"; Triton paged kernel check {meta['triton_paged_check']}" if dev.cuda else ""
    skipped = (f"; {counts['skipped']} skipped, {counts['errors']} of them errors "
               "(iter/skipped.csv, the log)") if counts["skipped"] else ""
    print(f"measured {counts['measured']}/{counts['total']} iteration points in "
          f"{time.perf_counter() - t0:.0f} s ({stopped}): {rows}{skipped}{check}")
    return 0


def triton_check(dev) -> str:
    """The Triton paged kernel against exact attention, before its first timings on a GPU
    (a failure is recorded; the timings are still worth having)."""
    from sim.calibrate.triton_paged import check_paged_attention

    try:
        result = f"passed, max error {check_paged_attention(dev.device, dev.dtype):.3g}"
    except Exception as e:  # noqa: BLE001 - a mismatch, or a compile error: recorded
        result = f"FAILED: {type(e).__name__}: {str(e)[:200]}"
    print(f"Triton paged kernel check: {result}", flush=True)
    return result


def run_points(points: list, dev, w, t0: float, budget_s: float) -> tuple[dict, str]:
    """Each point in turn; one that does not fit, runs out of memory or raises is recorded
    in skipped.csv (its traceback in the log) and the next runs: on a device never tried
    before, one failing shape (a graph capture, say) must not lose the others."""
    from sim.calibrate.device import TooLarge, is_oom

    counts = {"measured": 0, "skipped": 0, "errors": 0, "total": len(points)}
    for p in points:
        if time.perf_counter() - t0 > budget_s:
            return counts, "budget"
        try:
            rows = p.run(dev)
        except TooLarge as e:
            reason = f"too large: {e}"
        except Exception as e:  # noqa: BLE001 - recorded, see the docstring
            first = (str(e).splitlines() or [""])[0][:200]
            oom = is_oom(e)
            reason = f"out of memory: {first}" if oom else f"error: {type(e).__name__}: {first}"
            counts["errors"] += not oom
            traceback.print_exc()
            traceback.clear_frames(e.__traceback__)  # they hold the point's tensors
            gc.collect()
            dev.release()
        else:
            times = ", ".join(f"{r.get('_table', p.table)} {r['ms']:.3f} ms" for r in rows)
            for row in rows:
                w.add(p.table, row)
            counts["measured"] += 1
            print(f"{time.perf_counter() - t0:6.1f} s  {p.label}: {times}", flush=True)
            continue
        w.add("skipped", {"table": p.table, "what": p.label, "reason": reason})
        counts["skipped"] += 1
        print(f"{time.perf_counter() - t0:6.1f} s  {p.label}: skipped ({reason})", flush=True)
    return counts, "complete"


def publish(c: report.Check, out: Path, work: Path) -> None:
    """Rewrite the summary, its JSON and the archive of the work folder."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "device_check.md").write_text(report.markdown(c), encoding="utf-8")
    (out / "device_check.json").write_text(json.dumps(asdict(c), indent=1, default=str) + "\n")
    for name in ("iter_grid_graphs.csv", "iter_grid_eager.csv"):
        if (work / "iter" / name).is_file():
            shutil.copyfile(work / "iter" / name, out / name)
    tmp = out / "device_check.tar.gz.part"
    with tarfile.open(tmp, "w:gz") as tar:
        for f in sorted(p for p in work.rglob("*") if p.is_file()):
            if f.stat().st_size <= MAX_FILE_BYTES:
                tar.add(f, arcname=str(f.relative_to(work)))
    tmp.replace(out / "device_check.tar.gz")


# ---- the orchestration ------------------------------------------------------------------
class Clock:
    def __init__(self, budget_s: float):
        self.t0 = time.monotonic()
        self.deadline = self.t0 + budget_s

    def left(self) -> float:
        return self.deadline - time.monotonic() - RESERVE_S

    def log(self, msg: str) -> None:
        print(f"[device_check {time.monotonic() - self.t0:5.0f} s] {msg}", flush=True)


def run_step(name: str, argv: list[str], timeout_s: float,
             work: Path) -> tuple[report.Step, str]:
    """Run `python ARGV` in the repository root, killed after `timeout_s`; (the step, its
    stdout). Its output goes to WORK/logs/NAME.out and .err."""
    logs = work / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    paths = (str(ROOT), os.environ.get("PYTHONPATH"))
    env = {**os.environ, "PYTHONUNBUFFERED": "1",
           "PYTHONPATH": os.pathsep.join(p for p in paths if p)}
    t = time.monotonic()
    out_f, err_f = logs / f"{name}.out", logs / f"{name}.err"
    with open(out_f, "w") as so, open(err_f, "w") as se:
        try:
            rc = subprocess.run([sys.executable, *argv], cwd=ROOT, env=env, stdout=so, stderr=se,
                                stdin=subprocess.DEVNULL, timeout=max(1.0, timeout_s)).returncode
        except subprocess.TimeoutExpired:
            rc = None
    seconds = time.monotonic() - t
    tail = [ln for ln in err_f.read_text(errors="replace").splitlines() if ln.strip()][-1:]
    if rc is None:
        step = report.Step(name, "timed out", seconds, f"killed after {timeout_s:.0f} s")
    elif rc:
        step = report.Step(name, "failed", seconds, f"exit {rc}: {' '.join(tail)[:300]}")
    else:
        step = report.Step(name, "ok", seconds)
    return step, out_f.read_text(errors="replace")


def env_problem(env: dict, device: str) -> str:
    """Why this machine cannot run the check ("" when it can)."""
    problems = []
    if device == "cuda" and "cuda_available" in env and not env["cuda_available"]:
        problems.append(f"--device cuda, but PyTorch {env.get('torch')} sees no CUDA device "
                        "(torch.cuda.is_available() is False): nothing measured")
    needed = [p for p in PACKAGES if p != "triton" or device == "cuda"]
    missing = [p for p in needed if str(env.get(p, "missing")).startswith("missing")]
    if missing:
        problems.append(f"missing Python packages: {', '.join(missing)} (carry them as wheels: "
                        "docs/calibration.md, Device check)")
    return "; ".join(problems)


def expected_s(scenario: Path, startup_s: float, runs: int) -> float:
    """Start-up plus the simulator's own estimate of each real run's length."""
    from sim import run

    return startup_s + runs * run(scenario, {"runtime": "h200-eager-live"}).summary["duration_s"]


def iterations_step(c: report.Check, a, clock: Clock, work: Path) -> None:
    budget = min(ITER_SHARE * a.budget_s, clock.left())
    if budget < 5:
        c.steps.append(report.Step("iterations", "skipped", 0, f"{max(budget, 0):.0f} s left"))
        return
    argv = [str(Path(__file__).resolve()), "--step", "iterations", "--out", str(work / "iter"),
            "--device", a.device, "--models", a.models, "--budget-s", f"{budget:.0f}"]
    step, out = run_step("iterations", argv + (["--quick"] if a.quick else []),
                         min(budget + STEP_SLACK_S, clock.left()), work)
    step.detail = step.detail or (out.strip().splitlines() or [""])[-1]
    c.steps.append(step)


def comparisons(c: report.Check, work: Path) -> None:
    from sim.costmodel.runtime import load_runtime

    grids = work / "iter"
    for key, csv_name, runtime in (("graphs", "iter_grid_graphs.csv", report.graph_runtime),
                                   ("eager", "iter_grid_eager.csv",
                                    lambda: load_runtime("h200-eager-reference"))):
        t = time.monotonic()
        try:
            result = report.compare(grids / csv_name, runtime())
            if not result["rows"]:
                why = "CUDA only" if key == "graphs" and c.args["device"] != "cuda" else \
                    "the iterations step measured none"
                result = {"note": f"No rows in `{csv_name}` ({why})."}
            elif key == "graphs":
                result["fit"] = report.graph_fit(grids / csv_name)
            setattr(c, key, result)
            c.steps.append(report.Step(f"compare {key}", "ok", time.monotonic() - t))
        except Exception as e:  # noqa: BLE001 - recorded; the other steps go on
            setattr(c, key, {"note": f"Comparison failed: {type(e).__name__}: {e}"})
            c.steps.append(report.Step(f"compare {key}", "failed", time.monotonic() - t,
                                       str(e)[:300]))


def validate_step(c: report.Check, a, clock: Clock, work: Path, name: str,
                  startup_s: float) -> None:
    """`llmsim validate` of one held-out scenario, if the time left covers its estimate."""
    scenario = ROOT / FIXTURES / f"{name}.yaml"
    try:
        est = expected_s(scenario, startup_s, a.runs)
    except Exception as e:  # noqa: BLE001
        c.steps.append(report.Step(f"validate {name}", "failed", 0, f"estimate: {e}"[:300]))
        return
    if clock.left() < est:
        c.steps.append(report.Step(f"validate {name}", "skipped", 0,
                                   f"needs ~{est:.0f} s, {max(clock.left(), 0):.0f} s left"))
        return
    folder = work / f"validate-{name}"
    argv = ["-m", "sim", "validate", str(scenario.relative_to(ROOT)),
            "--profile", report.PROFILE, "--runtime", report.LIVE_RUNTIME, "--out", str(folder),
            "--device", a.device, "--runs", str(a.runs)]
    step, _ = run_step(f"validate-{name}", argv, clock.left(), work)
    step.detail = step.detail or f"estimated {est:.0f} s"
    c.steps.append(step)
    if (folder / "report.json").is_file():
        try:
            c.validations.append({"scenario": name, **report.validation_summary(folder)})
        except Exception as e:  # noqa: BLE001
            c.validations.append({"scenario": name, "error": f"unreadable report: {e}"})
    else:
        c.validations.append({"scenario": name, "error": f"no report ({step.status})"})


def env_step(c: report.Check, device: str, clock: Clock, work: Path) -> None:
    step, text = run_step("env", [str(Path(__file__).resolve()), "--step", "env"],
                          max(30.0, min(120.0, clock.left())), work)
    c.steps.append(step)
    try:
        c.env = json.loads(text.strip().splitlines()[-1])
    except (ValueError, IndexError):
        c.env = {"probe": f"{step.status} {step.detail}"}
    c.stopped = (env_problem(c.env, device) if step.status == "ok"
                 else "the environment probe failed (see logs/env.err in the archive)")
    clock.log(f"env: torch {c.env.get('torch')}, CUDA available {c.env.get('cuda_available')}, "
              f"device {c.env.get('device_name', '-')}")


OUT_FILES = {"device_check.md", "device_check.json", "device_check.tar.gz",
             "device_check.tar.gz.part", "iter_grid_graphs.csv", "iter_grid_eager.csv"}


def foreign(folder: Path, ours: set[str] | None) -> list[str]:
    """What in `folder` this script did not write (`ours`: the names it writes there;
    None: it must be empty or absent). Nothing of a user's is overwritten."""
    if not folder.exists():
        return []
    if not folder.is_dir():
        return [str(folder)]
    return sorted(p.name for p in folder.iterdir() if ours is None or p.name not in ours)


def _nested(a: Path, b: Path) -> bool:
    a, b = a.resolve(), b.resolve()
    return a == b or a in b.parents or b in a.parents


def orchestrate(a, argv: list[str]) -> int:
    clock = Clock(a.budget_s)
    out = Path(a.out)
    if a.work and _nested(Path(a.work), out):
        print(f"device_check: error: --work {a.work}: is --out or inside it, or holds it "
              "(allowed: a folder apart from --out)", file=sys.stderr)
        return 2
    for flag, folder, ours in (("--out", out, OUT_FILES), ("--work", Path(a.work or ""), None)):
        if (flag == "--out" or a.work) and foreign(folder, ours):
            print(f"device_check: error: {flag} {folder}: holds files this script did not write "
                  f"({', '.join(foreign(folder, ours)[:3])}) (allowed: an empty or new folder)",
                  file=sys.stderr)
            return 2
    work = Path(a.work) if a.work else Path(tempfile.mkdtemp(prefix="device_check-"))
    work.mkdir(parents=True, exist_ok=True)
    plan = PLANS[a.device]
    a.models = a.models or plan["models"]
    scenarios = a.scenarios.split(",") if a.scenarios else plan["scenarios"]
    c = report.Check(args={
        "command": shlex.join(["python", "benchmarks/fidelity/device_check.py", *argv]),
        "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "budget_s": a.budget_s, "device": a.device, "quick": a.quick, "models": a.models,
        "scenarios": scenarios, "runs": a.runs, "work": str(work)})
    clock.log(f"work folder {work}; summary in {out}/device_check.md")
    env_step(c, a.device, clock, work)
    publish(c, out, work)
    if c.stopped:
        clock.log(c.stopped)
        print(report.markdown(c))
        return 2
    iterations_step(c, a, clock, work)
    clock.log(f"iterations: {c.steps[-1].status} {c.steps[-1].detail}")
    comparisons(c, work)
    publish(c, out, work)
    for name in scenarios:
        validate_step(c, a, clock, work, name, plan["startup_s"])
        clock.log(f"validate {name}: {c.steps[-1].status} {c.steps[-1].detail}")
        publish(c, out, work)
    print(report.markdown(c))
    clock.log(f"done; wrote {out}/device_check.md, device_check.json, device_check.tar.gz")
    return 1 if any(s.status in ("failed", "timed out") for s in c.steps) else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", help="folder for device_check.md/.json/.tar.gz (e.g. \"$OUT\")")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--quick", action="store_true", help="calibrate's small iteration grid")
    ap.add_argument("--budget-s", type=float, default=480.0, help="wall-clock budget (s)")
    ap.add_argument("--runs", type=int, default=1, help="real runs per validation")
    ap.add_argument("--models", help="default: llama-3-8b,llama-3.2-1b (cuda), tiny-llama (cpu)")
    ap.add_argument("--scenarios", help=f"comma-separated names in {FIXTURES}/ "
                    "(default: per device)")
    ap.add_argument("--work", help="work folder (default: a new temporary folder)")
    ap.add_argument("--step", choices=("env", "iterations"), help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.step == "env":
        print(json.dumps(probe_env()))
        return 0
    if not a.out:
        ap.error("--out is required")
    if a.step == "iterations":
        return measure_iterations(a.models.split(","), Path(a.out), a.device, a.quick, a.budget_s)
    return orchestrate(a, sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    sys.exit(main())
