"""The live runtime against the shared live log: the tables of README "Live serving".

    python benchmarks/fidelity/live_check.py [--runtime YAML] [--seeds 5] [--only fit,replay,cv,sensitivity]

Prints markdown. `fit`: `llmsim fit-log`'s step errors on the log (in-sample). `replay`:
the logged trace through the simulator (`sim/fit/replay.py`) under the warm-grid runtime,
the live runtime without its jitter model, and the live runtime over seeds 0..N-1.
`cv`: cross-validation on the one log: fit-log on some of the steps (the first or second
half by time; or alternate 2-second windows), then the other steps' errors and a replay
(per-request figures of the requests arriving in the held-out windows; throughput and
batch size are the whole run's). `sensitivity`: the same stack at loads and memory sizes
the log does not have (no data to compare with: plausibility only).

`--runtime` (default gpu_profiles/runtimes/h200-eager-live.yaml) is the live runtime
replayed; the cross-validation fits its own with the arguments of the shipped one's
fit (docs/calibration.md, "Serving logs").
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # this checkout's sim, not an installed one

from sim.config.scenario import load_scenario  # noqa: E402
from sim.costmodel.models import load_model  # noqa: E402
from sim.costmodel.profiles import load_profile  # noqa: E402
from sim.costmodel.runtime import load_runtime  # noqa: E402
from sim.engine.runner import run  # noqa: E402
from sim.fit.logfit import (  # noqa: E402
    errors_by_kind,
    fit_log,
    level_factors,
    predict_ms,
    runtime_yaml,
    step_rows,
    subset,
)
from sim.fit.replay import replay  # noqa: E402
from sim.fit.servinglog import (  # noqa: E402
    decode_max_ctx,
    prefill_lengths,
    read_requests_log,
    read_steps_log,
)

SCENARIO = ROOT / "scenarios" / "azure_conv_reference.yaml"
STEPS = ROOT / "data" / "live" / "cb_r16_steps.csv"
REQUESTS = ROOT / "data" / "live" / "cb_r16_requests.csv"
LIVE = ROOT / "gpu_profiles" / "runtimes" / "h200-eager-live.yaml"
WARM = "h200-eager-reference"
FIT = dict(model="llama-3-8b", gpu="h200-sxm", base=WARM)  # as the shipped runtime was fitted
WINDOW_S = 2.0
REPLAY_ROWS = ["TTFT p50 (ms)", "TTFT p90 (ms)", "TTFT p99 (ms)", "TPOT p50 (ms)", "TPOT p99 (ms)",
               "E2E p50 (s)", "E2E p99 (s)", "requests/s", "mean batch size",
               "TTFT queue wait p50 (ms)", "TTFT after admission p50 (ms)"]
CV_ROWS = ["TTFT p50 (ms)", "TTFT p90 (ms)", "TPOT p50 (ms)", "E2E p50 (s)", "E2E p99 (s)",
           "requests/s"]


def pct(x: float | None) -> str:
    return "-" if x is None else f"{x:+.1%}".replace("-", "−")


def num(x: float) -> str:
    return f"{x:,.4g}" if abs(x) < 1000 else f"{x:,.0f}"


def write_runtime(rt, folder: Path, name: str) -> str:
    path = folder / f"{name}.yaml"
    path.write_text(runtime_yaml(replace(rt, name=name), ""))
    return str(path)


def fit(mask: np.ndarray | None = None):
    return fit_log(STEPS, REQUESTS, load_model(FIT["model"]), load_profile(FIT["gpu"]),
                   load_runtime(FIT["base"]), "live", fit_steps=mask)


def fit_table() -> str:
    f = fit()
    lines = ["| runtime | kind | steps | mean abs error | median abs error | bias | measured mean / median | modelled mean / median |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    for label, errs in ((f"{WARM} (warm grid)", f.base_errors), ("live, deterministic terms", f.errors),
                        ("live, × decode levels", f.level_errors)):
        for kind in ("prefill", "decode"):
            e = errs[kind]
            lines.append(f"| {label} | {kind} | {e['steps']:,} | {e['mean_abs']:.1%} | {e['median_abs']:.1%} "
                         f"| {pct(e['bias'])} | {e['measured_mean_ms']:.1f} / {e['measured_median_ms']:.1f} ms "
                         f"| {e['model_mean_ms']:.1f} / {e['model_median_ms']:.1f} ms |")
    bias = ", ".join(f"{k} {pct(v)}" for k, v in f.jittered_mean_bias.items())
    return "\n".join(lines) + f"\n\nWith the jitter model's mean factor, the mean bias is {bias}.\n"


def replay_table(live: str, seeds: int, tmp: Path) -> str:
    det = write_runtime(replace(load_runtime(live), jitter=None), tmp, "live-no-jitter")
    cols = [("warm grid", WARM, 0), ("live, no jitter", det, 0)] + [
        (f"live, seed {s}", live, s) for s in range(seeds)]
    reports = [{m["metric"]: m for m in replay(SCENARIO, STEPS, REQUESTS, runtime=rt,
                                               overrides={"seed": seed})["metrics"]}
               for _, rt, seed in cols]
    lines = ["| metric | logged | " + " | ".join(c[0] for c in cols) + " |",
             "|---|---:|" + "---:|" * len(cols)]
    for metric in REPLAY_ROWS:
        lines.append(f"| {metric} | {num(reports[0][metric]['logged'])} | "
                     + " | ".join(pct(r[metric]["error"]) for r in reports) + " |")
    return "\n".join(lines) + "\n"


def folds(steps: pd.DataFrame, requests: pd.DataFrame) -> list[tuple[str, np.ndarray, np.ndarray]]:
    """(name, steps fitted to, requests compared): time halves, alternate windows."""
    t = steps.t_start.to_numpy(float)
    half = t < np.median(t)
    window = (t // WINDOW_S).astype(int) % 2 == 0
    arrive = (requests.arrival_s.to_numpy(float) // WINDOW_S).astype(int) % 2 == 0
    ids = requests.id.to_numpy()
    return [("fit 1st half of the steps (t < median), check 2nd", half, ids),
            ("fit 2nd half, check 1st", ~half, ids),
            (f"fit even {WINDOW_S:g}-s windows, check odd", window, ids[~arrive]),
            (f"fit odd {WINDOW_S:g}-s windows, check even", ~window, ids[arrive])]


def cv_table(tmp: Path, seeds: int) -> str:
    steps, requests = read_steps_log(STEPS), read_requests_log(REQUESTS)
    model, gpu = load_model(FIT["model"]), load_profile(FIT["gpu"])
    rows_all = step_rows(steps, prefill_lengths(steps, requests), model, gpu,
                         max_ctx=decode_max_ctx(steps, requests))
    lines = ["| split | held-out steps: prefill / decode mean abs error (bias) | requests compared | "
             + " | ".join(CV_ROWS) + " |", "|---|---|---:|" + "---:|" * len(CV_ROWS)]
    for name, mask, ids in folds(steps, requests):
        f = fit(mask)
        held = ~mask
        rows = subset(rows_all, held)
        pred = predict_ms(f.runtime, model.layers, rows) * level_factors(f.runtime.jitter, rows)
        errs = errors_by_kind(rows, pred)
        step_err = " / ".join(f"{errs[k]['mean_abs']:.1%} ({pct(errs[k]['bias'])})" if k in errs else "-"
                              for k in ("prefill", "decode"))
        path = write_runtime(f.runtime, tmp, "cv")
        per_seed = [{m["metric"]: m["error"] for m in replay(
            SCENARIO, STEPS, REQUESTS, runtime=path, overrides={"seed": s},
            request_ids=None if len(ids) == len(requests) else ids)["metrics"]} for s in range(seeds)]
        cells = []
        for metric in CV_ROWS:
            v = [r[metric] for r in per_seed if r[metric] is not None]
            cells.append(pct(v[0]) if len(v) == 1 else f"{pct(min(v))} to {pct(max(v))}")
        lines.append(f"| {name} | {step_err} | {len(ids)} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def simulate(trace: Path, runtime: str, seed: int, blocks: int) -> dict:
    out = run(load_scenario(SCENARIO, {"seed": seed, "runtime": runtime, "kv.num_blocks": blocks,
                                       "workload": {"trace": {"path": str(trace), "format": "csv"}}}))
    s, r = out.summary, out.requests
    return {"TTFT p50 (ms)": s["ttft_s"]["p50"] * 1e3, "TPOT p50 (ms)": s["tpot_s"]["p50"] * 1e3,
            "E2E p50 (s)": s["e2e_s"]["p50"], "requests/s": s["request_throughput"],
            "preemptions": int(r.preemptions.sum())}


def sensitivity_table(live: str, seeds: int, tmp: Path) -> str:
    requests = read_requests_log(REQUESTS)
    thin = tmp / "thinned.csv"
    requests[requests.id % 2 == 0].to_csv(thin, index=False)
    cases = [("the log: 16 req/s, 20,480 blocks", REQUESTS, 20480),
             ("every other request (8 req/s), 20,480 blocks", thin, 20480),
             ("16 req/s, 5,120 blocks (4x fewer)", REQUESTS, 5120),
             ("8 req/s, 2,560 blocks (8x fewer)", thin, 2560)]
    det = write_runtime(replace(load_runtime(live), jitter=None), tmp, "live-no-jitter")
    metrics = ["TTFT p50 (ms)", "TPOT p50 (ms)", "E2E p50 (s)", "requests/s", "preemptions"]
    lines = ["| case | runtime | " + " | ".join(metrics) + " |", "|---|---|" + "---:|" * len(metrics)]
    for label, trace, blocks in cases:
        for rt_label, rt, n in ((f"{WARM} (warm grid)", WARM, 1), ("live, no jitter", det, 1),
                                (f"live, seeds 0-{seeds - 1}", live, seeds)):
            runs = [simulate(Path(trace).resolve(), rt, s, blocks) for s in range(n)]
            cells = []
            for m in metrics:
                v = [r[m] for r in runs]
                cells.append(num(v[0]) if n == 1 else f"{num(min(v))}-{num(max(v))}")
            lines.append(f"| {label} | {rt_label} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runtime", default=str(LIVE))
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--only", default="fit,replay,cv,sensitivity")
    a = ap.parse_args()
    parts = a.only.split(",")
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        if "fit" in parts:
            print("## Step time on the live log (in-sample)\n\n" + fit_table())
        if "replay" in parts:
            print("## Replay of the live log (error = simulated / logged - 1)\n\n"
                  + replay_table(a.runtime, a.seeds, tmp))
        if "cv" in parts:
            print(f"## Cross-validation (ranges over seeds 0-{a.seeds - 1})\n\n" + cv_table(tmp, a.seeds))
        if "sensitivity" in parts:
            print("## Sensitivity (predictions, no data)\n\n" + sensitivity_table(a.runtime, a.seeds, tmp))


if __name__ == "__main__":
    main()
