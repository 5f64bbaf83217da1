"""Candidate keys over a cluster's pools: `prefill.gpu`, `decode.tensor`, `ratio`.

A plan whose scenario has a `cluster:` can search each pool of its unit
(`sim/planning/units.py`) apart, and the prefill:decode split of a disaggregated one:

```yaml
scenario: ../scenarios/disaggregated.yaml   # 2 prefill + 2 decode H200s
candidates:
  ratio: [aggregated, "1:1", "1:2", "2:1"]  # prefill:decode replicas per unit (quoted: YAML
                                            # reads an unquoted 2:1 as the number 121)
  prefill.tensor: [1, 2]                    # every prefill group's parallel.tensor
  decode.gpu: [h100-sxm, h200-sxm]          # every decode group's gpu
```

- `<role>.<key>` (role: `prefill`, `decode` or `both`; key: a candidate short name —
  gpu, tensor, policy, chunk_tokens, block_size, max_num_seqs, speculative — or a group
  field: `count`, `runtime`, `scheduler.…`, `kv.…`, `parallel.…`) sets that field of
  every group of that role (`cluster.groups.<i>.<field>`).
- `ratio` sets the counts of the cluster's one prefill group and one decode group: `"P:D"`
  or `[P, D]`. `aggregated` is the colocated alternative: the scenario without its
  cluster, one replica doing prefill and decode (on the scenario's own `gpu`,
  `parallel`, ...; top-level keys such as `gpu` and `tensor` still apply), so one plan
  compares aggregated and disaggregated deployments. An aggregated candidate ignores
  the pool keys (the grid keeps one of each such combination).

Each candidate is still a mapping of dotted scenario overrides, as every other
candidate; `pool_label` names the groups by name in its label.
"""

from __future__ import annotations

import itertools
import json
import re
from typing import Any

from sim.io.specload import SpecError

ROLES = ("prefill", "decode", "both")
AGGREGATED = "aggregated"
_GROUP_KEY = re.compile(r"^cluster\.groups\.(\d+)\.(.+)$")

Groups = tuple[tuple[str, str], ...]  # each group's (name, role), in the cluster's order


def is_pool_key(key: str) -> bool:
    return key == "ratio" or key.split(".", 1)[0] in ROLES


def key_overrides(key: str, value: Any, groups: Groups | None, aliases: dict[str, str],
                  plan_file: Any = None) -> dict[str, Any]:
    """The scenario overrides one candidate `key: value` stands for; a pool key the
    scenario has no pool for is a SpecError naming the plan's candidate."""
    if not is_pool_key(key):
        return {aliases.get(key, key): value}
    where = f"candidates.{key}"
    if key == "ratio":
        return _ratio(value, groups, plan_file, where)
    role, field = key.split(".", 1)
    idx = [i for i, (_, r) in enumerate(groups or ()) if r == role]
    if not idx:
        has = ", ".join(sorted({r for _, r in groups})) if groups else "none: the scenario has no cluster"
        raise SpecError(plan_file, where, f"the scenario has no '{role}' group (its roles: {has})")
    return {f"cluster.groups.{i}.{aliases.get(field, field)}": value for i in idx}


def _ratio(value: Any, groups: Groups | None, plan_file: Any, where: str) -> dict[str, Any]:
    if value == AGGREGATED:
        return {"cluster": None}
    pre = [i for i, (_, r) in enumerate(groups or ()) if r == "prefill"]
    dec = [i for i, (_, r) in enumerate(groups or ()) if r == "decode"]
    if len(pre) != 1 or len(dec) != 1:
        raise SpecError(plan_file, where, "needs a scenario whose cluster has one prefill and one "
                        f"decode group (allowed without: {AGGREGATED})")
    pair = value.split(":") if isinstance(value, str) else value
    try:
        p, d = (int(x) for x in pair)
    except (TypeError, ValueError):
        p = d = 0
    if isinstance(value, bool) or p < 1 or d < 1 or (isinstance(value, str) and value.count(":") != 1):
        raise SpecError(plan_file, where, f"{value!r} is no prefill:decode ratio (allowed: '{AGGREGATED}', "
                        "'P:D' quoted, or [P, D], counts >= 1)")
    return {f"cluster.groups.{pre[0]}.count": p, f"cluster.groups.{dec[0]}.count": d}


def pool_grid(candidates: dict[str, tuple], groups: Groups | None, aliases: dict[str, str],
              plan_file: Any = None) -> list[dict]:
    """Every candidate as scenario overrides: the cross product of the keys' overrides;
    an aggregated candidate loses its cluster overrides, and repeats are dropped."""
    per_key = [[key_overrides(k, v, groups, aliases, plan_file) for v in values]
               for k, values in candidates.items()]
    out, seen = [], set()
    for combo in itertools.product(*per_key):
        cand: dict[str, Any] = {}
        for ov in combo:
            cand.update(ov)
        if "cluster" in cand and cand["cluster"] is None:
            cand = {k: v for k, v in cand.items() if not k.startswith("cluster.")}
        key = json.dumps(cand, sort_keys=True, default=str)
        if key not in seen:
            seen.add(key)
            out.append(cand)
    return out


def pool_label(cand: dict, groups: Groups | None, part) -> tuple[str, dict]:
    """The pool part of a candidate's label ('aggregated', 'prefill(x1 tp2) decode(x2
    h100-sxm)') and the rest of the candidate, for `part(name, value)` to word."""
    rest = {k: v for k, v in cand.items() if k != "cluster" and not _GROUP_KEY.match(k)}
    if "cluster" in cand and cand["cluster"] is None:
        return AGGREGATED, rest
    pools: dict[int, list[str]] = {}
    for k, v in cand.items():
        m = _GROUP_KEY.match(k)
        if m:
            i, field = int(m.group(1)), m.group(2)
            pools.setdefault(i, []).append(f"x{v}" if field == "count" else part(field, v))
    names = [f"{groups[i][0] if groups and i < len(groups) else f'g{i}'}({' '.join(ps)})"
             for i, ps in sorted(pools.items())]
    return " ".join(names), rest


def groups_of(sc) -> Groups | None:
    """A scenario's groups as (name, role), or None without a cluster."""
    if sc.cluster is None:
        return None
    return tuple((g.name or f"g{i}", g.role) for i, g in enumerate(sc.cluster.groups))
