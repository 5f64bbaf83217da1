"""`llmsim validate`: the simulator against the reference engine on the same trace.

1. The scenario's workload is drawn (same seed, same requests) and replayed
   through the reference engine on the device, twice (`runs`), after a short
   warm-up run and one untimed step per kernel specialisation the runs can meet
   (`warmup.warm_kernels`). Run 1 is "real"; run 2 shows the real run-to-run spread.
2. The same workload is simulated with the measured profile (the scenario's
   `gpu` pointed at the profile folder) and its fitted runtime
   (`<profile>/runtime-eager.yaml` unless another is given), with the same KV
   capacity, scheduler and attention kernels.
3. The report compares request-level metrics (TTFT, TPOT, ITL, E2E at p50, p90,
   p99, and throughput) and iteration-level times in two ways: `replayed` (the
   step model applied to each real step's exact composition: the iteration-level
   error proper) and `matched` (real and simulated steps paired by order, where
   kind and batch size agree).

Errors are simulated / real − 1; the spread is run 2 / run 1 − 1.
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import numpy as np
import pandas as pd

from sim.calibrate.device import Device, pick_device, pick_dtype, quiet_gc, set_threads
from sim.calibrate.reference import Llama, ReferenceEngine, StepDetail, check_supported
from sim.calibrate.warmup import warm_kernels
from sim.config.scenario import Scenario, load_scenario, replace_scenario
from sim.costmodel.latency import StepLatency
from sim.costmodel.models import load_model
from sim.costmodel.profiles import load_profile
from sim.costmodel.runtime import RuntimeSpec
from sim.engine.build import build_replica, replica_configs
from sim.engine.memory import memory_budget
from sim.engine.metrics import requests_frame, steps_frame, summarize
from sim.engine.processes import simulate
from sim.fit.servinglog import write_serving_log
from sim.io.outputs import check_out_dir, write_atomically
from sim.io.specload import SpecError, build, is_file, load_yaml
from sim.workload.requests import Workload, generate

METRICS = [(f"{name} p{p} (ms)", key, f"p{p}", 1e3) for name, key in
           (("TTFT", "ttft_s"), ("TPOT", "tpot_s"), ("ITL", "itl_s"), ("E2E", "e2e_s"))
           for p in (50, 90, 99)]
METRICS += [("requests/s", "request_throughput", None, 1.0),
            ("output tokens/s", "output_token_throughput", None, 1.0)]


def _frames(res, sc: Scenario) -> tuple[pd.DataFrame, pd.DataFrame, dict]:
    req, steps = requests_frame(res), steps_frame(res)
    return req, steps, summarize(req, steps, res, sc.slo)


def _write(folder: Path, req: pd.DataFrame, steps: pd.DataFrame, summary: dict) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    req.to_csv(folder / "requests.csv", index=False, float_format="%.6f")
    steps.to_csv(folder / "steps.csv", index=False, float_format="%.6f")
    (folder / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")


def _value(summary: dict, key: str, sub: str | None) -> float | None:
    v = summary[key] if sub is None else summary[key][sub]
    return None if v is None else float(v)


def _rel(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b == 0 else a / b - 1


def _err_stats(err: np.ndarray) -> dict:
    if not len(err):
        return {"steps": 0}
    a = np.abs(err)
    return {"steps": int(len(err)), "mean_abs": float(a.mean()), "median_abs": float(np.median(a)),
            "p90_abs": float(np.quantile(a, 0.9)), "bias": float(err.mean())}


def replayed_steps(lat: StepLatency, steps: pd.DataFrame, detail: StepDetail) -> pd.DataFrame:
    """Each real step with the step model's prediction for its exact composition."""
    pred = []
    seen: set = set()  # the real server's prefill shapes so far (a live runtime stalls on new ones)
    for kind, lens, s, mx, n in zip(detail.kind, detail.prefill_lens, detail.sum_ctx,
                                    detail.max_ctx, steps.num_seqs, strict=True):
        pred.append(lat.prefill([(q, 0) for q in lens], seen) if kind == "prefill"
                    else lat.decode(int(n), s, mx))
    out = steps.copy()
    out["real_s"] = out.t_end - out.t_start
    out["pred_s"] = pred
    out["err"] = out.pred_s / out.real_s - 1
    return out


