"""A serving stack's own defaults under a scenario's settings.

A runtime of a stack at a version (`runtime: vllm-0.10`, `gpu_profiles/runtimes/`) carries
the settings that stack picks when its user does not (`RuntimeSpec.stack`, sim/costmodel/
runtime.py): step budget, max_num_seqs, chunked prefill, prefix caching, KV dtype, memory
fraction, refined by GPU and tensor degree where the stack picks by hardware. They are laid
into the scenario's YAML before it is read, under whatever the scenario (or `--set`) says:
an explicit field always wins. A cluster group gets its own runtime's settings the same
way, under the group's fields and the scenario's explicit ones (a group cannot set
`dtype`, so a group's runtime brings no KV dtype).
"""

from __future__ import annotations

from pathlib import Path

from sim.costmodel.runtime import RuntimeSpec, load_runtime

# a stack setting -> (the scenario section and key it fills)
TARGETS = {
    "policy": ("scheduler", "policy"),
    "max_num_seqs": ("scheduler", "max_num_seqs"),
    "max_num_batched_tokens": ("scheduler", "max_num_batched_tokens"),
    "prefix_caching": ("kv", "prefix_caching"),
    "gpu_memory_utilization": ("kv", "gpu_memory_utilization"),
    "kv_cache_dtype": ("dtype", "kv_cache"),
}
TARGET_SECTIONS = ("scheduler", "kv", "dtype")
GROUP_SECTIONS = ("scheduler", "kv")  # what a cluster group may merge (no dtype)


def stack_settings(rt: RuntimeSpec, gpu: object, tensor: int) -> dict[tuple[str, str], object]:
    """(section, key) -> value of the stack's settings on `gpu` at `tensor` ways."""
    if rt.stack is None:
        return {}
    return {TARGETS[k]: v for k, v in rt.stack.settings(str(gpu), tensor).items()}


def with_stack_defaults(data: dict, defaults: dict[str, object], *, file=None,
                        base_dir: str | Path | None = None) -> dict:
    """`data` (a scenario's YAML mapping) with its runtime's stack settings under its own;
    `defaults` holds the scenario's defaults for `runtime` and `gpu`. A new mapping; the
    sections it fills are copies. An unknown runtime is named here (file and field)."""
    if not isinstance(data, dict):
        return data
    explicit = {(sec, key) for sec in TARGET_SECTIONS
                if isinstance(data.get(sec), dict) for key in data[sec]}
    rt = _runtime(data.get("runtime", defaults["runtime"]), file, "runtime", base_dir)
    gpu = data.get("gpu", defaults["gpu"])
    out = _fill(data, rt, gpu, _tensor(data.get("parallel")), explicit, TARGET_SECTIONS)
    cluster = data.get("cluster")
    groups = cluster.get("groups") if isinstance(cluster, dict) else None
    if not isinstance(groups, list):
        return out
    filled = []
    for i, g in enumerate(groups):
        if isinstance(g, dict) and {"runtime", "gpu", "parallel"} & g.keys():
            g_rt = (_runtime(g["runtime"], file, f"cluster.groups[{i}].runtime", base_dir)
                    if "runtime" in g else rt)
            par = {**_mapping(data.get("parallel")), **_mapping(g.get("parallel"))}
            g = _fill(g, g_rt, g.get("gpu", gpu), _tensor(par), explicit, GROUP_SECTIONS)
        filled.append(g)
    out["cluster"] = {**cluster, "groups": filled}
    return out


def _fill(node: dict, rt: RuntimeSpec | None, gpu: object, tensor: int, explicit: set,
          sections: tuple[str, ...]) -> dict:
    """`node` with the stack's settings in `sections` where neither it nor the scenario
    says otherwise (a section that is not a mapping is left for the loader to refuse)."""
    out = dict(node)
    if rt is None:
        return out
    for (sec, key), value in stack_settings(rt, gpu, tensor).items():
        own = out.get(sec)
        if sec in sections and (sec, key) not in explicit and isinstance(own or {}, dict) \
                and key not in (own or {}):
            out[sec] = {**(own or {}), key: value}
    return out


def _runtime(name: object, file, path: str, base_dir: str | Path | None) -> RuntimeSpec | None:
    if not isinstance(name, str):
        return None  # not a name: the loader refuses it, naming the field
    return load_runtime(name, file=file, path=path, base_dir=base_dir)


def _mapping(node: object) -> dict:
    return node if isinstance(node, dict) else {}


def _tensor(parallel: object) -> int:
    t = _mapping(parallel).get("tensor", 1)
    return t if isinstance(t, int) and not isinstance(t, bool) and t >= 1 else 1
