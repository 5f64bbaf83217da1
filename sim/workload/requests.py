"""Workloads: each request's arrival time, prompt and output length, drawn from
distributions, a length file, or a trace (`data/traces/README.md`).

- The first request arrives at t = 0, for synthetic arrivals and traces alike.
- Trace time t is seconds since the trace's first request; `trace.start_s` and `limit`
  pick a window of rows, then arrival_s = (t - start_s) * time_scale: time_scale 2
  stretches the trace to twice its span, i.e. half the request rate (no rate_scale).
- With a trace, lengths come from its rows unless `prompt`/`output` or `lengths` override
  them; synthetic arrivals over a trace take its rows in order, wrapping around.
- Lognormal lengths are rounded and clipped to [min, max] (max defaults to MAX_TOKENS,
  10^7); sigma is at most MAX_LOGNORMAL_SIGMA (10). Bounds: `sim/io/specload.py`.
- `max_tokens` (what a system reserving KV up front plans for) is `max_output_tokens`
  (outputs are cut to it), else the output distribution's max (fixed value, uniform high,
  lognormal max, file or trace column max), else the largest output drawn.
- Relative paths resolve against the scenario file's folder, then the repository root.
- Files are read, validated and cached by `sim/workload/traces.py`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import numpy as np

from sim.io.specload import (
    MAX_GAMMA_CV,
    MAX_LOGNORMAL_SIGMA,
    MAX_PREFIX_BLOCKS,
    MAX_REQUESTS,
    MAX_TIME_S,
    MAX_TOKENS,
    MIN_GAMMA_CV,
    SpecError,
)
from sim.workload.clients import ClientPlan, ClientsSpec, plan_clients
from sim.workload.prefixes import HASH_TOKENS, MultiTurnSpec, SharedPrefixSpec, declare_prefixes
from sim.workload.profile import RateProfile, diurnal, load_profile, profile_arrivals
from sim.workload.traces import (
    MOONCAKE_BLOCK_TOKENS,
    TraceSpec,
    length_column,
    resolve,
    trace_window,
)

_Problem = tuple[str, str] | None  # what check() returns: (field, message) or None
_POS = {"gt": 0}
_LENGTH = {"ge": 1, "le": MAX_TOKENS}  # one length in tokens
_TOKENS = {"gt": 0, "le": MAX_TOKENS}
_ARRIVAL_FIELDS = {"poisson": ("rate",), "gamma": ("rate", "cv"), "constant": ("rate",), "trace": (),
                   "profile": ("path", "cv"),  # sim/workload/profile.py
                   "diurnal": ("rate", "peak_to_trough", "period_s", "peak_s", "cv")}
_ARRIVAL_NEEDS = {"profile": ("path",), "diurnal": ("rate", "peak_to_trough", "period_s")}
_LENGTH_FIELDS = {"fixed": ("value",), "uniform": ("low", "high"), "file": ("path", "column"),
                  "lognormal": ("mean", "median", "sigma", "min", "max")}
_Drawn = tuple[np.ndarray, int | None]  # lengths (int64) and the distribution's max


def _kind_problem(spec: Any, table: dict[str, tuple[str, ...]], need: Sequence[str]) -> _Problem:
    """check() for a spec with a `kind`: a needed field missing, or one the kind does not use."""
    its = ", ".join(table[spec.kind]) or "none"
    for name in need:
        if getattr(spec, name) is None:
            return name, f"missing required field for kind '{spec.kind}' (its fields: {its})"
    for name in sorted({n for names in table.values() for n in names} - set(table[spec.kind])):
        if getattr(spec, name) is not None:
            return name, f"not used by kind '{spec.kind}' (its fields: {its})"
    return None


@dataclass(frozen=True)
class ArrivalSpec:
    """When requests arrive: poisson, gamma (burstiness cv), constant, trace timestamps, or
    a time-varying rate (profile CSV or diurnal shape; sim/workload/profile.py)."""

    kind: Literal["poisson", "gamma", "constant", "trace", "profile", "diurnal"]
    rate: float | None = field(default=None, metadata=_POS)  # requests per second (diurnal: mean)
    cv: float | None = field(default=None, metadata={"ge": MIN_GAMMA_CV, "le": MAX_GAMMA_CV})  # gamma: std/mean of gaps; 1 = Poisson
    path: str | None = None  # profile: CSV of time_s,rate (piecewise linear)
    peak_to_trough: float | None = field(default=None, metadata={"ge": 1, "le": 1e6})  # diurnal
    period_s: float | None = field(default=None, metadata={"gt": 0, "le": MAX_TIME_S})  # diurnal
    peak_s: float | None = field(default=None, metadata={"ge": 0, "le": MAX_TIME_S})  # diurnal; default period_s/2

    def check(self) -> _Problem:
        return _kind_problem(self, _ARRIVAL_FIELDS, _ARRIVAL_NEEDS.get(self.kind, _ARRIVAL_FIELDS[self.kind]))


@dataclass(frozen=True)
class LengthSpec:
    """A token-length distribution: fixed, uniform, lognormal, or rows of a CSV column."""

    kind: Literal["fixed", "uniform", "lognormal", "file"]
    value: int | None = field(default=None, metadata=_LENGTH)  # fixed
    low: int | None = field(default=None, metadata=_LENGTH)  # uniform, inclusive
    high: int | None = field(default=None, metadata=_LENGTH)  # uniform, inclusive
    mean: float | None = field(default=None, metadata=_TOKENS)  # lognormal: mean or median
    median: float | None = field(default=None, metadata=_TOKENS)
    # lognormal: std of log(length), at most MAX_LOGNORMAL_SIGMA
    sigma: float | None = field(default=None, metadata={"ge": 0, "le": MAX_LOGNORMAL_SIGMA})
    min: int | None = field(default=None, metadata=_LENGTH)  # lognormal clip; default 1
    max: int | None = field(default=None, metadata=_LENGTH)  # lognormal clip; default MAX_TOKENS
    path: str | None = None  # file: a CSV with a header line, rows sampled with replacement
    column: str | None = None  # file: the column to sample

    def check(self) -> _Problem:
        need = ("sigma",) if self.kind == "lognormal" else _LENGTH_FIELDS[self.kind]
        problem = _kind_problem(self, _LENGTH_FIELDS, need)
        if problem is None and self.kind == "uniform" and self.low > self.high:
            return "low", f"{self.low} > high={self.high} (allowed: low <= high)"
        if problem is None and self.kind == "lognormal" and (self.mean is None) == (self.median is None):
            return "mean", "give exactly one of mean or median for kind 'lognormal'"
        if problem is None and (self.min or 1) > (self.max or np.inf):  # only lognormal has min/max
            return "min", f"{self.min} > max={self.max} (allowed: min <= max)"
        return problem

    def draw(self, n: int, rng: np.random.Generator, column: Callable[[], np.ndarray]) -> _Drawn:
        """n lengths and the distribution's max (None when unbounded)."""
        if self.kind == "fixed":
            return np.full(n, self.value, dtype=np.int64), self.value
        if self.kind == "uniform":
            return rng.integers(self.low, self.high + 1, size=n, dtype=np.int64), self.high
        if self.kind == "lognormal":
            mu = np.log(self.median if self.median is not None else self.mean)
            mu -= self.sigma**2 / 2 if self.median is None else 0.0  # E[X] = exp(mu + sigma^2/2)
            x = np.rint(rng.lognormal(mu, self.sigma, size=n))
            hi = self.max if self.max is not None else MAX_TOKENS
            return np.clip(x, self.min or 1, hi).astype(np.int64), self.max
        values = column()
        return values[rng.integers(0, len(values), size=n)], int(values.max())


