"""How sure a plan's, a curve's and a run's figures are: a 90 % prediction interval on each.

Two sources of doubt, combined into one interval per figure:

* **seed to seed**: the 90 % prediction interval of one more seed's value,
  exp(mean(log x) +- t(0.95, df) s sqrt(1 + 1/n)) around the log-mean of the figure's own n
  seeds (Student t; figures are positive and skewed), joined with the seeds' own
  [lowest, highest]. s and df are **pooled** where a plan has run enough seed groups
  (`seed_pool`): s^2 = sum (n_i - 1) s_i^2 / sum (n_i - 1) over the logs of every group
  of >= 2 seeds of the same figure (p99 TTFT, TPOT, E2E) that is comparable, with
  df = sum (n_i - 1). **Comparable** (one rule, `comparable`, and `seed_pools` keeps two
  pools): of the figure's kind, *unit* (one unit's steady probes and its runs at a
  candidate's share: the candidates' p99s) or *fleet* (fleet checks and the headroom's
  fleet probes: the checked fleets' p99s); every seed of the group met the SLOs in steady
  state; and a unit's group ran at an offered load of at least `POOL_LOAD` (half) of the
  highest its unit passed (a probe at rate r of a unit sustaining R: r / R; at its share:
  share / R; a fleet that held runs near its capacity: the check moves the count until
  one fewer breaks, the headroom probes run above it). Spread grows towards saturation,
  so failing groups and ones far below it (a nearly empty queue, p99 ~ the prefill
  alone) are left out. Kinds are not mixed: a fleet's p99 stands on 10x or more the
  requests of a probe's and varies far less from seed to seed (plans/chat_8b.yaml: log-sd
  of p99 TTFT 0.19 over 67 unit groups, 0.06 over its 5 fleet groups). A pooled interval
  can be wider than the figure's own t interval: two seeds that happen to agree closely
  say little about the spread, and the pool says what it typically is. A checked fleet
  whose own kind's pool has under `MIN_POOL_DF` degrees of freedom (a mixed plan's few
  fleets that held) stands on the units' pool instead, an upper bound on its spread
  (`fleet_pool`).
  Below `MIN_POOL_DF` (4) degrees of freedom the figure's own seeds decide: s their
  sample sd, df = n - 1 (t(0.95, 1) = 6.3 with two seeds: wide). One seed and no pool
  measures no spread (the interval is then the step model's alone, and says so). A
  sustained rate's seed term is the bisection's bracket [sustained rate, lowest failing
  rate], where the seeds disagree.
* **the step model's own error**: each lookup class (measured = exact + interpolated,
  derived, extrapolated, analytic) has `interval90`, the half-width of a 90 % interval of
  the relative error of time e = modelled / measured - 1, sized from the project's
  held-out validation record (`data/step_error_bands.yaml`, sized and its coverage
  checked by benchmarks/fidelity/interval_coverage.py); a figure's is the share-weighted
  mean over its run's simulated step time (`lookup_provenance`). With |e| <= b the
  true time lies in [modelled / (1 + b), modelled / (1 - b)], and (to first order) a
  rate or throughput, inverse to step time, in [modelled x (1 - b), modelled x (1 + b)].

So a latency's interval is [seed low / (1 + b), seed high / (1 - b)], a rate's
[seed low x (1 - b), seed high x (1 + b)]; replicas needed = ceil(sizing rate / rate)
over the rate's interval and dollars follow from replicas. Near saturation a latency
moves by more than its step time: its interval is then a floor.
"""

from __future__ import annotations

import math
from pathlib import Path

from sim.io.filecache import FileCache
from sim.io.specload import ROOT, SpecError, load_yaml

BANDS_FILE = ROOT / "data" / "step_error_bands.yaml"

# one-sided 95 % quantiles of Student's t (a two-sided 90 % interval), by degrees of freedom
# 1..30 (standard tables); past 30 the normal's 1.645 (t(0.95, 30) = 1.697)
T95 = (6.314, 2.920, 2.353, 2.132, 2.015, 1.943, 1.895, 1.860, 1.833, 1.812, 1.796, 1.782, 1.771,
       1.761, 1.753, 1.746, 1.740, 1.734, 1.729, 1.725, 1.721, 1.717, 1.714, 1.711, 1.708, 1.706,
       1.703, 1.701, 1.699, 1.697)


def load_bands(path: str = str(BANDS_FILE)) -> dict[str, dict]:
    """class -> {tags, interval90, source}, from the bands file (read again once it changes)."""
    return _BANDS.get(Path(path).resolve(), lambda watch: _read_bands(str(watch(Path(path)))))


