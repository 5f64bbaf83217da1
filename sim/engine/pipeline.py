"""A pipeline-parallel replica: its stages and the micro-batches in flight on them.

As vLLM runs pipeline parallelism (V0's `pipeline_parallel_size` virtual engines; V1's
batch queue of the same depth), a replica of P stages keeps up to P micro-batches in
flight: P virtual engines, each with its own running batch and scheduler (each bounded by
`max_num_seqs` and `max_num_batched_tokens`, as V0's per-engine schedulers), all admitting
from the replica's one queue and sharing its one KV pool (every stage holds KV for its
own layers; sim/engine/memory.py). Each engine loops: plan its next micro-batch, then run
it through the stages in order — stage s is one `simpy.Resource` (its GPUs run one
micro-batch at a time, first come first served), held for that stage's share of the step
(sim/costmodel/pipeline.StageLatency), then the activations cross to the next stage
(`StagedLatency.transfer_s`; the sending stage is free meanwhile) — and finishes the step
once the last stage is done. So with P engines busy a replica completes one micro-batch
per slowest-stage time while each one's latency is the sum of its stage times and
transfers; stages idle (the bubble) when micro-batches are unequal or fewer than P.

The replica the fleet sees is engine 0 (`PipelinedReplica`): its queue, KV pool, port and
step record are the replica's, shared by its sibling engines, and its `done` counts
theirs too. The step log holds each micro-batch's span on the last stage (so its busy time
is the last stage's); per-stage busy time and bubble share are in `stage_summary`.
Jitter and swap time scale a step's stage times in proportion.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from sim.engine.replica import Replica, Step
from sim.policies.plan import StepKind

if TYPE_CHECKING:  # simpy is imported where the process runs (the build stays without it)
    import simpy

IDLE = StepKind.IDLE


class VirtualEngine(Replica):
    """One of a pipelined replica's virtual engines (its own batch and scheduler)."""

    pipe: list[Replica]
    own_record = True  # decode steps logged by `record` too (Replica.finish inlines its own)

    def record(self, t0: float, t1: float, step: Step) -> None:
        """The step's entry, with the KV blocks and tokens the whole replica holds."""
        held = (sum(e.st.batch.kv_tokens() for e in self.pipe) + self.port.outside_tokens
                - self.kv.shared_tokens())
        self.rec.log.add(t0, t1, step.kind, step.seqs, step.tokens, self.st.kv.used_blocks,
                         held)


class PipelinedReplica(VirtualEngine):
    """Engine 0 of a pipelined replica: the replica as the fleet and the results see it."""

    def __init__(self, *args, **kwargs):
        self.siblings: list[VirtualEngine] = []
        self._done = 0
        super().__init__(*args, **kwargs)
        self.pipe = [self]
        self.staged = None  # sim.costmodel.pipeline.StagedLatency (set by attach)
        self.stage_busy_s: list[float] = []
        self.active_s = 0.0  # time with at least one micro-batch in flight
        self._in_flight = 0
        self._since = 0.0
        self.process = pipelined

    @property
    def done(self) -> int:  # requests this replica finished or rejected, all engines
        return self._done + sum(e.done for e in self.siblings)

    @done.setter
    def done(self, value: int) -> None:
        self._done = value - sum(e.done for e in self.siblings)

    def attach(self, staged, make_engine: Callable[[int], VirtualEngine]) -> None:
        """Add the sibling engines (`make_engine(i)` for i = 1 .. P-1) and the step model."""
        self.staged = staged
        stages = len(staged.stages)
        self.siblings = [make_engine(i) for i in range(1, stages)]
        self.pipe = [self, *self.siblings]
        for e in self.pipe:
            e.pipe = self.pipe
            e.rec, e.port, e.name, e.index, e.config = (self.rec, self.port, self.name,
                                                        self.index, self.config)
        self.stage_busy_s = [0.0] * stages

    def check_conserved(self) -> None:
        super().check_conserved()
        for e in self.siblings:
            if e.st.swapped:
                raise RuntimeError(f"{len(e.st.swapped)} requests left in host memory")

    def flight(self, now: float, delta: int) -> None:
        """A micro-batch enters (+1) or leaves (-1) the pipeline at `now`."""
        if self._in_flight == 0:
            self._since = now
        self._in_flight += delta
        if self._in_flight == 0:
            self.active_s += now - self._since

    def stage_summary(self, duration_s: float) -> list[dict]:
        """Per stage: layers, busy seconds, busy share of the run, bubble share (idle
        while a micro-batch was in flight somewhere in the pipeline)."""
        active = self.active_s or 1e-12
        return [{"stage": i, "layers": st.layers, "busy_s": busy,
                 "busy_share": min(1.0, busy / duration_s) if duration_s > 0 else 0.0,
                 "bubble_share": max(0.0, 1.0 - busy / active) if self.active_s else 0.0}
                for i, (st, busy) in enumerate(zip(self.staged.stages, self.stage_busy_s,
                                                   strict=True))]


