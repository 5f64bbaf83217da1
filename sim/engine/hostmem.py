"""Host memory a run needs, known before it starts.

A run keeps every request (its record, its row of the request table, its share of the
CSV being written) and every iteration of every replica (its step-log row) in memory.
Both costs were measured (`benchmarks/speed/host_memory.py`: peak RSS of `llmsim run` on
quickstart at 1,000 to 24,000 requests, fitted as base + per request + per iteration):
about 1.75 KB per request and 175 B per iteration by least squares (1.75-2.4 KB and
90-175 B from pairs of points; issue 19 quotes ~150 B per iteration). A run
whose estimate is over the memory available is refused before anything is generated
or simulated, in one line, instead of a MemoryError after minutes.
A fleet simulated replica by replica (sim/engine/split.py: round robin, random) keeps
its requests as records on disk, not objects: its floor per request is PER_RECORD_B.

The estimate is a floor, so that no run that fits is refused: the measured costs rounded
down, and the fewest iterations the workload allows (every replica decoding its largest
batch, `max_num_seqs` sequences x (1 + speculative tokens) per step).

    check_host_memory(sc)                  before the workload is generated: requests only
    check_host_memory(sc, output_tokens)   once it is: requests and iterations

Available memory: MemAvailable of /proc/meminfo (Linux; elsewhere no check), or
LLMSIM_MEMORY_LIMIT_GIB (a number of GiB; `off` runs whatever the estimate says).
"""

from __future__ import annotations

import os

from sim.config.scenario import Scenario
from sim.engine.recorder import MEMORY_ROWS
from sim.engine.splitrule import may_split
from sim.io.specload import SpecError

PER_REQUEST_B = 1500  # measured 1.75-2.4 KB (benchmarks/speed/host_memory.py), rounded down: a floor
# a fleet simulated replica by replica (sim/engine/split.py) keeps its requests as records
# on disk: in memory only the workload's columns and the split's (arrival, prompt, output,
# max tokens, clock, instant, replica, row: 8 x 8 B), derived; a floor
PER_RECORD_B = 64
PER_ITERATION_B = 90  # measured 90-175 B per step-log row, the low end: a floor
BASE_B = 60 * 2**20  # interpreter, numpy, model and profile tables (measured 56-76 MiB)
ENV = "LLMSIM_MEMORY_LIMIT_GIB"


def available_bytes() -> int | None:
    """The memory a run may use: LLMSIM_MEMORY_LIMIT_GIB, else MemAvailable; None: no
    check (`off`, or no /proc/meminfo)."""
    limit = os.environ.get(ENV, "").strip()
    if limit:
        if limit.lower() in ("off", "none", "0"):
            return None
        try:
            return int(float(limit) * 2**30)
        except ValueError:
            raise SpecError(ENV, "", f"{limit!r} is not a number of GiB (allowed: e.g. 64, or off)") from None
    return meminfo_available()


def meminfo_available() -> int | None:
    """MemAvailable from /proc/meminfo in bytes; None where there is none (not Linux)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def expected_requests(sc: Scenario) -> int | None:
    """Requests the workload will hold, from its spec (None: a trace, known once read)."""
    w = sc.workload
    if w.trace is not None:
        return w.trace.limit or None
    n = w.num_requests
    if w.duration_s is not None and w.arrival is not None and getattr(w.arrival, "rate", None):
        by_time = int(w.duration_s * w.arrival.rate)
        n = by_time if n is None else min(n, by_time)
    return n


def _widest_step(sc: Scenario) -> int:
    """The most tokens any replica decodes in one step: max_num_seqs x (1 + draft tokens)."""
    widths, drafts = [sc.scheduler.max_num_seqs], [sc.speculative.k if sc.speculative.method != "none" else 0]
    for g in (sc.cluster.groups if sc.cluster is not None else []):  # a group's patches
        seqs = (g.scheduler or {}).get("max_num_seqs")
        widths += [seqs] if isinstance(seqs, int) else []
        k = (getattr(g, "speculative", None) or {}).get("k", sc.speculative.k)
        drafts += [k] if isinstance(k, int) and (getattr(g, "speculative", None) or {}).get("method") else []
    return max(1, max(widths)) * (1 + max(drafts))


def estimate_bytes(requests: int, output_tokens: int = 0, widest_step: int = 1,
                   per_request: int = PER_REQUEST_B) -> int:
    """A floor on a run's peak memory: base + per request + per iteration (the fewest)."""
    iterations = -(-output_tokens // max(1, widest_step))
    iterations = min(iterations, MEMORY_ROWS)  # past these, a run's steps go to disk
    return BASE_B + per_request * requests + PER_ITERATION_B * iterations


def check_host_memory(sc: Scenario, requests: int | None = None, output_tokens: int = 0) -> None:
    """Refuse (SpecError, one line) a run whose memory floor is over what is available."""
    n = requests if requests is not None else expected_requests(sc)
    if not n:
        return
    avail = available_bytes()
    if avail is None:
        return
    per = PER_RECORD_B if may_split(sc) else PER_REQUEST_B
    need = estimate_bytes(n, output_tokens, _widest_step(sc) if output_tokens else 1, per)
    if need > avail:
        what = f"{n:,} requests" + (f" and {output_tokens:,} output tokens" if output_tokens else "")
        raise SpecError(sc.file or "<scenario>", "workload.num_requests",
                        f"{what} need at least {need / 2**30:.1f} GiB of memory (estimate: "
                        f"{per:,} B per request, {PER_ITERATION_B} B per iteration) "
                        f"and {avail / 2**30:.1f} GiB is available (allowed: fewer requests, or "
                        f"{ENV}=<GiB> to run anyway)")