@dataclass(frozen=True)
class LengthsSpec:
    """Prompt and output lengths sampled jointly from rows of one CSV (keeps them paired)."""

    path: str
    prompt_column: str = "num_prefill_tokens"
    output_column: str = "num_decode_tokens"


@dataclass(frozen=True)
class WorkloadSpec:
    """The scenario's `workload:` mapping."""

    num_requests: int | None = field(default=None, metadata={"ge": 1, "le": MAX_REQUESTS})
    duration_s: float | None = field(default=None, metadata={"gt": 0, "le": MAX_TIME_S})  # no arrivals at or after this
    arrival: ArrivalSpec | None = None  # default with a trace: {kind: trace}
    prompt: LengthSpec | None = None
    output: LengthSpec | None = None
    lengths: LengthsSpec | None = None
    trace: TraceSpec | None = None
    max_output_tokens: int | None = field(default=None, metadata=_LENGTH)
    shared_prefix: SharedPrefixSpec | None = None  # see sim/policies/prefix.py
    multi_turn: MultiTurnSpec | None = None
    clients: ClientsSpec | None = None  # closed loop (sim/workload/clients.py); None: open loop

    def check(self) -> _Problem:
        if self.clients is not None:
            problem = self._clients_problem()
            if problem is not None:
                return problem
        kind = self.arrival.kind if self.arrival is not None else None
        if kind is None and self.trace is None and self.clients is not None:
            kind = "clients"
        if kind is None and self.trace is None:
            return "arrival", "missing required field (kind: poisson, gamma, constant, trace, profile or diurnal)"
        if kind == "trace" and self.trace is None:
            return "arrival.kind", "'trace' needs workload.trace (path, format: csv, azure or mooncake)"
        if kind not in (None, "trace", "clients"):
            if self.num_requests is None and self.duration_s is None:
                return "num_requests", f"arrival kind '{kind}' needs num_requests or duration_s (or both)"
            if (self.num_requests is None and self.arrival.rate is not None
                    and self.duration_s * self.arrival.rate > MAX_REQUESTS):
                return "duration_s", f"{self.duration_s} s x rate {self.arrival.rate} is over {MAX_REQUESTS} requests (allowed: fewer, or set num_requests)"
        if self.shared_prefix is not None and self.shared_prefix.tokens > MAX_TOKENS:
            return "shared_prefix.tokens", f"{self.shared_prefix.tokens} is out of range (allowed: <= {MAX_TOKENS:,})"
        if self.multi_turn is not None and self.multi_turn.turns > MAX_REQUESTS:
            return "multi_turn.turns", f"{self.multi_turn.turns} is out of range (allowed: <= {MAX_REQUESTS:,})"
        if self.shared_prefix is not None and self.multi_turn is not None:
            return "multi_turn", "give either shared_prefix or multi_turn, not both"
        if self.lengths is not None and (self.prompt is not None or self.output is not None):
            return "lengths", "give either lengths or prompt/output, not both"
        for name in ("prompt", "output"):
            if getattr(self, name) is None and self.trace is None and self.lengths is None:
                return name, "missing required field (kind: fixed, uniform, lognormal or file), or give lengths or trace"
        return None

    def _clients_problem(self) -> _Problem:
        c = self.clients
        if self.arrival is not None or self.trace is not None:
            return "clients", "closed-loop clients send requests when earlier ones end (allowed: no arrival and no trace with clients)"
        if (c.requests_per_client is None) == (self.num_requests is None):
            return "clients.requests_per_client", "give exactly one of clients.requests_per_client or workload.num_requests (the measured requests)"
        turns = self.multi_turn.turns if self.multi_turn is not None else 1
        for name, count in (("warmup_requests", c.warmup_requests),
                            ("requests_per_client", c.measured(self.num_requests))):
            if count % turns:
                return f"clients.{name}", f"{count} requests is not a whole number of {turns}-turn conversations (allowed: a multiple of multi_turn.turns)"
        return None


