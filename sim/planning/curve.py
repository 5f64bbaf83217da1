"""Throughput-latency curves: each scenario at a list of offered request rates.

Every point is a run of the scenario at a Poisson rate (trace arrivals become Poisson
over the trace's lengths, as in `sim/planning/capacity.py`), through the sweep executors,
as long as the steady rule of a plan's probes asks (`sim/planning/steady.py`: at least
`--requests` and 60 s of traffic, warm-up discarded, doubled up to 480 s until the
halves of the measured window agree, or stopped once the point clearly fails; the
halves are compared against the scenario's SLO bounds, TTFT's else `--ttft-bound`).
Columns: p50/p99 TTFT, TPOT and E2E over the measured window, goodput (finished
requests/s meeting the scenario's SLOs; empty when it sets none), achieved request rate,
steady throughput ratio, the rule's verdict and the traffic the point ran. Each p50/p99
latency has its 90 % prediction interval (`<figure>.low90`, `<figure>.high90`;
`sim/planning/uncertainty.py`): a point runs one seed, so it is the step model's 90 %
error alone (`interval90_model`, by what the point's step time stands on), no seed
spread; the plot shades the p99's.

The saturation knee of a scenario is the highest offered rate r such that at r and at
every lower rate of the curve
* p99 TTFT <= the TTFT bound (the scenario's `slo.ttft_s`, else `--ttft-bound`, else
  10 x the p99 TTFT at the curve's lowest rate),
* p99 TPOT <= the scenario's `slo.tpot_s` (when it sets one), and
* steady throughput (completions over the middle half of the arrivals, see
  `steady_throughput`) >= 90 % of offered: the replica keeps up.
Past the knee the queue grows without bound for as long as the traffic lasts. Where every
rate tried passes there is no knee in the curve: the knee table says so ("no knee up to
the highest rate tried") and its rate is that highest rate, a lower bound on the knee.

With `concurrency` instead of rates every point is a closed loop of C users
(`sim/workload/clients.py`: each sends its next request when its previous one ended),
as benchmark tools sweep `--max-concurrency`; the tables then have a `concurrency`
column instead of `rate`, and the knee is the highest C whose p99 TTFT meets the bound
(a closed loop always keeps up with itself).
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
LATENCIES = ["ttft_s.p50", "ttft_s.p99", "tpot_s.p50", "tpot_s.p99", "e2e_s.p50", "e2e_s.p99"]
INTERVAL_COLUMNS = ["interval90_model", *(f"{c}.{end}" for c in LATENCIES for end in ("low90", "high90"))]


def point_intervals(row: dict) -> dict:
    """A curve point's 90 % intervals: each latency's from the step model's error by the
    point's lookup provenance (its `lookup_provenance.*` columns); one seed, no spread."""
    from sim.planning.uncertainty import interval_band, latency_interval

    prov = {k.split(".", 1)[1]: v for k, v in row.items()
            if k.startswith("lookup_provenance.") and isinstance(v, int | float)}
    b = interval_band(prov)
    out: dict = {"interval90_model": b}
    for c in LATENCIES:
        v = row.get(c)
        lo, hi = latency_interval([v], b) or (None, None)
        out[f"{c}.low90"], out[f"{c}.high90"] = lo, hi
    return out


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


def concurrency_overrides(workload, users: int, requests: int) -> dict:
    """Overrides that run a scenario as `users` closed-loop clients: its own clients with
    another concurrency, else `requests` requests over the scenario's lengths (a trace's
    lengths are kept as a length file would be: not here, so a trace scenario is refused)."""
    if workload.clients is not None:
        return {"workload.clients.concurrency": int(users)}
    return {"workload.arrival": None, "workload.duration_s": None,
            "workload.num_requests": int(requests), "workload.clients": {"concurrency": int(users)}}


