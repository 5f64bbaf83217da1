"""What one replica sustains: SLO checks, a steady-state throughput measure, and the
bisection on the request rate that `llmsim plan` and `llmsim curve` share.

A probe runs the scenario at one Poisson rate for several seeds, each run long enough
to reach steady state (`sim/planning/steady.py`: warm-up discarded, doubled until the
p99s of the measured window's two halves agree and completions keep up, or it clearly
fails). It passes when every seed (or `need` of them) meets the SLOs over its window:
* p99 TTFT, p99 TPOT, p99 E2E under their bounds, and the share of requests meeting
  all of them (goodput) at least `goodput_min`, over finished requests;
* no request rejected;
* the run reached steady state;
* steady throughput at least `min_throughput_ratio` (default 0.9, the same bound as the
  curve's knee) of offered load. Steady throughput counts completions while the
  measured window's arrivals come in, divided by those arrivals (`steady_throughput`
  without a probe's window: the middle half of the arrivals); an overloaded replica
  completes at its service rate whatever the offered load, while the drain at the end
  of a finite run, which makes whole-run throughput look low, is left out.
The bisection brackets the highest passing rate geometrically (doubling or halving from
`rate_start`), then halves the bracket in log space until hi/lo <= 1 + rel_tol. The
answer is the highest rate where every seed passed; the spread across seeds at that
rate is reported with it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from sim.planning.steady import not_steady
from sim.policies.batch import FINISHED


@dataclass(frozen=True)
class SLO:
    ttft_p99_s: float | None = field(default=None, metadata={"gt": 0})
    tpot_p99_s: float | None = field(default=None, metadata={"gt": 0})
    e2e_p99_s: float | None = field(default=None, metadata={"gt": 0})
    goodput_min: float | None = field(default=None, metadata={"gt": 0, "le": 1})
    # on by default: probes run >= 60 s of traffic, where the window count is within a few %
    min_throughput_ratio: float | None = field(default=0.9, metadata={"ge": 0, "le": 1})

    def check(self):
        if all(v is None for v in (self.ttft_p99_s, self.tpot_p99_s, self.e2e_p99_s, self.goodput_min)):
            return "ttft_p99_s", "give at least one of ttft_p99_s, tpot_p99_s, e2e_p99_s, goodput_min"
        return None

    def bounds(self) -> dict[str, float | None]:
        """metric -> p99 bound (None: unbounded), as the steady rule reads them."""
        return {"ttft_s": self.ttft_p99_s, "tpot_s": self.tpot_p99_s, "e2e_s": self.e2e_p99_s}

    def as_scenario_slo(self) -> dict:
        """The per-request bounds, as a scenario's `slo:` (goodput counts against them)."""
        return {k: v for k, v in (("ttft_s", self.ttft_p99_s), ("tpot_s", self.tpot_p99_s),
                                  ("e2e_s", self.e2e_p99_s)) if v is not None}


def steady_throughput(req: pd.DataFrame) -> dict[str, float]:
    """Offered and achieved request rates over the middle half of the arrivals."""
    if len(req) < 8:
        return {"offered_rate": float("nan"), "achieved_rate": float("nan"), "ratio": float("nan")}
    t0, t1 = np.percentile(req.arrival_s.to_numpy(dtype=float), [25, 75])
    width = max(t1 - t0, 1e-12)
    arrived = int(((req.arrival_s >= t0) & (req.arrival_s < t1)).sum())
    fin = req.finish_s[req.status == FINISHED]
    done = int(((fin >= t0) & (fin < t1)).sum())
    return {"offered_rate": arrived / width, "achieved_rate": done / width,
            "ratio": done / arrived if arrived else float("nan")}


