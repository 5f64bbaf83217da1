"""Throughput-latency curves: each scenario at a list of offered request rates.

Every point is a run of the scenario at a Poisson rate (trace arrivals become Poisson
over the trace's lengths, as in `sim/planning/capacity.py`), through the sweep executors,
as long as the steady rule of a plan's probes asks (`sim/planning/steady.py`: at least
`--requests` and 60 s of traffic, warm-up discarded, doubled up to 480 s until the
halves of the measured window agree, or stopped once the point clearly fails; the
halves are compared against the scenario's SLO bounds, TTFT's else `--ttft-bound`).
Columns: p50/p99 TTFT, TPOT and E2E over the measured window, goodput (finished
requests/s meeting the scenario's SLOs; empty when it sets none), achieved request rate,
steady throughput ratio, the rule's verdict and the traffic the point ran.

The saturation knee of a scenario is the highest offered rate r such that at r and at
every lower rate of the curve
* p99 TTFT <= the TTFT bound (the scenario's `slo.ttft_s`, else `--ttft-bound`, else
  10 x the p99 TTFT at the curve's lowest rate), and
* steady throughput (completions over the middle half of the arrivals, see
  `steady_throughput`) >= 90 % of offered: the replica keeps up.
Past the knee the queue grows without bound for as long as the traffic lasts.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from sim.config.scenario import load_scenario
from sim.io.outdir import write_output
from sim.planning.capacity import rate_overrides
from sim.planning.steady import SteadyRule, steady_run
from sim.planning.sweep import UNSTABLE, check_configs, config_key, execute, flatten

KNEE_THROUGHPUT_RATIO = 0.9
DEFAULT_RULE = SteadyRule()
COLUMNS = ["scenario", "rate", "seed", "ttft_s.p50", "ttft_s.p99", "tpot_s.p50", "tpot_s.p99",
           "e2e_s.p50", "e2e_s.p99", "goodput.requests_per_s", "request_throughput",
           "steady.ratio", "gpu_busy_fraction", "gpu_kernel_fraction", "mean_batch_size", "preemptions",
           "steady.verdict", "steady.traffic_s"]


def steady_point(scenario_file: str, overrides: dict, *, ttft_bound: float | None = None,
                 rule: SteadyRule = DEFAULT_RULE) -> dict:
    """One curve point under the steady rule, as a flattened row (run in a worker)."""
    from sim.engine.runner import run

    sc = load_scenario(scenario_file, overrides)
    rate = float(overrides["workload.arrival"]["rate"])
    bounds = {"ttft_s": sc.slo.ttft_s or ttft_bound, "tpot_s": sc.slo.tpot_s, "e2e_s": sc.slo.e2e_s}
    rule = dataclasses.replace(rule, min_requests=int(overrides["workload.num_requests"]))

    def run_n(n: int):
        out = run(scenario_file, {**overrides, "workload.num_requests": n})
        return out.requests, out.summary
    summary = steady_run(run_n, rate, rule, bounds)
    if summary.get("goodput") is not None:  # the window's goodput in requests/s
        span = summary["steady"]["window_s"]
        met = summary["goodput"]["fraction_met"] * summary["steady"]["window_arrivals"]
        summary["goodput"] = {**summary["goodput"], "requests_per_s": met / max(span, 1e-12)}
    summary.pop("whole_run")
    return {k: v for k, v in flatten(summary).items() if k not in UNSTABLE}


def curve_tasks(files: list[str], rates: list[float], requests: int | None, seed: int | None):
    tasks, meta = [], []
    for f in files:
        sc = load_scenario(f)
        n = requests or sc.workload.num_requests or 500
        overs = [{**rate_overrides(sc.workload.arrival, r, n), **({"seed": seed} if seed is not None else {})}
                 for r in rates]
        check_configs(f, {}, overs, names=[f"curve point {r:g} req/s" for r in rates],
                      origin="--rates")  # every point, before any run
        for r, over in zip(rates, overs, strict=True):
            tasks.append((config_key(f, {}, over), f, over))
            meta.append((sc.name, r, sc.seed if seed is None else seed, sc.slo.ttft_s))
    return tasks, meta


def run_curve(files: list[str], rates: list[float], out_dir: str | Path | None = None, *,
              requests: int | None = None, seed: int | None = None, ttft_bound: float | None = None,
              executor: str = "process", workers: int | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Run every (scenario, rate); return the curve table and the knee table."""
    rates = sorted(float(r) for r in rates)
    tasks, meta = curve_tasks([str(f) for f in files], rates, requests, seed)
    rows = dict(execute(tasks, executor, workers, fn=functools.partial(steady_point, ttft_bound=ttft_bound)))
    recs = []
    for (key, _, _), (name, rate, s, _) in zip(tasks, meta, strict=True):
        row = rows[key]
        recs.append({"scenario": name, "rate": rate, "seed": s, **{c: row.get(c) for c in COLUMNS[3:]}})
    table = pd.DataFrame.from_records(recs, columns=COLUMNS)
    bounds = {name: b for name, _, _, b in meta}
    knees = knee_table(table, {n: b or ttft_bound for n, b in bounds.items()})
    if out_dir is not None:
        def write(folder: Path) -> None:
            table.to_csv(folder / "curve.csv", index=False)
            knees.to_csv(folder / "knees.csv", index=False)
            plot_curves(table, knees).savefig(folder / "curve.png", dpi=110)

        write_output(out_dir, "curve", write, {"scenarios": [str(f) for f in files], "rates": rates})
    return table, knees


