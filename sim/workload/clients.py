"""Closed-loop clients, as benchmark tools run them: `workload.clients`.

C users, each sending its next request when its previous response ended (plus an
optional think time), instead of requests arriving on their own clock (open loop, the
default). This is how vLLM's `benchmarks/benchmark_serving.py --max-concurrency C`
(an asyncio semaphore of C around a fixed list of prompts), aiperf / genai-perf
`--concurrency C` and inference-perf's concurrency load drive a server.

```yaml
workload:
  clients:
    concurrency: 16          # C users
    requests_per_client: 20  # each user's measured requests (or workload.num_requests: one queue)
    warmup_requests: 16      # sent first, excluded from the metrics, marked in requests.csv
    drain_warmup: true       # measured requests wait until every warm-up one has ended
    think: {kind: exponential, mean_s: 2.0}   # or {kind: fixed, mean_s: 0.5}; none: 0
  duration_s: 600            # optional: no measured request sent after this window
  prompt: {kind: fixed, value: 512}
  output: {kind: fixed, value: 128}
  multi_turn: {turns: 4}     # optional: sessions whose turns resend the conversation so far
```

- A session is one request, or with `multi_turn` one conversation of `turns` requests
  sent one after another. With `requests_per_client` every user sends its own sessions
  (user k: measured sessions k, k + C, k + 2C, ...), as inference-perf's and Locust's
  users do; with `workload.num_requests` the sessions form one queue and a user takes
  the next when it has ended its previous one, as vLLM's benchmark does (a semaphore
  of C around its list of prompts). Warm-up sessions are always one queue.
- A user's next request goes out `think` seconds after its previous response ended;
  think times are drawn up front, one per request (the pause after it), from the run's
  generator, so they do not depend on the order in which the simulation visits users.
- Warm-up: the first `warmup_requests` requests of the queue (whole conversations with
  `multi_turn`); with `drain_warmup` no measured request is sent before the last
  warm-up request ended. The measured window runs from the first measured send to the
  last measured response; throughput = measured completions / window (vLLM's
  `benchmark_duration`), and latency statistics cover measured requests only.
- `workload.duration_s` with clients: no measured request is sent once the window is
  that long; the requests never sent leave no row.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from sim.io.specload import MAX_REQUESTS, MAX_TIME_S

_Problem = tuple[str, str] | None


@dataclass(frozen=True)
class ThinkSpec:
    """A user's pause between a response's end and its next request: fixed, or
    exponential (memoryless, as in the interactive-system model) with mean `mean_s`."""

    kind: Literal["fixed", "exponential"]
    mean_s: float = field(metadata={"ge": 0, "le": MAX_TIME_S})

    def draw(self, n: int, rng: np.random.Generator) -> np.ndarray:
        if self.kind == "fixed" or self.mean_s == 0:
            return np.full(n, float(self.mean_s))
        return rng.exponential(self.mean_s, size=n)


@dataclass(frozen=True)
class ClientsSpec:
    """The scenario's `workload.clients:` mapping (see the module docstring)."""

    concurrency: int = field(metadata={"ge": 1, "le": 10**6})
    requests_per_client: int | None = field(default=None, metadata={"ge": 1, "le": MAX_REQUESTS})
    warmup_requests: int = field(default=0, metadata={"ge": 0, "le": MAX_REQUESTS})
    drain_warmup: bool = True
    think: ThinkSpec | None = None

    def measured(self, num_requests: int | None) -> int | None:
        """Measured requests: C x requests_per_client, else the workload's num_requests."""
        if self.requests_per_client is not None:
            return self.concurrency * self.requests_per_client
        return num_requests

    def check(self) -> _Problem:
        if self.concurrency * (self.requests_per_client or 0) + self.warmup_requests > MAX_REQUESTS:
            return "requests_per_client", f"concurrency x requests_per_client + warmup_requests is over {MAX_REQUESTS:,} (allowed: fewer)"
        return None


@dataclass(frozen=True, eq=False)
class ClientPlan:
    """How a closed-loop run sends a workload's requests (built by `plan_clients`)."""

    concurrency: int
    sessions: tuple[tuple[int, ...], ...]  # request indices, in queue order; a session's in turn order
    warmup: np.ndarray  # bool [n]: excluded from the metrics
    think_s: np.ndarray  # float64 [n]: the user's pause after request i's response
    drain_warmup: bool
    window_s: float | None
    per_user: bool = False  # each user its own measured sessions (else one shared queue)  # no measured request sent once the measured window is this long

    def __post_init__(self) -> None:
        self.warmup.flags.writeable = False
        self.think_s.flags.writeable = False


def plan_clients(spec: ClientsSpec, n: int, turns: int | None, window_s: float | None,
                 rng: np.random.Generator) -> ClientPlan:
    """The queue of sessions for `n` requests: conversation c of a multi-turn workload is
    requests c, c + k, c + 2k, ... (k = n // turns, `sim/workload/prefixes.py`), so it
    holds whole conversations; `spec.warmup_requests` of them come first."""
    convs = max(1, n // turns) if turns else n
    sessions = tuple(tuple(range(c, n, convs)) for c in range(convs))
    warm = np.zeros(n, dtype=bool)
    count = 0
    for sess in sessions:
        if count >= spec.warmup_requests:
            break
        warm[list(sess)] = True
        count += len(sess)
    think = spec.think.draw(n, rng) if spec.think is not None else np.zeros(n)
    return ClientPlan(spec.concurrency, sessions, warm, think, spec.drain_warmup, window_s,
                      spec.requests_per_client is not None)
