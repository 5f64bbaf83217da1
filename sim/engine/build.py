"""The one place a replica is built from a scenario.

`replica_configs(sc)` resolves a scenario (and each group of its `cluster` section)
into frozen `ReplicaConfig`s — model, GPU profile, runtime, memory budget, KV manager
settings, policy, attention kernels, speculative settings — and checks up front that
each fits its GPU. `build_replica(cfg, ...)` gives a config its run-time state (KV
manager, running batch, policy, prefix cache, speculator): a `Replica` ready for the
engine. The runner, `llmsim validate`, the benchmarks and the fleet all come here.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

from sim.config.cluster import ClusterSpec, KVTransferSpec, Link
from sim.config.scenario import Scenario, group_scenario
from sim.costmodel.comm import known_links
from sim.costmodel.jitter import jittered
from sim.costmodel.latency import StepLatency
from sim.costmodel.models import ModelSpec, context_window, load_model
from sim.costmodel.parallel import check_layout, with_dtypes
from sim.costmodel.pipeline import StagedLatency, StageLatency, stage_link, stage_ops
from sim.costmodel.profiles import GPUProfile, load_profile
from sim.costmodel.runtime import RuntimeSpec, load_runtime
from sim.engine.memory import MemoryBudget, memory_budget, stage_budgets
from sim.engine.pipeline import PipelinedReplica, VirtualEngine
from sim.engine.recorder import StepRecorder
from sim.engine.replica import Replica
from sim.io.specload import ROOT, SpecError, load_yaml
from sim.policies.batch import RunningBatch
from sim.policies.chunked import ChunkedPolicy
from sim.policies.kv import make_kv
from sim.policies.prefix import PrefixCache
from sim.policies.router import make_router, pool_router
from sim.policies.scheduler import ContinuousPolicy, ReplicaState, StaticPolicy
from sim.policies.speculative import SpecBatch, Speculator

POLICIES = {"continuous": ContinuousPolicy, "static": StaticPolicy, "chunked": ChunkedPolicy}
LINKS_FILE = ROOT / "gpu_profiles" / "links.yaml"


@dataclass(frozen=True)
class ReplicaConfig:
    """Everything fixed about one replica (its run-time state comes from build_replica)."""

    name: str              # "r0", or "<group>-<i>" in a cluster
    group: str
    role: str              # both | prefill | decode
    scenario: Scenario     # the scenario as this replica sees it (group fields laid over it)
    model: ModelSpec
    profile: GPUProfile
    runtime: RuntimeSpec
    budget: MemoryBudget
    draft: ModelSpec | None
    latency: StepLatency   # shared by the replicas of a group (a memo of step times)
    draft_latency: StepLatency | None

    @property
    def max_model_len(self) -> int:
        return self.scenario.kv.max_model_len or self.model.max_len

    @property
    def kv_bytes_per_token(self) -> float:
        """KV bytes one token holds on each GPU of the replica (heads split by tensor
        parallelism; with pipeline stages, the largest stage's layers; sliding-window layers
        shorter than max_model_len left out, sim/engine/memory.py)."""
        par = self.scenario.parallel
        width, context = self.model.kv_dtype_bytes, self.max_model_len
        if par.pipeline > 1:
            ops = self.model.ops(par.tensor)
            return max(stage_ops(ops, s, par.pipeline).kv_split(width, context)[0]
                       for s in range(par.pipeline))
        if self.model.sliding_layers:  # beyond the windows, the full layers' only
            return self.model.ops(par.tensor).kv_split(width, context)[0]
        return self.model.shard(self.scenario.parallel.tensor).kv_bytes_per_token

    @property
    def window_blocks(self) -> int:
        """KV blocks a sequence's sliding-window layers hold besides its tokens' (blocks at
        the full layers' bytes; one-token slots for a contiguous manager): the blocks
        covering its last window, sim/engine/memory.py. 0 without a window shorter than
        max_model_len."""
        if not self.model.sliding_layers:
            return 0
        sc, width = self.scenario, self.model.kv_dtype_bytes
        bs = sc.kv.block_size if sc.kv.manager == "paged" else 1
        ops = self.model.ops(sc.parallel.tensor, sc.parallel.expert)
        extra = 0
        for s in range(sc.parallel.pipeline):
            per_token, held = stage_ops(ops, s, sc.parallel.pipeline).kv_split(
                width, self.max_model_len, bs)
            extra = max(extra, -(-held // (per_token * bs)) if held else 0)
        return extra

    @property
    def stage_budgets(self) -> list[MemoryBudget]:
        """The memory budget of one GPU of each pipeline stage (sim/engine/memory.py)."""
        return stage_budgets(self.scenario, self.model, self.profile, self.draft)

    @property
    def swap_blocks(self) -> int:
        sc = self.scenario
        bs = sc.kv.block_size if sc.kv.manager == "paged" else 1
        return int(sc.kv.swap_space_gib * 1024**3 // (self.kv_bytes_per_token * bs))


def replica_configs(sc: Scenario, *, runtime: RuntimeSpec | None = None,
                    kv_tokens: int | None = None) -> list[ReplicaConfig]:
    """One config per replica; each group resolved (and checked to fit) once.

    `runtime` and `kv_tokens` override what the scenario implies (`llmsim validate`
    replays a measured run with its fitted runtime and its real KV pool)."""
    cluster = sc.cluster
    if cluster is None:
        return [_resolve(sc, "r0", "", "both", "", runtime, kv_tokens)]
    out: list[ReplicaConfig] = []
    for gi, group in enumerate(cluster.groups):
        where = f"cluster.groups[{gi}]"
        gsc = group_scenario(sc, group, where)
        label = group.name or f"g{gi}"
        first = _resolve(gsc, f"{label}-0", label, group.role, where, runtime, kv_tokens)
        out.append(first)
        count = cluster.autoscale.max_replicas if cluster.autoscale else group.count  # the pool
        out.extend(dataclasses.replace(first, name=f"{label}-{i}") for i in range(1, count))
    _check_roles(sc, cluster, out)
    if cluster.disaggregated:
        load_link(cluster.kv_transfer, file=sc.file or None)  # an unknown link fails up front
    return out


def _check_roles(sc: Scenario, cluster: ClusterSpec, configs: list[ReplicaConfig]) -> None:
    if not cluster.disaggregated:
        return
    for c in configs:
        s = c.scenario
        if c.role != "both" and (s.kv.manager != "paged" or s.scheduler.policy == "static"):
            raise SpecError(sc.file or None, "cluster.groups",
                            f"group '{c.group}' with role '{c.role}' needs kv.manager: paged and "
                            "scheduler.policy: continuous or chunked")
    models = {c.model.name for c in configs}
    if len(models) > 1:
        raise SpecError(sc.file or None, "cluster.groups", "prefill and decode groups must "
                        f"serve one model (got {', '.join(sorted(models))})")


def _resolve(sc: Scenario, name: str, group: str, role: str, where: str,
             runtime: RuntimeSpec | None, kv_tokens: int | None) -> ReplicaConfig:
    f = sc.file or None
    prefix = f"{where}." if where else ""
    profile = load_profile(sc.gpu, file=f, path=f"{prefix}gpu")
    model = with_dtypes(load_model(sc.model, file=f, path="model"), sc.dtype, profile, file=f)
    context_window(model, sc.kv.max_model_len, file=f, path=f"{prefix}kv.max_model_len")  # vLLM refuses more
    if runtime is None:
        runtime = load_runtime(sc.runtime, file=f, path=f"{prefix}runtime",
                               base_dir=sc.base_dir or None)
    if sc.elementwise is not None:  # the scenario names its stack's kernels
        runtime = dataclasses.replace(runtime, elementwise=sc.elementwise)
    draft = None
    if sc.speculative.method == "draft_model":
        draft = load_model(sc.speculative.draft_model, file=f, path="speculative.draft_model")
    check_layout(sc.parallel, model, profile, file=f, draft=draft)
    budget = memory_budget(sc, model, profile, draft)
    if kv_tokens is not None:
        budget = dataclasses.replace(budget, kv_tokens=kv_tokens)
    tp = sc.parallel.tensor
    if sc.parallel.pipeline > 1:
        lat = _staged(sc, model, profile, runtime, role, where)
    else:
        lat = StepLatency(model, profile, runtime, sc.attention.prefill, sc.decode_attention,
                          verify_impl=_verify_impl(sc), tensor=tp,
                          fp8_weights=sc.dtype.fp8_weights, expert=sc.parallel.expert,
                          data=sc.parallel.data, network=_network(sc.parallel.network),
                          all_to_all=sc.parallel.all_to_all)
    draft_lat = StepLatency(draft, profile, runtime, sc.attention.prefill,
                            sc.decode_attention, tensor=tp) if draft else None
    return ReplicaConfig(name, group, role, sc, model, profile, runtime, budget, draft, lat,
                         draft_lat)


def _network(name: str | None) -> tuple[float, float] | None:
    """(GB/s, µs) of the named link between NVLink domains (checked by check_layout)."""
    return known_links()[name] if name is not None else None


def _staged(sc: Scenario, model: ModelSpec, profile: GPUProfile, runtime: RuntimeSpec,
            role: str, where: str) -> StagedLatency:
    """The step model of a pipelined replica, after refusing what it does not model."""
    f, pp = sc.file or None, sc.parallel.pipeline
    prefix = f"{where}." if where else ""
    refusals = (("speculative.method", sc.speculative.method != "none", "speculative decoding"),
                ("scheduler.policy", sc.scheduler.policy == "static", "static batching"),
                ("cluster.groups", role != "both", f"a {role} role"))
    for path, refused, what in refusals:
        if refused:
            raise SpecError(f, f"{prefix}{path}", f"{what} with pipeline: {pp} is not modelled "
                            "(allowed: pipeline 1)")
    tp = sc.parallel.tensor
    par = sc.parallel
    stages = [StageLatency(model, profile, runtime, sc.attention.prefill, sc.decode_attention,
                           verify_impl=_verify_impl(sc), tensor=tp,
                           fp8_weights=sc.dtype.fp8_weights, expert=par.expert, stage=i,
                           stages=pp, data=par.data, network=_network(par.network),
                           all_to_all=par.all_to_all)
              for i in range(pp)]
    link = stage_link(par, profile, file=f, path=f"{prefix}parallel")
    return StagedLatency(stages, link, model.hidden, tp, par.data)


def _verify_impl(sc: Scenario) -> str:
    v = sc.attention.verify
    return sc.decode_attention if v == "decode_kernel" else v


def build_replica(cfg: ReplicaConfig, rng: np.random.Generator, *,
                  acceptance: np.ndarray | None = None, prefix_tokens: int | None = None,
                  index: int = 0, seed: int | None = None, latency=None) -> Replica:
    """A replica with fresh state: KV manager, running batch, policy, prefix cache, speculator.

    `seed` (default: the scenario's) seeds step-time jitter where the runtime has it.
    `rng` feeds speculative acceptance draws; `prefix_tokens` is the workload's tokens per
    prefix hash (None: the workload declares no prefixes, so nothing can be cached).
    `latency` replaces the step model (the reference engine times real steps instead)."""
    sc = cfg.scenario
    kv = make_kv(sc.kv.manager, cfg.budget.kv_tokens, sc.kv.block_size, cfg.window_blocks)
    paged = kv.paged
    policy = POLICIES[sc.scheduler.policy](sc.scheduler, kv)
    spec = None
    if sc.speculative.method != "none":
        if sc.speculative.acceptance.kind == "trace" and acceptance is None:
            raise SpecError(sc.file or None, "speculative.acceptance.kind",
                            "'trace' needs a csv trace with an 'acceptance' column")
        spec = Speculator(sc.speculative, cfg.latency, cfg.draft_latency, rng, acceptance)
        batch = SpecBatch(kv.block_size, paged, spec, kv.extra_blocks)
    else:
        batch = RunningBatch(kv.block_size, paged, keep_finished=policy.holds_batch,
                             extra_blocks=kv.extra_blocks)
    state = ReplicaState(kv=kv, batch=batch, max_model_len=cfg.max_model_len,
                         swap_free_blocks=cfg.swap_blocks,
                         reserve_max_model_len=sc.kv.reserve == "max_model_len")
    if sc.kv.prefix_caching and prefix_tokens is not None and paged:
        unit = math.lcm(prefix_tokens, kv.block_size)  # whole KV blocks (sim/prefix.regroup)
        state.prefix = PrefixCache(kv, unit, int(sc.kv.prefix_cache_host_gib * 1024**3
                                                 // (cfg.kv_bytes_per_token * unit)))
    if latency is None:
        latency = jittered(cfg.latency, sc.seed if seed is None else seed, index)
    pcie = cfg.profile.facts.pcie_gbs * 1e9
    pp = sc.parallel.pipeline
    rep = (PipelinedReplica if pp > 1 else Replica)(state, policy, latency,
                                                    cfg.kv_bytes_per_token, pcie)
    rep.name, rep.index, rep.config, rep.speculator = cfg.name, index, cfg, spec
    if sc.step_log == "summary":  # the step log's sums only (sim/engine/steptally.py)
        rep.rec = StepRecorder(summary=True)
    if pp > 1:  # the sibling engines: own batch and scheduler, the replica's queue and KV
        def engine(_: int) -> VirtualEngine:
            b = RunningBatch(kv.block_size, paged, keep_finished=False,
                             extra_blocks=kv.extra_blocks)
            s = ReplicaState(kv=kv, batch=b, max_model_len=cfg.max_model_len,
                             waiting=state.waiting, swap_free_blocks=cfg.swap_blocks // pp,
                             reserve_max_model_len=sc.kv.reserve == "max_model_len",
                             prefix=state.prefix)
            return VirtualEngine(s, POLICIES[sc.scheduler.policy](sc.scheduler, kv), latency,
                                 cfg.kv_bytes_per_token, pcie)
        state.swap_free_blocks = cfg.swap_blocks // pp
        rep.attach(cfg.latency, engine)
    return rep



@dataclass
class FleetSetup:
    """A scenario's replicas with fresh state, and how requests reach them."""

    replicas: list[Replica]
    router: object                 # sim.policies.router policy for arrivals (front replicas)
    decode_router: object | None   # disaggregated: picks the decode replica of a hand-off
    link: Link | None              # disaggregated: the prefill -> decode KV link
    staleness_s: float


def build_fleet(sc: Scenario, configs: list[ReplicaConfig], rng: np.random.Generator, *,
                acceptance: np.ndarray | None = None,
                prefix_tokens: int | None = None) -> FleetSetup:
    """Fresh replicas for `configs` (from `replica_configs(sc)`), a router and, for
    prefill/decode pools, the KV link. Routers draw from their own stream of the seed."""
    replicas = []
    for i, cfg in enumerate(configs):
        tokens = prefix_tokens if cfg.role != "decode" else None  # decode pools reuse nothing
        replicas.append(build_replica(cfg, rng, acceptance=acceptance, prefix_tokens=tokens,
                                      index=i))
    cluster = sc.cluster or ClusterSpec()
    router_rng = np.random.default_rng([sc.seed, 2])
    router = make_router(cluster.router, router_rng, [c.group for c in configs if c.role != "decode"])
    decode_router = link = None
    if cluster.disaggregated:
        decode_router = make_router(pool_router(cluster.router), router_rng)
        link = load_link(cluster.kv_transfer, file=sc.file or None)
    return FleetSetup(replicas, router, decode_router, link, cluster.router.staleness_s)


def load_link(spec: KVTransferSpec, *, file=None) -> Link:
    """The KV link of a disaggregated cluster: a named link (gpu_profiles/links.yaml)
    with the scenario's bandwidth / latency overrides."""
    links = load_yaml(LINKS_FILE)
    if spec.link not in links:
        raise SpecError(file, "cluster.kv_transfer.link",
                        f"unknown '{spec.link}' (known: {', '.join(sorted(links))})")
    known = links[spec.link]
    gbs = spec.bandwidth_gbs if spec.bandwidth_gbs is not None else float(known["bandwidth_gbs"])
    us = spec.latency_us if spec.latency_us is not None else float(known["latency_us"])
    return Link(gbs * 1e9, us * 1e-6)
