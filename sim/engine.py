"""The SimPy engine: an arrival process feeding a replica process.

`arrivals(env, ...)` releases requests at their arrival times; `replica(env, ...)`
loops: ask the policy for a plan, apply it (`sim/replica.py`: admit, preempt, swap,
allocate KV), hold the clock for the step's latency, then apply the step's results
(first tokens, finished requests, freed KV). Policies never see `env`.
"""

from __future__ import annotations

import numpy as np
import simpy

from .batch import RunningBatch, Seq
from .kv import ContiguousKV, PagedKV
from .latency import StepLatency
from .prefix import PrefixCache, regroup
from .replica import Replica, RunResult
from .scheduler import ReplicaState, StaticPolicy
from .speculative import SpecBatch, Speculator
from .workload import Workload


def arrivals(env: simpy.Environment, rep: Replica, seqs: list[Seq]):
    """Release each request at its arrival time into the replica's queue."""
    t = 0.0
    for s in seqs:
        if s.arrival > t:
            yield env.timeout(s.arrival - t)
            t = s.arrival
        rep.st.waiting.append(s)
        if rep.wake is not None and not rep.wake.triggered:
            rep.wake.succeed()
    rep.arrivals_done = True
    if rep.wake is not None and not rep.wake.triggered:
        rep.wake.succeed()


def replica(env: simpy.Environment, rep: Replica, progress=None):
    """Run iterations until every request has finished or been rejected."""
    st, log = rep.st, rep.log
    batch = st.batch
    policy = rep.policy
    while rep.pending > 0:
        now = env.now
        plan = policy.schedule(st, now)
        if plan.reject:
            rep.reject(plan)
        kind = plan.kind
        if kind == "decode":
            dur, n = rep.decode_step(plan)
            yield env.timeout(dur)
            t_end = now + dur
            for s in batch.advance(t_end, rep.gaps, rep.weights):
                rep.release(s)
            if rep.spec:
                code, tokens = rep.finish_round(n)
                rep.record(now, t_end, code, n, tokens)
            else:
                rep.record(now, t_end, 1, n, n)
        elif kind == "prefill":
            dur, n, tokens = rep.prefill_step(plan, now)
            yield env.timeout(dur)
            t_end = now + dur
            rep.finish_prefill_step(plan, t_end)
            rep.record(now, t_end, 0, n, tokens)
        elif kind == "mixed":
            dur, code, n, tokens = rep.mixed_step(plan, now)
            yield env.timeout(dur)
            t_end = now + dur
            rep.finish_mixed_step(plan, t_end)
            rep.record(now, t_end, code, n, tokens)
        elif kind == "preempt":
            rep.preempt(plan)
            rep.swap(plan)
        elif kind == "idle":
            if rep.arrivals_done and not st.waiting and not st.swapped and len(batch) == 0:
                break
            rep.wake = env.event()
            if plan.wake_at is not None:
                yield rep.wake | env.timeout(max(0.0, plan.wake_at - now))
            else:
                yield rep.wake
            rep.wake = None
        if rep.static and len(batch) == 0 and (batch.n_compute or rep.static_rows):
            rep.end_static_batch()
        if progress is not None and len(log.t_end) % 2000 == 0:
            progress(env.now)


def simulate(workload: Workload, kv: PagedKV, policy, latency: StepLatency, *,
             max_model_len: int, kv_bytes_per_token: float, pcie_bytes_per_s: float,
             swap_blocks: int = 0, reserve_max_model_len: bool = True,
             prefix_caching: bool = False, prefix_host_bytes: float = 0.0,
             speculator: Speculator | None = None, progress=None) -> RunResult:
    """Replay `workload` through one replica; every request ends finished or rejected."""
    paged = not isinstance(kv, ContiguousKV)
    if speculator is not None:
        batch = SpecBatch(kv.block_size, paged, speculator)
    else:
        batch = RunningBatch(kv.block_size, paged, keep_finished=isinstance(policy, StaticPolicy))
    st = ReplicaState(kv=kv, batch=batch, max_model_len=max_model_len, swap_free_blocks=swap_blocks,
                      reserve_max_model_len=reserve_max_model_len)
    hashes = workload.prefix_hashes
    if prefix_caching and hashes is not None and paged:
        hashes, hash_tokens = regroup(hashes, workload.block_tokens, kv.block_size)
        st.prefix = PrefixCache(kv, hash_tokens, int(prefix_host_bytes // (kv_bytes_per_token * hash_tokens)))
    rep = Replica(st, policy, latency, kv_bytes_per_token, pcie_bytes_per_s)
    arr = np.asarray(workload.arrival_s, dtype=float).tolist()
    # as in vLLM, generation stops at the context window (a longer prompt is rejected)
    seqs = [
        Seq(i, a, p, max(1, min(o, max_model_len - p)), m)
        for i, (a, p, o, m) in enumerate(zip(
            arr,
            np.asarray(workload.prompt_tokens).tolist(),
            np.asarray(workload.output_tokens).tolist(),
            np.asarray(workload.max_tokens).tolist(),
            strict=True,
        ))
    ]
    if hashes is not None:
        for s, h in zip(seqs, hashes, strict=True):
            s.prefix = h
    rep.pending = len(seqs)
    env = simpy.Environment()
    env.process(arrivals(env, rep, seqs))
    env.process(replica(env, rep, progress))
    env.run()
    if rep.pending:
        raise RuntimeError(f"simulation ended with {rep.pending} requests unaccounted for")
    rep.check_conserved()
    return RunResult(seqs, rep.log, rep.gaps, rep.weights, kv, env.now, rep.swap_bytes,
                     st.prefix.summary() if st.prefix is not None else None)
