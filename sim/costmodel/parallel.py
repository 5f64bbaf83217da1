"""How one model replica is laid out on GPUs, and in which number formats.

```yaml
parallel: {tensor: 4, pipeline: 1}    # GPUs of one replica: tensor x pipeline
parallel: {tensor: 8, pipeline: 2, stage_link: infiniband-ndr400}  # two stages, two nodes
parallel: {tensor: 4, expert: 4}      # a MoE model's experts spread over those 4 GPUs
parallel: {data: 8, expert: 8}        # attention data parallel x 8, experts over all 8 GPUs
parallel: {data: 16, expert: 16, network: infiniband-ndr400}   # EP across two 8-GPU nodes
parallel: {data: 8, expert: 8, pipeline: 2}   # two stages of 8 GPUs, EP 8 + DP 8 in each
parallel: {data: 8, expert: 8, all_to_all: {kernel: deepep}}   # DeepEP's kernels, fp8 dispatch
dtype: {weights: fp8, kv_cache: fp8}  # defaults bf16
```

A replica of `tensor` GPUs holds `ModelSpec.shard(tensor)` on each GPU (split heads,
MLP and vocabulary; see sim/costmodel/models.py) and runs `ModelSpec.ops(tensor)`: each
operation split as its `split` says, an all-reduce after every row-split operation (two
per Llama layer) and the embedding, a gather after the LM head (sim/costmodel/layer.py;
priced by sim/costmodel/latency.py, sim/costmodel/comm.py).
With `pipeline: P` > 1 the layers are split over P stages, each a `tensor`-way group
(sim/costmodel/pipeline.py: layers per stage, a stage's ops, memory and step time, the
activations sent between stages over NVLink within a node or `stage_link` across nodes),
and the replica keeps P micro-batches in flight (sim/engine/pipeline.py). Not with
speculative decoding, static batching or a disaggregated role (refused up front); the
replica's one prefix cache serves all its micro-batches. Combined with expert parallelism
and attention data parallelism (`pipeline: P, data: D, expert: D x tensor`) each stage is
a D x `tensor` group holding its own layers' experts spread over its GPUs (E/expert whole
experts of each of its MoE layers per GPU), with its own all-to-alls, and each attention
rank sends its own tokens' activations to the next stage: P x D x `tensor` GPUs.

Expert parallelism (`expert: N`, a MoE model only) spreads the routed experts over the
replica's N = `tensor` GPUs, E/N whole experts each (instead of every expert split N
ways), attention still tensor-parallel; tokens reach their experts by an all-to-all
dispatch and return by an all-to-all combine per MoE layer, and the step runs at the pace
of the most loaded rank (sim/costmodel/layer.moe_layer, sim/costmodel/moe.py: the rank
with the most popular experts, and the random excess of the busiest of the EP ranks over
a step's picks, `Routing.busiest_factor`).

Attention data parallelism (`data: D`, as DeepSeek, SGLang `--enable-dp-attention` and
vLLM's data-parallel MoE deploy it) makes a replica of D x `tensor` GPUs: D attention
ranks, each running attention (and the dense layers, embedding and LM head) on its own
share of the replica's batch with `tensor`-way TP inside the rank, while the routed experts
are spread over all of them (`expert` = D x `tensor`, required). A step's operations are
priced at the busiest rank's rows: ⌈T/D⌉ tokens (⌈S/D⌉ sequences) for the rank's own
operations, all T tokens' routed rows for the experts after the dispatch
(sim/costmodel/latency.py). Each GPU holds the KV of its own sequences only, so the
replica's KV capacity is D times one GPU's (the point of DP attention for latent attention,
whose cache TP replicates). An expert group larger than the NVLink domain
(`interconnect.gpus_per_node`, 72 on an NVL72 rack) sends the share of its all-to-all bound
for other nodes over `network` (an entry of gpu_profiles/links.yaml; sim/costmodel/comm.py).

FP8 needs FP8 tensor cores (a profile with `datasheet_fp8_tflops`). fp8 weights halve
weight bytes and run the operations marked `fp8` (the projections) at the FP8 rate
(sim/costmodel/profiles.GPUProfile.gemm_fp8; the LM head runs at the bf16 rate, as in vLLM's
fp8 checkpoints, though its bytes count at 1 like every weight); an fp8 KV cache halves KV bytes
per token (capacity doubles, decode attention reads half the bytes).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from sim.costmodel.comm import known_links
from sim.costmodel.deepep import AllToAllSpec, check_deepep
from sim.costmodel.models import ModelSpec
from sim.costmodel.profiles import GPUProfile
from sim.io.specload import SpecError

DTYPE_BYTES = {"bf16": 2, "fp8": 1}


@dataclass(frozen=True)
class ParallelSpec:
    """GPUs per replica: `tensor`-way tensor parallel (within one node) x `pipeline` stages."""

    tensor: int = field(default=1, metadata={"gt": 0})
    pipeline: int = field(default=1, metadata={"gt": 0})
    expert: int = field(default=1, metadata={"gt": 0})  # expert-parallel ranks (= tensor x data)
    data: int = field(default=1, metadata={"gt": 0})  # attention data-parallel ranks
    network: str | None = None  # gpu_profiles/links.yaml: the link between NVLink domains
    # the link between stages on different nodes (a gpu_profiles/links.yaml name)
    stage_link: str = "infiniband-ndr400"
    # expert parallelism's dispatch and combine (sim/costmodel/deepep.py)
    all_to_all: AllToAllSpec = AllToAllSpec()

    def check(self) -> tuple[str, str] | None:
        stage = self.tensor * self.data  # the GPUs of one pipeline stage
        if self.data > 1 and self.expert != stage:
            where = " of a stage" if self.pipeline > 1 else ""
            return ("data", f"{self.data} attention ranks need the experts spread over all "
                    f"{stage} GPUs{where} (allowed: 1, or expert = tensor x data = {stage})")
        return None

    @property
    def gpus(self) -> int:
        return self.tensor * self.pipeline * self.data


@dataclass(frozen=True)
class DTypeSpec:
    """Number formats of the weights (projections) and of the KV cache."""

    weights: Literal["bf16", "fp8"] = "bf16"
    kv_cache: Literal["bf16", "fp8"] = "bf16"

    @property
    def fp8_weights(self) -> bool:
        return self.weights == "fp8"


def check_layout(parallel: ParallelSpec, model: ModelSpec, profile: GPUProfile, *,
                 file: str | Path | None = None, path: str = "parallel",
                 draft: ModelSpec | None = None) -> None:
    """A one-line SpecError at `path`.tensor if the model cannot be split that way here."""
    tp, ep = parallel.tensor, parallel.expert
    gpus = tp * parallel.data
    if parallel.pipeline > model.layers:
        raise SpecError(file, f"{path}.pipeline", f"{parallel.pipeline} stages for the "
                        f"{model.layers} layers of {model.name} (allowed: <= {model.layers})")
    if parallel.pipeline > 1 and draft is not None:
        raise SpecError(file, f"{path}.pipeline", "a draft model with pipeline stages is not "
                        "modelled (allowed: 1 with speculative decoding)")
    problem = model.expert_problem(ep, gpus)
    if problem:
        ok = f", or {gpus} when it divides num_experts" if model.is_moe and gpus > 1 else ""
        raise SpecError(file, f"{path}.expert", f"{problem} (allowed: 1{ok})")
    if draft is not None and parallel.data > 1:
        raise SpecError(file, f"{path}.data", "a draft model with attention data parallelism "
                        "is not modelled (allowed: 1, or speculative.method mtp)")
    _check_expert_domain(parallel, profile, file, path)
    check_deepep(parallel.all_to_all, ep, model.hidden, profile, file=file,
                 path=f"{path}.all_to_all")
    if tp == 1:
        return
    for m in (model, draft):
        problem = m.tensor_problem(tp) if m is not None else None
        if problem:
            allowed = ", ".join(str(t) for t in valid_tensor_degrees(m, profile)) or "1"
            raise SpecError(file, f"{path}.tensor", f"{problem} of {m.name} (allowed: {allowed})")
    link = profile.facts.interconnect
    if link is None:
        raise SpecError(file, f"{path}.tensor", f"{profile.name} states no GPU interconnect "
                        "(allowed: 1, or a profile with `interconnect:`)")
    if tp > link.gpus_per_node:
        raise SpecError(file, f"{path}.tensor", f"{tp} exceeds the {link.gpus_per_node} GPUs "
                        f"of one {profile.name} node (allowed: <= {link.gpus_per_node})")


def _check_expert_domain(parallel: ParallelSpec, profile: GPUProfile, file, path: str) -> None:
    """An expert group beyond one NVLink domain needs a known network link between domains."""
    ep = parallel.expert
    if ep == 1:
        return
    link = profile.facts.interconnect
    if link is None:
        raise SpecError(file, f"{path}.expert", f"{profile.name} states no GPU interconnect "
                        "(allowed: 1, or a profile with `interconnect:`)")
    if parallel.network is not None:
        if parallel.network not in known_links():
            raise SpecError(file, f"{path}.network", f"unknown {parallel.network!r} (known: "
                            f"{', '.join(sorted(known_links()))})")
    domain = link.gpus_per_node
    if ep > domain:
        if parallel.network is None:
            raise SpecError(file, f"{path}.expert", f"{ep} exceeds the {domain}-GPU NVLink "
                            f"domain of {profile.name} and no network link is named (allowed: "
                            f"<= {domain}, or parallel.network: a link of gpu_profiles/links.yaml)")
        if ep % domain:
            raise SpecError(file, f"{path}.expert", f"{ep} spans a partial {domain}-GPU "
                            f"NVLink domain (allowed: <= {domain}, or a multiple of {domain})")


def valid_tensor_degrees(model: ModelSpec, profile: GPUProfile) -> list[int]:
    """Tensor-parallel degrees that split `model` and fit one node of `profile`."""
    link = profile.facts.interconnect
    top = link.gpus_per_node if link is not None else 1
    return [t for t in range(1, top + 1) if model.tensor_problem(t) is None]


def with_dtypes(model: ModelSpec, dtype: DTypeSpec, profile: GPUProfile, *,
                file: str | Path | None = None, path: str = "dtype") -> ModelSpec:
    """The model with the scenario's weight and KV byte widths; FP8 needs FP8 tensor cores."""
    widths = {}  # bf16 keeps the model file's own width
    for name, value, width in (("weights", dtype.weights, "weight_dtype_bytes"),
                               ("kv_cache", dtype.kv_cache, "kv_dtype_bytes")):
        if value == "fp8":
            if profile.facts.datasheet_fp8_tflops is None:
                raise SpecError(file, f"{path}.{name}", f"fp8 needs FP8 tensor cores, which "
                                f"{profile.name} lacks (allowed: bf16; fp8 on a GPU with datasheet_fp8_tflops)")
            widths[width] = DTYPE_BYTES["fp8"]
    return dataclasses.replace(model, **widths) if widths else model
