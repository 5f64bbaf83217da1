"""README blocks of "Accuracy" (benchmarks/readme/readme_results.py): the eager reference
runtime refitted from its H200 iteration grid, its errors by model and step kind, and the
fitted host model in words."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from benchmarks.readme.readme_format import half_up, pct, prose, table
from benchmarks.readme.readme_runs import ROOT, Runs

if TYPE_CHECKING:
    from sim.costmodel.runtime import RuntimeSpec

GRID = ROOT / "gpu_profiles" / "h200-sxm" / "iter_grid_eager_reference.csv"


def refit_eager_reference() -> tuple[RuntimeSpec, list[dict]]:
    """The eager reference runtime fitted afresh from its grid: (RuntimeSpec, the grid's
    rows with their fitted times), as `python -m sim.cli.maintain runtime-fit` fits it."""
    from sim.fit.runtime_fit import fit, read_grid

    return fit(read_grid(GRID), "h200-sxm", "h200-eager-reference")


def warm_grid_accuracy(runs: Runs) -> str:
    from sim.fit.runtime_fit import error_summary

    _, rows = refit_eager_reference()
    names = {"llama-3-8b": "Llama-3-8B", "llama-3.2-1b": "Llama-3.2-1B"}
    kinds = {"prefill": 0, "decode": 1, "verify": 2}
    summary = error_summary(rows)
    order = sorted((k for k in summary if k != "all"),
                   key=lambda k: (k.split(" ")[0], kinds.get(k.split(" ")[1], 9)))
    out = []
    for key, e in ((k, summary[k]) for k in [*order, "all"]):
        model, _, kind = key.partition(" ")
        label = f"{names.get(model, model)} {kind}" if kind else key
        out.append([label, str(e["rows"]), pct(e["mape"], 1),
                    f"{e['bias'] * 100:+.1f} %".replace("-", "−"), pct(e["max"], 1)])
    return table(["model, step kind", "rows", "mean abs error", "mean error", "max abs error"],
                 out)


def warm_grid_fit(runs: Runs) -> str:
    """The refitted host model in words (its parameters are rounded decimals: half up)."""
    import yaml

    spec, _ = refit_eager_reference()
    shipped = yaml.safe_load((ROOT / "gpu_profiles" / "runtimes" /
                              "h200-eager-reference.yaml").read_text(encoding="utf-8"))
    stale = [k for k in ("host_ms_per_step", "host_ms_per_layer", "host_ms_per_layer_decode_extra",
                         "host_ms_per_prefill_seq_layer", "host_ms_per_verify_seq_layer",
                         "gpu_scale", "gpu_scale_decode") if shipped.get(k) != getattr(spec, k)]
    if stale:
        print("warning: gpu_profiles/runtimes/h200-eager-reference.yaml differs from a refit in "
              f"{', '.join(stale)} (refit: python -m sim.cli.maintain runtime-fit "
              f"{GRID.relative_to(ROOT)} --name h200-eager-reference --write)", file=sys.stderr)
    layers = 32
    step, layer, extra = spec.host_ms_per_step, spec.host_ms_per_layer, \
        spec.host_ms_per_layer_decode_extra
    return prose(
        f"The fitted host model (`gpu_profiles/runtimes/h200-eager-reference.yaml`): "
        f"{half_up(step, 2)} ms per step + {half_up(layer, 2)} ms per layer "
        f"(+{half_up(extra, 3)} ms per layer on decode's path), "
        f"{half_up(spec.host_ms_per_prefill_seq_layer, 2)} ms per sequence and layer for "
        f"per-sequence flash prefill, {half_up(spec.host_ms_per_verify_seq_layer, 2)} ms per "
        "sequence and layer for the gather+SDPA of multi-token steps; the host floor is "
        f"{half_up(step + layer * layers, 1)} ms for prefill and "
        f"{half_up(step + (layer + extra) * layers, 1)} ms for decode on a {layers}-layer model. "
        f"GPU time is scaled by {half_up(spec.gpu_scale, 2)} (prefill, verify) and "
        f"{half_up(spec.gpu_scale_decode, 2)} (decode).")