@dataclass(frozen=True, eq=False)
class Workload:
    """The requests of one run, sorted by arrival; every array has one entry per request."""

    arrival_s: np.ndarray  # float64 [n], non-decreasing, seconds
    prompt_tokens: np.ndarray  # int64 [n], >= 1
    output_tokens: np.ndarray  # int64 [n], >= 1: tokens the request will generate
    max_tokens: np.ndarray  # int64 [n] (read-only; maybe one value broadcast), >= output_tokens: the output cap reservations plan for
    prefix_hashes: tuple[tuple[int, ...], ...] | None = None  # [n] prompt block ids (mooncake)
    block_tokens: int | None = None  # prompt tokens per prefix hash (512 for mooncake)
    acceptance: np.ndarray | None = None  # float64 [n]: a csv trace's `acceptance` column
    clients: ClientPlan | None = None  # closed loop: arrival_s are all 0, set when each is sent

    def __post_init__(self) -> None:
        for name in ("arrival_s", "prompt_tokens", "output_tokens", "max_tokens"):
            getattr(self, name).flags.writeable = False

    def __len__(self) -> int:
        return len(self.arrival_s)


def generate(spec: WorkloadSpec, rng: np.random.Generator, *, file: str | Path | None = None,
             path: str = "workload", base_dir: str | Path | None = None) -> Workload:
    """Draw the workload `spec` describes; `file` and `path` name the spec in errors."""
    base = Path(base_dir) if base_dir else (Path(file).parent if file is not None else None)

    def column(sub: str, p: str, name: str, key: str = "column") -> Callable[[], np.ndarray]:
        def read() -> np.ndarray:  # an integer column (>= 1) of a CSV length file
            src = resolve(p, base, file, f"{path}.{sub}.path")
            return length_column(src, name, file, f"{path}.{sub}.{key}")
        return read

    ts = spec.trace
    tr = trace_window(ts, resolve(ts.path, base, file, f"{path}.trace.path"), file, f"{path}.trace") if ts else None
    if spec.clients is not None:  # closed loop: send times come from the simulation
        n = spec.clients.measured(spec.num_requests) + spec.clients.warmup_requests
        arrival, rows = np.zeros(n), None
    elif spec.arrival is None or spec.arrival.kind == "trace":
        with np.errstate(over="ignore"):
            arrival = (tr.t - spec.trace.start_s) * spec.trace.time_scale
        n = min(len(arrival), spec.num_requests or len(arrival))
        if spec.duration_s is not None:
            n = min(n, int(np.searchsorted(arrival, spec.duration_s, side="left")))
        if n == 0:
            raise SpecError(file, f"{path}.duration_s", f"no trace request arrives before {spec.duration_s} s (allowed: > {arrival[0]:.3f})")
        arrival, rows = arrival[:n], np.arange(n)
        _check_times(arrival, file, f"{path}.trace.time_scale")
    else:
        with np.errstate(over="ignore", invalid="ignore"):  # checked just below
            arrival = _arrivals(spec.arrival, spec.num_requests, spec.duration_s, rng,
                                lambda: rate_profile(spec.arrival, spec.duration_s, base, file, path))
        _check_times(arrival, file, f"{path}.arrival.rate")
        n = len(arrival)
        rows = np.arange(n) % len(tr.t) if tr is not None else None

    sp, so, ls = spec.prompt, spec.output, spec.lengths
    if ls is not None:  # one row per request, so paired lengths stay paired
        pcol = column("lengths", ls.path, ls.prompt_column, "prompt_column")()
        ocol = column("lengths", ls.path, ls.output_column, "output_column")()
        idx = rng.integers(0, len(pcol), size=n)
        prompt, output, out_max = pcol[idx], ocol[idx], int(ocol.max())
    else:
        prompt = sp.draw(n, rng, column("prompt", sp.path, sp.column))[0] if sp else tr.prompt[rows]
        output, out_max = (so.draw(n, rng, column("output", so.path, so.column)) if so
                           else (tr.output[rows], int(tr.output.max())))
    cap = spec.max_output_tokens
    output = np.minimum(output, cap) if cap else output
    max_tok = cap or out_max or int(output.max())
    hashes = None  # prefix blocks describe the trace's prompts: dropped when prompts are redrawn
    if tr is not None and tr.hashes is not None and spec.prompt is None and spec.lengths is None:
        hashes = tr.hashes[:n] if n <= len(tr.hashes) else tuple(tr.hashes[i] for i in rows)
    acc = None
    if tr is not None and tr.acceptance is not None:
        acc = tr.acceptance[rows]
    wl = Workload(np.array(arrival, dtype=np.float64), np.array(prompt, dtype=np.int64),
                  np.array(output, dtype=np.int64),
                  np.broadcast_to(np.int64(max_tok), n),  # one value: no n copies of it
                  hashes, MOONCAKE_BLOCK_TOKENS if hashes is not None else None, acc)
    if (spec.shared_prefix or spec.multi_turn) and hashes is not None:
        raise SpecError(file, f"{path}.shared_prefix", "the trace brings its own prefix hashes (allowed: no shared_prefix/multi_turn with a mooncake trace)")
    _check_prefix_blocks(wl, spec, file, path)
    return _with_clients(declare_prefixes(wl, spec.shared_prefix, spec.multi_turn, rng), spec, rng)


