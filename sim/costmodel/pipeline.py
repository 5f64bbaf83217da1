"""Pipeline parallelism: a replica's layers split over `pipeline` stages, each stage a
`tensor`-way tensor-parallel group, and what one micro-batch costs on each stage.

Layers per stage (`stage_layers`) as vLLM splits them (`vllm.distributed.utils.
get_pp_indices`): L // P layers each, the remainder L mod P going one each to the stages
before the last, nearest it first (the last stage also runs the final norm and the LM
head, the first the embedding; VLLM_PP_LAYER_PARTITION's custom splits are not modelled); stage 0
runs the embedding. A MoE model's leading dense layers fall in the stages that hold them.

A stage's operations (`stage_ops`) are the model's list (sim/costmodel/layer.py) cut to
its layers, with the embedding on the first stage and the final norm and LM head on the
last; with tied embeddings the last stage holds its own copy of the LM head's weights
(the embedding lives on stage 0). Memory per stage (sim/engine/memory.py) and a stage's
step time (`StageLatency`) are read from that list; each stage holds KV only for its own
layers, so a replica's KV capacity grows with the number of stages.

Host work per stage: each stage's worker launches its own layers' kernels (the
per-layer terms of the runtime), while the per-step and per-sequence terms (scheduling,
input preparation, sampling, detokenising: what waits for the sampled token) are paid
once per micro-batch, on the last stage (`stage_runtime`; an assumption, analytic).

Between stages the micro-batch's activations move: vLLM's Llama sends the hidden states
and the residual (`IntermediateTensors`, two tensors of tokens x hidden, bf16) and each
of the `tensor` ranks sends 1/tensor of them to its peer in the next stage, which
all-gathers them (`send_tensor_dict(..., all_gather_group=tp_group)`):

    transfer(T tokens) = α + 2 · T · hidden · 2 bytes / tensor / B  (+ all-gather)

over the link between the stages (`StageLink`): the profile's NVLink within a node
(its `interconnect` datasheet rate and α), a network link of gpu_profiles/links.yaml
across nodes (`parallel.stage_link`, datasheet rates, analytic). Stages sit on
consecutive GPUs, so they cross nodes when tensor x data x pipeline exceeds a node. With
D attention data-parallel ranks a stage's ranks each send their own tokens (the busiest
⌈T/D⌉), and each stage runs its own layers' expert all-to-alls (sim/costmodel/ranks.py).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from sim.costmodel.latency import TAGS, StepLatency
from sim.costmodel.layer import BF16, ModelOps
from sim.costmodel.models import ModelSpec
from sim.costmodel.profiles import GPUProfile
from sim.costmodel.runtime import RuntimeSpec
from sim.io.specload import ROOT, SpecError, load_yaml

LINKS_FILE = ROOT / "gpu_profiles" / "links.yaml"

ACTIVATION_TENSORS = 2  # hidden states and residual (vLLM's IntermediateTensors for Llama)
# runtime terms paid once per micro-batch (on the last stage); the per-layer ones on every stage
_ONCE = ("host_ms_per_step", "host_ms_per_prefill_seq", "host_ms_per_decode_seq",
         "serial_ms_per_step", "serial_ms_per_seq", "serial_ms_per_new_prefill_shape")


def stage_layers(layers: int, stages: int) -> tuple[int, ...]:
    """Layers per stage as vLLM's get_pp_indices splits them: L // P each, the remainder
    one each to the stages before the last, nearest the last first (61 over 4: 15, 15, 16,
    15, vLLM's documentation example)."""
    per, extra = divmod(layers, stages)
    parts = [per] * stages
    for i in range(2, extra + 2):
        parts[-i] += 1
    return tuple(parts)


def stage_ops(ops: ModelOps, stage: int, stages: int) -> ModelOps:
    """The operations stage `stage` of `stages` runs (and whose weights it holds)."""
    if stages == 1:
        return ops
    split = stage_layers(ops.layers + ops.dense_layers, stages)
    start = sum(split[:stage])
    end = start + split[stage]
    lead = ops.dense_layers
    dense = max(0, min(end, lead) - start)
    last = ops.last if stage == stages - 1 else ()
    if last:  # tied embeddings: the last stage holds its own copy of the LM head
        last = tuple(dataclasses.replace(op, params=op.shape[0] * op.shape[1])
                     if op.kind == "lm_head" and not op.params else op for op in last)
    windows = ops.windows[max(start, lead) - lead:end - lead]  # its layers' windows
    return dataclasses.replace(ops, layers=split[stage] - dense, dense_layers=dense,
                               first=ops.first if stage == 0 else (), last=last,
                               windows=windows)


def stage_runtime(rt: RuntimeSpec, stage: int, stages: int) -> RuntimeSpec:
    """The runtime terms stage `stage` pays: all on the last stage, the per-layer ones elsewhere."""
    if stage == stages - 1:
        return rt
    return dataclasses.replace(rt, **{k: 0.0 for k in _ONCE})


class StageLatency(StepLatency):
    """Seconds one stage spends on a micro-batch: `StepLatency` over the stage's ops.
    Stages other than the last run no LM head (`lm_head_ms` is 0 there)."""

    def __init__(self, model: ModelSpec, profile: GPUProfile, runtime: RuntimeSpec,
                 prefill_impl: str = "flash", decode_impl: str = "paged",
                 verify_impl: str = "paged_gather", tensor: int = 1, fp8_weights: bool = False,
                 expert: int = 1, *, stage: int = 0, stages: int = 1, data: int = 1,
                 network: tuple[float, float] | None = None, all_to_all=None):
        self.stage, self.stages = stage, stages
        self.last = stage == stages - 1
        super().__init__(model, profile, stage_runtime(runtime, stage, stages), prefill_impl,
                         decode_impl, verify_impl, tensor, fp8_weights, expert, data=data,
                         network=network, all_to_all=all_to_all)
        ops = stage_ops(model.ops(tensor, expert), stage, stages)
        self.layers = ops.layers + ops.dense_layers
        self.m = dataclasses.replace(self.m, layers=self.layers)  # host terms per layer

    def _price_ops(self, ops: ModelOps) -> None:
        part = stage_ops(ops, self.stage, self.stages)
        if not self.last:  # the LM head's op stays findable; it is priced by nothing
            part = dataclasses.replace(part, last=(ops.find("lm_head"),))
        super()._price_ops(part)

    def _lm_parts(self, rows: int) -> list[tuple[float, str]]:
        return super()._lm_parts(rows) if self.last else []


@dataclass(frozen=True)
class StageLink:
    """The link activations cross between two consecutive stages (per GPU, one direction)."""

    name: str
    bytes_per_s: float
    latency_s: float
    across_nodes: bool

    def seconds(self, nbytes: float) -> float:
        return self.latency_s + nbytes / self.bytes_per_s


def activation_bytes(hidden: int, tokens: int) -> int:
    """Bytes a micro-batch of `tokens` tokens sends from one stage to the next (all ranks)."""
    return ACTIVATION_TENSORS * tokens * hidden * BF16


class StagedLatency:
    """A pipelined replica's step model: each stage's `StageLatency`, and the transfer of
    activations between stages. A step's `seconds` (what `decode`, `prefill`, `mixed`
    return) is the sum of its stage times; `stage_s` holds each stage's share of the step
    priced last, `kernel_s` the GPU kernel seconds of one GPU averaged over the stages
    (before jitter; each stage's GPUs run their share only)."""

    def __init__(self, stages: list[StageLatency], link: StageLink, hidden: int, tensor: int,
                 data: int = 1):
        self.stages, self.link, self.hidden, self.tensor = stages, link, hidden, tensor
        self.data = data  # attention data-parallel ranks per stage
        self.rt = stages[-1].rt
        self.p = stages[0].p
        self.m = stages[0].m
        self.stage_s = [0.0] * len(stages)
        self.kernel_s = 0.0

    def _each(self, call) -> float:
        total = kernel = 0.0
        out = self.stage_s
        for i, st in enumerate(self.stages):
            s = call(st)
            out[i] = s
            total += s
            kernel += st.kernel_s
        self.kernel_s = kernel / len(self.stages)  # per GPU: each stage's GPUs run their share
        return total

    def decode(self, n: int, sum_ctx: int, max_ctx: int = 0) -> float:
        return self._each(lambda st: st.decode(n, sum_ctx, max_ctx))

    def prefill(self, chunks: list[tuple[int, int]], seen: set | None = None) -> float:
        # a new shape's stall is a host term: the last stage's (`stage_runtime`)
        last = self.stages[-1]
        return self._each(lambda st: st.prefill(chunks, seen if st is last else None))

    def mixed(self, n: int, sum_ctx: int, max_ctx: int, chunks: list[tuple[int, int]],
              seen: set | None = None) -> float:
        last = self.stages[-1]
        return self._each(lambda st: st.mixed(n, sum_ctx, max_ctx, chunks,
                                              seen if st is last else None))

    def mixed_one(self, n: int, sum_ctx: int, max_ctx: int, q: int,
                  seen: set | None = None) -> float:
        return self.mixed(n, sum_ctx, max_ctx, [(q, 0)], seen)

    def transfer_s(self, tokens: int) -> float:
        """Seconds to send a micro-batch of `tokens` tokens' activations to the next stage:
        each rank sends 1/tensor over its own link, the receiving group all-gathers; with D
        attention data-parallel ranks each sends its own share, the busiest ⌈tokens/D⌉."""
        nbytes = activation_bytes(self.hidden, -(-tokens // self.data))
        s = self.link.seconds(nbytes / self.tensor)
        if self.tensor > 1:
            s += self.p.comm.all_gather(nbytes, self.tensor)[0] * 1e-3
        return s

    def provenance_seconds(self) -> dict[str, float]:
        out = dict.fromkeys(TAGS, 0.0)
        for st in self.stages:
            for k, v in st.provenance_seconds().items():
                out[k] += v
        return out

    def provenance(self) -> dict[str, float]:
        tot = self.provenance_seconds()
        s = sum(tot.values()) or 1.0
        return {t: v / s for t, v in tot.items()}


def stage_link(parallel, profile: GPUProfile, *, file=None, path: str = "parallel") -> StageLink:
    """The link between consecutive stages of `parallel` (a ParallelSpec) on `profile`:
    the profile's NVLink when the whole replica fits one node, else `parallel.stage_link`
    (gpu_profiles/links.yaml)."""
    link = profile.facts.interconnect
    if link is not None and parallel.gpus <= link.gpus_per_node:
        return StageLink(link.name, link.datasheet_gbs * 1e9, link.latency_us * 1e-6, False)
    links = load_yaml(LINKS_FILE)
    if parallel.stage_link not in links:
        raise SpecError(file, f"{path}.stage_link", f"unknown '{parallel.stage_link}' "
                        f"(known: {', '.join(sorted(links))})")
    known = links[parallel.stage_link]
    return StageLink(parallel.stage_link, float(known["bandwidth_gbs"]) * 1e9,
                     float(known["latency_us"]) * 1e-6, True)