def violations(summary: dict, slo: SLO) -> list[str]:
    """What a run's summary breaks, in words ('p99 TTFT 2.31 s > 2 s'); empty if none.
    A run stopped once its failure was certain (sim/planning/probestop.py) says what was
    certain and when it stopped: its figures are the finished requests' so far."""
    if summary.get("stopped"):
        return [stopped_words(summary["stopped"])]
    out = []
    for key, bound, label in (("ttft_s", slo.ttft_p99_s, "TTFT"), ("tpot_s", slo.tpot_p99_s, "TPOT"),
                              ("e2e_s", slo.e2e_p99_s, "E2E")):
        if bound is None:
            continue
        v = summary[key]["p99"]
        if v is None or v > bound:
            out.append(f"p99 {label} {_s(v)} > {bound:g} s")
    gp = summary.get("goodput")
    if slo.goodput_min is not None and gp is not None and gp["fraction_met"] < slo.goodput_min:
        out.append(f"goodput {gp['fraction_met']:.1%} < {slo.goodput_min:.1%}")
    if summary["requests"]["rejected"]:
        out.append(f"{summary['requests']['rejected']} rejected")
    ratio = summary.get("steady", {}).get("ratio")
    if slo.min_throughput_ratio is not None and ratio is not None and not math.isnan(ratio) \
            and ratio < slo.min_throughput_ratio:
        out.append(f"steady throughput {ratio:.0%} of offered < {slo.min_throughput_ratio:.0%}")
    unsteady = not_steady(summary)
    if unsteady and not out:
        out.append(unsteady)
    return out


def stopped_words(st: dict) -> str:
    """A stopped run's violation: 'p99 TTFT > 3 s certain (12 of 1080 window requests over
    it; stopped at 21 s of 60 s of arrivals, 812 requests unfinished)'; a fleet stopped
    between replicas says after how many ('stopped after 1 of 3 replicas, 10560 requests
    not simulated)')."""
    why, detail = (st["reason"][:-1], "; ") if st["reason"].endswith(")") else (st["reason"], " (")
    if "replicas_run" in st:  # a fleet simulated replica by replica (sim/planning/fleetstop.py)
        return (f"{why}{detail}stopped after {st['replicas_run']} of {st['replicas']} replicas, "
                f"{st['unfinished']} requests not simulated)")
    return (f"{why}{detail}stopped at {st['at_s']:.3g} s of {st['last_arrival_s']:.3g} s of arrivals, "
            f"{st['unfinished']} requests unfinished)")


def _s(v) -> str:
    return "-" if v is None else f"{v:.4g} s"


def rate_overrides(arrival, rate: float, requests: int) -> dict:
    """Overrides that run a scenario at `rate` req/s for `requests` requests. Trace or
    constant arrivals become Poisson (a trace then lends its lengths, in order)."""
    kind = arrival.kind if arrival is not None and arrival.kind in ("poisson", "gamma") else "poisson"
    spec = {"kind": kind, "rate": float(rate)}
    if kind == "gamma":
        spec["cv"] = arrival.cv
    return {"workload.arrival": spec, "workload.num_requests": int(requests), "workload.duration_s": None}


@dataclass
class Probe:
    rate: float
    passed: bool
    seeds_passed: int
    seeds_run: int
    summaries: list[dict]
    broke: list[str]  # the first failing seed's violations


def probe(run_at, rate: float, seeds: list[int], slo: SLO, need: int) -> Probe:
    """Run seeds at `rate` until the verdict is known (`need` passes, or too many fails)."""
    summaries, passed, broke = [], 0, []
    for i, seed in enumerate(seeds):
        s = run_at(rate, seed)
        summaries.append(s)
        v = violations(s, slo)
        passed += not v
        broke = broke or v
        if passed >= need or (len(seeds) - i - 1) + passed < need:
            break
    return Probe(rate, passed >= need, passed, len(summaries), summaries, broke)


@dataclass
class Capacity:
    rate: float  # highest probed rate that passed (0 if none)
    fail_rate: float | None  # lowest probed rate that failed (None: never failed up to rate_max)
    at_rate: Probe | None
    at_fail: Probe | None
    probes: list[Probe]

    def spread(self, key: str = "ttft_s") -> tuple[float, float] | None:
        """Min and max p99 of `key` across the seeds run at the sustained rate."""
        if self.at_rate is None:
            return None
        vals = [s[key]["p99"] for s in self.at_rate.summaries if s[key]["p99"] is not None]
        return (min(vals), max(vals)) if vals else None


# the other seeds of a lazy search run at every passing rate from this share of the answer up
LAZY_BELOW = 0.5