def _with_clients(wl: Workload, spec: WorkloadSpec, rng: np.random.Generator) -> Workload:
    """A closed loop's plan (sessions, warm-up, think times) drawn after everything else."""
    if spec.clients is None:
        return wl
    turns = spec.multi_turn.turns if spec.multi_turn is not None else None
    return replace(wl, clients=plan_clients(spec.clients, len(wl), turns, spec.duration_s, rng))


def _check_prefix_blocks(wl: Workload, spec: WorkloadSpec, file: Any, path: str) -> None:
    """Synthetic prefixes keep one hash per HASH_TOKENS prompt tokens of every request:
    refuse a workload that would need more than MAX_PREFIX_BLOCKS of them."""
    if spec.shared_prefix is None and spec.multi_turn is None:
        return
    p, o, n = wl.prompt_tokens.astype(np.float64), wl.output_tokens.astype(np.float64), len(wl)
    if spec.shared_prefix is not None:  # at most: the prefix's blocks + the whole prompt's
        total, where = (n * 2.0 * spec.shared_prefix.tokens + p.sum()) / HASH_TOKENS + n, "shared_prefix.tokens"
    else:  # multi_turn: each turn's prompt holds its conversation so far
        convs = max(1, n // spec.multi_turn.turns)
        grid = np.zeros(-(-n // convs) * convs)
        grid[:n] = p + o
        total = np.cumsum(grid.reshape(-1, convs), axis=0).ravel()[:n].sum() / HASH_TOKENS + n
        where = "multi_turn.turns"
    if total > MAX_PREFIX_BLOCKS:
        raise SpecError(file, f"{path}.{where}", f"the prompts would need {total:.3g} prefix-hash blocks of {HASH_TOKENS} tokens (allowed: at most {MAX_PREFIX_BLOCKS:.0e}: fewer requests, shorter prompts or fewer turns)")


def _check_times(arrival: np.ndarray, file: Any, field_path: str) -> None:
    """Arrival times must stay finite and at most MAX_TIME_S."""
    last = float(arrival[-1]) if len(arrival) else 0.0
    if not last <= MAX_TIME_S:  # also catches inf and nan
        raise SpecError(file, field_path, f"arrivals reach {last:.3g} s (allowed: arrival times <= {MAX_TIME_S:.0e} s)")


def rate_profile(a: ArrivalSpec, duration: float | None, base: Path | None, file: Any,
                 path: str) -> RateProfile:
    """The rate profile of a `profile` or `diurnal` arrival, its expected count over
    `duration` checked (relative paths resolve against `base`; errors name `file` and
    `path`). Public: a day plan reads the profile its scenario's arrivals follow."""
    if a.kind == "diurnal":
        prof = diurnal(a.rate, a.peak_to_trough, a.period_s, a.peak_s)
    else:
        prof = load_profile(resolve(a.path, base, file, f"{path}.arrival.path"))
    if duration is not None and float(prof.integral(duration)) > MAX_REQUESTS:
        raise SpecError(file, f"{path}.duration_s", f"the profile expects {float(prof.integral(duration)):.3g} requests in {duration} s (allowed: <= {MAX_REQUESTS}: shorter, or set num_requests)")
    return prof


def _arrivals(a: ArrivalSpec, n: int | None, duration: float | None,
              rng: np.random.Generator, profile: Callable[[], RateProfile] | None = None) -> np.ndarray:
    """Arrival times: the first at 0, then gaps of mean 1/rate, until n requests or duration;
    a profile's by inversion of a unit-rate process (sim/workload/profile.py)."""
    if a.kind in ("profile", "diurnal"):
        unit = ArrivalSpec("poisson", rate=1.0) if (a.cv or 1.0) == 1.0 else ArrivalSpec("gamma", 1.0, a.cv)
        return profile_arrivals(profile(), n, duration,
                                lambda count, horizon: _arrivals(unit, count, horizon, rng))
    if a.kind == "constant":
        count = n if duration is None else int(min(n or np.inf, np.ceil(duration * a.rate) + 1))
        t = np.arange(count) / a.rate  # exactly evenly spaced: k / rate
        return t[t < (duration or np.inf)]

    def gaps(size: int) -> np.ndarray:
        if a.kind == "poisson":
            return rng.exponential(1.0 / a.rate, size=size)
        shape = 1.0 / a.cv**2  # gamma: mean = shape * scale = 1/rate, cv = 1/sqrt(shape)
        return rng.gamma(shape, 1.0 / (a.rate * shape), size=size)

    if duration is None:
        return np.concatenate(([0.0], np.cumsum(gaps(n - 1))))
    chunk = int(min(duration * a.rate * 1.1 + 64, n or np.inf))  # draws depend on the spec only
    parts, total = [np.zeros(1)], 1
    while parts[-1][-1] < duration and (n is None or total < n):
        parts.append(parts[-1][-1] + np.cumsum(gaps(chunk)))
        total += chunk
    t = np.concatenate(parts)[:n]
    return t[t < duration]
