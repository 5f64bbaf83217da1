"""The fleet's replica lifecycle under an autoscaler: starting, ready, draining, gone.

The pool holds `max_replicas` replicas (sim/engine/build.py); the group's `count` are
ready at t = 0. A replica asked for starts at once and is ready `delay_s` later (node
start plus its weight shard over the source's bandwidth, data/autoscale/provisioning.yaml);
only ready replicas are routed to (`Fleet.ready`). Scaling down cancels replicas still
starting (newest first), then drains ready ones (the fewest outstanding first): a draining
replica gets no new request, finishes its running and queued ones, and is gone when the
last has ended, never losing or restarting one. A replica gone can start again later (with
an empty KV and prefix cache). GPU-hours count every replica from its start to its end
(gone, or the run's end) times its GPUs.

The SimPy process that drives this is `autoscaler` in sim/engine/processes.py; the decision
is the policy's (sim/policies/autoscale.py). `Attainment` is the SLO policy's windowed
metric; `autoscale_summary` and `window_power` are the run's per-window figures.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field

import numpy as np

from sim.config.cluster import AutoscaleSpec
from sim.io.specload import ROOT, SpecError, load_yaml
from sim.policies.autoscale import HPAPolicy, SchedulePolicy, SLOPolicy
from sim.policies.batch import FINISHED, REJECTED

# watch(now, lifecycle, seqs), called at every scrape of an autoscaled run while set (a
# planner screening fleets: sim/planning/dayscreen.py); it reads and never changes the
# run, and raises `Stopped` to end the run there (the run then returns nothing)
SCRAPE_WATCH: ContextVar[Callable | None] = ContextVar("llmsim_scrape_watch", default=None)


class Stopped(Exception):  # noqa: N818 (a stop, not an error)
    """A scrape watch ended the run early; `args[0]` says why."""


@contextmanager
def watching(watch: Callable) -> Iterator[None]:
    """Inside the block, autoscaled runs call `watch(now, lifecycle, seqs)` at every scrape."""
    token = SCRAPE_WATCH.set(watch)
    try:
        yield
    finally:
        SCRAPE_WATCH.reset(token)

PROVISIONING_FILE = ROOT / "data" / "autoscale" / "provisioning.yaml"
GB = 1e9


def provisioning_delay(spec: AutoscaleSpec, weight_bytes_per_gpu: float, *, file=None) -> dict:
    """The delay from a scale-up decision to a ready replica, and what it stands on."""
    data = load_yaml(PROVISIONING_FILE)
    p = spec.provisioning
    if p.source not in data["sources"]:
        raise SpecError(file, "cluster.autoscale.provisioning.source",
                        f"unknown {p.source!r} (allowed: {', '.join(data['sources'])})")
    src = data["sources"][p.source]
    gbs = p.bandwidth_gbs if p.bandwidth_gbs is not None else float(src["bandwidth_gbs"])
    start = p.node_start_s if p.node_start_s is not None else float(data["node_start_s"])
    load = weight_bytes_per_gpu / (gbs * GB)
    return {"delay_s": start + load, "node_start_s": start, "weights_load_s": load,
            "weight_gb_per_gpu": weight_bytes_per_gpu / GB, "bandwidth_gbs": gbs,
            "source": p.source,
            "basis": "node_start_s: " + ("given" if p.node_start_s is not None else "assumed (file)")
                     + "; bandwidth: " + ("given" if p.bandwidth_gbs is not None else src["source"])}


def make_policy(spec: AutoscaleSpec):
    if spec.policy == "schedule":
        return SchedulePolicy(spec.schedule, spec.min_replicas, spec.max_replicas)
    if spec.policy == "slo":
        return SLOPolicy(spec.target, spec.min_replicas, spec.max_replicas, high=spec.high,
                         step=spec.step, down_utilization=spec.down_utilization,
                         stabilization_s=spec.stabilization_s)
    return HPAPolicy(spec.target, spec.min_replicas, spec.max_replicas,
                     tolerance=spec.tolerance, stabilization_s=spec.stabilization_s)


class Attainment:
    """The SLO policy's metric as the scaler sees it at a scrape: of the requests that
    ended in the last `window_s` (finished or rejected), and of those still waiting for a
    first token past the TTFT bound (certain misses, counted at once so a growing queue
    shows before its requests end), the share that met TTFT and TPOT. Incremental:
    each scrape looks at the new arrivals and the requests still open."""

    def __init__(self, seqs: list, ttft_s: float | None, tpot_s: float | None, window_s: float):
        self.seqs, self.ttft, self.tpot, self.window = seqs, ttft_s, tpot_s, window_s
        self.next = 0
        self.open: list = []
        self.ended: deque[tuple[float, bool]] = deque()
        self.met = 0

    def _ok(self, s) -> bool:
        if s.state != FINISHED:
            return False
        ttft = s.first_token_t - s.arrival
        if self.ttft is not None and ttft > self.ttft:
            return False
        if self.tpot is not None and s.output > 1:
            return (s.finish_t - s.arrival - ttft) / (s.output - 1) <= self.tpot
        return True

    def at(self, now: float) -> float | None:
        seqs = self.seqs
        while self.next < len(seqs) and seqs[self.next].arrival <= now:
            self.open.append(seqs[self.next])
            self.next += 1
        still, late, new = [], 0, []
        for s in self.open:
            if s.state in (FINISHED, REJECTED):
                ok = self._ok(s)
                new.append((s.finish_t if s.state == FINISHED else now, ok))
                self.met += ok
            else:
                still.append(s)
                if self.ttft is not None and s.first_token_t < 0 and now - s.arrival > self.ttft:
                    late += 1
        self.open = still
        self.ended.extend(sorted(new))
        while self.ended and self.ended[0][0] < now - self.window:
            self.met -= self.ended.popleft()[1]
        n = len(self.ended) + late
        return self.met / n if n else None


@dataclass
class Life:
    """One stint of one replica: start, ready, draining, gone (None: not yet)."""

    replica: int
    start: float
    ready: float | None = None
    draining: float | None = None
    gone: float | None = None


@dataclass
class Lifecycle:
    """Which replica is in which state, and every stint so far."""

    spec: AutoscaleSpec
    delay_s: float
    gpus_per_replica: int
    pool: int
    state: list[str] = field(default_factory=list)  # per replica: off|starting|ready|draining
    lives: list[Life] = field(default_factory=list)
    current: dict[int, Life] = field(default_factory=dict)
    ready_curve: list[tuple[float, int]] = field(default_factory=list)  # (time, ready count)
    routed: list[int] = field(default_factory=list)  # requests routed to each replica
    slo: tuple[float | None, float | None] = (None, None)  # (TTFT, TPOT) bounds: policy slo

    def __post_init__(self) -> None:
        self.state = ["off"] * self.pool
        self.routed = [0] * self.pool

    def powered_s(self, replicas: int) -> list[float]:
        """Seconds each replica of the pool was up (start to gone, over all its stints;
        call after `close`): what its GPUs drew power and were paid for."""
        up = [0.0] * replicas
        for life in self.lives:
            up[life.replica] += life.gone - life.start
        return up

    def begin(self, initial: int) -> None:
        for i in range(initial):
            self.state[i] = "ready"
            self.current[i] = life = Life(i, 0.0, 0.0)
            self.lives.append(life)
        self.ready_curve.append((0.0, initial))

    def ready_ids(self) -> list[int]:
        return [i for i, s in enumerate(self.state) if s == "ready"]

    def count(self, *states: str) -> int:
        return sum(s in states for s in self.state)

    def start(self, now: float) -> int | None:
        i = next((i for i, s in enumerate(self.state) if s == "off"), None)
        if i is not None:
            self.state[i] = "starting"
            self.current[i] = life = Life(i, now)
            self.lives.append(life)
        return i

    def became_ready(self, i: int, now: float, life: Life) -> bool:
        if self.state[i] != "starting" or self.current.get(i) is not life:
            return False  # cancelled while it started (and perhaps started again since)
        self.state[i] = "ready"
        self.current[i].ready = now
        self._mark(now)
        return True

    def cancel_newest_starting(self, now: float) -> bool:
        starting = [i for i, s in enumerate(self.state) if s == "starting"]
        if not starting:
            return False
        i = max(starting, key=lambda k: self.current[k].start)
        self.state[i] = "off"
        life = self.current.pop(i)
        life.gone = max(now, life.start)
        return True

    def drain(self, i: int, now: float) -> None:
        self.state[i] = "draining"
        self.current[i].draining = now
        self._mark(now)

    def gone(self, i: int, at: float) -> None:
        self.state[i] = "off"
        self.current.pop(i).gone = at

    def _mark(self, now: float) -> None:
        n = self.count("ready")
        if self.ready_curve and self.ready_curve[-1][0] == now:
            self.ready_curve[-1] = (now, n)
        else:
            self.ready_curve.append((now, n))

    def close(self, end: float) -> None:
        for life in self.lives:
            if life.gone is None:
                life.gone = max(end, life.start)

    def check_accounted(self, done: list[int], total: int) -> None:
        """Ready + draining + gone replicas account for every request: each request was
        routed to a ready replica, and each replica ended every request routed to it."""
        if sum(self.routed) != total:
            raise RuntimeError(f"autoscaler: {sum(self.routed)} requests routed, {total} in the run")
        for i, (r, d) in enumerate(zip(self.routed, done, strict=True)):
            if r != d:
                raise RuntimeError(f"autoscaler: replica {i} was routed {r} requests and ended {d}")
        if self.count("draining", "starting"):
            raise RuntimeError("autoscaler: a replica was left draining or starting at the end")


def autoscale_summary(lc: Lifecycle, provisioning: dict, req, slo, end: float,
                      power: list[float | None] | None = None) -> dict:
    """Timeline, ready replicas over time, GPU-hours, and per window: requests, SLO
    attainment, mean ready replicas, p99 TTFT and TPOT (of the window's arrivals), and
    `power_w` (`power`: per window, from `window_power`; None where no power model)."""
    lc.close(end)
    replica_s = sum(life.gone - life.start for life in lc.lives)
    gpu_hours = replica_s * lc.gpus_per_replica / 3600
    peak = max(n for _, n in lc.ready_curve)
    win = lc.spec.window_s
    arrival = np.asarray(req["arrival_s"], dtype=float)
    status = np.asarray(req["status"], dtype=object)
    ok = status == "finished"
    for name in ("ttft_s", "tpot_s", "e2e_s"):
        limit = getattr(slo, name, None) if slo is not None else None
        if limit is not None:
            v = np.asarray(req[name], dtype=float)
            ok &= np.nan_to_num(v, nan=0.0) <= limit
    n_win = max(1, math.ceil(end / win))
    idx = np.minimum((arrival // win).astype(int), n_win - 1)
    offered = np.bincount(idx, minlength=n_win)
    met = np.bincount(idx, weights=ok.astype(float), minlength=n_win)
    p99 = {name: _window_p99(idx, np.asarray(req[name], dtype=float), n_win)
           for name in ("ttft_s", "tpot_s")}
    windows = []
    for k in range(n_win):
        lo, hi = k * win, min((k + 1) * win, end)
        windows.append({"start_s": lo, "requests": int(offered[k]),
                        "slo_attainment": float(met[k] / offered[k]) if offered[k] else None,
                        "mean_ready": _mean_ready(lc.ready_curve, lo, hi),
                        "ttft_p99_s": p99["ttft_s"][k], "tpot_p99_s": p99["tpot_s"][k],
                        "power_w": power[k] if power is not None else None})
    return {
        "policy": lc.spec.policy, "target": lc.spec.target,
        "min_replicas": lc.spec.min_replicas, "max_replicas": lc.spec.max_replicas,
        "scrape_s": lc.spec.scrape_s, "stabilization_s": lc.spec.stabilization_s,
        "provisioning": provisioning,
        "gpu_hours": gpu_hours,
        "replica_hours": replica_s / 3600,
        "gpus_per_replica": lc.gpus_per_replica,
        "peak_ready": peak,
        "static_peak_gpu_hours": peak * lc.gpus_per_replica * end / 3600,
        "slo_attainment": float(ok.mean()) if len(ok) else None,
        "timeline": [{"replica": life.replica, "start_s": life.start, "ready_s": life.ready,
                      "draining_s": life.draining, "gone_s": life.gone} for life in lc.lives],
        "ready_over_time": [[t, n] for t, n in lc.ready_curve],
        "windows": windows,
    }


def _mean_ready(curve: list[tuple[float, int]], lo: float, hi: float) -> float:
    """The time-average of the ready count over [lo, hi] (a step function)."""
    if hi <= lo:
        return float(curve[-1][1])
    total = 0.0
    for k, (t, n) in enumerate(curve):
        t_next = curve[k + 1][0] if k + 1 < len(curve) else math.inf
        a, b = max(t, lo), min(t_next, hi)
        if b > a:
            total += n * (b - a)
    return total / (hi - lo)


def _window_p99(idx: np.ndarray, v: np.ndarray, n_win: int) -> list[float | None]:
    """The p99 of `v` (NaN left out) over each window's arrivals; None for none."""
    keep = ~np.isnan(v)
    idx, v = idx[keep], v[keep]
    order = np.lexsort((v, idx))
    idx, v = idx[order], v[order]
    cuts = np.searchsorted(idx, np.arange(n_win + 1))
    return [float(np.percentile(v[a:b], 99)) if b > a else None
            for a, b in zip(cuts[:-1], cuts[1:], strict=True)]


def window_power(lc: Lifecycle, configs: list, kernel_s: list[float], steps: list[dict],
                 end: float) -> list[float | None] | None:
    """The fleet's mean power (W) per report window, by the power model of
    sim/costmodel/power.py: each GPU of a replica draws idle power while the replica is
    up (start to gone) and board - idle more while its kernels run. A replica's kernel
    seconds are known for the run as a whole; a window gets the share its steps' time
    falls in (derived: kernel time assumed proportional to step time within a replica).
    None when a GPU has no power model. Call after `close`."""
    win = lc.spec.window_s
    n_win = max(1, math.ceil(end / win))
    edges = np.minimum(np.arange(n_win + 1) * win, end)
    joules = np.zeros(n_win)
    for i, cfg in enumerate(configs):
        power = cfg.profile.facts.power
        if power is None:
            return None
        par = cfg.scenario.parallel
        gpus = par.tensor * par.pipeline
        up = np.zeros(n_win)
        for life in lc.lives:
            if life.replica == i:
                up += _overlap(edges, life.start, life.gone)
        busy = np.zeros(n_win)
        t0, t1 = steps[i]["t_start"], steps[i]["t_end"]
        if len(t0):
            until, total = _busy_until(edges, t0, t1)
            busy = np.diff(until)
            busy *= kernel_s[i] / total if total > 0 else 0.0
        joules += gpus * (power.idle_w * up + (power.board_w - power.idle_w) * busy)
    width = np.diff(edges)
    return [float(j / w) if w > 0 else None for j, w in zip(joules, width, strict=True)]


def _overlap(edges: np.ndarray, a: float, b: float) -> np.ndarray:
    """Seconds of [a, b) inside each window [edges[k], edges[k+1])."""
    return np.clip(np.minimum(edges[1:], b) - np.maximum(edges[:-1], a), 0.0, None)


def _busy_until(edges: np.ndarray, t0, t1, block: int = 1 << 20) -> tuple[np.ndarray, float]:
    """Step seconds before each time in `edges` (steps are back to back or apart, in order),
    and all steps' seconds. `t0`, `t1` are arrays or a spilled step log's disk columns
    (sim/io/spill.py), read `block` rows at a time; the running sum is carried from block
    to block in the same order as one `np.cumsum`, so the figures are the same bits."""
    n = len(t0)
    out = np.zeros(len(edges))
    carry = 0.0
    for lo in range(0, n, block):
        hi = min(n, lo + block)
        a, b = np.asarray(t0[lo:hi], dtype=float), np.asarray(t1[lo:hi], dtype=float)
        d = b - a
        cum = np.cumsum(np.concatenate(([carry], d)))  # busy seconds before each step
        k = np.searchsorted(a, edges, side="right") - 1  # the last step started at or before
        later = float(t0[hi]) if hi < n else math.inf  # the next block's first start
        here = (k >= 0) & (edges < later)
        kk = k[here]
        out[here] = cum[kk] + np.clip(edges[here] - a[kk], 0.0, d[kk])
        carry = float(cum[-1])
    return out, carry
