"""Which runs may be simulated replica by replica (sim/engine/split.py, merged by
sim/engine/parallel.py): asked by every run, so kept apart from that machinery, which a
run loads only when it splits.

A fleet splits when its router never looks at the replicas' state (`FEEDBACK_FREE`) and
nothing else joins its replicas: no autoscaling, no disaggregation, no closed loop, no
speculative decoding, no pipeline parallelism (sim/engine/parallel.py says why each).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sim.config.scenario import Scenario

# router policies that choose without looking at the replicas (the rest read their load)
# (`length`: its pools' `within` router may read load, and `assign` would need the pools:
# single process for now)
FEEDBACK_FREE = {"round_robin": True, "random": True, "least_outstanding": False,
                 "least_kv": False, "power_of_two": False, "affinity": False, "length": False}


# `workers` "auto" (`llmsim run`'s default): one process per core, but only for a run with
# at least this many requests per process. Below it the fork, the results' trip back and
# each worker's cold step-time lookups cost about what the second core saves. Measured
# (benchmarks/speed/fleet_speed.py --hours 0.1, workers 1 vs 2, CPU s, medians of 3,
# load ~8): 2 replicas, 3,927 requests: +0.30 s CPU in all, the busier process 0.65 s
# against 0.84 s alone (1.3x at best on two free cores); 4 replicas, 7,723 requests:
# +0.18 s, 0.94 against 1.51 s (1.6x); 16 replicas, 31,066: +0.0 s, 3.11 against 5.61 s.
AUTO_MIN_REQUESTS = 2_500


def cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def auto_workers(replicas: int, requests: int, cores_: int | None = None) -> int:
    """Processes for `workers` "auto": one per core, no more than replicas, and each with
    at least AUTO_MIN_REQUESTS requests to simulate (1: this process alone)."""
    n = min(cores_ or cores(), replicas, requests // AUTO_MIN_REQUESTS)
    return max(1, n)


def may_split(sc: Scenario) -> bool:
    """Whether the scenario's run can be simulated replica by replica, from its spec alone
    (`refusal` checks its replicas too; sim/engine/hostmem.py sizes the run by this
    before its workload is drawn)."""
    c = sc.cluster
    return (c is not None and FEEDBACK_FREE.get(c.router.policy, False) and c.autoscale is None
            and not c.disaggregated and sc.workload.clients is None
            and sc.speculative.method == "none" and sc.parallel.pipeline == 1
            and sum(g.count for g in c.groups) > 1)


def refusal(sc: Scenario, configs: list, workload) -> str | None:
    """Why this run cannot be split by replica (None: it can)."""
    cluster = sc.cluster
    if cluster is None or len(configs) < 2:
        return "one replica"
    if cluster.autoscale is not None:
        return "autoscaling reads the whole fleet"
    if any(c.role != "both" for c in configs):
        return "a disaggregated fleet joins prefill and decode replicas"
    if workload.clients is not None:
        return "a closed loop's clients wait for their answers"
    if not FEEDBACK_FREE.get(cluster.router.policy, False):
        return (f"router {cluster.router.policy} chooses by the replicas' load (feedback); "
                f"only {', '.join(k for k, v in FEEDBACK_FREE.items() if v)} split")
    if any(c.scenario.speculative.method != "none" for c in configs):
        return "speculative decoding draws from the run's shared generator"
    if any(c.scenario.parallel.pipeline > 1 for c in configs):
        return "pipeline-parallel replicas run their own engine process (sim/engine/pipeline.py)"
    return None


__all__ = ["AUTO_MIN_REQUESTS", "FEEDBACK_FREE", "auto_workers", "cores", "may_split", "refusal"]
