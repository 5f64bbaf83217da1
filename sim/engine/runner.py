"""Run a scenario end to end: the Python API behind `llmsim run`.

    >>> from sim import run
    >>> out = run("scenarios/quickstart.yaml")
    >>> out.requests.ttft_s.median(), out.summary["output_token_throughput"]
    >>> out.write("runs/quickstart")   # requests.csv, steps.csv, summary.json, plots
    >>> out.write("runs/q", plots=False, fmt="parquet")   # requests.parquet, steps.parquet

The tables are numpy columns (sim/io/tablefile.py); `out.requests`, `out.steps` and
`out.itl` make pandas frames of them on first use, so a run that only writes its
files never imports pandas.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from sim.config.scenario import Scenario, load_scenario
from sim.costmodel.latency import StepLatency
from sim.costmodel.stepcache import warm
from sim.engine.autoscale import (
    Lifecycle,
    autoscale_summary,
    make_policy,
    provisioning_delay,
    window_power,
)
from sim.engine.build import POLICIES, ReplicaConfig, build_fleet
from sim.engine.closedloop import client_summary
from sim.engine.energy import energy_and_cost
from sim.engine.metrics import (
    _measured,
    _rows,
    itl_table,
    per_replica,
    request_table,
    step_sums,
    step_tables,
    summarize,
)
from sim.engine.pipeline import pipeline_summary
from sim.engine.prepare import Prepared, prepare
from sim.engine.processes import simulate
from sim.engine.recorder import spill_logs
from sim.engine.replica import RunResult
from sim.engine.splitrule import auto_workers, refusal
from sim.io.outputs import write_atomically
from sim.io.specload import SpecError
from sim.io.tablefile import frame, write_csv, write_parquet
from sim.policies.prefix import combine_summaries
from sim.policies.speculative import summarize_speculators
from sim.workload.requests import Workload

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["POLICIES", "Prepared", "RunOutput", "prepare", "run"]


NOTICES = logging.getLogger("llmsim")
TABLE_FORMATS = ("csv", "parquet")


@dataclass
class RunOutput:
    scenario: Scenario
    request_table: dict  # numpy columns (sim/engine/metrics.py request_table)
    # one per replica, views of its step log; None: the replicas kept only its sums
    # (step_log: summary, sim/engine/steptally.py)
    step_tables: list[dict] | None
    summary: dict
    result: RunResult
    itl_table: dict  # weighted inter-token gaps: gap_s, count
    # or "64 replicas apart, ... (router round_robin needs no feedback)" (split_engine)
    engine: str = "single process"
    # a split fleet simulated in worker processes: each worker's CPU and peak memory
    # (sim/engine/parallel.py Usage); none when simulated in this process
    worker_usage: tuple = ()

    @cached_property
    def requests(self) -> pd.DataFrame:
        return frame(self.request_table)

    @cached_property
    def steps(self) -> pd.DataFrame:
        """Every replica's iterations, replica by replica (ValueError: step_log: summary)."""
        return frame(_rows(self.step_tables))

    @cached_property
    def itl(self) -> pd.DataFrame:
        """Weighted inter-token gaps: columns gap_s, count."""
        return frame(self.itl_table)

    def write(self, out_dir: str | Path, plots: bool = True, fmt: str = "csv") -> Path:
        """Write all outputs into the folder `out_dir`, replacing an earlier llmsim run
        there atomically; any other non-empty folder is refused (see sim.io.outputs)."""
        return write_atomically(out_dir, lambda folder: self.write_files(folder, plots, fmt),
                                {"scenario": self.scenario.name, **(
                                    {"step_log": "summary"} if self.step_tables is None
                                    else {})})

    def write_files(self, folder: Path, plots: bool = True, fmt: str = "csv") -> None:
        """requests.csv, steps.csv (or .parquet; not for step_log: summary, which kept no
        rows), summary.json (and the plots: they need the rows) into an existing folder."""
        if fmt not in TABLE_FORMATS:
            raise ValueError(f"table format {fmt!r} (known: {', '.join(TABLE_FORMATS)})")
        if plots and self.step_tables is None:
            raise ValueError("the timeline plot needs the step rows: step_log: summary kept "
                             "none (allowed: plots=False, or step_log: rows)")
        write = write_parquet if fmt == "parquet" else write_csv
        write(folder / f"requests.{fmt}", self.request_table)
        if self.step_tables is not None:
            write(folder / f"steps.{fmt}", self.step_tables)
        (folder / "summary.json").write_text(json.dumps(self.summary, indent=2) + "\n")
        if plots:
            from sim.engine.plots import plot_run

            plot_run(self, folder)


