"""Scenario specs: one YAML file describes one simulated deployment and its traffic.

```yaml
name: quickstart
seed: 1
model: llama-3-8b            # models/<name>.yaml, or a path to a model YAML
gpu: h200-sxm                # gpu_profiles/<name>/
runtime: cuda-graph          # gpu_profiles/runtimes/<name>.yaml: host overhead model; a stack
                             # at a version (vllm-0.10, sglang-0.4, ...) also brings its defaults
attention: {prefill: flash, decode: paged}
scheduler: {policy: chunked, max_num_seqs: 256, max_num_batched_tokens: 8192}  # chunked: vLLM V1
kv: {manager: paged, block_size: 16, gpu_memory_utilization: 0.9}
parallel: {tensor: 1, pipeline: 1}         # optional; see sim/costmodel/parallel.py
dtype: {weights: bf16, kv_cache: bf16}    # optional; fp8 on GPUs with FP8 tensor cores
slo: {ttft_s: 1.0, tpot_s: 0.1}
step_log: rows               # optional; summary: no steps.csv, the summary's step sums only
workload: {...}              # see sim/workload/requests.py
```
"""

from __future__ import annotations

import copy
import dataclasses
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import yaml

from sim.config.cluster import ClusterSpec, ReplicaGroupSpec
from sim.config.stackdefaults import with_stack_defaults
from sim.costmodel.models import context_window, load_model
from sim.costmodel.parallel import DTypeSpec, ParallelSpec
from sim.io.filecache import FileCache
from sim.io.specload import (
    MAX_SEED,
    SpecError,
    build,
    load_yaml,
    show,
)
from sim.policies.kv import KVSpec
from sim.policies.scheduler import SchedulerSpec
from sim.policies.speculative import SpeculativeSpec
from sim.workload.requests import WorkloadSpec


@dataclass(frozen=True)
class AttentionSpec:
    prefill: Literal["flash", "naive"] = "flash"
    # None: follow the KV manager (paged -> paged kernel, contiguous -> contiguous kernel).
    # paged: a FlashAttention/FlashInfer-class paged kernel (derived); paged_reference: the
    # measured Triton teaching kernel of the eager reference stack; paged_gather: gather+SDPA
    decode: Literal["paged", "paged_reference", "paged_gather", "contiguous"] | None = None
    # multi-token steps over cached context (speculative verify): the decode kernel once per
    # query row, or per sequence gather + SDPA (the eager reference stack), or flash
    verify: Literal["decode_kernel", "paged_gather", "flash"] = "decode_kernel"


@dataclass(frozen=True)
class SLOSpec:
    ttft_s: float | None = field(default=None, metadata={"gt": 0})
    tpot_s: float | None = field(default=None, metadata={"gt": 0})
    e2e_s: float | None = field(default=None, metadata={"gt": 0})


