"""The accuracy suite: every public measurement set llmsim uses, in one error table.

    python benchmarks/fidelity/accuracy.py                 # the table (all datasets)
    python benchmarks/fidelity/accuracy.py --markdown      # the same as Markdown
    python benchmarks/fidelity/accuracy.py --check         # exit 1 if a median passes its limit
    python benchmarks/fidelity/accuracy.py --folds 2       # fewer folds (CI: tests/test_accuracy.py)

Datasets (docs/fidelity.md lists which were used to fit what):

    published       data/published/published_measurements.csv, each row costed as its stack
                    ran it (benchmarks/fidelity/published_check.py); nothing was fitted to
                    them: check only. Error = time error (negative: the simulator is fast).
    live-heldout    the live log of the H200 eager reference stack (data/live/cb_r16_*),
                    fit-log refitted on k-1 blocked time folds, each held-out step predicted
                    (sim/fit/crossval.py); the log was used to fit h200-eager-live, so only
                    held-out steps are scored here.
    live-load       the same log, fitted at low load (batch <= median), high-load steps
                    predicted, and the reverse: how the fit extrapolates in load.
    grid-heldout    the H200 whole-iteration grid (gpu_profiles/h200-sxm/
                    iter_grid_eager_reference.csv, two models): the eager runtime's host
                    terms refitted on one model's steps, the other model's steps predicted
                    (the shipped runtime is fitted to both: in-sample there).
    published-ratios
                    data/published/published_ratios.csv: published ratio figures for expert
                    parallel, MTP and pipeline parallel (and one per-GPU throughput) that
                    README cites beside simulated ones, simulated by the README scripts'
                    own functions (benchmarks/readme/readme_moe.py, readme_pipeline.py);
                    check only, never fitted. Error = simulated / published - 1 (negative:
                    llmsim shows less of the effect). Every row is flagged: "up to" figures,
                    other batch sizes or request shapes (the file's flag_note says which).

Per dataset and group: rows, median |error|, share within 10 % and 25 %, bias (mean
signed error), the 90th percentile of |error|, and the prediction interval's coverage:
each row's stated 90 % half-width is the share-weighted `interval90` of its lookups'
provenance classes (data/step_error_bands.yaml, sim/planning/uncertainty.py), and
"coverage" is the share of rows whose |error| is inside it (the shipped widths scored on
every row, including those they were sized on; benchmarks/fidelity/interval_coverage.py
sizes them on one part of the rows and checks coverage on another).
`--check` compares each dataset's median |error| with LIMITS: limits with headroom over
the figures measured (docs/fidelity.md), so a change that makes the model worse fails CI
and a small re-costing of some rows (e.g. H100/A100 attention derived from the H200
tables) does not.
"""

from __future__ import annotations

import argparse
import csv
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.fidelity import published_check as pc  # noqa: E402
from benchmarks.readme import readme_moe, readme_pipeline  # noqa: E402
from benchmarks.readme.readme_runs import Runs  # noqa: E402
from sim.costmodel.latency import StepLatency  # noqa: E402
from sim.costmodel.models import load_model  # noqa: E402
from sim.costmodel.profiles import load_profile  # noqa: E402
from sim.costmodel.runtime import RuntimeSpec, load_runtime  # noqa: E402
from sim.fit.crossval import load_folds, time_folds  # noqa: E402
from sim.fit.logfit import (  # noqa: E402
    fit_jitter,
    fit_rows,
    level_factors,
    predict_ms,
    read_logs,
    running_seqs,
    subset,
)
from sim.fit.runtime_fit import fit, gpu_times, predict, read_grid  # noqa: E402
from sim.planning.uncertainty import class_shares, interval_band  # noqa: E402

LIVE_STEPS = ROOT / "data" / "live" / "cb_r16_steps.csv"
LIVE_REQUESTS = ROOT / "data" / "live" / "cb_r16_requests.csv"
GRID = ROOT / "gpu_profiles" / "h200-sxm" / "iter_grid_eager_reference.csv"
RATIOS = ROOT / "data" / "published" / "published_ratios.csv"
LIVE_FIT = dict(model="llama-3-8b", gpu="h200-sxm", base="h200-eager-reference")

# median |error| each dataset must stay under (--check, tests/test_accuracy.py); measured on
# main at 1412c97 + this branch: published 8.4 %, live-heldout 3.4 %, live-load 11.1 %,
# grid-heldout 7.0 %; published-ratios 14.0 % at 8d1110f (5 rows, all flagged: its limit is
# wide, a third-row median moves a lot when one row is re-costed), 25.3 % with the sixth,
# gpt-oss-120b on one H100 (branch gptoss: +88 %: the MXFP4 experts' dequantisation in
# prefill priced at the bf16 GEMM rate, unmeasured, and a nearly full 80 GB GPU whose few
# GiB of KV llmsim may overstate; not tuned to it)
LIMITS = {"published": 0.12, "live-heldout": 0.06, "live-load": 0.12, "grid-heldout": 0.18,
          "published-ratios": 0.28}
