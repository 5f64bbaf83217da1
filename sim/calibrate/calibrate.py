"""`llmsim calibrate`: measure a GPU (or CPU) profile in the simulator's own format.

The points (`bench.kernel_points`, `itergrid.iteration_points`) run in order of
importance (`grids.TABLE_ORDER`, coarse tier first). A point whose tensors do
not fit, or that runs out of memory, is recorded in `skipped.csv` and the run
goes on; a time budget stops the run between points; Ctrl-C stops it at once.
Either way the rows measured so far are on disk and `finish` writes profile.yaml
and the runtime fits for them.
"""

from __future__ import annotations

import datetime
import gc
import platform
import shutil
import subprocess
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

import torch

from sim.calibrate import bench, itergrid
from sim.calibrate.device import (
    Device,
    TooLarge,
    is_oom,
    pick_device,
    pick_dtype,
    quiet_gc,
    set_threads,
)
from sim.calibrate.grids import GRIDS, TABLE_ORDER
from sim.calibrate.output import TableWriter, fit_runtimes, write_meta, write_profile
from sim.costmodel.models import load_model


@dataclass
class Outcome:
    out: Path
    measured: int = 0
    total: int = 0
    skipped: int = 0
    oom: int = 0  # of the skipped: ran out of memory despite the size check
    stopped: str = ""  # "", "budget" or "interrupted"
    seconds: float = 0.0
    runtimes: dict = field(default_factory=dict)
    rows: dict = field(default_factory=dict)


def _driver() -> str:
    if not torch.cuda.is_available():
        return "n/a (cpu)"
    if shutil.which("nvidia-smi"):
        try:
            r = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                               capture_output=True, text=True, timeout=10)
            if r.returncode == 0 and r.stdout.strip():
                return r.stdout.strip().splitlines()[0]
        except (OSError, subprocess.SubprocessError):
            pass
    return f"unknown (CUDA runtime {torch.version.cuda})"


def metadata(dev: Device, models: list[str], grid: str, argv: list[str]) -> dict:
    meta = {
        "device_name": dev.name,
        "device": str(dev.device),
        "driver": _driver(),
        "torch": torch.__version__,
        "dtype": str(dev.dtype).replace("torch.", ""),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(["llmsim", *argv]) if argv else "llmsim calibrate",
        "models": ",".join(models),
        "grid": grid,
        "host": f"{platform.system()} {platform.machine()}, python {platform.python_version()}",
        "threads": torch.get_num_threads(),
    }
    if dev.cuda:
        try:
            import triton

            meta["triton"] = triton.__version__
        except ImportError:
            meta["triton"] = "not installed"
    return meta


def ordered(points: list[bench.Point]) -> list[bench.Point]:
    """Tier 0 first; within a tier by table importance; stable otherwise."""
    rank = {t: i for i, t in enumerate(TABLE_ORDER)}
    return sorted(points, key=lambda p: (p.tier, rank[p.table]))


def calibrate(models: list[str], out: Path, *, device: str = "auto", dtype: str = "auto",
              quick: bool = False, budget_s: float | None = None, progress: bool = True,
              threads: int | None = None, argv: list[str] | None = None) -> Outcome:
    """Measure every point (or as many as the budget allows) and write the profile folder.

    Raises KeyboardInterrupt after writing the partial profile when interrupted.
    """
    t0 = time.perf_counter()
    specs = [load_model(m, file="--models", path="") for m in models]
    g = GRIDS["quick" if quick else "full"]
    dev_t = pick_device(device)
    set_threads(dev_t, threads)
    dev = Device(dev_t, pick_dtype(dtype, dev_t), warmup=g["warmup"], repeats=g["repeats"],
                 max_s_per_point=g["max_s_per_point"])
    meta = metadata(dev, models, "quick" if quick else "full", argv or [])
    w = TableWriter(out)
    res = Outcome(out)
    resident = itergrid.Resident()  # the reference model, while iteration points run
    points = ordered(bench.kernel_points(specs, g)
                     + itergrid.iteration_points(specs, g, resident))
    res.total = len(points)
    ceil: dict = {}
    try:
        with quiet_gc():
            ceil = bench.ceilings(dev, *g["ceilings"][dev_t.type])
            _measure(points, dev, w, res, t0, budget_s, progress, resident)
    except KeyboardInterrupt:
        res.stopped = "interrupted"
        raise
    finally:
        resident.release(dev)
        meta["timing"] = dict(dev.timing)
        w.close()
        res.seconds = time.perf_counter() - t0
        res.rows = {t: n for t, n in w.rows.items() if n}
        _finish(w, meta, ceil, dev, res)
    return res


def _measure(points: list[bench.Point], dev: Device, w: TableWriter, res: Outcome, t0: float,
             budget_s: float | None, progress: bool, resident: itergrid.Resident) -> None:
    """Run the points in order. Between phases the reference model and its KV pool are
    released (a kernel point after an iteration point runs on an empty device); after an
    out-of-memory error the failed point's tensors are dropped before the cache is
    emptied, so the next point starts from the memory the failed one found."""
    from tqdm import tqdm

    bar = tqdm(points, desc="calibrating", unit="pt", leave=False,  # on stderr
               disable=not progress)
    for p in bar:
        if budget_s is not None and time.perf_counter() - t0 > budget_s:
            res.stopped = "budget"
            break
        bar.set_postfix_str(p.label[:40])
        if p.table != "iteration":
            resident.release(dev)  # no-op unless an iteration point ran last
        oom = ""
        try:
            rows = p.run(dev)
        except TooLarge as e:
            w.add("skipped", {"table": p.table, "what": p.label, "reason": f"too large: {e}"})
            res.skipped += 1
            continue
        except (RuntimeError, MemoryError) as e:
            if not is_oom(e):
                raise
            oom = "out of memory: " + str(e).splitlines()[0][:120]
            # the traceback's frames hold the point's tensors: clear them, and `e` goes
            # at the end of this clause
            traceback.clear_frames(e.__traceback__)
        if oom:
            gc.collect()  # the collector is paused while measuring; cycles too
            dev.release()
            w.add("skipped", {"table": p.table, "what": p.label, "reason": oom})
            res.skipped += 1
            res.oom += 1
            continue
        for row in rows:
            w.add(p.table, row)
        res.measured += 1
    bar.close()


def _finish(w: TableWriter, meta: dict, ceil: dict, dev: Device, res: Outcome) -> None:
    meta["points"] = {"measured": res.measured, "skipped": res.skipped, "out_of_memory": res.oom,
                      "total": res.total}
    meta["stopped"] = res.stopped or "complete"
    meta["seconds"] = round(res.seconds, 1)
    meta["ceilings"] = {k: round(v, 5) for k, v in ceil.items()}
    if ceil:
        note = {"": "complete", "budget": "partial: the time budget ran out",
                "interrupted": "partial: interrupted"}[res.stopped]
        note += f"; {res.measured}/{res.total} points measured, {res.skipped} skipped"
        write_profile(w, meta, ceil, {"total_bytes": dev.total_bytes(), "units": dev.units()},
                      note)
        try:
            res.runtimes = fit_runtimes(w, "max" if dev.cuda else "sum")
            meta["runtime_fit_errors"] = res.runtimes
        except KeyboardInterrupt:  # a second Ctrl-C: keep the tables and profile.yaml
            meta["runtime_fit_errors"] = "interrupted"

    write_meta(w, meta)