def _read_bands(path: str) -> dict[str, dict]:
    classes = load_yaml(path).get("classes")
    if not isinstance(classes, dict) or not classes:
        raise SpecError(path, "classes", "missing (allowed: a mapping class -> {tags, interval90, source})")
    out = {}
    for name, rec in classes.items():
        interval = rec.get("interval90") if isinstance(rec, dict) else None
        if not isinstance(interval, int | float) or not 0 <= interval < 1:
            raise SpecError(path, f"classes.{name}.interval90",
                            f"expected a number in [0, 1), got {interval!r}")
        if not rec.get("source"):
            raise SpecError(path, f"classes.{name}.source", "missing (every interval names its source)")
        out[str(name)] = {"tags": list(rec.get("tags") or [name]), "interval90": float(interval),
                          "source": " ".join(str(rec["source"]).split())}
    return out


_BANDS: FileCache[dict[str, dict]] = FileCache()  # by path, while the file is unchanged


def class_shares(provenance: dict[str, float] | None) -> dict[str, float]:
    """Share of step time per class (measured, derived, extrapolated, analytic)."""
    p = provenance or {}
    return {name: float(sum(p.get(t, 0.0) for t in rec["tags"])) for name, rec in load_bands().items()}


def interval_band(provenance: dict[str, float] | None) -> float:
    """The half-width b of a figure's 90 % interval of step-model error, share-weighted over
    its lookup classes' `interval90` (the widest class's if the provenance is unknown)."""
    bands = load_bands()
    shares = class_shares(provenance)
    total = sum(shares.values())
    if total <= 0:
        return max(b["interval90"] for b in bands.values())
    return sum(shares[k] * bands[k]["interval90"] for k in bands) / total


POOL_FIGURES = {"ttft_p99": "ttft_s", "tpot_p99": "tpot_s", "e2e_p99": "e2e_s"}
POOL_LOAD = 0.5  # a group counts at >= this share of the highest load its unit passed
MIN_POOL_DF = 4  # below this many pooled degrees of freedom, the figure's own seeds decide


def t95(df: int) -> float:
    """t(0.95, df): the table's up to 30 degrees of freedom, the normal's 1.645 past it."""
    return T95[df - 1] if df <= len(T95) else 1.645


def seed_group(name: str, summaries: list[dict], passed: bool, load: float | None) -> dict:
    """One unit's group of seeds run alike (a probe, a candidate at its share): its p99s per
    pooled figure, whether every seed met the SLOs in steady state, and its offered load
    as a share of the highest its unit passed."""
    return {"name": name, "kind": "unit", "passed": bool(passed), "load": load,
            "values": {f: [(s.get(k) or {}).get("p99") for s in summaries] for f, k in POOL_FIGURES.items()}}


def fleet_group(name: str, passed: bool, seeds_by_metric: dict[str, list]) -> dict:
    """A fleet's group of seeds (a count checked, a headroom probe): `seeds_by_metric`
    ttft/tpot/e2e -> each seed's p99."""
    return {"name": name, "kind": "fleet", "passed": bool(passed), "load": None,
            "values": {f"{k}_p99": list(v or []) for k, v in seeds_by_metric.items()}}


def comparable(group: dict) -> bool:
    """The pooling rule (module docstring): passed on every seed, a unit's at >= POOL_LOAD
    load (`seed_pools` keeps the kinds apart)."""
    return group["passed"] and (group["load"] is None or group["load"] >= POOL_LOAD - 1e-12)


def seed_pools(groups: list[dict]) -> dict[str, dict[str, dict]]:
    """{'unit': seed_pool of the units' groups, 'fleet': of the fleets'} (module docstring)."""
    return {kind: seed_pool([g for g in groups if g.get("kind", "unit") == kind]) for kind in ("unit", "fleet")}


def seed_pool(groups: list[dict]) -> dict[str, dict]:
    """figure -> {sd_log, df, groups}: the seed-to-seed sd of log values pooled over the
    comparable groups with >= 2 positive values of that figure (module docstring);
    sd_log None where no group has two."""
    out = {}
    for f in POOL_FIGURES:
        ss, df, names = 0.0, 0, []
        for g in groups:
            vals = [float(v) for v in g["values"].get(f) or [] if v is not None and not math.isnan(v)]
            if not comparable(g) or len(vals) < 2 or min(vals) <= 0:
                continue
            logs = [math.log(v) for v in vals]
            mean = sum(logs) / len(logs)
            ss += sum((x - mean) ** 2 for x in logs)
            df += len(logs) - 1
            names.append(g["name"])
        out[f] = {"sd_log": math.sqrt(ss / df) if df else None, "df": df, "groups": names}
    return out