ROLE = {"published": "check only", "live-heldout": "held out of fit-log's fit",
        "live-load": "held out (load extrapolation)",
        "grid-heldout": "held out (other model) of the runtime fit",
        "published-ratios": "check only, never fitted"}
PER_ROW = ("published-ratios",)  # datasets whose every row's error is printed


@dataclass(frozen=True)
class Err:
    dataset: str
    group: str
    id: str
    error: float  # modelled / measured time - 1
    interval: float  # the stated 90 % half-width for this row
    cls: str = ""  # the provenance class with the largest share of its step time
    shares: tuple[tuple[str, float], ...] = ()  # (class, share of its step time)
    detail: str = ""  # published vs simulated, for datasets printed row by row


def _bands(prov: dict[str, float]) -> tuple[float, str, tuple[tuple[str, float], ...]]:
    shares = class_shares(prov)
    return interval_band(prov), max(shares, key=shares.get), tuple(shares.items())


def published_errors() -> list[Err]:
    out = []
    for row in pc.read_rows():
        lat = pc.step_latency(row, row.runtime)
        simulated = pc.METRICS[row.metric](row, lat)
        out.append(Err("published", f"{row.gpu} {row.metric}", row.id,
                       pc.time_error(row.metric, simulated, row.value), *_bands(lat.provenance())))
    return out


def read_ratios(path: Path = RATIOS) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def ratio_errors(path: Path = RATIOS) -> list[Err]:
    """Each published ratio against the README scripts' simulated value. A row's interval is
    the single-figure interval of the runs it divides (their lookups' provenance pooled);
    a ratio's step-model errors partly cancel, so it is a loose statement."""
    runs = Runs()
    sims = {f"readme_moe.{k}": v for k, v in readme_moe.simulated_figures(runs).items()}
    sims |= {f"readme_pipeline.{k}": v for k, v in readme_pipeline.simulated_ratios().items()}
    out = []
    for row in read_ratios(path):
        value, summaries = sims[row["simulated_by"]]
        prov: dict[str, float] = {}
        for s in summaries:
            for k, v in (s.get("lookup_provenance") or {}).items():
                prov[k] = prov.get(k, 0.0) + v / len(summaries)
        published = float(row["published"])
        sim = f"{value:,.0f}" if value >= 100 else f"{value:.3g}"
        out.append(Err("published-ratios", row["group"], row["id"], value / published - 1,
                       *_bands(prov), detail=f"published {published:,g}, simulated {sim} "
                       f"({row['kind']}; {row['flag']})"))
    return out


def _live():
    model, gpu = load_model(LIVE_FIT["model"]), load_profile(LIVE_FIT["gpu"])
    base = load_runtime(LIVE_FIT["base"])
    logs = read_logs(LIVE_STEPS, LIVE_REQUESTS, model, gpu, elementwise=base.elementwise)
    # the provenance of the log's kernel lookups (one StepLatency over its decode shapes)
    lat = StepLatency(model, gpu, RuntimeSpec(name="k", elementwise=base.elementwise),
                      "flash", "paged_reference")
    for n in np.unique(logs.rows.seqs[logs.rows.kind == "decode"]).astype(int):
        lat.decode(int(n), int(n) * 700, 700)
    for n in (1, 2, 4):
        lat.prefill([(512, 0)] * n)
    return model, base, logs.rows, _bands(lat.provenance())


def _held_out(base, layers, rows, mask) -> tuple[np.ndarray, np.ndarray]:
    rt, fitted, _ = fit_rows(base, layers, subset(rows, mask), "cv")
    jitter = fit_jitter(fitted, predict_ms(rt, layers, fitted))
    held = subset(rows, ~mask)
    return predict_ms(rt, layers, held) * level_factors(jitter, held) / held.measured_ms - 1, held.kind


def live_errors(folds: int = 5) -> list[Err]:
    model, base, rows, bands = _live()
    out = []
    for f in time_folds(rows.kind, folds):
        err, kind = _held_out(base, model.layers, rows, f.fit)
        out += [Err("live-heldout", f"h200 {k} step", f.name, float(e), *bands)
                for e, k in zip(err, kind, strict=True)]
    for f in load_folds(running_seqs(rows)):
        err, kind = _held_out(base, model.layers, rows, f.fit)
        out += [Err("live-load", f"h200 {k} step ({f.name.split(',')[0]})", f.name, float(e), *bands)
                for e, k in zip(err, kind, strict=True)]
    return out


