"""Runtime profiles (`gpu_profiles/runtimes/NAME.yaml`, one per serving stack): how the
stack's host side adds to each step's kernel time.

A `RuntimeSpec` holds the host's costs per step, per layer, per sequence and layer, and per
sequence, the serial part that does not overlap the GPU (per step, per sequence, and per
tensor-parallel worker the driver calls each step), GPU scale factors, how host and GPU
combine (max or sum), the stall on a new prefill shape, the step-time jitter model, which
all-reduce and elementwise kernels the stack runs, and, for a stack at a version
(`vllm-0.10`, `sglang-0.4`, ...), that stack's own defaults (`StackDefaults`: step budget,
max_num_seqs, chunking, KV dtype, memory fraction), which `sim/config/stackdefaults.py`
lays under a scenario's own settings. `sim/costmodel/latency.py` turns them
into a step's time (its module docstring gives the formula); `sim/fit/runtime_fit.py` fits
them to a warm grid, `sim/fit/logfit.py` to a live serving log.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from sim.costmodel.jitter import JitterSpec
from sim.io.filecache import FileCache
from sim.io.specload import ROOT, SpecError, build, is_file, known_names, load_yaml, show

RUNTIMES_DIR = ROOT / "gpu_profiles" / "runtimes"


@dataclass(frozen=True)
class Sourced:
    """One number and where it comes from (a non-zero value must say)."""

    value: float = field(default=0.0, metadata={"ge": 0, "le": 1e6})
    source: str = ""

    def check(self) -> tuple[str, str] | None:
        if self.value > 0 and not self.source.strip():
            return "source", "a non-zero value needs its source (allowed: a citation or how it was measured)"
        return None


@dataclass(frozen=True)
class RequestLatencySpec:
    """Per-request latency outside the step loop (`runtime.request:`): the stack's API
    server, tokenisation and detokenisation, the hand-off between the server and the
    engine, streaming. A constant delay per request, with no contention between requests
    (a saturated API server is not modelled). Where each falls:

    - `receive_ms` + `tokenize_us_per_prompt_token` x prompt: between the client's send and
      the engine's queue (HTTP parse, validation, chat template, tokenisation, hand-off to
      the engine process): adds to TTFT, E2E and queue_s; the engine sees the request later.
    - `chunk_ms`: between the engine's token and the client, for every streamed chunk
      (detokenise, SSE framing, hand-off back, first chunk included): adds to TTFT and
      E2E; ITL and TPOT unchanged (every chunk is delayed alike).
    - `finish_ms`: after the last chunk (final usage chunk, closing the response): E2E,
      and in a closed loop the user's next request waits for it.
    """

    receive_ms: Sourced = Sourced()
    tokenize_us_per_prompt_token: Sourced = Sourced()
    chunk_ms: Sourced = Sourced()
    finish_ms: Sourced = Sourced()

    def seconds(self) -> tuple[float, float, float, float] | None:
        """(receive s, s per prompt token, chunk s, finish s), or None when all are 0."""
        out = (self.receive_ms.value / 1e3, self.tokenize_us_per_prompt_token.value / 1e6,
               self.chunk_ms.value / 1e3, self.finish_ms.value / 1e3)
        return out if any(out) else None


@dataclass(frozen=True)
class StackSettings:
    """Settings a serving stack picks when its user does not: the scheduler's step budget
    and sequence cap, chunked prefill (policy `chunked`: mixed prefill+decode steps under
    the budget; `continuous`: prefill-first, a prompt in one step), prefix caching, the
    KV-cache number format and the share of GPU memory the stack takes. None: the stack
    does not decide it here (llmsim's own default applies). `source` says where each
    number comes from."""

    policy: Literal["continuous", "chunked", "static"] | None = None
    max_num_seqs: int | None = field(default=None, metadata={"gt": 0})
    max_num_batched_tokens: int | None = field(default=None, metadata={"gt": 0})
    prefix_caching: bool | None = None
    kv_cache_dtype: Literal["bf16", "fp8"] | None = None
    gpu_memory_utilization: float | None = field(default=None, metadata={"gt": 0, "le": 1})
    source: str = ""

    def check(self) -> tuple[str, str] | None:
        if self.values() and not self.source.strip():
            return "source", "settings need their source (allowed: a citation of the stack's code or docs)"
        return None

    def values(self) -> dict[str, object]:
        """The settings this block decides (name -> value), in field order."""
        return {k: v for k, v in vars(self).items() if k != "source" and v is not None}


@dataclass(frozen=True)
class StackDefaults:
    """A serving stack at a version (`runtime.stack:`): its name, version and defaults;
    `by_gpu` (GPU profile name -> settings) and `by_tensor` (the smallest tensor degree
    a block applies from -> settings) refine them where the stack picks by hardware."""

    name: str
    version: str
    defaults: StackSettings = StackSettings()
    by_gpu: dict[str, StackSettings] = field(default_factory=dict)
    by_tensor: dict[str, StackSettings] = field(default_factory=dict)

    def check(self) -> tuple[str, str] | None:
        for k in self.by_tensor:
            if not k.isdigit() or int(k) < 1:
                return f"by_tensor.{k}", "not a tensor degree (allowed: an integer >= 1)"
        return None

    def settings(self, gpu: str, tensor: int) -> dict[str, object]:
        """The stack's settings on `gpu` at `tensor`-way tensor parallelism."""
        out = dict(self.defaults.values())
        for k in sorted((k for k in self.by_tensor if int(k) <= tensor), key=int):
            out.update(self.by_tensor[k].values())
        if gpu in self.by_gpu:
            out.update(self.by_gpu[gpu].values())
        return out


@dataclass(frozen=True)
class RuntimeSpec:
    """How the serving stack's host side adds to each step."""

    name: str
    description: str = ""
    host_ms_per_step: float = field(default=0.0, metadata={"ge": 0})
    host_ms_per_layer: float = field(default=0.0, metadata={"ge": 0})
    host_ms_per_layer_decode_extra: float = field(default=0.0, metadata={"ge": 0})  # decode's host path
    host_ms_per_prefill_seq_layer: float = field(default=0.0, metadata={"ge": 0})
    host_ms_per_verify_seq_layer: float = field(default=0.0, metadata={"ge": 0})
    host_ms_per_prefill_seq: float = field(default=0.0, metadata={"ge": 0})  # per prefill sequence (input prep, sampling)
    host_ms_per_decode_seq: float = field(default=0.0, metadata={"ge": 0})  # per decode sequence (sampling, detokenise)
    serial_ms_per_step: float = field(default=0.0, metadata={"ge": 0})  # host time not overlapped with the GPU
    serial_ms_per_seq: float = field(default=0.0, metadata={"ge": 0})  # likewise, per sequence in the step
    gpu_scale: float = field(default=1.0, metadata={"gt": 0})
    gpu_scale_decode: float = field(default=1.0, metadata={"gt": 0})
    # max: the host issues kernels ahead of an asynchronous GPU, so the slower of the two
    # sets the pace; sum: host work and kernels run one after the other (a CPU "device",
    # where the host thread runs the kernels itself)
    combine: Literal["max", "sum"] = "max"
    # a stall, not overlapped, the first time a prefill attention shape (new tokens, context)
    # is seen on a replica: per-shape plan building / kernel specialisation (sim/fit/logfit.py)
    serial_ms_per_new_prefill_shape: float = field(default=0.0, metadata={"ge": 0})
    jitter: JitterSpec | None = None  # step-time jitter (sim/costmodel/jitter.py); None: deterministic
    # the stack reduces small messages with its own NVLink kernel (sim/costmodel/comm.py), not NCCL
    custom_all_reduce: bool = False
    # RMSNorm, residual add, SiLU·mul as the stack runs them (sim/costmodel/fused.py): fused (vLLM,
    # TensorRT-LLM), unfused (eager PyTorch) or as_measured (whatever the profile timed)
    elementwise: Literal["fused", "unfused", "as_measured"] = "as_measured"
    source: str = ""
    # per-request latency outside the step loop (API server, tokenisation, streaming)
    request: RequestLatencySpec | None = None
    # tensor-parallel workers the driver calls every step (an RPC per worker: Ray actors,
    # processes behind a queue), serial: the step's dispatch to each remote worker and the
    # wait for it, and per sequence the step's sequence metadata serialised to each one.
    # Remote workers: tensor - 1 (the driver is rank 0), or all `tensor` when the driver is
    # a separate process (`driver_is_rank0: false`); none at tensor 1.
    serial_ms_per_rank: float = field(default=0.0, metadata={"ge": 0})
    serial_ms_per_rank_seq: float = field(default=0.0, metadata={"ge": 0})
    driver_is_rank0: bool = True
    # the stack's own settings at this version, under the scenario's (sim/config/stackdefaults.py)
    stack: StackDefaults | None = None

    def remote_workers(self, tensor: int) -> int:
        """Workers the driver calls by RPC each step on a `tensor`-way replica."""
        if tensor <= 1:
            return 0
        return tensor - 1 if self.driver_is_rank0 else tensor


def load_runtime(name: str, *, file=None, path: str = "runtime",
                 base_dir: str | Path | None = None) -> RuntimeSpec:
    """A runtime by name (gpu_profiles/runtimes/NAME.yaml) or by a path ending in .yaml
    (relative paths from the scenario's folder, then the current one)."""
    if name.endswith((".yaml", ".yml")):
        f = Path(name)
        if not f.is_absolute() and base_dir and is_file(Path(base_dir) / f):
            f = Path(base_dir) / f
        if not is_file(f):
            raise SpecError(file, path, f"file not found: {show(name)}")
        return _LOADED.get(f.resolve(), lambda watch: build(RuntimeSpec, load_yaml(watch(f)), file=f))
    known = known_names(RUNTIMES_DIR)
    if name not in known:
        raise SpecError(file, path, f"unknown {show(name)} (known: {', '.join(known)})")
    f = RUNTIMES_DIR / f"{name}.yaml"
    return _LOADED.get(f.resolve(), lambda watch: build(RuntimeSpec, load_yaml(watch(f)), file=f))


_LOADED: FileCache[RuntimeSpec] = FileCache()  # by path, while the file is unchanged