def fleet_pool(pools: dict[str, dict[str, dict]]) -> dict[str, dict]:
    """The pool a checked fleet's p99s stand on, per figure: the fleets' own (`seed_pools`)
    with >= MIN_POOL_DF degrees of freedom, else the units' (a probe's p99 varies more from
    seed to seed than a fleet's: an upper bound), else the fleets' (too few: own seeds)."""
    out = {}
    for f in POOL_FIGURES:
        fleet, unit = pools["fleet"].get(f) or {}, pools["unit"].get(f) or {}
        use = unit if (fleet.get("df") or 0) < MIN_POOL_DF <= (unit.get("df") or 0) else fleet
        out[f] = {**use, "kind": "unit" if use is unit else "fleet"}
    return out


def pool_words(pool: dict[str, dict] | None) -> str:
    """What the seed term stands on, in words ('pooled over 12 seed groups (df 12) ...')."""
    p = (pool or {}).get("ttft_p99") or {}
    if (p.get("df") or 0) < MIN_POOL_DF:
        return (f"each figure's own seeds (the pool's {p.get('df') or 0} degrees of freedom are under "
                f"{MIN_POOL_DF})")
    sds = ", ".join(f"{name} {pool[f]['sd_log']:.3f}" for f, name in
                    (("ttft_p99", "TTFT99"), ("tpot_p99", "TPOT99"), ("e2e_p99", "E2E99"))
                    if (pool.get(f) or {}).get("sd_log") is not None)
    kind = {"fleet": " of fleets", "unit": " of single units' probes (an upper bound for a fleet: "
            "too few fleet groups)"}.get(p.get("kind"), "")
    return f"seed sd pooled over {len(p['groups'])} comparable seed groups{kind} (df {p['df']}; log-sd {sds})"


def seed_interval(values: list[float | None], pool: dict | None = None) -> tuple[float, float] | None:
    """The 90 % prediction interval of one more seed's value from these seeds' (module
    docstring): [lowest, highest] joined with the Student-t interval on logs, its sd and
    df from `pool` ({sd_log, df} of the figure, `seed_pool`) when it has >= MIN_POOL_DF
    degrees of freedom, else from the seeds themselves; (v, v) for one seed without a
    pool; None for none. Non-positive values fall back to the t interval on values."""
    vals = [float(v) for v in values if v is not None and not math.isnan(v)]
    if not vals:
        return None
    n = len(vals)
    logs = all(v > 0 for v in vals)
    pooled = logs and pool is not None and pool.get("sd_log") is not None \
        and (pool.get("df") or 0) >= MIN_POOL_DF
    if n == 1 and not pooled:
        return vals[0], vals[0]
    xs = [math.log(v) for v in vals] if logs else vals
    mean = sum(xs) / n
    if pooled:
        s, t = pool["sd_log"], t95(pool["df"])
    else:
        s, t = math.sqrt(sum((x - mean) ** 2 for x in xs) / (n - 1)), t95(n - 1)
    h = t * s * math.sqrt(1 + 1 / n)
    lo, hi = (math.exp(mean - h), math.exp(mean + h)) if logs else (max(mean - h, 0.0), mean + h)
    return min(lo, min(vals)), max(hi, max(vals))


def latency_interval(values: list[float | None], b: float,
                     pool: dict | None = None) -> tuple[float, float] | None:
    """A time's 90 % interval: its seed interval (`pool`: the figure's pooled {sd_log, df}),
    widened by the step model's error b."""
    r = seed_interval(values, pool)
    return None if r is None else (r[0] / (1 + b), r[1] / (1 - b))


def rate_interval(low: float, high: float, b: float) -> tuple[float, float]:
    """A rate's (or throughput's) 90 % interval from its seed range: inverse to step time."""
    return low * (1 - b), high * (1 + b)


def prediction_interval(value: float, provenance: dict[str, float] | None,
                        seed_values: list[float] | None = None) -> tuple[float, float]:
    """A time's 90 % prediction interval over its seeds' values (the value alone: one seed)."""
    return latency_interval(seed_values or [value], interval_band(provenance))