def max_rate(run_at, slo: SLO, seeds: list[int], need: int | None = None, rate_start: float = 4.0,
             rate_min: float = 0.05, rate_max: float = 1024.0, rel_tol: float = 0.08,
             max_probes: int = 16, lazy: bool = True) -> Capacity:
    """Bisection (in log rate) for the highest rate whose probe passes.

    `lazy` (when every seed must pass): the search runs the first seed of each probe, then
    the other seeds at each rate it passed from LAZY_BELOW (half) of its answer up, lowest
    first. Where they pass too, that is the exhaustive search's answer and path whenever a
    seed passing at a rate also passes at half that rate and below (what the bisection
    already assumes of the rate, over a factor of 2 at most): a first seed that fails
    decides a probe either way. At the first passing rate where another seed fails, and
    at the passing rates below it down to one where every seed passes (the split: the
    lowest of them that fails), the exhaustive search's path leaves this one: the search runs again, as before
    up to the split, which now fails, and from there every probe runs every seed (every run
    made is kept, so nothing runs twice). The answer's probe and the first failing rate's
    are the exhaustive search's; passing probes under half the answer list their first
    seed only (`runs` counts the runs made)."""
    need = len(seeds) if need is None else need
    done: dict[tuple[float, int], dict] = {}

    def run(rate: float, seed: int) -> dict:
        if (rate, seed) not in done:
            done[(rate, seed)] = run_at(rate, seed)
        return done[(rate, seed)]

    args = (rate_start, rate_min, rate_max, rel_tol, max_probes)
    if not lazy or len(seeds) < 2 or need < len(seeds):
        return _bisect(lambda r: probe(run, r, seeds, slo, need), *args)
    first = _bisect(lambda r: probe(run, r, seeds[:1], slo, 1), *args)  # the first seed only
    passes = [i for i, p in enumerate(first.probes) if p.passed]  # rising in rate and in time
    known: dict[float, Probe] = {}
    split = None  # the first passing probe (in order) where another seed fails
    for i in passes:  # every seed, at each passing rate from LAZY_BELOW x the answer up
        r = first.probes[i].rate
        if r >= LAZY_BELOW * first.rate:
            known[r] = probe(run, r, seeds, slo, need)
            if not known[r].passed:
                split = i
                break
    below = [i for i in passes if split is not None and i < split]
    for i in reversed(below):  # a seed failing there may fail lower down: down to a pass
        r = first.probes[i].rate
        if r not in known:
            known[r] = probe(run, r, seeds, slo, need)
        if known[r].passed:
            break
        split = i
    if split is None:  # every seed passes there: taken to pass at the lower rates too
        return _swap(first, known)
    # the exhaustive search's path is this one up to `split`, which fails: from there on,
    # every probe runs every seed (the runs made so far kept)
    made = [0]

    def probe_at(r: float) -> Probe:
        made[0] += 1
        if r in known:
            return known[r]
        if made[0] <= split:  # before the split: as the first search went
            return probe(run, r, seeds[:1], slo, 1)
        return probe(run, r, seeds, slo, need)
    return _swap(_bisect(probe_at, *args), known)


def _swap(cap: Capacity, known: dict[float, Probe]) -> Capacity:
    """`cap` with its probes at the rates every seed ran at replaced by those full probes."""
    cap.probes = [known.get(p.rate, p) for p in cap.probes]
    cap.at_rate = known.get(cap.at_rate.rate, cap.at_rate) if cap.at_rate else None
    cap.at_fail = known.get(cap.at_fail.rate, cap.at_fail) if cap.at_fail else None
    return cap


def _bisect(probe_at, rate_start: float, rate_min: float, rate_max: float, rel_tol: float,
            max_probes: int) -> Capacity:
    probes: list[Probe] = []
    lo: Probe | None = None
    hi: Probe | None = None
    r = rate_start
    while len(probes) < max_probes:
        p = probe_at(r)
        probes.append(p)
        if p.passed:
            lo = p if lo is None or p.rate > lo.rate else lo
        else:
            hi = p if hi is None or p.rate < hi.rate else hi
        if lo is None:
            if r / 2 < rate_min:
                break
            r = r / 2
        elif hi is None:
            if r * 2 > rate_max:
                break
            r = r * 2
        elif hi.rate / lo.rate <= 1 + rel_tol:
            break
        else:
            r = math.sqrt(lo.rate * hi.rate)
    return Capacity(lo.rate if lo else 0.0, hi.rate if hi else None, lo, hi, probes)
