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
from pathlib import Path
from typing import TYPE_CHECKING

from sim.io.specload import SpecError

if TYPE_CHECKING:
    from sim.config.scenario import Scenario

ALIASES = {"gpu": "gpu", "tensor": "parallel.tensor", "policy": "scheduler.policy",
           "chunk_tokens": "scheduler.max_num_batched_tokens", "block_size": "kv.block_size",
           "max_num_seqs": "scheduler.max_num_seqs", "speculative": "speculative"}
KEYS_ALLOWED = ", ".join(ALIASES) + ", or a dotted scenario field"

# How specload and the name loaders (profiles, models, runtimes) word a value that is
# wrong whatever it is combined with: an unknown name, key or choice, a wrong type, a
# number out of its range. Any other refusal depends on the combination.
_TYPO_STARTS = ("unknown ", "expected ")
_TYPO_PARTS = (" is out of range (", " is not finite (", " is too large (")


def candidate_grid(candidates: dict[str, tuple]) -> list[dict]:
    """Every candidate as scenario overrides (short names expanded)."""
    names = [ALIASES.get(k, k) for k in candidates]
    return [dict(zip(names, combo, strict=True)) for combo in itertools.product(*candidates.values())]


# number formats as a label says them: `h100-sxm tp2 fp8`, `... bf16 fp8 KV`
FORMAT_WORDS = {"dtype.weights": "{}", "dtype.kv_cache": "{} KV"}


def label(cand: dict) -> str:
    """A candidate's short name: its overrides in order, GPU and policy by value, TP as
    `tp2`, number formats as `fp8` / `bf16` (weights) and `fp8 KV` (cache), whether given
    as dotted fields or as a `dtype:` mapping, other fields as `name=value`."""
    short = {v: k for k, v in ALIASES.items()}
    parts = []
    for k, v in _dtype_fields(cand).items():
        if k in FORMAT_WORDS:
            parts.append(FORMAT_WORDS[k].format(v))
            continue
        name = short.get(k, k.split(".")[-1])
        parts.append(str(v) if name in ("gpu", "policy") else f"{'tp' if name == 'tensor' else name + '='}{v}")
    return " ".join(parts) or "base"


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
    for key, values in candidates.items():
        dotted = ALIASES.get(key, key)
        for i, value in enumerate(values):
            e = resolve(scenario, {**base, dotted: value})
            if not isinstance(e, SpecError) or not _about(e.path, dotted):
                continue
            if e.path == dotted or dotted.startswith(e.path + "."):  # the key itself
                if e.message.startswith("unknown key") or "not a mapping" in e.message:
                    if "." not in e.path and key not in ALIASES:  # no such top-level field
                        raise SpecError(plan_file, f"candidates.{key}", f"unknown key (allowed: {KEYS_ALLOWED})")
                    raise SpecError(plan_file, f"candidates.{key}", e.message)
            if is_typo(e):
                raise SpecError(plan_file, f"candidates.{key}[{i}]{e.path[len(dotted):]}", e.message)


def _about(path: str, dotted: str) -> bool:
    """Whether an error at `path` is about the field `dotted` (itself, inside it, or a
    mapping on the way to it)."""
    return (path == dotted or path.startswith((dotted + ".", dotted + "["))
            or dotted.startswith(path + "."))