@dataclass(frozen=True)
class Scenario:
    workload: WorkloadSpec
    name: str = "scenario"
    description: str = ""
    seed: int = field(default=0, metadata={"ge": 0, "le": MAX_SEED})
    model: str = "llama-3-8b"
    gpu: str = "h200-sxm"
    runtime: str = "cuda-graph"
    attention: AttentionSpec = AttentionSpec()
    # the stack's elementwise kernels (sim/costmodel/fused.py): fused (one add+RMSNorm kernel, as
    # vLLM, SGLang, TensorRT-LLM run) or unfused (the eager reference stack's PyTorch ops);
    # default: the runtime's `elementwise`. Like attention.decode: paged_reference, a
    # reference-stack scenario names it, so swapping its runtime keeps its kernels.
    elementwise: Literal["fused", "unfused"] | None = None
    scheduler: SchedulerSpec = SchedulerSpec()
    kv: KVSpec = KVSpec()
    slo: SLOSpec = SLOSpec()
    speculative: SpeculativeSpec = SpeculativeSpec()
    parallel: ParallelSpec = ParallelSpec()  # GPUs per replica (sim/costmodel/parallel.py)
    dtype: DTypeSpec = DTypeSpec()  # weight and KV-cache number formats
    cluster: ClusterSpec | None = None  # replica groups behind a router (sim/config/cluster.py)
    # what each replica keeps of its steps: `rows` (steps.csv: one row an iteration) or
    # `summary` (the summary's sums only, sim/engine/steptally.py: no steps.csv, no timeline
    # plot or trace; for fleet-days, whose rows would not fit on disk)
    step_log: Literal["rows", "summary"] = "rows"
    # set by the loader, not by the YAML: the scenario file and its folder (where
    # relative paths resolve)
    base_dir: str = field(default="", init=False, compare=False)
    file: str = field(default="", init=False, compare=False)

    def check(self):
        if self.step_log == "summary":
            needs = self._rows_needed()
            if needs:
                return "step_log", f"'summary' keeps no step rows, and {needs} (allowed: rows)"
        if self.speculative.method != "none" and self.scheduler.policy != "continuous":
            return "speculative.method", ("needs scheduler.policy: continuous (the default "
                                          "policy is chunked)")
        if self.kv.prefix_caching and self.kv.manager != "paged":
            return "kv.prefix_caching", "needs kv.manager: paged"
        if self.kv.prefix_caching and self.scheduler.policy == "static":
            return "kv.prefix_caching", "needs scheduler.policy: continuous or chunked"
        if self.scheduler.policy == "chunked" and self.kv.manager != "paged":
            return "scheduler.policy", ("'chunked' (the default) needs kv.manager: paged "
                                        "(allowed with contiguous: continuous, static)")
        if self.kv.manager == "contiguous" and self.attention.decode in ("paged", "paged_reference",
                                                                       "paged_gather"):
            return (
                "attention.decode",
                f"'{self.attention.decode}' needs kv.manager: paged (allowed with contiguous: contiguous)",
            )
        if self.kv.manager == "paged" and self.attention.decode == "contiguous":
            return (
                "attention.decode",
                "'contiguous' needs kv.manager: contiguous "
                "(allowed with paged: paged, paged_reference, paged_gather)",
            )
        return None

    def _rows_needed(self) -> str | None:
        """What of this scenario reads the step log's rows (None: nothing)."""
        if self.cluster is not None and self.cluster.autoscale is not None:
            return "cluster.autoscale's power per window reads them"
        clients = self.workload.clients
        if clients is not None and clients.warmup_requests:
            return ("a closed loop's warm-up leaves its steps out of the figures by them "
                    "(workload.clients.warmup_requests)")
        return None

    @property
    def decode_attention(self) -> str:
        if self.attention.decode is not None:
            return self.attention.decode
        return "paged" if self.kv.manager == "paged" else "contiguous"


MERGED_SECTIONS = ("scheduler", "kv", "attention", "speculative", "parallel")  # by key
# what a runtime's stack settings need to know of a scenario that does not say
SCENARIO_DEFAULTS = {"runtime": Scenario.runtime, "gpu": Scenario.gpu}


def load_scenario(file: str | Path, overrides: dict[str, object] | None = None, *,
                  origins: dict[str, str] | None = None) -> Scenario:
    """Load and validate a scenario file; `overrides` maps dotted paths (a list item by its
    index: `cluster.groups.1.gpu` or `cluster.groups[1].gpu`) to values. `origins` maps an
    override's path to the flag it came from (`--set`): an error in that override then names
    it (`--set workload.arival.rate=3: workload.arival: unknown key ...`), not the file."""
    p = Path(file)
    data = copy.deepcopy(_PARSED.get(p.resolve(), lambda watch: load_yaml(watch(p), "scenario file")))
    labels = override_labels(overrides, origins)
    for dotted, value in (overrides or {}).items():
        set_dotted(data, dotted, value, file=labels.get(dotted, p))
    try:
        return scenario_from_dict(data, file=p, base_dir=p.resolve().parent)
    except SpecError as e:
        raise relabel(e, p, labels) from None


_PARSED: FileCache[dict] = FileCache()  # a scenario file's YAML, while the file is unchanged
# (each load takes a deep copy: overrides are set into it)


