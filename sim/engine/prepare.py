"""A scenario resolved into what a run simulates: its replicas' configs (checked to fit)
and its workload, drawn from the run's seeded generator. `sim/engine/runner.py` runs it
in one process; `sim/engine/parallel.py`'s forked workers inherit it, Ray's resolve
the configs again (the workload comes through Ray's object store), spawned ones both.
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import numpy as np

from sim.config.scenario import Scenario
from sim.engine.build import ReplicaConfig, replica_configs
from sim.engine.hostmem import check_host_memory
from sim.workload.requests import Workload, generate


class Prepared(NamedTuple):
    configs: list[ReplicaConfig]  # one per replica (sim/engine/build.py)
    workload: Workload
    rng: np.random.Generator


def prepare(sc: Scenario) -> Prepared:
    """Resolve a scenario into replica configs (checked to fit) and its workload."""
    configs = replica_configs(sc)
    check_host_memory(sc)  # before the workload is drawn: its size alone
    rng = np.random.default_rng(sc.seed)
    base = Path(sc.base_dir) if sc.base_dir else None
    wl = generate(sc.workload, rng, file=sc.file or None, path="workload", base_dir=base)
    check_host_memory(sc, len(wl), int(wl.output_tokens.sum()))  # and its iterations
    return Prepared(configs, wl, rng)
