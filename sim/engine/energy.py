"""Energy and dollars of a run: the summary's `energy` and `cost`.

Each replica draws power on all the GPUs of its tensor x pipeline group over the run's
duration (the summary's, the measured window of a closed loop): idle power throughout,
plus the utilisation-dependent part while its kernels run (its kernel seconds; a
measured run's reference engine has none of its own, so its step time stands in). The
power model and the prices are sim/costmodel/power.py and sim/costmodel/prices.py.
"""

from __future__ import annotations

import math

from sim.costmodel.power import energy_figures, replica_energy
from sim.costmodel.prices import cost_figures, load_price_table
from sim.engine.metrics import StepSums
from sim.engine.results import RunResult


def energy_and_cost(configs: list, res: RunResult, summary: dict, prices: dict | None = None,
                    t0: float | None = None, powered_s: list[float] | None = None) -> dict:
    """{"energy": ..., "cost": ...} for a run; `configs`: the replicas' ReplicaConfigs,
    `summary`: the run summary so far (duration, finished requests, output throughput);
    `powered_s`: seconds each replica was up (an autoscaled pool: from its start to its
    leaving, 0 for one never started), default the whole duration."""
    duration = float(summary["duration_s"])
    finished = int(summary["requests"]["finished"])
    tokens = round(summary["output_token_throughput"] * duration)
    rows, sources, gpu_s = [], [], {}
    for i, (cfg, rep) in enumerate(zip(configs, res.replicas, strict=True)):
        up = duration if powered_s is None else powered_s[i]
        par = cfg.scenario.parallel
        gpus = par.gpus
        kernel = rep.kernel_busy_s
        if math.isnan(kernel):
            kernel = StepSums(rep, t0).busy
        power = cfg.profile.facts.power
        rows.append(replica_energy(power, gpus, up, kernel))
        if power is not None:
            for s in power.sources():
                line = f"{cfg.profile.name}: {s}"
                if line not in sources:
                    sources.append(line)
        gpu_s[cfg.profile.name] = gpu_s.get(cfg.profile.name, 0.0) + gpus * up
    energy = energy_figures(rows, duration, finished, tokens, sources)
    cost = cost_figures(gpu_s, duration, tokens, prices or load_price_table())
    return {"energy": energy, "cost": cost}