RUN_FIGURES = {"TTFT p50 (s)": ("ttft_s", "p50"), "TTFT p99 (s)": ("ttft_s", "p99"),
               "TPOT p50 (s)": ("tpot_s", "p50"), "TPOT p99 (s)": ("tpot_s", "p99"),
               "E2E p50 (s)": ("e2e_s", "p50"), "output tok/s": ("output_token_throughput", None)}


def run_intervals(summaries: list[dict]) -> dict[str, tuple[float, float, float]]:
    """A run's headline figures with their 90 % intervals: figure -> (value of the first
    summary, low, high), over one summary per seed (`summaries`, the first is the run's)."""
    out = {}
    b = interval_band(summaries[0].get("lookup_provenance"))
    for name, (key, q) in RUN_FIGURES.items():
        vals = [s.get(key) if q is None else (s.get(key) or {}).get(q) for s in summaries]
        vals = [float(v) for v in vals if v is not None]
        if not vals:
            continue
        seeds = seed_interval(vals)
        lo, hi = rate_interval(*seeds, b) if q is None else latency_interval(vals, b)
        out[name] = (vals[0], lo, hi)
    return out


def measured_share(provenance: dict[str, float] | None) -> float:
    return class_shares(provenance).get("measured", 0.0)


def stands_on(provenance: dict[str, float] | None) -> str:
    """'measured 5 % / derived 0 % / extrapolated 40 % / analytic 55 %'."""
    return " / ".join(f"{k} {v:.0%}" for k, v in class_shares(provenance).items())


def replicas_needed(sizing: float, rates: tuple[float, float], extra: int = 0, least: int = 1,
                    most: int | None = None) -> tuple[int, int]:
    """(fewest, most) units needed at the sizing rate over a per-unit rate interval."""
    reps = [max(least, math.ceil(sizing / r - 1e-9) + extra) for r in (rates[1], rates[0])]
    return tuple(min(most, n) for n in reps) if most else tuple(reps)


def candidate_intervals(target: float, rate: float, fail_rate: float | None, at_rate_prov: dict | None,
                        share_p99s: dict[str, list[float]], share_prov: dict | None,
                        gpus_per_replica: int, usd_per_gpu_hour: float, usd_per_m: float,
                        usd_per_hour: float, extra_replicas: int = 0, min_replicas: int = 1,
                        pool: dict[str, dict] | None = None) -> dict:
    """A candidate's figures with their 90 % intervals (module docstring): `target` is the
    sizing rate, `rate` and `fail_rate` the bisection's bracket, `share_p99s` each seed's
    p99 at the candidate's share of the target."""
    b = interval_band(at_rate_prov)
    rates = rate_interval(rate, fail_rate or rate, b)
    reps = replicas_needed(target, rates, extra_replicas, min_replicas)
    usd = [n * gpus_per_replica * usd_per_gpu_hour for n in reps]
    per_usd = usd_per_m / usd_per_hour if usd_per_hour else math.nan
    lat_b = interval_band(share_prov)
    out = {"interval90_model": b, "measured_share": measured_share(at_rate_prov),
           "stands_on": stands_on(at_rate_prov),
           "sustained_rate_interval90": rates, "replicas_interval90": reps,
           "usd_per_hour_interval90": tuple(usd),
           "usd_per_m_output_tokens_interval90": tuple(u * per_usd for u in usd),
           "latency_interval90_model": lat_b, "latency_measured_share": measured_share(share_prov),
           "seeds_at_share": max((len([v for v in vs if v is not None]) for vs in share_p99s.values()),
                                 default=0)}
    out.update(p99_intervals(share_p99s, lat_b, pool))
    return out


def p99_intervals(seeds_by_metric: dict[str, list[float]], b: float,
                  pool: dict[str, dict] | None = None) -> dict:
    """`<metric>_p99_interval90_s` for each metric's seeds (ttft, tpot, e2e), on the pooled
    seed term of its figure where `pool` (`seed_pool`) gives one."""
    return {f"{k}_p99_interval90_s": latency_interval(vals, b, (pool or {}).get(f"{k}_p99"))
            for k, vals in seeds_by_metric.items()}


def interval_columns(row: dict) -> dict:
    """A row for a CSV: each (low, high) interval `<figure>_interval90[_s]` as the two
    columns `<figure>_interval90_low[_s]` and `<figure>_interval90_high[_s]`."""
    out = {}
    for k, v in row.items():
        if "_interval90" in k and not k.endswith("_model") \
                and (v is None or isinstance(v, tuple | list)):
            lo, hi = v if v else (None, None)
            stem, _, unit = k.partition("_interval90")
            out[f"{stem}_interval90_low{unit}"], out[f"{stem}_interval90_high{unit}"] = lo, hi
        else:
            out[k] = v
    return out