def override_labels(overrides: dict[str, object] | None, origins: dict[str, str] | None) -> dict[str, str]:
    """How errors name each override that has an origin: `--set workload.arrival.rate=3`."""
    return {k: f"{origins[k]} {k}={yaml_text(v)}" for k, v in (overrides or {}).items()
            if origins and k in origins}


def relabel(error: SpecError, file: str | Path | None, labels: dict[str, str]) -> SpecError:
    """`error`, when it names `file` at a path that an override set (or lies in), as that
    override; otherwise `error` itself. Also for errors found later, once the model and
    GPU are read (`llmsim run`)."""
    label = override_behind(error.path, labels)
    if label is None or not file or error.file != SpecError(file, "", "").file:
        return error
    return SpecError(label, error.path, error.message)


def yaml_text(value: object) -> str:
    """`value` as YAML flow text, as a user would type it (`true`, `h100-sxm`, `[1, 2]`)."""
    text = yaml.safe_dump(value, default_flow_style=True, width=10**6, sort_keys=False).strip()
    return text[:-3].strip() if text.endswith("\n...") or text == "..." else text


def path_parts(dotted: str) -> list[str]:
    """`cluster.groups[1].gpu` or `cluster.groups.1.gpu` -> ['cluster', 'groups', '1', 'gpu']
    (an error path's `group: field` form counts as one more dot)."""
    return [k for k in re.sub(r"\[(-?\d+)\]", r".\1", dotted.replace(": ", ".")).split(".") if k]


def override_behind(error_path: str, labels: dict[str, str]) -> str | None:
    """The label of the override an error at `error_path` lies in or above (the longest)."""
    where = path_parts(error_path)
    best, best_len = None, -1
    for key, label in labels.items():
        parts = path_parts(key)
        n = min(len(parts), len(where))
        if n and parts[:n] == where[:n] and len(parts) > best_len:
            best, best_len = label, len(parts)
    return best


def scenario_from_dict(data: dict, *, file: str | Path | None = None,
                       base_dir: str | Path | None = None) -> Scenario:
    data = with_stack_defaults(data, SCENARIO_DEFAULTS, file=file, base_dir=base_dir)
    sc = build(Scenario, data, file=file)
    object.__setattr__(sc, "file", str(file) if file else "")
    object.__setattr__(sc, "base_dir", str(base_dir) if base_dir else "")
    if sc.cluster is None:
        sc = step_budget(sc)
    else:  # every group's merged settings are checked up front
        for gi, group in enumerate(sc.cluster.groups):
            group_scenario(sc, group, f"cluster.groups[{gi}]")
    return sc


DEFAULT_STEP_TOKENS = 8192


def step_budget(sc: Scenario, where: str = "") -> Scenario:
    """`sc` with its step budget (SchedulerSpec.max_num_batched_tokens) resolved and checked.

    Without chunked prefill (`continuous`) a prompt is prefilled in one step: an unset
    budget is raised to the context window (as vLLM v0 raises its default), and one set
    below it would reject every longer prompt, so it is refused, as vLLM refuses it at
    start-up. Static batching has no per-step budget, and chunked prefill spreads a prompt
    over steps: an unset budget is DEFAULT_STEP_TOKENS. `where` prefixes the field paths."""
    budget = sc.scheduler.max_num_batched_tokens
    if sc.scheduler.policy == "continuous":
        file = sc.file or None
        window = context_window(load_model(sc.model, file=file, path="model"), sc.kv.max_model_len,
                                file=file, path=f"{where}kv.max_model_len")
        if budget is not None and budget < window:
            raise SpecError(file, f"{where}scheduler.max_num_batched_tokens",
                            f"{budget} is below the context window {window} (allowed: >= the "
                            "context window, a smaller kv.max_model_len, or policy: chunked)")
        default = max(DEFAULT_STEP_TOKENS, window)
    else:
        default = DEFAULT_STEP_TOKENS
    if budget is not None:
        return sc
    return replace_scenario(sc, scheduler=dataclasses.replace(sc.scheduler, max_num_batched_tokens=default))


