"""How sure a plan's figures are: a range on each, and what share rests on measurement.

Two sources of doubt, combined into one range per figure:

* **seed to seed**: the bisection's bracket [sustained rate, lowest failing rate] (where
  seeds disagree, the rate each seed sustains lies inside it) and, for p99s, the lowest
  and highest seed at the candidate's share of the target;
* **the step model's own error**: each lookup class (measured = exact + interpolated,
  derived, extrapolated, analytic) has a relative error band sized from the project's
  validation record (`data/step_error_bands.yaml`, every band with its source); a
  figure's band is the share-weighted mean over its run's simulated step time
  (`lookup_provenance`). To first order a step model off by e moves a replica's
  capacity by e and its latencies by e, so the rate range is
  [rate x (1 - band), fail_rate x (1 + band)], replicas and dollars follow from it, and
  p99 ranges are [lowest seed x (1 - band), highest seed x (1 + band)] (near saturation
  a latency moves by more than its step time: the range is then a floor).
"""

from __future__ import annotations

import math
from functools import cache

from sim.io.specload import ROOT, SpecError, load_yaml

BANDS_FILE = ROOT / "data" / "step_error_bands.yaml"


@cache
def load_bands(path: str = str(BANDS_FILE)) -> dict[str, dict]:
    """class -> {tags, band, source}, from the bands file."""
    classes = load_yaml(path).get("classes")
    if not isinstance(classes, dict) or not classes:
        raise SpecError(path, "classes", "missing (allowed: a mapping class -> {tags, band, source})")
    out = {}
    for name, rec in classes.items():
        band = rec.get("band") if isinstance(rec, dict) else None
        if not isinstance(band, int | float) or not 0 <= band < 1:
            raise SpecError(path, f"classes.{name}.band", f"expected a number in [0, 1), got {band!r}")
        if not rec.get("source"):
            raise SpecError(path, f"classes.{name}.source", "missing (every band names its source)")
        interval = rec.get("interval90", band)
        if not isinstance(interval, int | float) or not 0 <= interval < 1:
            raise SpecError(path, f"classes.{name}.interval90",
                            f"expected a number in [0, 1), got {interval!r}")
        out[str(name)] = {"tags": list(rec.get("tags") or [name]), "band": float(band),
                          "interval90": float(interval),
                          "source": " ".join(str(rec["source"]).split()),
                          "interval90_source": " ".join(str(rec.get("interval90_source", "")).split())}
    return out


def class_shares(provenance: dict[str, float] | None) -> dict[str, float]:
    """Share of step time per class (measured, derived, extrapolated, analytic)."""
    p = provenance or {}
    return {name: float(sum(p.get(t, 0.0) for t in rec["tags"])) for name, rec in load_bands().items()}


def _weighted(provenance: dict[str, float] | None, field: str) -> float:
    """A band field share-weighted over a run's lookup classes (the widest if unknown)."""
    bands = load_bands()
    shares = class_shares(provenance)
    total = sum(shares.values())
    if total <= 0:
        return max(b[field] for b in bands.values())
    return sum(shares[k] * bands[k][field] for k in bands) / total


def model_band(provenance: dict[str, float] | None) -> float:
    """The share-weighted step-model error band of a run (the widest band if unknown)."""
    return _weighted(provenance, "band")


def interval_band(provenance: dict[str, float] | None) -> float:
    """The half-width of a figure's 90 % prediction interval from the step model's error,
    share-weighted over its lookup classes' `interval90` (measured from held-out data by
    benchmarks/fidelity/accuracy.py; the widest class's if the provenance is unknown)."""
    return _weighted(provenance, "interval90")


def prediction_interval(value: float, provenance: dict[str, float] | None,
                        seed_values: list[float] | None = None) -> tuple[float, float]:
    """A figure's 90 % prediction interval: the spread of its seeds (lowest to highest; the
    value alone with one seed) widened by the step model's 90 % error (`interval_band`).
    To first order a step model off by e moves a latency by e and a capacity by e
    (module docstring); near saturation a latency moves by more: the range is then a floor."""
    vals = [v for v in (seed_values or [value]) if v is not None]
    b = interval_band(provenance)
    return min(vals) * (1 - b), max(vals) * (1 + b)


RUN_FIGURES = {"TTFT p50 (s)": ("ttft_s", "p50"), "TTFT p99 (s)": ("ttft_s", "p99"),
               "TPOT p50 (s)": ("tpot_s", "p50"), "TPOT p99 (s)": ("tpot_s", "p99"),
               "E2E p50 (s)": ("e2e_s", "p50"), "output tok/s": ("output_token_throughput", None)}


