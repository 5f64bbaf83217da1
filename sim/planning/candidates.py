"""A plan's candidate grid, checked before any run.

`candidates:` maps short names (`ALIASES`) or dotted scenario fields to lists of
values; the grid is their cross product. Two kinds of bad candidate are told apart:

- a **typo** refuses the whole plan with one line naming the plan file and the
  candidate (`check_candidates`): a key that is no scenario field
  (`candidates.tensr: unknown key (...)`), or a value that is wrong on its own, such
  as a name the scenario does not know (`candidates.gpu[1]: unknown 'h100' (known:
  ...)`), a value of the wrong type or out of range;
- a **refused combination** of known values (TP 3 on a model with 32 heads, a model
  that does not fit at TP 1) is a candidate the plan lists as skipped with the
  scenario's reason (`refusal`), and the plan goes on with the rest.

Each value is tried alone on the plan's scenario (with the plan's SLOs) and each
combination as a whole, by loading the scenario with those overrides and resolving
its replica (`sim/engine/build.py: replica_configs`, where names are looked up and layouts
and memory checked), in the calling process: no error needs to cross a process
boundary.
"""

from __future__ import annotations

import itertools
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sim.io.specload import SpecError
from sim.planning.poolkeys import (
    Groups,
    groups_of,
    is_pool_key,
    key_overrides,
    pool_grid,
    pool_label,
)

if TYPE_CHECKING:
    from sim.config.scenario import Scenario

ALIASES = {"gpu": "gpu", "tensor": "parallel.tensor", "policy": "scheduler.policy",
           "chunk_tokens": "scheduler.max_num_batched_tokens", "block_size": "kv.block_size",
           "max_num_seqs": "scheduler.max_num_seqs", "speculative": "speculative",
           # a MoE model's layouts: expert parallel over tensor x data GPUs (sim/costmodel/parallel.py)
           "expert": "parallel.expert", "data": "parallel.data",
           "pipeline": "parallel.pipeline"}
# how a label writes a layout degree: `tp8`, `ep8`, `dp8`, `pp2`
DEGREE_WORDS = {"tensor": "tp", "expert": "ep", "data": "dp", "pipeline": "pp"}
KEYS_ALLOWED = (", ".join(ALIASES) + ", ratio, prefill.KEY, decode.KEY, both.KEY (a cluster's pools), "
                "or a dotted scenario field")

# How specload and the name loaders (profiles, models, runtimes) word a value that is
# wrong whatever it is combined with: an unknown name, key or choice, a wrong type, a
# number out of its range. Any other refusal depends on the combination.
_TYPO_STARTS = ("unknown ", "expected ")
_TYPO_PARTS = (" is out of range (", " is not finite (", " is too large (")


def candidate_grid(candidates: dict[str, tuple], groups: Groups | None = None,
                   plan_file: Any = None) -> list[dict]:
    """Every candidate as scenario overrides (short names expanded; pool keys such as
    `prefill.gpu` and `ratio` over the scenario's cluster `groups`: sim/planning/poolkeys.py)."""
    if any(is_pool_key(k) for k in candidates):
        return pool_grid(candidates, groups, ALIASES, plan_file)
    names = [ALIASES.get(k, k) for k in candidates]
    return [dict(zip(names, combo, strict=True)) for combo in itertools.product(*candidates.values())]


# number formats as a label says them: `h100-sxm tp2 fp8`, `... bf16 fp8 KV`
FORMAT_WORDS = {"dtype.weights": "{}", "dtype.kv_cache": "{} KV"}


def _part(field: str, v: Any) -> str:
    if field in FORMAT_WORDS:
        return FORMAT_WORDS[field].format(v)
    short = {v: k for k, v in ALIASES.items()}
    name = short.get(field, field.split(".")[-1])
    return str(v) if name in ("gpu", "policy") else f"{DEGREE_WORDS.get(name, name + '=')}{v}"


def label(cand: dict, groups: Groups | None = None) -> str:
    """A candidate's short name: its pools (a cluster's prefill/decode groups), then its
    overrides in order, GPU and policy by value, TP as `tp2`, PP as `pp2`, number formats as `fp8` /
    `bf16` (weights) and `fp8 KV` (cache), whether given as dotted fields or as a `dtype:`
    mapping, other fields as `name=value`."""
    pools, rest = pool_label(_dtype_fields(cand), groups, _part)
    parts = [_part(k, v) for k, v in rest.items()]
    return " ".join(([pools] if pools else []) + parts) or "base"


def _dtype_fields(cand: dict) -> dict:
    """The candidate with a `dtype:` mapping spread into dotted fields, in place."""
    out: dict = {}
    for k, v in cand.items():
        if k == "dtype" and isinstance(v, dict):
            out.update({f"dtype.{f}": x for f, x in v.items()})
        else:
            out[k] = v
    return out


def is_typo(e: SpecError) -> bool:
    return e.message.startswith(_TYPO_STARTS) or any(p in e.message for p in _TYPO_PARTS)


def resolve(scenario: str | Path, overrides: dict) -> Scenario | SpecError:
    """The scenario with these overrides, its replica resolved and checked to fit; or
    the SpecError it refuses them with."""
    from sim.config.scenario import load_scenario
    from sim.engine.build import replica_configs

    try:
        sc = load_scenario(scenario, overrides)
        replica_configs(sc)
    except SpecError as e:
        return e
    return sc


def check_candidates(plan_file: str, candidates: dict[str, tuple], scenario: str | Path,
                     base: dict) -> None:
    """Refuse (SpecError naming the plan file) a candidate key that is no scenario field
    or a value wrong on its own; `base` holds the overrides every candidate carries."""
    groups = None
    if any(is_pool_key(k) for k in candidates):
        from sim.config.scenario import load_scenario

        groups = groups_of(load_scenario(scenario))
    for key, values in candidates.items():
        for i, value in enumerate(values):
            overrides = key_overrides(key, value, groups, ALIASES, plan_file)
            e = resolve(scenario, {**base, **overrides})
            dotted = next((d for d in overrides if isinstance(e, SpecError) and _about(e.path, d)), None)
            if dotted is None:
                continue
            path, dotted = _dots(e.path), _dots(dotted)
            if path == dotted or dotted.startswith(path + "."):  # the key itself
                if e.message.startswith("unknown key") or "not a mapping" in e.message:
                    if "." not in path and key not in ALIASES:  # no such top-level field
                        raise SpecError(plan_file, f"candidates.{key}", f"unknown key (allowed: {KEYS_ALLOWED})")
                    raise SpecError(plan_file, f"candidates.{key}", e.message)
            if is_typo(e):
                raise SpecError(plan_file, f"candidates.{key}[{i}]{path[len(dotted):]}", e.message)


def _about(path: str, dotted: str) -> bool:
    """Whether an error at `path` is about the field `dotted` (itself, inside it, or a
    mapping on the way to it)."""
    path, dotted = _dots(path), _dots(dotted)
    return (path == dotted or path.startswith((dotted + ".", dotted + "["))
            or dotted.startswith(path + "."))


def _dots(path: str) -> str:
    """`cluster.groups[1].gpu` as `cluster.groups.1.gpu`."""
    return re.sub(r"\[(\d+)\]", r".\1", path)