def run(scenario: Scenario | str | Path, overrides: dict | None = None,
        progress: bool = False, workers: int | str = 1, executor: str = "process",
        split: bool = True, step_cache: Path | None = None, watch=None) -> RunOutput:
    """Simulate a scenario (object or YAML path) and return its tables and summary.
    A fleet behind a router that needs no feedback (round robin, random) is simulated
    replica by replica (`split`, the default; False: the whole fleet in one engine), each
    replica alone with its own requests, with the same results (sim/engine/split.py);
    `workers` > 1 spreads the replicas over that many processes (`executor` "process" or
    "ray"; "auto": one per core when the run is large enough to pay for them, else 1:
    sim/engine/splitrule.py `auto_workers`). Any other run is simulated whole, in one process (with `workers` > 1 saying
    why: sim/engine/parallel.py). `step_cache`: a folder of step times remembered between
    runs (sim/costmodel/stepcache.py; `llmsim run` passes its default); the same results,
    faster when warm. `watch`: a run simulated whole stops once it says so
    (sim/engine/watch.py; the watch keeps why), its unfinished requests left in their
    state; a run split by replica never stops early."""
    sc = scenario if isinstance(scenario, Scenario) else load_scenario(scenario, overrides)
    t0 = time.perf_counter()
    configs, wl, rng = prepare(sc)
    cache = warm(step_cache, [c.latency for c in configs])  # saved by cache.save() below
    reason = refusal(sc, configs, wl) if split else "the whole fleet in one engine (split=False)"
    if workers == "auto":  # the same results whatever it picks: silent when it picks 1
        workers = auto_workers(len(configs), len(wl)) if reason is None else 1
    if reason is None:
        out = _finish(sc, configs, wl, t0, None, workers=workers, executor=executor, rng=rng)
        cache.save()
        return out
    if workers > 1:
        NOTICES.warning("single process (--workers %d not used): %s", workers, reason)
    engine = "single process" + (f" ({reason})" if workers > 1 else "")
    fleet = build_fleet(sc, configs, rng, acceptance=wl.acceptance, prefix_tokens=wl.block_tokens
                        if wl.prefix_hashes is not None else None)
    if wl.clients is None:  # a closed loop's warm-up marks count gaps in memory: kept there
        spill_logs(fleet.replicas)
    bar = _progress_bar(float(wl.arrival_s[-1]) if len(wl) else 0.0) if progress else None
    scaling = _autoscaling(sc, configs)
    t_sim = time.perf_counter()
    res = simulate(wl, fleet.replicas, fleet.router, decode_router=fleet.decode_router,
                   link=fleet.link, staleness_s=fleet.staleness_s,
                   progress=bar.update_to if bar else None,
                   lifecycle=scaling[0] if scaling else None,
                   scaler=scaling[1] if scaling else None, watcher=watch)
    t_sim = time.perf_counter() - t_sim
    if bar:
        bar.close()
    out = _finish(sc, configs, wl, t0, (res, t_sim, scaling), replicas=fleet.replicas)
    out.engine = engine
    cache.save()
    return out


def _finish(sc: Scenario, configs: list[ReplicaConfig], wl: Workload, t0: float, done,
            workers: int = 1, executor: str = "process", replicas=None,
            rng: np.random.Generator | None = None) -> RunOutput:
    """The tables and summary of a simulated run (`done`: (result, engine seconds,
    autoscaling)), or of one simulated now replica by replica (`done` None), in `workers`
    processes."""
    if done is None:  # a split run: its machinery loaded here, only for it
        from sim.engine.parallel import simulate_split, split_engine

        t_sim = time.perf_counter()
        res, every, usage = simulate_split(sc, configs, wl, rng, workers, executor)
        t_sim = time.perf_counter() - t_sim
        engine = split_engine(len(configs), sc.cluster.router.policy, workers, executor, every)
        NOTICES.info("simulated %s", engine)
        scaling = None
    else:
        res, t_sim, scaling = done
    req = request_table(res)
    steps = step_tables(res)
    sums = step_sums(res, _measured(req)[1])  # summarize's and per_replica's
    first = configs[0]
    lats = list({id(c.latency): c.latency for c in configs}.values())
    summary = {
        "scenario": sc.name,
        "model": first.model.name,
        "gpu": "+".join(dict.fromkeys(c.profile.name for c in configs)),
        "gpu_analytic": first.profile.facts.analytic,
        "runtime": "+".join(dict.fromkeys(c.runtime.name for c in configs)),
        "policy": "+".join(dict.fromkeys(c.scenario.scheduler.policy for c in configs)),
        "kv_manager": first.scenario.kv.manager,
        "attention": {"prefill": first.scenario.attention.prefill,
                      "decode": first.scenario.decode_attention},
        "seed": sc.seed,
        "replicas": len(configs),
        "parallel": _parallel(first.scenario.parallel),
        "dtype": {"weights": first.scenario.dtype.weights,
                  "kv_cache": first.scenario.dtype.kv_cache},
        **summarize(req, steps, res, sc.slo, sums),
        "memory_gib": first.budget.as_dict(),
        "prefix_cache": combine_summaries([r.prefix_cache for r in res.replicas]),
        "speculative": speculative_summary([r.speculator for r in res.replicas]),
        "lookup_provenance": merged_provenance(lats),
        "wall_s": time.perf_counter() - t0,
        "simulate_wall_s": t_sim,  # the engine alone (wall_s adds loading, tables, summary)
    }
    if scaling:
        scaling[0].close(res.end_time)
        watts = window_power(scaling[0], configs, [r.kernel_busy_s for r in res.replicas], steps,
                             res.end_time)
        summary["autoscale"] = autoscale_summary(scaling[0], scaling[2], req, sc.slo, res.end_time,
                                                 watts)
    summary.update(energy_and_cost(configs, res, summary, t0=_measured(req)[1],
                                   powered_s=scaling[0].powered_s(len(configs)) if scaling else None))
    if replicas is not None and (
            pipe := pipeline_summary(replicas, configs, summary["duration_s"])) is not None:
        summary["pipeline"] = pipe
    if wl.clients is not None:
        summary["clients"] = client_summary(wl.clients, req)
    if len(configs) > 1:
        summary["per_replica"] = per_replica(req, steps, res, sums)
        summary["groups"] = [{"group": c.group, "role": c.role, "gpu": c.profile.name,
                              "runtime": c.runtime.name, "tensor": c.scenario.parallel.tensor,
                              "memory_gib": c.budget.as_dict()}
                             for c in {c.group: c for c in configs}.values()]
    if summary["prefix_cache"] is not None:
        summary["prefix_cache"].update(prefill_saved(req, first.latency))
    return RunOutput(sc, req, steps, summary, res, itl_table(res),
                     engine if done is None else "single process",
                     tuple(usage) if done is None else ())