def fmt_range(r, fmt: str = "{:.3g}") -> str:
    if not r:
        return "-"
    lo, hi = r
    return fmt.format(lo) if lo == hi else f"{fmt.format(lo)}-{fmt.format(hi)}"


def fleet_intervals(spec, row: dict, check: dict, head: dict | None,
                    pool: dict[str, dict] | None = None) -> dict:
    """The recommended fleet's figures with their 90 % intervals: p99s over the check's
    seeds; replicas needed from the fleet's own capacity per unit (the target times its
    headroom, else the target, over the serving units) over its rate interval; dollars
    follow; and `robust`, how far the recommendation holds across them (`robustness`)."""
    at_n = next(c for c in check["checks"] if c["replicas"] == check["replicas"])
    prov = at_n.get("lookup_provenance")
    b = interval_band(prov)
    extra = 1 if check.get("redundancy") == "n+1" else 0
    s = spec.search
    sizing = s.sizing_rate(spec.target_rate)
    fleet_rate = spec.target_rate * head["factor"] if head else sizing
    per_unit = fleet_rate / max(check["replicas"] - extra, 1)
    reps = replicas_needed(sizing, rate_interval(per_unit, per_unit, b), extra, s.min_replicas,
                           s.max_replicas)
    usd_unit = check["usd_per_hour"] / check["replicas"]
    usd = [n * usd_unit for n in reps]
    per_usd = check["usd_per_m_output_tokens"] / check["usd_per_hour"]
    out = {"interval90_model": b, "measured_share": measured_share(prov),
           "stands_on_lookups": stands_on(prov), "seeds": len(check.get("seeds") or []),
           "replicas_interval90": reps, "usd_per_hour_interval90": tuple(usd),
           "usd_per_m_output_tokens_interval90": tuple(u * per_usd for u in usd)}
    out.update(p99_intervals({k: at_n.get(f"{k}_p99_seeds_s") or [] for k in ("ttft", "tpot", "e2e")},
                             b, pool))
    out["seed_term"] = pool_words(pool)
    out["robust"] = robustness(check["replicas"], out, spec.slo.bounds(), usd_unit)
    return out


SLO_NAMES = {"ttft_s": ("ttft", "p99 TTFT"), "tpot_s": ("tpot", "p99 TPOT"), "e2e_s": ("e2e", "p99 E2E")}


def robustness(replicas: int, iv: dict, bounds: dict[str, float | None], usd_per_unit_hour: float) -> dict:
    """How far a recommendation of `replicas` holds across its 90 % intervals: the most
    replicas the interval needs (with that many each serves a share its lowest capacity
    still carries, to first order), the p99s whose interval tops pass their SLO at the
    recommended count, and one sentence saying so."""
    lo, hi = iv["replicas_interval90"]
    covers = replicas >= hi
    over = [name for key, (k, name) in SLO_NAMES.items()
            if bounds.get(key) is not None and iv.get(f"{k}_p99_interval90_s")
            and iv[f"{k}_p99_interval90_s"][1] > bounds[key]]
    words = f"90 % interval of replicas needed {fmt_range((lo, hi), '{:d}')}; "
    if covers:
        words += f"the recommended {replicas} cover the whole interval"
    else:
        words += (f"with {hi} (+{hi - replicas}, ${hi * usd_per_unit_hour:.2f}/hour) it meets the SLOs "
                  f"across the interval; with {replicas} only if the model errs by less")
    seeds = iv.get("seeds", 0)
    pooled = "pooled" in iv.get("seed_term", "")
    if over:
        words += (f"; at {replicas} the 90 % interval of {', '.join(over)} reaches past its SLO "
                  "(the fleet check met it on every seed"
                  + (f"; {seeds} seeds leave the seed term wide: more (search.seeds) narrow it)"
                     if 1 < seeds < 5 and not pooled else ")"))
    elif any(bounds.get(k) is not None for k in SLO_NAMES):
        words += f"; at {replicas} every p99 interval stays within its SLO"
    if seeds == 1:
        words += " (one seed: no seed spread measured; more seeds make this surer)"
    return {"replicas_for_interval": hi, "covers_interval": covers,
            "usd_per_hour_for_interval": hi * usd_per_unit_hour, "p99_past_slo": over, "words": words}
