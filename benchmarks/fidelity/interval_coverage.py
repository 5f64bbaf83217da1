"""The 90 % prediction intervals: each provenance class's width sized on one part of the
validation record, its coverage checked on another.

    python benchmarks/fidelity/interval_coverage.py            # widths and coverage
    python benchmarks/fidelity/interval_coverage.py --check    # exit 1 if a claim fails

The errors are the accuracy suite's (benchmarks/fidelity/accuracy.py: time error
e = modelled / measured - 1, each row the held-out prediction of its dataset). Sizing
data: the published rows, the live log's held-out time blocks and the H200 grid held out
by model (CALIBRATION). The interval of a class is its **split-conformal 90 % quantile**
of |e| (the ceil(0.9 (n + 1))-th smallest of n rows, which covers a fresh row from the
same population with probability >= 90 %), taken per dataset over the rows where that
class has the largest share of step time, and the **widest over the datasets** with at
least MIN_ROWS such rows (every situation sized must be covered, not their average: a
plan's model is usually one no runtime was fitted to, as in the grid held out by model).
Then **a worse provenance is never surer** (ORDER: measured, derived, extrapolated,
analytic): a class narrower than the one before it takes that one's width; `derived`,
with two rows of its own, is set by this alone.

The split (FOLDS parts): the live log's rows by time block (block k is part k; the suite
already scores each block with a fit that did not see it), every other dataset's rows in
turn within each group (row i of a group is part i mod FOLDS). For each part, widths are
sized on the other parts and the part's rows are scored against them; the coverage
printed for a calibration dataset is over every row so scored, each row by widths that
never saw it, each row's half-width its classes' widths share-weighted over its step
time, as the simulator weighs them (`width`). The widths shipped in data/step_error_bands.yaml are the same rule on all
rows (`--check` fails if the file differs from it by more than rounding). Datasets not
used to size (the live log's load split, the published ratios) are scored with the
shipped widths: wholly out of sample.

`--check` (CI: tests/test_benchmarks.py) exits 1 if a calibration dataset's held-out
coverage is under 90 % or the file is stale.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.fidelity import published_check as pc  # noqa: E402
from benchmarks.fidelity.accuracy import CALIBRATION, Err, collect  # noqa: E402
from sim.planning.uncertainty import load_bands  # noqa: E402

FOLDS = 5  # parts of the split; the live log's 5 time blocks are its parts
MIN_ROWS = 9  # fewest rows a conformal 90 % quantile needs: ceil(0.9 (n + 1)) <= n
CLAIM = 0.90
ORDER = ("measured", "derived", "extrapolated", "analytic")  # surest provenance first
ROUNDING = 0.005  # how far the shipped file may sit from the rule (it rounds to 3 decimals)


def conformal_q90(values: list[float]) -> float | None:
    """The ceil(0.9 (n + 1))-th smallest value (None when n is too small to have one)."""
    v = sorted(values)
    k = math.ceil(CLAIM * (len(v) + 1))
    return v[k - 1] if k <= len(v) else None


def size(errs: list[Err]) -> dict[str, dict]:
    """class -> {interval90, by: what set it} from the calibration rows (module docstring):
    per class the widest over datasets of its conformal quantile, then never narrower than
    a surer class's (ORDER)."""
    cal = [e for e in errs if e.dataset in CALIBRATION]
    out: dict[str, dict] = {}
    floor, floor_by = 0.0, ""
    for cls in ORDER:
        qs = {}
        for ds in CALIBRATION:
            mine = [abs(e.error) for e in cal if e.dataset == ds and e.cls == cls]
            if len(mine) >= MIN_ROWS:
                qs[ds] = (conformal_q90(mine), len(mine))
        if qs:
            ds = max(qs, key=lambda d: qs[d][0])
            own, by = qs[ds][0], f"{ds} ({qs[ds][1]} rows)"
        else:
            n = sum(1 for e in cal if e.cls == cls)
            own, by = 0.0, f"too few rows of its own ({n})"
        if own < floor:
            own, by = floor, f"{by}; raised to {floor_by}'s (a worse provenance is never surer)"
        out[cls] = {"interval90": own, "by": by}
        floor, floor_by = own, cls
    return out


def parts(errs: list[Err], folds: int = FOLDS) -> list[int]:
    """Each row's part (module docstring): live rows by time block, others in turn by group."""
    seen: dict[tuple[str, str], int] = {}
    out = []
    for e in errs:
        if e.dataset.startswith("live") and e.id.startswith("time block"):
            out.append((int(e.id.split()[2].split("/")[0]) - 1) % folds)
            continue
        k = (e.dataset, e.group)
        out.append(seen.get(k, 0) % folds)
        seen[k] = seen.get(k, 0) + 1
    return out