def knee(points: pd.DataFrame, ttft_bound: float | None) -> tuple[float | None, float]:
    """(knee rate or None, the TTFT bound used) for one scenario's points."""
    pts = points.sort_values("rate")
    bound = ttft_bound if ttft_bound else 10 * float(pts["ttft_s.p99"].iloc[0])
    best = None
    for r, p99, ratio in zip(pts.rate, pts["ttft_s.p99"], pts["steady.ratio"], strict=True):
        ok = p99 is not None and not math.isnan(p99) and p99 <= bound and \
            (ratio is None or math.isnan(ratio) or ratio >= KNEE_THROUGHPUT_RATIO)
        if not ok:
            break
        best = float(r)
    return best, bound


def knee_table(table: pd.DataFrame, bounds: dict[str, float | None]) -> pd.DataFrame:
    recs = []
    for name, pts in table.groupby("scenario", sort=False):
        k, b = knee(pts, bounds.get(name))
        recs.append({"scenario": name, "knee_rate": k, "ttft_bound_s": b})
    return pd.DataFrame.from_records(recs, columns=["scenario", "knee_rate", "ttft_bound_s"])


def rate_panel(table: pd.DataFrame) -> tuple[str, dict[str, str]]:
    """The fourth panel's title and, per scenario, the column it plots: goodput (finished
    requests/s meeting the scenario's SLOs) where the scenario sets SLOs, else plain
    request throughput, and the title says which. The knee is not defined by goodput
    (it is p99 TTFT against the bound, and throughput keeping up), so the panel does not
    invent a goodput from `--ttft-bound`."""
    column = {name: "goodput.requests_per_s" if pts["goodput.requests_per_s"].notna().any()
              else "request_throughput" for name, pts in table.groupby("scenario", sort=False)}
    kinds = set(column.values())
    if kinds == {"request_throughput"}:
        return "throughput (req/s; no SLO set)", column
    if kinds == {"goodput.requests_per_s"}:
        return "goodput (req/s meeting the SLOs)", column
    return "goodput (req/s meeting the SLOs; throughput where none)", column


def plot_curves(table: pd.DataFrame, knees: pd.DataFrame) -> Figure:
    """Four panels against offered rate: TTFT, TPOT, E2E (p50 dashed, p99 solid), and
    goodput or, for a scenario without SLOs, request throughput (`rate_panel`)."""
    fig = Figure(figsize=(11, 7.5), layout="constrained")
    axes = fig.subplots(2, 2)
    rate_title, rate_column = rate_panel(table)
    panels = (("TTFT (s)", "ttft_s"), ("TPOT (s)", "tpot_s"), ("E2E latency (s)", "e2e_s"),
              (rate_title, None))
    colors = {n: f"C{i}" for i, n in enumerate(dict.fromkeys(table.scenario))}
    knee_at = dict(zip(knees.scenario, knees.knee_rate, strict=True))
    mixed = len(set(rate_column.values())) > 1
    for ax, (title, key) in zip(np.ravel(axes), panels, strict=True):
        for name, pts in table.groupby("scenario", sort=False):
            c = colors[name]
            if key:
                ax.plot(pts.rate, pts[f"{key}.p99"], "-o", color=c, ms=3, label=f"{name} p99")
                ax.plot(pts.rate, pts[f"{key}.p50"], "--", color=c, label=f"{name} p50")
                ax.set_yscale("log")
            else:
                col = rate_column[name]
                label = f"{name} ({'goodput' if col.startswith('goodput') else 'throughput'})" if mixed else name
                ax.plot(pts.rate, pts[col].astype(float), "-o", color=c, ms=3, label=label)
                ax.plot(pts.rate, pts.rate, ":", color="grey", lw=0.8)
            k = knee_at.get(name)
            if k is not None and not (isinstance(k, float) and math.isnan(k)):
                ax.axvline(k, color=c, ls=":", lw=1.2)
        ax.set_title(title)
        ax.set_xlabel("offered load (requests/s)")
        ax.grid(alpha=0.3)
    np.ravel(axes)[0].legend(fontsize=7)
    if mixed:
        np.ravel(axes)[3].legend(fontsize=7)
    fig.suptitle("throughput-latency curves (dotted vertical line: saturation knee)")
    return fig