def run_intervals(summaries: list[dict]) -> dict[str, tuple[float, float, float]]:
    """A run's headline figures with their 90 % intervals: figure -> (value of the first
    summary, low, high), over one summary per seed (`summaries`, the first is the run's).
    Throughput moves inversely to step time: its interval is value / (1 +- band)."""
    out = {}
    prov = summaries[0].get("lookup_provenance")
    b = interval_band(prov)
    for name, (key, q) in RUN_FIGURES.items():
        vals = [s.get(key) if q is None else (s.get(key) or {}).get(q) for s in summaries]
        vals = [float(v) for v in vals if v is not None]
        if not vals:
            continue
        if q is None:
            out[name] = (vals[0], min(vals) / (1 + b), max(vals) / (1 - b))
        else:
            lo, hi = prediction_interval(vals[0], prov, vals)
            out[name] = (vals[0], lo, hi)
    return out


def measured_share(provenance: dict[str, float] | None) -> float:
    return class_shares(provenance).get("measured", 0.0)


def stands_on(provenance: dict[str, float] | None) -> str:
    """'measured 5 % / derived 0 % / extrapolated 40 % / analytic 55 %'."""
    return " / ".join(f"{k} {v:.0%}" for k, v in class_shares(provenance).items())


def candidate_ranges(target: float, rate: float, fail_rate: float | None, at_rate_prov: dict | None,
                     share_p99s: dict[str, list[float]], share_prov: dict | None, gpus_per_replica: int,
                     usd_per_gpu_hour: float, usd_per_m: float, usd_per_hour: float,
                     extra_replicas: int = 0, min_replicas: int = 1) -> dict:
    """Ranges (low, high) of a candidate's figures; see the module docstring."""
    band = model_band(at_rate_prov)
    lo_rate = rate * (1 - band)
    hi_rate = (fail_rate if fail_rate else rate) * (1 + band)
    reps = [max(min_replicas, math.ceil(target / r - 1e-9) + extra_replicas) for r in (hi_rate, lo_rate)]
    usd = [n * gpus_per_replica * usd_per_gpu_hour for n in reps]
    per_usd = usd_per_m / usd_per_hour if usd_per_hour else math.nan
    lat_band = model_band(share_prov)
    out = {"model_band": band, "measured_share": measured_share(at_rate_prov),
           "stands_on": stands_on(at_rate_prov),
           "sustained_rate_range": (lo_rate, hi_rate), "replicas_range": tuple(reps),
           "usd_per_hour_range": tuple(usd), "usd_per_m_output_tokens_range": tuple(u * per_usd for u in usd),
           "latency_band": lat_band, "latency_measured_share": measured_share(share_prov)}
    for k, vals in share_p99s.items():
        vals = [v for v in vals if v is not None]
        out[f"{k}_p99_range_s"] = (min(vals) * (1 - lat_band), max(vals) * (1 + lat_band)) if vals else None
    return out


def fmt_range(r, fmt: str = "{:.3g}") -> str:
    if not r:
        return "-"
    lo, hi = r
    return fmt.format(lo) if lo == hi else f"{fmt.format(lo)}-{fmt.format(hi)}"


def fleet_ranges(spec, row: dict, check: dict, head: dict | None) -> dict:
    """Ranges of the recommended fleet's figures: p99s over the check's seeds widened by
    the step model's band; replicas from the fleet's own capacity (the target times its
    headroom, else the target, over the replicas) moved by the band; dollars follow."""
    at_n = next(c for c in check["checks"] if c["replicas"] == check["replicas"])
    prov = at_n.get("lookup_provenance")
    band = model_band(prov)
    extra = 1 if check.get("redundancy") == "n+1" else 0
    sizing = spec.search.sizing_rate(spec.target_rate)
    fleet_rate = spec.target_rate * head["factor"] if head else sizing
    per_replica = fleet_rate / max(check["replicas"] - extra, 1)
    reps = [min(spec.search.max_replicas, max(spec.search.min_replicas,
                                               math.ceil(sizing / (per_replica * f) - 1e-9) + extra))
            for f in (1 + band, 1 - band)]
    usd_gpu = check["usd_per_hour"] / check["gpus"]
    usd = [n * check["tp"] * usd_gpu for n in reps]
    per_usd = check["usd_per_m_output_tokens"] / check["usd_per_hour"]
    out = {"model_band": band, "measured_share": measured_share(prov), "stands_on_lookups": stands_on(prov),
           "replicas_range": tuple(reps), "usd_per_hour_range": tuple(usd),
           "usd_per_m_output_tokens_range": tuple(u * per_usd for u in usd)}
    for k in ("ttft", "tpot", "e2e"):
        vals = [v for v in at_n.get(f"{k}_p99_seeds_s", []) if v is not None]
        out[f"{k}_p99_range_s"] = (min(vals) * (1 - band), max(vals) * (1 + band)) if vals else None
    return out