def width(e: Err, widths: dict[str, dict]) -> float:
    """The half-width a row gets: its classes' widths share-weighted over its step time, as
    sim/planning/uncertainty.py interval_band weighs them (the widest if no shares)."""
    shares = dict(e.shares)
    total = sum(shares.values())
    if total <= 0:
        return max(w["interval90"] for w in widths.values())
    return sum(v * widths[c]["interval90"] for c, v in shares.items()) / total


def held_out_coverage(errs: list[Err], folds: int = FOLDS) -> dict[str, dict[str, float]]:
    """dataset -> {rows, coverage, width}: each calibration row scored by widths sized on
    the other parts (`width`: the mean half-width it was scored with)."""
    part = parts(errs, folds)
    hits: dict[str, list[tuple[bool, float]]] = {}
    for k in range(folds):
        widths = size([e for e, p in zip(errs, part, strict=True) if p != k])
        for e, p in zip(errs, part, strict=True):
            if p == k and e.dataset in CALIBRATION:
                w = width(e, widths)
                hits.setdefault(e.dataset, []).append((abs(e.error) <= w, w))
                hits.setdefault(f"{e.dataset} / {e.cls}", []).append((abs(e.error) <= w, w))
    return {k: {"rows": len(v), "coverage": float(np.mean([h for h, _ in v])),
                "width": float(np.mean([w for _, w in v]))} for k, v in hits.items()}


def shipped_coverage(errs: list[Err]) -> dict[str, dict[str, float]]:
    """Datasets not used to size, scored by the shipped widths (wholly out of sample)."""
    out = {}
    for ds in dict.fromkeys(e.dataset for e in errs if e.dataset not in CALIBRATION):
        mine = [e for e in errs if e.dataset == ds]
        out[ds] = {"rows": len(mine), "coverage": float(np.mean([abs(e.error) <= e.interval for e in mine])),
                   "width": float(np.mean([e.interval for e in mine]))}
    return out


def failures(errs: list[Err], held: dict, sized: dict) -> list[str]:
    out = [f"{ds}: held-out coverage {held[ds]['coverage']:.1%} under the claimed {CLAIM:.0%}"
           for ds in CALIBRATION if ds in held and held[ds]["coverage"] < CLAIM]
    bands = load_bands()
    out += [f"data/step_error_bands.yaml classes.{cls}.interval90 {bands[cls]['interval90']:.3f} is not "
            f"the rule's {r['interval90']:.3f} on this data (update it from this script)"
            for cls, r in sized.items() if abs(bands[cls]["interval90"] - r["interval90"]) > ROUNDING]
    return out


def render(sized: dict, held: dict, shipped: dict, markdown: bool = False) -> str:
    bands = load_bands()
    lines = pc._table(["class", "interval90 (rule, all rows)", "set by", "shipped"],
                      [[c, f"{r['interval90']:.1%}", r["by"], f"{bands[c]['interval90']:.1%}"]
                       for c, r in sized.items()], markdown)
    lines += ["", f"coverage of the 90 % interval (calibration rows: sized on the other {FOLDS - 1} of "
              f"{FOLDS} parts, scored on the part; other datasets: the shipped widths):"]
    body = [[k, "held out (other parts)", str(r["rows"]), f"{r['width']:.1%}", f"{r['coverage']:.1%}"]
            for k, r in held.items()]
    body += [[k, "check only (shipped widths)", str(r["rows"]), f"{r['width']:.1%}", f"{r['coverage']:.1%}"]
             for k, r in shipped.items()]
    return "\n".join(lines + pc._table(["dataset / class", "scored", "rows", "mean ±", "coverage"], body,
                                       markdown))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if a held-out coverage is under 90 %% "
                    "or data/step_error_bands.yaml differs from the rule")
    ap.add_argument("--markdown", action="store_true")
    a = ap.parse_args(argv)
    errs = collect(FOLDS)
    sized, held, shipped = size(errs), held_out_coverage(errs), shipped_coverage(errs)
    print(render(sized, held, shipped, a.markdown))
    bad = failures(errs, held, sized)
    for line in bad:
        print(f"interval coverage: {line}", file=sys.stderr)
    return 1 if a.check and bad else 0


if __name__ == "__main__":
    sys.exit(main())
