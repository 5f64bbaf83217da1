"""GPU-hour prices (gpu_profiles/prices.yaml) and the dollars of a run.

Each GPU has `usd_per_hour` (on demand) and, where a source gives them,
`reserved_usd_per_hour` and `spot_usd_per_hour`, each with a source; the file carries
its date. `llmsim plan` reads the on-demand price through sim/planning/planspec.py.
"""

from __future__ import annotations

from pathlib import Path

from sim.io.specload import ROOT, SpecError, load_yaml

DEFAULT_PRICES = ROOT / "gpu_profiles" / "prices.yaml"
KINDS = {"on_demand": "usd_per_hour", "reserved": "reserved_usd_per_hour",
         "spot": "spot_usd_per_hour"}


def load_price_table(path: str | Path | None = None) -> dict:
    """{"date", "currency", "gpus": {gpu: {kind: usd_per_hour}}, "sources": {gpu: [str]}}."""
    p = Path(path) if path else DEFAULT_PRICES
    data = load_yaml(p)
    gpus = data.get("gpus")
    if not isinstance(gpus, dict):
        raise SpecError(p, "gpus", "missing (allowed: a mapping gpu -> {usd_per_hour, source})")
    table: dict[str, dict[str, float]] = {}
    sources: dict[str, list[str]] = {}
    for name, rec in gpus.items():
        if not isinstance(rec, dict):
            raise SpecError(p, f"gpus.{name}", "expected a mapping (allowed: {usd_per_hour, source})")
        row = {}
        for kind, key in KINDS.items():
            v = rec.get(key)
            if v is None and kind != "on_demand":
                continue
            if not isinstance(v, int | float) or isinstance(v, bool) or v <= 0:
                raise SpecError(p, f"gpus.{name}.{key}", f"expected a positive number, got {v!r}")
            row[kind] = float(v)
        table[str(name)] = row
        sources[str(name)] = [str(rec[k]) for k in ("source", "reserved_source", "spot_source")
                              if rec.get(k)]
    return {"date": str(data.get("date", "")), "currency": str(data.get("currency", "USD")),
            "gpus": table, "sources": sources, "file": p.name}


def cost_figures(gpu_seconds: dict[str, float], duration_s: float, output_tokens: int,
                 prices: dict) -> dict:
    """The summary's `cost`: GPU-hours per GPU type and dollars per price kind.
    `gpu_seconds`: GPU type -> GPUs x the run's duration."""
    hours = {g: s / 3600 for g, s in gpu_seconds.items()}
    total_h = sum(hours.values())
    out: dict = {"gpu_hours": total_h, "gpu_hours_per_day": total_h / duration_s * 86400
                 if duration_s else 0.0}
    missing = [g for g in hours if g not in prices["gpus"]]
    if missing:
        return {**out, "available": False,
                "note": f"no price for GPU '{missing[0]}' in {prices['file']}"}
    kinds = [k for k in KINDS if all(k in prices["gpus"][g] for g in hours)]
    usd = {k: sum(h * prices["gpus"][g][k] for g, h in hours.items()) for k in kinds}
    return {
        **out, "available": True,
        "usd": usd,
        "usd_per_m_output_tokens": {k: v / output_tokens * 1e6 if output_tokens else None
                                    for k, v in usd.items()},
        "usd_per_day": {k: v / duration_s * 86400 if duration_s else 0.0 for k, v in usd.items()},
        "prices_date": prices["date"],
        "sources": [s for g in hours for s in prices["sources"].get(g, [])],
    }