def curve_tasks(files: list[str], rates: list[float], requests: int | None, seed: int | None,
                closed: bool = False):
    """One run per (scenario, point): `rates` are offered req/s, or users when `closed`."""
    tasks, meta = [], []
    for f in files:
        sc = load_scenario(f)
        n = requests or sc.workload.num_requests or 500
        overs = [{**(concurrency_overrides(sc.workload, r, n) if closed
                     else rate_overrides(sc.workload.arrival, r, n)),
                  **({"seed": seed} if seed is not None else {})} for r in rates]
        names = [f"curve point {r:g} {'users' if closed else 'req/s'}" for r in rates]
        check_configs(f, {}, overs, names=names,
                      origin="--concurrency" if closed else "--rates")  # every point, before any run
        for r, over in zip(rates, overs, strict=True):
            tasks.append((config_key(f, {}, over), f, over))
            meta.append((sc.name, r, sc.seed if seed is None else seed, sc.slo.ttft_s))
    return tasks, meta


def run_curve(files: list[str], rates: list[float] | None = None, out_dir: str | Path | None = None, *,
              requests: int | None = None, seed: int | None = None, ttft_bound: float | None = None,
              executor: str = "process", workers: int | None = None,
              concurrency: list[int] | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Run every (scenario, rate) under the steady rule, or every (scenario, users) with
    `concurrency` (a closed loop keeps up with itself: one run of the scenario's requests);
    return the curve table and the knee table."""
    closed = concurrency is not None
    rates = sorted(int(c) for c in concurrency) if closed else sorted(float(r) for r in rates)
    tasks, meta = curve_tasks([str(f) for f in files], rates, requests, seed, closed)
    fn = None if closed else functools.partial(steady_point, ttft_bound=ttft_bound)
    rows = dict(execute(tasks, executor, workers, fn=fn))
    recs = []
    for (key, _, _), (name, rate, s, _) in zip(tasks, meta, strict=True):
        row = rows[key]
        recs.append({"scenario": name, "rate": rate, "seed": s, **{c: row.get(c) for c in COLUMNS[3:]},
                     **point_intervals(row)})
    table = pd.DataFrame.from_records(recs, columns=COLUMNS + INTERVAL_COLUMNS)
    bounds = {name: b for name, _, _, b in meta}
    if closed:  # a closed loop always keeps up with itself: the knee is TTFT's alone
        table["steady.ratio"] = float("nan")
    knees = knee_table(table, {n: b or ttft_bound for n, b in bounds.items()},
                       slo_tpot_bounds([str(f) for f in files]))
    if closed:  # its x is users
        table = table.rename(columns={"rate": "concurrency"})
        knees = knees.rename(columns={"knee_rate": "knee_concurrency"})
    if out_dir is not None:
        def write(folder: Path) -> None:
            table.to_csv(folder / "curve.csv", index=False)
            knees.to_csv(folder / "knees.csv", index=False)
            plot_curves(table, knees).savefig(folder / "curve.png", dpi=110)

        write_output(out_dir, "curve", write, {"scenarios": [str(f) for f in files],
                                               "concurrency" if closed else "rates": rates})
    return table, knees


def knee(points: pd.DataFrame, ttft_bound: float | None,
         tpot_bound: float | None = None) -> tuple[float | None, float]:
    """(knee rate or None, the TTFT bound used) for one scenario's points: the highest rate
    at which it and every lower rate keep p99 TTFT (and p99 TPOT, given a bound) within
    their bounds and steady throughput up with offered; None when the lowest rate fails."""
    pts = points.sort_values("rate")
    bound = ttft_bound if ttft_bound else 10 * float(pts["ttft_s.p99"].iloc[0])
    best = None
    tpots = pts["tpot_s.p99"] if "tpot_s.p99" in pts else [math.nan] * len(pts)
    for r, p99, tpot, ratio in zip(pts.rate, pts["ttft_s.p99"], tpots, pts["steady.ratio"],
                                   strict=True):
        ok = _within(p99, bound) and (tpot_bound is None or _within(tpot, tpot_bound, True)) \
            and (ratio is None or math.isnan(ratio) or ratio >= KNEE_THROUGHPUT_RATIO)
        if not ok:
            break
        best = float(r)
    return best, bound


def _within(v: float | None, bound: float, missing_ok: bool = False) -> bool:
    """v <= bound; a missing value (None, NaN) passes only where `missing_ok` (no request
    with two tokens has no TPOT, but a p99 TTFT always exists)."""
    if v is None or math.isnan(v):
        return missing_ok
    return v <= bound


KNEE_COLUMNS = ["scenario", "knee_rate", "knee", "ttft_bound_s", "tpot_bound_s"]


def knee_table(table: pd.DataFrame, bounds: dict[str, float | None],
               tpot_bounds: dict[str, float | None] | None = None) -> pd.DataFrame:
    """One row per scenario: its knee rate and, in words, what the curve says about it
    (`knee_words`), with the bounds it was judged against."""
    recs = []
    for name, pts in table.groupby("scenario", sort=False):
        tpot = (tpot_bounds or {}).get(name)
        k, b = knee(pts, bounds.get(name), tpot)
        recs.append({"scenario": name, "knee_rate": k, "knee": knee_words(k, pts.rate),
                     "ttft_bound_s": b, "tpot_bound_s": tpot})
    return pd.DataFrame.from_records(recs, columns=KNEE_COLUMNS)


def knee_words(k: float | None, rates) -> str:
    """The knee as a planner reads it: a rate, none up to the highest rate tried (every
    rate passed: the knee lies above it), or below the lowest rate tried."""
    lo, hi = float(min(rates)), float(max(rates))
    if k is None:
        return f"below the lowest rate tried ({lo:g} req/s)"
    if k >= hi:
        return f"no knee up to the highest rate tried ({hi:g} req/s)"
    return f"{k:g} req/s"


def slo_tpot_bounds(files: list[str]) -> dict[str, float | None]:
    """Each scenario's p99 TPOT bound for its knee: its `slo.tpot_s` (None: not judged)."""
    return {sc.name: sc.slo.tpot_s for sc in map(load_scenario, files)}


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
    closed = "concurrency" in table
    if closed:  # users on the x axis (`run_curve(concurrency=...)`)
        table = table.rename(columns={"concurrency": "rate"})
        knees = knees.rename(columns={"knee_concurrency": "knee_rate"})
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
                if f"{key}.p99.low90" in pts:  # the p99's 90 % interval (step model's error)
                    ax.fill_between(pts.rate, pts[f"{key}.p99.low90"].astype(float),
                                    pts[f"{key}.p99.high90"].astype(float), color=c, alpha=0.15, lw=0,
                                    label=f"{name} p99, 90 % interval")
                ax.plot(pts.rate, pts[f"{key}.p50"], "--", color=c, label=f"{name} p50")
                ax.set_yscale("log")
            else:
                col = rate_column[name]
                label = f"{name} ({'goodput' if col.startswith('goodput') else 'throughput'})" if mixed else name
                ax.plot(pts.rate, pts[col].astype(float), "-o", color=c, ms=3, label=label)
                if not closed:
                    ax.plot(pts.rate, pts.rate, ":", color="grey", lw=0.8)
            k = knee_at.get(name)  # none drawn where every rate tried passed (no knee seen)
            if k is not None and not (isinstance(k, float) and math.isnan(k)) and k < pts.rate.max():
                ax.axvline(k, color=c, ls=":", lw=1.2)
        ax.set_title(title)
        ax.set_xlabel("concurrent users (closed loop)" if closed else "offered load (requests/s)")
        ax.grid(alpha=0.3)
    np.ravel(axes)[0].legend(fontsize=7)
    if mixed:
        np.ravel(axes)[3].legend(fontsize=7)
    fig.suptitle("throughput-latency curves (dotted vertical line: saturation knee; "
                 "shaded: p99's 90 % interval)")
    return fig