def group_scenario(sc: Scenario, group: ReplicaGroupSpec, where: str) -> Scenario:
    """`sc` with a cluster group's fields laid over it; errors name the group's fields."""
    file = sc.file or None
    changes: dict = {"cluster": None}
    for name in ("gpu", "runtime", "elementwise"):
        if getattr(group, name) is not None:
            changes[name] = getattr(group, name)
    for name in MERGED_SECTIONS:
        patch = getattr(group, name)
        if patch is None:
            continue
        current = getattr(sc, name, None)
        if current is None:
            raise SpecError(file, f"{where}.{name}", "not supported by this version (allowed: "
                            + ", ".join(n for n in MERGED_SECTIONS if hasattr(sc, n)) + ")")
        base = {f.name: getattr(current, f.name) for f in dataclasses.fields(current) if f.init}
        changes[name] = build(type(current), {**_plain(base), **patch}, file=file,
                              path=f"{where}.{name}")
    out = replace_scenario(sc, **changes)
    problem = out.check()
    if problem:
        field_name, message = problem
        raise SpecError(file, f"{where}: {field_name}", message)
    # the group's own fields are named where it sets the budget, policy or window
    own = {*(group.scheduler or {}), *(group.kv or {})} & {"policy", "max_num_batched_tokens",
                                                          "max_model_len"}
    return step_budget(out, f"{where}." if own else "")


def replace_scenario(sc: Scenario, **changes) -> Scenario:
    """`dataclasses.replace` that keeps where the scenario came from (file, folder)."""
    out = dataclasses.replace(sc, **changes)
    for attr in ("file", "base_dir"):
        object.__setattr__(out, attr, getattr(sc, attr))
    return out


def _plain(d: dict) -> dict:
    """Nested specs back to mappings, so a group's patch can be merged over them."""
    return {k: (_plain(dataclasses.asdict(v)) if dataclasses.is_dataclass(v) else
                list(v) if isinstance(v, tuple) else v) for k, v in d.items()}


def _own_copy(node: object) -> object:
    """A node on an override's path as its own copy: a YAML alias (`*x`, a `<<:` merge)
    shares one object between places, and an override sets only the place it names."""
    if node is None:
        return {}
    return dict(node) if isinstance(node, dict) else list(node) if isinstance(node, list) else node


def set_dotted(data: dict, dotted: str, value: object, *, file=None) -> None:
    """Set `a.b.c = value` in nested dicts, creating mappings on the way; a list item is
    reached by its index (`groups.1.gpu` or `groups[1].gpu`)."""
    keys = path_parts(dotted)
    if not keys:
        raise SpecError(file, dotted, "empty field path (allowed: FIELD.PATH=VALUE)")
    node: object = data
    where = ""
    for i, k in enumerate(keys):
        last = i == len(keys) - 1
        if isinstance(node, list):
            allowed = f"(allowed: 0 to {len(node) - 1})" if node else "(allowed: none, the list is empty)"
            if not k.lstrip("-").isdigit():
                raise SpecError(file, f"{where}.{k}", f"not an index of a list of {len(node)} {allowed}")
            if not 0 <= int(k) < len(node):
                raise SpecError(file, f"{where}[{k}]", f"index {k} is out of range of a list of "
                                                       f"{len(node)} {allowed}")
            where = f"{where}[{k}]"
            if last:
                node[int(k)] = value
                return
            nxt = node[int(k)] = _own_copy(node[int(k)])
        elif isinstance(node, dict):
            where = f"{where}.{k}" if where else k
            if last:
                node[k] = value
                return
            if node.get(k) is None and keys[i + 1].lstrip("-").isdigit():
                raise SpecError(file, where, f"not in the scenario, so it has no item {keys[i + 1]} "
                                             "(allowed: an index into a list the scenario has)")
            nxt = node[k] = _own_copy(node.get(k))
        else:
            raise SpecError(file, where, f"cannot set '{dotted}': {where} is {show(node)}, not a "
                                         "mapping or a list (allowed: a path through mappings and lists)")
        node = nxt