def matched_steps(a: pd.DataFrame, b: pd.DataFrame) -> pd.DataFrame:
    """Steps paired by position where kind and batch size agree; err = b / a - 1."""
    n = min(len(a), len(b))
    x, y = a.iloc[:n].reset_index(drop=True), b.iloc[:n].reset_index(drop=True)
    same = (x.kind == y.kind) & (x.num_seqs == y.num_seqs) & (x.num_tokens == y.num_tokens)
    da, db = (x.t_end - x.t_start)[same], (y.t_end - y.t_start)[same]
    return pd.DataFrame({"kind": x.kind[same], "a_s": da, "b_s": db, "err": db / da - 1})


def _by_kind(df: pd.DataFrame) -> dict:
    out = {"all": _err_stats(df.err.to_numpy())}
    for kind, g in df.groupby("kind"):
        out[str(kind)] = _err_stats(g.err.to_numpy())
    return out


def _warmup_workload(wl: Workload) -> Workload:
    n = min(4, len(wl))
    out = np.minimum(wl.output_tokens[:n], 4)
    return Workload(np.zeros(n), wl.prompt_tokens[:n].copy(), out, out.copy())


def simulate_with(sc: Scenario, wl: Workload, profile_dir: Path, runtime: RuntimeSpec,
                  kv_tokens: int, max_len: int):
    """The simulator on `wl` with the measured profile and runtime (as `llmsim run` does)."""
    sc = replace_scenario(sc, gpu=str(profile_dir),
                          kv=dataclasses.replace(sc.kv, max_model_len=max_len))
    (cfg,) = replica_configs(sc, runtime=runtime, kv_tokens=kv_tokens)
    rep = build_replica(cfg, np.random.default_rng(sc.seed))
    res = simulate(wl, [rep])
    return res, cfg.latency


