"""Profile maintenance: converting measured tables into a profile, the L2 write-back fit,
and fitting a runtime's host terms to a grid of whole iterations.

    python -m sim.cli.maintain profile-convert SRC DST
    python -m sim.cli.maintain l2flush gpu_profiles/h200-sxm
    python -m sim.cli.maintain runtime-fit GRID.csv --name NAME [--gpu G] [--write]
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import asdict, replace
from pathlib import Path

import yaml


def profile_convert(argv: list[str]) -> int:
    from sim.fit.profile_convert import convert_measured, convert_peers, fit_report

    ap = argparse.ArgumentParser(prog="python -m sim.cli.maintain profile-convert",
                                 description="Convert measured kernel data into gpu_profiles/<gpu>/ "
                                             "tables, and fit roofline efficiencies.")
    ap.add_argument("src", type=Path, help="measurement folder or Vidur peers folder")
    ap.add_argument("dst", type=Path, help="profile folder (measured) or gpu_profiles/ (peers)")
    args = ap.parse_args(argv)
    if (args.src / "ceilings.csv").is_file():
        written = convert_measured(args.src, args.dst)
    elif any(args.src.glob("mlp_*.csv")):
        written = convert_peers(args.src, args.dst)
    else:
        ap.error(f"{args.src}: neither a measurement folder nor Vidur mlp_*.csv files")
    for p in written:
        print(f"wrote {p} ({sum(1 for _ in p.open()) - 1} rows)")
    for folder in sorted({p.parent for p in written}):
        for line in fit_report(folder):
            print(line)
    return 0


def l2flush(argv: list[str]) -> int:
    from sim.costmodel.l2flush import fit_write_back

    ap = argparse.ArgumentParser(prog="python -m sim.cli.maintain l2flush",
                                 description="Fit the dirty-L2 write-back of a flushed profile.")
    ap.add_argument("folder", help="a profile folder (attn_decode.csv, gemm.csv)")
    fit = fit_write_back(ap.parse_args(argv).folder)
    for name in ("no_write_back", "fit"):
        s = fit[name]
        floors = ", ".join(f"{k} {v:.2f} us" for k, v in s["floor_us"].items())
        medians = ", ".join(f"{k} {v:.1%}" for k, v in s["median"].items())
        print(f"{name:14} D {s['dirty_l2_mb']:5.1f} MB  B {s['write_back_tbs']:.3f} TB/s  floors "
              f"{floors}  RMS {s['rms']:.1%}  median |error| {medians}")
    lo, hi = fit["within_0.2_points"]
    print(f"{fit['rows']} rows; RMS within 0.2 points of the best for D in {lo:g}..{hi:g} MB")
    return 0


def runtime_fit(argv: list[str]) -> int:
    from sim.costmodel.runtime import RUNTIMES_DIR
    from sim.fit.runtime_fit import error_summary, fit, format_table, read_grid

    ap = argparse.ArgumentParser(prog="python -m sim.cli.maintain runtime-fit",
                                 description="Fit a runtime (host-overhead) profile to measured "
                                             "whole-iteration latencies.")
    ap.add_argument("grid")
    ap.add_argument("--gpu", default="h200-sxm")
    ap.add_argument("--name", required=True)
    ap.add_argument("--description", default="")
    ap.add_argument("--elementwise", choices=("unfused", "fused"), default="unfused",
                    help="the elementwise kernels the grid's stack ran (default: unfused, "
                         "the eager reference model's PyTorch ops)")
    ap.add_argument("--write", action="store_true", help="write gpu_profiles/runtimes/NAME.yaml")
    a = ap.parse_args(argv)
    spec, table = fit(read_grid(a.grid), a.gpu, a.name, elementwise=a.elementwise)
    spec = replace(spec, description=a.description,
                   source=f"fitted by sim.fit.runtime_fit to {Path(a.grid).name} on {a.gpu}")
    print(format_table(table))
    for k, v in error_summary(table).items():
        print(f"{k:24} rows {v['rows']:3d}  mean |error| {v['mape']:6.1%}  "
              f"mean error {v['bias']:+6.1%}  max |error| {v['max']:6.1%}")
    print(yaml.safe_dump(asdict(spec), sort_keys=False))
    if a.write:
        (RUNTIMES_DIR / f"{a.name}.yaml").write_text(yaml.safe_dump(asdict(spec), sort_keys=False))
    return 0


TOOLS = {"profile-convert": profile_convert, "l2flush": l2flush, "runtime-fit": runtime_fit}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in TOOLS:
        print(f"usage: python -m sim.cli.maintain {{{','.join(TOOLS)}}} ...", file=sys.stderr)
        return 2
    return TOOLS[argv[0]](argv[1:])


if __name__ == "__main__":
    sys.exit(main())
