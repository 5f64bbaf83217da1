"""Writing a calibrated profile folder: tables as they are measured, then profile.yaml.

Every measured row is appended to its CSV and flushed at once, so an interrupted
or out-of-budget run keeps everything measured so far. `finish` then writes
`profile.yaml` (the simulator's `GPUFacts`: measured ceilings stand in for the
datasheet rates, and the roofline efficiencies are fitted to the tables with
`sim.fit.profile_convert`), fits the runtime profiles to the iteration grids with
`sim.fit.runtime_fit`, and writes `calibration.json` (metadata and fit errors).
"""

from __future__ import annotations

import csv
import json
import math
from dataclasses import asdict, replace
from pathlib import Path

import pandas as pd
import yaml

from sim.costmodel.profiles import PROFILES_DIR, TABLES, load_profile
from sim.costmodel.runtime import RUNTIMES_DIR, RuntimeSpec
from sim.fit.runtime_fit import error_summary, fit

COLUMNS = {
    **{t: list(cols) for t, cols in TABLES.items()},
    "sampling": ["op", "M", "V", "ms"],
    "iter_grid_eager": ["model", "kind", "batch", "new_tokens", "ctx", "ms"],
    "iter_grid_graphs": ["model", "kind", "batch", "new_tokens", "ctx", "ms"],
    "skipped": ["table", "what", "reason"],
}
OWNED = [f"{t}.csv" for t in COLUMNS] + ["profile.yaml", "calibration.json",
                                         "runtime-eager.yaml", "runtime-graphs.yaml"]
IN_PROGRESS = {"tool": "llmsim calibrate", "stopped": "running"}  # until write_meta replaces it
SOURCE_KEYS = ("device_name", "device", "driver", "torch", "triton", "dtype", "threads", "date",
               "command", "models", "grid", "host")
# Roofline parameters used when a table needed for their fit was not measured.
FALLBACK = {"flops": 0.75, "mem_bw": 0.75, "gemm_floor_ms": 0.01, "attn_prefill_flops": 0.3,
            "attn_prefill_floor_ms": 0.02, "naive_bytes_per_score": 40.0,
            "attn_decode_bw": {"contiguous": 0.8, "paged_reference": 0.5, "paged_gather": 0.3},
            "attn_decode_floor_ms": {"contiguous": 0.01, "paged_reference": 0.05, "paged_gather": 0.1},
            "paged_decode_overhead": 0.01}  # as gpu_profiles/h200-sxm (FlashInfer, MLSys 2025)


def _fmt(v):
    return f"{v:.6g}" if isinstance(v, float) else v


class TableWriter:
    """Appends rows to `<out>/<table>.csv` and flushes after each."""

    def __init__(self, out: Path):
        self.out = out
        out.mkdir(parents=True, exist_ok=True)
        # a new calibration replaces the previous one's files (sim/cli/calibrate.py has
        # checked that the folder is new, empty or one llmsim calibrate wrote), and marks
        # the folder as a calibration's from its start, so an interrupted one is still ours
        for name in OWNED:
            (out / name).unlink(missing_ok=True)
        (out / "calibration.json").write_text(json.dumps(IN_PROGRESS) + "\n")
        self.files: dict[str, tuple] = {}
        self.rows: dict[str, int] = dict.fromkeys(COLUMNS, 0)

    def add(self, table: str, row: dict) -> None:
        table = row.pop("_table", table)
        if table not in self.files:
            f = (self.out / f"{table}.csv").open("w", newline="")
            w = csv.DictWriter(f, fieldnames=COLUMNS[table])
            w.writeheader()
            self.files[table] = (f, w)
        f, w = self.files[table]
        w.writerow({k: _fmt(v) for k, v in row.items()})
        f.flush()
        self.rows[table] += 1

    def close(self) -> None:
        for f, _ in self.files.values():
            f.close()
        self.files.clear()

    def frame(self, table: str) -> pd.DataFrame:
        p = self.out / f"{table}.csv"
        return pd.read_csv(p) if p.is_file() and self.rows.get(table) else pd.DataFrame()