def validate(scenario: str | Path, profile_dir: str | Path, out: str | Path, *,
             device: str = "auto", dtype: str = "auto", runtime: str | Path | None = None,
             runs: int = 2, threads: int | None = None) -> dict:
    """Run the comparison and write the report into `out`; returns the report dict."""
    t0 = time.perf_counter()
    profile_dir, out = Path(profile_dir).resolve(), Path(out)
    sc = load_scenario(scenario, {"gpu": str(profile_dir)})
    check_out_dir(out)  # before the runs, not after them
    check_supported(sc)
    rt_file = Path(runtime) if runtime else profile_dir / "runtime-eager.yaml"
    if not is_file(rt_file):
        raise SpecError(rt_file, "", "runtime profile not found (run llmsim calibrate first, "
                        "or give --runtime FILE)")
    rt = build(RuntimeSpec, load_yaml(rt_file), file=rt_file)
    spec = load_model(sc.model, file=sc.file or None)
    profile = load_profile(str(profile_dir), file=sc.file or None)
    kv_tokens = memory_budget(sc, spec, profile).kv_tokens
    max_len = sc.kv.max_model_len or spec.max_len
    wl = generate(sc.workload, np.random.default_rng(sc.seed), file=sc.file or None,
                  path="workload", base_dir=sc.base_dir or None)
    dev_t = pick_device(device)
    meta_file = profile_dir / "calibration.json"
    if threads is None and meta_file.is_file():  # time on as many threads as calibrate did
        threads = json.loads(meta_file.read_text()).get("threads")
    set_threads(dev_t, threads)
    dev = Device(dev_t, pick_dtype(dtype, dev_t), seed=sc.seed)
    engine = ReferenceEngine(sc, Llama(spec, dev), kv_tokens, max_len)
    engine.run(_warmup_workload(wl), seed=sc.seed)
    warm_kernels(engine, wl)  # every kernel specialisation the timed runs can meet
    real = []
    for _ in range(runs):
        with quiet_gc():
            res, detail = engine.run(wl, seed=sc.seed)
        real.append((*_frames(res, sc), detail))
    sim_res, lat = simulate_with(sc, wl, profile_dir, rt, kv_tokens, max_len)
    sim = _frames(sim_res, sc)
    report = _report(sc, profile_dir, rt_file, dev, real, sim, lat)
    report["seconds"] = round(time.perf_counter() - t0, 1)

    def write_report(folder: Path) -> None:
        for i, (req, steps, summary, detail) in enumerate(real, start=1):
            _write(folder / f"real-{i}", req, steps, summary)
            write_serving_log(folder / f"real-{i}", req, steps, detail.sum_ctx,
                              kv_tokens // sc.kv.block_size)
        _write(folder / "sim", *sim)
        (folder / "report.json").write_text(json.dumps(report, indent=2) + "\n")
        (folder / "report.md").write_text(markdown(report))

    write_atomically(out, write_report, {"scenario": sc.name, "profile": str(profile_dir)})
    return report


def _report(sc, profile_dir, rt_file, dev, real, sim, lat) -> dict:
    r1 = real[0][2]
    r2 = real[1][2] if len(real) > 1 else None
    rows = []
    for label, key, sub, scale in METRICS:
        a, s = _value(r1, key, sub), _value(sim[2], key, sub)
        b = _value(r2, key, sub) if r2 else None
        rows.append({"metric": label, "real": a and a * scale, "real_run2": b and b * scale,
                     "spread": _rel(b, a), "sim": s and s * scale, "error": _rel(s, a)})
    replay = replayed_steps(lat, real[0][1], real[0][3])
    iters = {"replayed": _by_kind(replay), "matched": _by_kind(matched_steps(real[0][1], sim[1]))}
    if len(real) > 1:
        iters["real_spread_matched"] = _by_kind(matched_steps(real[0][1], real[1][1]))
    return {"scenario": sc.name, "model": sc.model, "profile": str(profile_dir),
            "runtime": str(rt_file), "device": dev.name, "dtype": str(dev.dtype),
            "requests": int(r1["requests"]["total"]), "real_steps": len(real[0][1]),
            "sim_steps": len(sim[1]), "metrics": rows, "iterations": iters}


def _f(v, pct: bool = False) -> str:
    if v is None:
        return "-"
    return f"{v:+.1%}" if pct else f"{v:.4g}"


def markdown(r: dict) -> str:
    lines = [f"# Validation: {r['scenario']} ({r['model']}) on {r['device']}", "",
             f"Profile `{r['profile']}`, runtime `{r['runtime']}`, {r['requests']} requests; "
             f"{r['real_steps']} real steps, {r['sim_steps']} simulated.", "",
             "| metric | real | real (run 2) | run-to-run | simulated | sim error |",
             "|---|---:|---:|---:|---:|---:|"]
    for m in r["metrics"]:
        lines.append(f"| {m['metric']} | {_f(m['real'])} | {_f(m['real_run2'])} | "
                     f"{_f(m['spread'], True)} | {_f(m['sim'])} | {_f(m['error'], True)} |")
    lines += ["", "Iteration time (|error|: mean / median / p90; bias = mean error):", "",
              "| comparison | kind | steps | mean | median | p90 | bias |",
              "|---|---|---:|---:|---:|---:|---:|"]
    names = {"replayed": "model on each real step", "matched": "sim vs real, paired steps",
             "real_spread_matched": "real run 2 vs run 1, paired"}
    for key, by_kind in r["iterations"].items():
        for kind, s in by_kind.items():
            if s["steps"]:
                lines.append(f"| {names[key]} | {kind} | {s['steps']} | {s['mean_abs']:.1%} | "
                             f"{s['median_abs']:.1%} | {s['p90_abs']:.1%} | {s['bias']:+.1%} |")
    lines += ["", f"Took {r.get('seconds', 0)} s.", ""]
    return "\n".join(lines)