def _autoscaling(sc: Scenario, configs: list[ReplicaConfig]):
    """(lifecycle, policy, provisioning) for `cluster.autoscale`, else None."""
    spec = sc.cluster.autoscale if sc.cluster is not None else None
    if spec is None:
        return None
    first = configs[0]
    prov = provisioning_delay(spec, first.budget.weight_bytes, file=sc.file or None)
    par = first.scenario.parallel
    lc = Lifecycle(spec, prov["delay_s"], par.gpus, len(configs))
    if spec.policy == "slo":
        if sc.slo is None or (sc.slo.ttft_s is None and sc.slo.tpot_s is None):
            raise SpecError(sc.file or None, "cluster.autoscale.policy",
                            "'slo' needs the scenario's slo: ttft_s and/or tpot_s")
        lc.slo = (sc.slo.ttft_s, sc.slo.tpot_s)
    lc.begin(sc.cluster.groups[0].count)
    return lc, make_policy(spec), prov


def merged_provenance(lats: list) -> dict[str, float]:
    """Share of simulated GPU time by lookup kind, over every distinct step-latency model."""
    if len(lats) == 1:
        return lats[0].provenance()
    weights = [lat.provenance_seconds() for lat in lats]
    total = sum(sum(w.values()) for w in weights) or 1.0
    return {k: sum(w[k] for w in weights) / total for k in weights[0]}


def speculative_summary(specs: list) -> dict | None:
    specs = [s for s in specs if s is not None]
    if not specs:
        return None
    return summarize_speculators(specs)


def prefill_saved(req, lat: StepLatency) -> dict[str, float]:
    """Prefill time the prefix cache saved, request by request: a lone prefill of the
    whole prompt minus one of the uncached rest (queueing effects not included; compare
    a run without caching for those). `req`: the request table (or frame)."""
    cached = np.asarray(req["cached_tokens"], dtype=np.int64)
    hit = cached > 0
    prompt = np.asarray(req["prompt_tokens"], dtype=np.int64)[hit].tolist()
    saved = [lat.prefill([(p, 0)]) - lat.prefill([(p - c, c)])
             for p, c in zip(prompt, cached[hit].tolist(), strict=True)]
    total = float(sum(saved))
    return {"requests_hit": len(prompt), "prefill_s_saved_total": total,
            "prefill_s_saved_per_request": total / len(cached) if len(cached) else 0.0}


def _progress_bar(total_s: float):
    from tqdm import tqdm

    class Bar(tqdm):
        def update_to(self, now: float) -> None:
            self.update(min(now, self.total) - self.n)

    return Bar(total=round(total_s, 1), unit="sim-s", desc="simulating", leave=False,
               bar_format="{desc}: {percentage:3.0f}%|{bar}| {n:.0f}/{total:.0f} sim-s [{elapsed}]")


def _parallel(par) -> dict:
    """The layout as summary.json states it: tensor and pipeline, and the expert-parallel and
    attention data-parallel degrees when used (data: the first replica's)."""
    out = {"tensor": par.tensor, "pipeline": par.pipeline}
    if par.expert > 1:
        out |= {"expert": par.expert, "data": par.data}
    return out