def _efficiency(w: TableWriter, ceil: dict) -> tuple[dict, dict]:
    """Efficiency fields fitted to the tables (fallbacks where a table is missing)."""
    from sim.fit.profile_convert import fit_attention_efficiency, fit_gemm_efficiency

    tf, tb = ceil["peak_tflops"], ceil["mem_bw_tbs"]
    eff, errors = json.loads(json.dumps(FALLBACK)), {}
    gemm, pre, dec = w.frame("gemm"), w.frame("attn_prefill"), w.frame("attn_decode")
    if len(gemm):
        g = fit_gemm_efficiency(gemm, tf, tb)
        eff.update(flops=g["flops"], mem_bw=g["mem_bw"], gemm_floor_ms=g["gemm_floor_ms"])
        errors["gemm"] = [g["median_rel_err"], g["p90_rel_err"]]
        impls = set(pre.get("impl", [])), set(dec.get("impl", []))
        if {"flash", "naive"} <= impls[0] and len(impls[1]):
            a = fit_attention_efficiency(pre, dec, tf, tb, g)
            for k in ("attn_prefill_flops", "attn_prefill_floor_ms", "naive_bytes_per_score"):
                eff[k] = round(float(a[k]), 4)
            for k in ("attn_decode_bw", "attn_decode_floor_ms"):
                eff[k].update({i: round(float(v), 4) for i, v in a[k].items()})
            errors.update(a["errors"])
    elem = w.frame("elementwise")
    eff["elementwise_floor_ms"] = round(float(elem["ms"].min()), 5) if len(elem) else 0.005
    eff["flops"], eff["mem_bw"] = min(1.0, eff["flops"]), min(1.0, eff["mem_bw"])
    eff["source"] = ("fitted to this folder's tables by sim.fit.profile_convert, against the measured "
                     "ceilings (fallbacks for tables not measured)")
    return eff, errors


def write_profile(w: TableWriter, meta: dict, ceil: dict, dev_facts: dict, note: str) -> Path:
    """profile.yaml for the tables measured so far; returns its path."""
    measured = [t for t in TABLES if w.rows[t]]
    eff, errors = _efficiency(w, ceil)
    facts = {
        "name": w.out.name,
        "description": f"{meta['device_name']}: measured by llmsim calibrate ({meta['dtype']})",
        "analytic": False if len(measured) == len(TABLES) else "partial",
        "source": [f"{k}: {v}" for k, v in meta.items() if k in SOURCE_KEYS] + [
            "method: medians after warm-up (CUDA events, the L2 flushed by a 256 MiB read on CUDA, "
            "the thread's CPU clock on the CPU), random inputs; see docs/calibration.md",
            "datasheet_* fields hold the measured ceilings (copy bandwidth, large GEMM)"],
        "memory_gib": round(dev_facts["total_bytes"] / 2**30, 2),
        "datasheet_memory_gb": round(dev_facts["total_bytes"] / 1e9, 2),
        "mem_bw_tbs": round(ceil["mem_bw_tbs"], 5),
        "peak_tflops": round(ceil["peak_tflops"], 5),
        "datasheet_mem_bw_tbs": round(ceil["mem_bw_tbs"], 5),
        "datasheet_tflops": round(ceil["peak_tflops"], 5),
        "pcie_gbs": round(ceil["pcie_gbs"], 3),
        "sms": dev_facts["units"],
        "efficiency": eff,
        "tables": {t: f"measured ({meta['device_name']}, {meta['date'][:10]})" for t in measured},
        "elementwise_kernels": "unfused",  # the reference model's eager ops (sim/calibrate/ops.py)
        "notes": note,
    }
    p = w.out / "profile.yaml"
    p.write_text("# Written by llmsim calibrate; see calibration.json for the run's details.\n"
                 + yaml.safe_dump(facts, sort_keys=False, width=100))
    meta["roofline_fit_errors"] = errors
    return p