def grid_errors() -> list[Err]:
    rows = read_grid(GRID)
    models = sorted({r["model"] for r in rows})
    out = []
    for held in models:
        train = [r for r in rows if r["model"] != held]
        test = [r for r in rows if r["model"] == held]
        spec, _ = fit(train, "h200-sxm", "cv", elementwise="unfused")
        g = gpu_times(test, "h200-sxm")
        lat = StepLatency(load_model(held), load_profile("h200-sxm"),
                          RuntimeSpec(name="k", elementwise="unfused"), "flash", "paged_reference")
        for r in test:
            lat.gpu_ms(r["kind"], r["batch"], r["new_tokens"], r["ctx"])
        bands = _bands(lat.provenance())
        L = np.full(len(test), load_model(held).layers, float)
        P = np.array([r["batch"] if r["kind"] == "prefill" else 0 for r in test], float)
        V = np.array([r["batch"] if r["kind"] == "verify" else 0 for r in test], float)
        pred = predict(spec, g, L, P, V)
        out += [Err("grid-heldout", f"{held} {r['kind']} (fit on the other model)",
                    f"{r['model']} {r['kind']} b{r['batch']} n{r['new_tokens']} c{r['ctx']}",
                    float(p / r["ms"] - 1), *bands)
                for r, p in zip(test, pred, strict=True)]
    return out


def collect(folds: int = 5) -> list[Err]:
    return published_errors() + live_errors(folds) + grid_errors() + ratio_errors()


def stats(errs: list[Err]) -> dict[str, float]:
    e = np.array([x.error for x in errs])
    a = np.abs(e)
    return {"rows": len(e), "median_abs": float(np.median(a)), "within10": float((a <= 0.10).mean()),
            "within25": float((a <= 0.25).mean()), "bias": float(e.mean()),
            "p90_abs": float(np.quantile(a, 0.9)),
            "interval": float(np.mean([x.interval for x in errs])),
            "coverage": float(np.mean([abs(x.error) <= x.interval for x in errs]))}


def summary(errs: list[Err]) -> dict[str, dict[str, dict[str, float]]]:
    """dataset -> group ("all" first) -> stats."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    for ds in dict.fromkeys(x.dataset for x in errs):
        mine = [x for x in errs if x.dataset == ds]
        out[ds] = {"all": stats(mine)}
        for g in sorted({x.group for x in mine}):
            out[ds][g] = stats([x for x in mine if x.group == g])
    return out


def render(errs: list[Err], markdown: bool = False) -> str:
    head = ["dataset", "group", "rows", "median |err|", "within 10 %", "within 25 %", "bias",
            "p90 |err|", "90 % interval ±", "coverage"]
    body = []
    for ds, groups in summary(errs).items():
        for g, s in groups.items():
            body.append([ds, g if g != "all" else f"all ({ROLE[ds]})", str(s["rows"]),
                         f"{s['median_abs']:.1%}", f"{s['within10']:.0%}", f"{s['within25']:.0%}",
                         f"{s['bias']:+.1%}", f"{s['p90_abs']:.1%}", f"{s['interval']:.1%}",
                         f"{s['coverage']:.0%}"])
    everything = stats(errs)
    body.append(["all datasets", "", str(everything["rows"]), f"{everything['median_abs']:.1%}",
                 f"{everything['within10']:.0%}", f"{everything['within25']:.0%}",
                 f"{everything['bias']:+.1%}", f"{everything['p90_abs']:.1%}",
                 f"{everything['interval']:.1%}", f"{everything['coverage']:.0%}"])
    lines = pc._table(head, body, markdown)
    for ds in PER_ROW:
        mine = [x for x in errs if x.dataset == ds]
        if mine:
            lines += ["", f"{ds}, row by row (error = simulated / published - 1):"]
            lines += pc._table(["id", "group", "error", "published vs simulated"],
                               [[x.id, x.group, f"{x.error:+.1%}", x.detail] for x in mine],
                               markdown)
    return "\n".join(lines)


CALIBRATION = ("published", "live-heldout", "grid-heldout")  # what interval90 is sized on
# (benchmarks/fidelity/interval_coverage.py)


def failures(errs: list[Err]) -> list[str]:
    out = []
    for ds, groups in summary(errs).items():
        m = groups["all"]["median_abs"]
        if m > LIMITS[ds]:
            out.append(f"{ds}: median |error| {m:.1%} over its limit {LIMITS[ds]:.0%}")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--folds", type=int, default=5, help="blocked time folds of the live log")
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument("--check", action="store_true", help="exit 1 if a median passes LIMITS")
    a = ap.parse_args(argv)
    if a.folds < 2:
        ap.error("--folds: at least 2")
    errs = collect(a.folds)
    print(render(errs, a.markdown))
    bad = failures(errs)
    for line in bad:
        print(f"accuracy: {line}", file=sys.stderr)
    return 1 if a.check and bad else 0


if __name__ == "__main__":
    sys.exit(main())