def pipelined(env: simpy.Environment, node, progress=None):
    """The engine process of a pipelined replica (`node.rep` a PipelinedReplica): one
    process per virtual engine over the replica's stages."""
    import simpy

    rep: PipelinedReplica = node.rep
    stages = [simpy.Resource(env, capacity=1) for _ in rep.staged.stages]
    for e in rep.pipe:
        env.process(_engine(env, node, rep, e, stages, progress if e is rep else None))
    yield env.timeout(0)


def _engine(env: simpy.Environment, node, rep: PipelinedReplica, e: VirtualEngine,
            stages: list[simpy.Resource], progress):
    """One virtual engine: plan a micro-batch, run it through the stages, finish it."""
    st, policy, staged, log = e.st, e.policy, rep.staged, rep.rec.log
    busy = rep.stage_busy_s
    last = len(stages) - 1
    while True:
        now = env.now
        plan = policy.schedule(st, now)
        if plan.reject and node.ended is not None:
            node.ended([r.seq for r in plan.reject])
        step = e.start(plan, now)
        if step is not None:
            parts = list(staged.stage_s)
            total = sum(parts)
            if total > 0 and step.seconds != total:  # jitter, swaps: in proportion
                parts = [p * step.seconds / total for p in parts]
            transfer = staged.transfer_s(step.tokens)
            rep.flight(now, 1)
            t_last = now
            for s, resource in enumerate(stages):
                req = resource.request()
                yield req
                t_last = env.now
                yield env.timeout(parts[s])
                resource.release(req)
                busy[s] += parts[s]
                if s < last:
                    yield env.timeout(transfer)
            rep.flight(env.now, -1)
            done = e.finish(step, t_last, env.now)
            if node.ended is not None and done:
                node.ended(done)
            node.poke()  # siblings waiting for KV room or work plan again
        else:
            if plan.kind is IDLE:
                if node.wake is None or node.wake.triggered:
                    node.wake = env.event()
                wake = node.wake
                if plan.wake_at is not None:
                    yield wake | env.timeout(max(0.0, plan.wake_at - now))
                else:
                    yield wake
            e.end_of_step()
        if progress is not None and log.rows() % 2000 == 0:
            progress(env.now)


def pipeline_summary(replicas: list, configs: list, duration_s: float) -> dict | None:
    """`summary.json` → `pipeline`: the layout, the link between stages, memory per stage
    and each stage's busy and bubble shares (averaged over the pipelined replicas); None
    when no replica is pipelined."""
    pipes = [(r, c) for r, c in zip(replicas, configs, strict=True)
             if isinstance(r, PipelinedReplica)]
    if not pipes:
        return None
    rep, cfg = pipes[0]
    staged = rep.staged
    per = [r.stage_summary(duration_s) for r, _ in pipes]
    stages = []
    for i, first in enumerate(per[0]):
        row = dict(first)
        for k in ("busy_s", "busy_share", "bubble_share"):
            row[k] = sum(p[i][k] for p in per) / len(per)
        row["memory_gib"] = cfg.stage_budgets[i].as_dict()
        stages.append(row)
    link = staged.link
    return {"stages": len(staged.stages), "tensor": staged.tensor,
            **({"data": staged.data, "expert": cfg.scenario.parallel.expert}
               if staged.data > 1 or cfg.scenario.parallel.expert > 1 else {}),
            "micro_batches_in_flight": len(staged.stages),
            "link": {"name": link.name, "across_nodes": link.across_nodes,
                     "gbs": link.bytes_per_s / 1e9, "latency_us": link.latency_s * 1e6},
            "transfer_ms_per_decode_token": staged.transfer_s(1) * 1e3,
            "per_stage": stages}