def _unmeasured_terms(spec: RuntimeSpec, kinds: set[str], eager: RuntimeSpec | None
                      ) -> tuple[RuntimeSpec, str]:
    """Per-sequence host terms with no rows of their kind to fit them, set by a stated rule
    instead of the search's arbitrary value: verify steps launch attention per sequence
    as prefill steps do, so without verify rows the verify term is the prefill term
    (derived); a graph runtime (decode rows only) takes both from the eager fit, since a
    graph-capturing engine runs prefill and verify steps eagerly (derived), or 0 when no
    eager rows exist either (not fitted)."""
    notes = []
    if "prefill" not in kinds:
        c = eager.host_ms_per_prefill_seq_layer if eager else 0.0
        spec = replace(spec, host_ms_per_prefill_seq_layer=c)
        notes.append("host_ms_per_prefill_seq_layer " + (
            "derived: the eager fit's (no prefill rows)" if eager else "not fitted: 0 (no prefill rows)"))
    if "verify" not in kinds:
        spec = replace(spec, host_ms_per_verify_seq_layer=spec.host_ms_per_prefill_seq_layer)
        notes.append("host_ms_per_verify_seq_layer derived: = host_ms_per_prefill_seq_layer "
                     "(no verify rows)")
    return spec, "; ".join(notes)


def fit_runtimes(w: TableWriter, combine: str = "max") -> dict[str, dict]:
    """runtime-eager.yaml (and runtime-graphs.yaml) fitted to the iteration grids; for a
    profile written into gpu_profiles/, also gpu_profiles/runtimes/NAME-eager.yaml.
    `combine`: max on a GPU (host and kernels overlap), sum on the CPU (they do not).
    Terms whose kind of row was not measured are set by `_unmeasured_terms`, and say so."""
    out: dict[str, dict] = {}
    load_profile(str(w.out))  # fails loudly if the tables just written do not load
    eager: RuntimeSpec | None = None
    for mode, kinds in (("eager", ("prefill", "decode")), ("graphs", ("decode",))):
        grid = w.frame(f"iter_grid_{mode}")
        if not len(grid):
            continue
        rows = grid.to_dict("records")
        spec, table = fit(rows, str(w.out), f"{w.out.name}-{mode}", kinds=kinds, combine=combine)
        spec, derived = _unmeasured_terms(spec, {r["kind"] for r in rows if r["kind"] in kinds},
                                          eager)
        spec = replace(spec, description=f"{mode} reference engine on {w.out.name}", elementwise="unfused",
                       source=f"fitted by sim.fit.runtime_fit to {w.out.name}/iter_grid_{mode}.csv"
                       + (f"; {derived}" if derived else ""))
        eager = spec if mode == "eager" else eager
        text = yaml.safe_dump(asdict(spec), sort_keys=False)
        (w.out / f"runtime-{mode}.yaml").write_text(text)
        shared = RUNTIMES_DIR / f"{spec.name}.yaml"
        if w.out.parent.resolve() == PROFILES_DIR.resolve() and _ours_to_replace(shared, w.out):
            shared.write_text(text)  # usable as `runtime: NAME-eager`
        out[mode] = {k: {kk: (round(vv, 4) if isinstance(vv, float) and math.isfinite(vv) else vv)
                         for kk, vv in v.items()} for k, v in error_summary(table).items()}
    return out


def _ours_to_replace(runtime_file: Path, folder: Path) -> bool:
    """A shared runtime file may be (re)written when absent or when an earlier calibration
    of the same profile folder wrote it; any other runtime of that name is left alone."""
    if not runtime_file.exists():
        return True
    try:
        return f"fitted by sim.fit.runtime_fit to {folder.name}/iter_grid_" in runtime_file.read_text()
    except (OSError, UnicodeDecodeError):
        return False


def write_meta(w: TableWriter, meta: dict) -> None:
    (w.out / "calibration.json").write_text(json.dumps(meta, indent=2, default=str) + "\n")
