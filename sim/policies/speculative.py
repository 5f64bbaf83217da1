"""Speculative decoding as run-time state: a cheap proposer drafts k tokens per
sequence, one batched target forward verifies them, and each sequence keeps the
accepted prefix plus the target's own next token.

Per round, for the n running sequences:
* draft: `draft_model` runs k sequential decode steps of a small model (its own
  KV cache takes memory; costed from the profile at the same batch and
  contexts); `self_draft` (EAGLE/Medusa-style heads) costs `draft_cost` of a
  target decode step per drafted token; `ngram` (prompt lookup) costs nothing on
  the GPU; `mtp` (DeepSeek-V3's multi-token-prediction module as the proposer, as SGLang
  and vLLM run it) costs one extra MTP layer per drafted token: one decoder layer of the
  target, its projection of [hidden; embedding] (2·hidden → hidden) and the shared LM head,
  at the batch's n rows (`StepLatency.mtp_ms`, derived from the target's own lookups); its
  weights and one layer of KV count in memory. Acceptance is stated by the scenario:
  DeepSeek-V3's report (arXiv 2412.19437, §5.4.3) measures 85-90 % acceptance of the
  second token (k = 1) across generation topics, 1.8x the decoding TPS.
* verify: one target forward over k+1 query tokens per sequence (GEMMs at
  M = n(k+1), attention of k+1 queries over each cached context, LM head on
  every query row).
* accept: draft token j is accepted with probability alpha (per request, or
  per position); a sequence keeps the accepted prefix A and the target's token,
  A + 1 tokens, never past its output length. KV is allocated for all k+1
  positions before the round and the rejected positions are rolled back after.

Mean tokens per round with per-token acceptance alpha is
    E = (1 - alpha^(k+1)) / (1 - alpha)      (3.69 at alpha = 0.8, k = 5),
the accepted drafts plus the bonus token. Some texts quote (1 - alpha^k)/(1 - alpha)
(3.36 there): that is the expected accepted drafts plus one when the bonus token
is not counted for rounds where all k are accepted, i.e. a k-1 draft window. The
speed-up over plain decoding at a batch where a verify costs about one decode
step is E / (k c + 1), c the draft-to-target step-cost ratio.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from sim.policies.batch import RUNNING, Seq
from sim.policies.plan import StepKind


@dataclass(frozen=True)
class AcceptanceSpec:
    # fixed: one rate; per_request: rates drawn per request from a Beta(mean, std);
    # per_position: rates[j] for draft position j; trace: the trace's `acceptance` column
    kind: Literal["fixed", "per_request", "per_position", "trace"] = "fixed"
    alpha: float = field(default=0.8, metadata={"ge": 0, "le": 1})
    mean: float = field(default=0.8, metadata={"gt": 0, "lt": 1})
    std: float = field(default=0.1, metadata={"gt": 0})
    rates: tuple[float, ...] = ()

    def check(self):
        if self.kind == "per_position" and not self.rates:
            return "rates", "missing: one acceptance rate per draft position"
        if any(not 0 <= r <= 1 for r in self.rates):
            return "rates", "each rate must be in [0, 1]"
        if self.kind == "per_request" and self.std**2 >= self.mean * (1 - self.mean):
            return "std", f"too large for a Beta with mean {self.mean} (allowed: < {(self.mean * (1 - self.mean)) ** 0.5:.3f})"
        return None


@dataclass(frozen=True)
class SpeculativeSpec:
    method: Literal["none", "draft_model", "self_draft", "ngram", "mtp"] = "none"
    k: int = field(default=4, metadata={"gt": 0, "le": 16})
    draft_model: str | None = None       # draft_model: a models/ name
    draft_cost: float = field(default=0.05, metadata={"ge": 0})  # self_draft: per drafted token
    disable_above_batch: int | None = field(default=None, metadata={"gt": 0})  # plain decode above
    acceptance: AcceptanceSpec = AcceptanceSpec()

    def check(self):
        if self.method == "draft_model" and not self.draft_model:
            return "draft_model", "missing: the draft model's name (e.g. llama-3.2-1b)"
        if self.method != "draft_model" and self.draft_model:
            return "draft_model", f"only used with method: draft_model (method is {self.method})"
        if self.acceptance.kind == "per_position" and len(self.acceptance.rates) < self.k:
            return "acceptance.rates", f"needs at least k={self.k} rates"
        return None


class Speculator:
    """Acceptance draws, round costs and the statistics of a run."""

    def __init__(self, spec: SpeculativeSpec, lat, draft_lat, rng: np.random.Generator,
                 trace_alpha: np.ndarray | None):
        self.spec, self.k, self.lat, self.draft_lat, self.rng = spec, spec.k, lat, draft_lat, rng
        acc = spec.acceptance
        self.per_position = (np.array(acc.rates[: spec.k]) if acc.kind == "per_position"
                             else None)
        self.trace_alpha = trace_alpha
        self.rounds = self.proposed = self.accepted = self.emitted = self.seq_rounds = 0
        self.draft_s = self.verify_s = self.decode_s = 0.0
        self.kernel_s = 0.0  # GPU kernel seconds of the last round or decode step
        self.equiv_s = 0.0  # plain-decoding time for the tokens the rounds produced

    def alpha_for(self, s: Seq) -> float:
        acc = self.spec.acceptance
        if acc.kind == "per_request":
            c = acc.mean * (1 - acc.mean) / acc.std**2 - 1
            return float(self.rng.beta(acc.mean * c, (1 - acc.mean) * c))
        if acc.kind == "trace":
            return float(self.trace_alpha[s.rid])
        return acc.alpha

    def active(self, n: int) -> bool:
        lim = self.spec.disable_above_batch
        return lim is None or n <= lim

    def round_seconds(self, n: int, sum_ctx: int, max_ctx: int, rows: list[tuple[int, int]]) -> float:
        """Draft k tokens for n sequences, then verify k+1 per sequence."""
        k, sp = self.k, self.spec
        draft = kernel = 0.0
        if sp.method == "draft_model":
            for j in range(k):
                draft += self.draft_lat.decode(n, sum_ctx + j * n, max_ctx + j)
                kernel += self.draft_lat.kernel_s
        elif sp.method == "self_draft":
            draft = k * sp.draft_cost * self.lat.decode(n, sum_ctx, max_ctx)
            kernel = k * sp.draft_cost * self.lat.kernel_s
        elif sp.method == "mtp":  # the MTP layer once per drafted token, GPU time only
            for j in range(k):
                kernel += self.lat.mtp_ms(n, sum_ctx + j * n, max_ctx + j) * 1e-3
            draft = kernel
        verify = self.lat.verify_batch(n, k + 1, sum_ctx, max_ctx, rows)
        self.kernel_s = kernel + self.lat.kernel_s  # the round's GPU kernel seconds
        self.draft_s += draft
        self.verify_s += verify
        self.equiv_step = self.lat.decode(n, sum_ctx, max_ctx)
        return draft + verify

    def accept(self, alphas: np.ndarray) -> np.ndarray:
        """Accepted drafts per sequence: the length of the leading run of successes."""
        k = self.k
        rates = self.per_position[None, :] if self.per_position is not None else alphas[:, None]
        ok = self.rng.random((len(alphas), k)) < rates
        return np.where(ok.all(axis=1), k, np.argmin(ok, axis=1))

    def summary(self) -> dict:
        return summarize_speculators([self])


def summarize_speculators(specs: list[Speculator]) -> dict:
    """The run's speculative figures, the counters of every replica's speculator summed."""
    first = specs[0]
    total = {k: sum(getattr(s, k) for s in specs) for k in (
        "rounds", "proposed", "accepted", "emitted", "seq_rounds", "draft_s", "verify_s",
        "decode_s", "equiv_s")}
    spent = total["draft_s"] + total["verify_s"]
    return {
        "method": first.spec.method,
        "k": first.k,
        "rounds": total["rounds"],
        "acceptance_rate": total["accepted"] / total["proposed"] if total["proposed"] else 0.0,
        "tokens_per_round": total["emitted"] / (total["seq_rounds"] or 1),
        "time_s": {"draft": total["draft_s"], "verify": total["verify_s"],
                   "decode": total["decode_s"]},
        "speedup_vs_decode": total["equiv_s"] / spent if spent else 1.0,
    }


class SpecBatch:
    """The running batch under speculative decoding: members gain different numbers of
    tokens per round, so each keeps its own count (O(n) per round)."""

    def __init__(self, block_size: int, paged: bool, spec: Speculator, extra_blocks: int = 0):
        self.bs, self.paged, self.spec = block_size, paged, spec
        self.extra_blocks = extra_blocks  # a member's sliding-window blocks (PagedKV's)
        self.members: dict[Seq, None] = {}
        self.alpha: dict[Seq, float] = {}
        self.D = 0
        self.last_decode_end = 0.0
        self._order = 0
        self.keep_finished = False
        self.rolled_back = 0  # blocks the last round gave back (the engine frees them)
        self._la = 0  # this round's lookahead, fixed when the round is costed

    def __len__(self) -> int:
        return len(self.members)

    @property
    def n_compute(self) -> int:
        return len(self.members)

    def generated(self, s: Seq) -> int:
        return s.generated

    def sum_ctx(self) -> int:
        return sum(s.prompt + s.generated for s in self.members)

    def max_ctx(self) -> int:
        return max((s.prompt + s.generated for s in self.members), default=0)

    def kv_tokens(self) -> int:
        return self.sum_ctx() - len(self.members)

    def held_blocks(self, s: Seq) -> int:
        return -(-(s.prompt + s.generated - 1) // self.bs) + self.extra_blocks

    def lookahead(self) -> int:
        """Slots a round writes per sequence: its last token and k drafts (or 1 plain)."""
        return self.spec.k + 1 if self.spec.active(len(self.members)) else 1

    def needs_block(self, s: Seq, la: int = 0) -> int:
        """Blocks `s` must gain before the round to hold its lookahead slots."""
        if not self.paged:
            return 0
        length = s.prompt + s.generated
        return (-(-(length - 1 + (la or self.lookahead())) // self.bs) + self.extra_blocks
                - self.held_blocks(s))

    def join_growth(self, s: Seq) -> int:
        """Blocks a request outside the batch would gain in its first round after joining."""
        return self.needs_block(s, self.spec.k + 1) if self.paged else 0

    def new_blocks_needed(self, lookahead: int = 0) -> int:
        """Blocks the next round takes, at `lookahead` slots per sequence (0: the batch's
        own, from its size now)."""
        if not self.paged:
            return 0
        la = lookahead or self.lookahead()
        return sum(self.needs_block(s, la) for s in self.members)

    def join(self, s: Seq, now: float) -> None:
        self._order += 1
        s.order = self._order
        s.state = RUNNING
        s.last_token_t = now
        self.members[s] = None
        if s not in self.alpha:
            self.alpha[s] = self.spec.alpha_for(s)

    def leave(self, s: Seq) -> None:
        del self.members[s]
        s.epoch += 1

    def seconds(self, lookahead: int = 0) -> float:
        """Cost the next round, at `lookahead` slots per sequence (0: the batch's own)."""
        n = len(self.members)
        self._la = lookahead or self.lookahead()
        sum_ctx, max_ctx = self.sum_ctx(), self.max_ctx()
        if self._la == 1:
            t = self.spec.lat.decode(n, sum_ctx, max_ctx)
            self.spec.decode_s += t
            self.spec.kernel_s = self.spec.lat.kernel_s
            return t
        rows = [(self.spec.k + 1, s.prompt + s.generated - 1) for s in self.members]
        return self.spec.round_seconds(n, sum_ctx, max_ctx, rows)

    def end_round(self, n: int) -> tuple[StepKind, int, int]:
        """After a round of `n` rows: (VERIFY, or DECODE when the round ran as plain
        decode; tokens computed; KV blocks its rejected drafts give back)."""
        rolled, self.rolled_back = self.rolled_back, 0
        la = self._la
        return (StepKind.VERIFY if la > 1 else StepKind.DECODE), n * la, rolled

    def advance(self, t_end: float, gaps: list[float], weights: list[int]) -> list[Seq]:
        """One round ends at `t_end`; returns the members that finished."""
        members = list(self.members)
        sp = self.spec
        la = self._la
        active = la > 1
        if active:
            acc = sp.accept(np.array([self.alpha[s] for s in members]))
            sp.rounds += 1
            sp.proposed += sp.k * len(members)
            sp.accepted += int(acc.sum())
        done, freed, emitted = [], 0, 0
        for i, s in enumerate(members):
            before = self.held_blocks(s) + self.needs_block(s, la) if self.paged else 0
            gain = min(int(acc[i]) + 1 if active else 1, s.output - s.generated)
            s.generated += gain
            emitted += gain
            gaps.append(t_end - s.last_token_t)  # one streamed chunk of `gain` tokens
            weights.append(1)
            s.last_token_t = t_end
            if self.paged:  # roll back the slots of rejected drafts
                freed += before - self.held_blocks(s)
            if s.generated >= s.output:
                s.finish_t = t_end
                del self.members[s]
                s.epoch += 1
                done.append(s)
        if active:
            sp.emitted += emitted
            sp.seq_rounds += len(members)
            sp.equiv_s += emitted / len(members) * sp.equiv_step
        self.rolled_back = freed
        self.D += 1
        self.last_decode_end = t_end
        return done
