"""Run a scenario end to end: the Python API behind `llmsim run`.

    >>> from sim import run
    >>> out = run("scenarios/quickstart.yaml")
    >>> out.requests.ttft_s.median(), out.summary["output_token_throughput"]
    >>> out.write("runs/quickstart")   # requests.csv, steps.csv, summary.json, plots
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pandas as pd

from .chunked import ChunkedPolicy
from .engine import RunResult, simulate
from .kv import make_kv
from .latency import RuntimeSpec, StepLatency, load_runtime
from .memory import MemoryBudget, memory_budget
from .metrics import requests_frame, steps_frame, summarize
from .models import ModelSpec, context_window, load_model
from .profiles import GPUProfile, load_profile
from .scenario import Scenario, load_scenario
from .scheduler import ContinuousPolicy, StaticPolicy
from .specload import SpecError
from .speculative import Speculator
from .workload import Workload, generate

POLICIES = {"continuous": ContinuousPolicy, "static": StaticPolicy, "chunked": ChunkedPolicy}


@dataclass
class RunOutput:
    scenario: Scenario
    requests: pd.DataFrame
    steps: pd.DataFrame
    summary: dict
    itl: pd.DataFrame  # weighted inter-token gaps: columns gap_s, count
    result: RunResult

    def write(self, out_dir: str | Path, plots: bool = True) -> Path:
        """Write all outputs into `out_dir` atomically (a temp folder renamed at the end)."""
        out = Path(out_dir)
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
        try:
            self.requests.to_csv(tmp / "requests.csv", index=False, float_format="%.6f")
            self.steps.to_csv(tmp / "steps.csv", index=False, float_format="%.6f")
            (tmp / "summary.json").write_text(json.dumps(self.summary, indent=2) + "\n")
            if plots:
                from .plots import plot_run

                plot_run(self, tmp)
            if out.exists():
                shutil.rmtree(out)
            os.replace(tmp, out)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return out


class Prepared(NamedTuple):
    model: ModelSpec
    profile: GPUProfile
    runtime: RuntimeSpec
    budget: MemoryBudget
    workload: Workload
    rng: np.random.Generator
    draft: ModelSpec | None  # speculative draft model


def prepare(sc: Scenario) -> Prepared:
    """Resolve a scenario's names into model, profile, runtime, memory budget and workload."""
    f = sc.file or None
    model = load_model(sc.model, file=f, path="model")
    context_window(model, sc.kv.max_model_len, file=f)  # refuses one over the model's
    profile = load_profile(sc.gpu, file=f, path="gpu")
    runtime = load_runtime(sc.runtime, file=f, path="runtime", base_dir=sc.base_dir or None)
    draft = None
    if sc.speculative.method == "draft_model":
        draft = load_model(sc.speculative.draft_model, file=f, path="speculative.draft_model")
    budget = memory_budget(sc, model, profile, draft)
    rng = np.random.default_rng(sc.seed)
    base = Path(sc.base_dir) if sc.base_dir else None
    wl = generate(sc.workload, rng, file=f, path="workload", base_dir=base)
    return Prepared(model, profile, runtime, budget, wl, rng, draft)


def run(scenario: Scenario | str | Path, overrides: dict | None = None,
        progress: bool = False) -> RunOutput:
    """Simulate a scenario (object or YAML path) and return its tables and summary."""
    sc = scenario if isinstance(scenario, Scenario) else load_scenario(scenario, overrides)
    t0 = time.perf_counter()
    model, profile, runtime, budget, wl, rng, draft = prepare(sc)
    max_len = sc.kv.max_model_len or model.max_len
    kv = make_kv(sc.kv.manager, budget.kv_tokens, sc.kv.block_size)
    policy = POLICIES[sc.scheduler.policy](sc.scheduler, kv)
    lat = StepLatency(model, profile, runtime, sc.attention.prefill, sc.decode_attention,
                      verify_impl=_verify_impl(sc))
    spec = None
    if sc.speculative.method != "none":
        if sc.speculative.acceptance.kind == "trace" and wl.acceptance is None:
            raise SpecError(sc.file or None, "speculative.acceptance.kind",
                            "'trace' needs a csv trace with an 'acceptance' column")
        draft_lat = StepLatency(draft, profile, runtime, sc.attention.prefill,
                                sc.decode_attention) if draft else None
        spec = Speculator(sc.speculative, lat, draft_lat, rng, wl.acceptance)
    swap_blocks = int(sc.kv.swap_space_gib * 1024**3 // (model.kv_bytes_per_token * kv.block_size))
    bar = _progress_bar(float(wl.arrival_s[-1]) if len(wl) else 0.0) if progress else None
    res = simulate(
        wl, kv, policy, lat,
        max_model_len=max_len,
        kv_bytes_per_token=model.kv_bytes_per_token,
        pcie_bytes_per_s=profile.facts.pcie_gbs * 1e9,
        swap_blocks=swap_blocks,
        reserve_max_model_len=sc.kv.reserve == "max_model_len",
        prefix_caching=sc.kv.prefix_caching,
        prefix_host_bytes=sc.kv.prefix_cache_host_gib * 1024**3,
        speculator=spec,
        progress=bar.update_to if bar else None,
    )
    if bar:
        bar.close()
    req = requests_frame(res)
    steps = steps_frame(res)
    summary = {
        "scenario": sc.name,
        "model": model.name,
        "gpu": profile.name,
        "gpu_analytic": profile.facts.analytic,
        "runtime": runtime.name,
        "policy": sc.scheduler.policy,
        "kv_manager": sc.kv.manager,
        "attention": {"prefill": sc.attention.prefill, "decode": sc.decode_attention},
        "seed": sc.seed,
        **summarize(req, steps, res, sc.slo),
        "memory_gib": budget.as_dict(),
        "prefix_cache": res.prefix_cache,
        "speculative": spec.summary() if spec else None,
        "lookup_provenance": lat.provenance(),
        "wall_s": time.perf_counter() - t0,
    }
    if res.prefix_cache is not None:
        res.prefix_cache.update(prefill_saved(req, lat))
    itl = pd.DataFrame({"gap_s": res.itl_gaps, "count": res.itl_weights})
    return RunOutput(sc, req, steps, summary, itl, res)


def _verify_impl(sc: Scenario) -> str:
    v = sc.attention.verify
    return sc.decode_attention if v == "decode_kernel" else v


def prefill_saved(req: pd.DataFrame, lat: StepLatency) -> dict[str, float]:
    """Prefill time the prefix cache saved, request by request: a lone prefill of the
    whole prompt minus one of the uncached rest (queueing effects not included; compare
    a run without caching for those)."""
    hit = req[req.cached_tokens > 0]
    saved = [lat.prefill([(p, 0)]) - lat.prefill([(p - c, c)])
             for p, c in zip(hit.prompt_tokens.tolist(), hit.cached_tokens.tolist(), strict=True)]
    total = float(sum(saved))
    return {"requests_hit": len(hit), "prefill_s_saved_total": total,
            "prefill_s_saved_per_request": total / len(req) if len(req) else 0.0}


def _progress_bar(total_s: float):
    from tqdm import tqdm

    class Bar(tqdm):
        def update_to(self, now: float) -> None:
            self.update(min(now, self.total) - self.n)

    return Bar(total=round(total_s, 1), unit="sim-s", desc="simulating", leave=False,
               bar_format="{desc}: {percentage:3.0f}%|{bar}| {n:.0f}/{total:.0f} sim-s [{elapsed}]")
