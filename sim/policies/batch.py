"""Requests at run time, and the running batch with O(1)-per-step bookkeeping.

There is no prefill phase or decode phase in a request: it has tokens computed
and tokens wanted, and a step advances some of them. The running batch is the
set of requests that decode one token per decode step. Rather than touching
every request at every step (millions of Python operations on an hour-long
trace), the batch keeps a decode counter `D` and each member remembers the
counter and its token count when it joined; its current length, its KV blocks,
the step at which it finishes and the step at which it needs a new KV block
all follow from those two numbers. A step then costs O(1) plus O(events).
"""

from __future__ import annotations

import heapq

from sim.policies.stepkind import StepKind

WAITING, RUNNING, SWAPPED, FINISHED, REJECTED = "waiting", "running", "swapped", "finished", "rejected"
TRANSFERRING = "transferring"  # disaggregated: KV on its way from a prefill to a decode replica
_DECODE = StepKind.DECODE
_push, _pop = heapq.heappush, heapq.heappop


class Seq:
    """One request's run-time state."""

    __slots__ = (
        "rid", "arrival", "prompt", "output", "max_tokens", "generated", "state",
        "first_token_t", "finish_t", "sched_t", "preemptions", "d0", "g0", "t_join",
        "order", "epoch", "reserved", "last_token_t", "reject_reason", "cached_tokens",
        "prefix", "prefix_refs", "prefilled", "replica", "prefill_replica",
    )

    def __init__(self, rid: int, arrival: float, prompt: int, output: int, max_tokens: int):
        self.rid = rid
        self.arrival = arrival
        self.prompt = prompt
        self.output = output
        self.max_tokens = max_tokens
        self.generated = 0          # output tokens produced so far
        self.state = WAITING
        self.first_token_t = -1.0
        self.finish_t = -1.0
        self.sched_t = -1.0         # first time the request was scheduled
        self.preemptions = 0
        self.d0 = 0                 # decode counter when it joined the running batch
        self.g0 = 0                 # tokens generated when it joined
        self.t_join = 0.0           # when its last token before joining was produced
        self.order = 0              # admission order (for picking preemption victims)
        self.epoch = 0              # bumped when it leaves the batch (stale heap entries)
        self.reserved = 0           # KV slots held outside the lazy formula (contiguous, swap)
        self.last_token_t = -1.0    # when its latest token was produced (set on leave)
        self.reject_reason = ""
        self.cached_tokens = 0      # prompt tokens served from the prefix cache
        self.prefix = None          # prefix-block hashes, when the workload has them
        self.prefix_refs = []       # prefix-cache blocks this request references
        self.prefilled = 0          # tokens of the current (re)prefill computed so far
        self.replica = 0            # index of the replica that serves (finishes) it
        self.prefill_replica = -1   # disaggregated: the replica that ran its prefill

    @property
    def tokens_to_prefill(self) -> int:
        """A (re)prefill recomputes the prompt and everything generated so far."""
        return self.prompt + self.generated


class RunningBatch:
    """Requests decoding together; all bookkeeping O(1) per decode step."""

    def __init__(self, block_size: int, paged: bool, keep_finished: bool = False,
                 extra_blocks: int = 0):
        self.bs = block_size
        self.extra_blocks = extra_blocks    # a member's sliding-window blocks (PagedKV's)
        self.paged = paged
        self.keep_finished = keep_finished  # static batching: finished rows stay as padding
        self.D = 0                          # decode steps taken
        self.members: dict[Seq, None] = {}  # insertion order = admission order
        self.n_compute = 0                  # rows computed per decode step (members + padding)
        self.s0 = 0                         # sum over rows of (len at join - d0)
        self.s0_live = 0                    # the same over members only (no padding rows)
        self.phase = [0] * block_size       # rows needing a new block when D % bs == phase
        self.finish_heap: list[tuple[int, int, int, Seq]] = []
        self.len_heap: list[tuple[int, int, int, Seq]] = []  # max-heap of (len at join - d0)
        self.fresh: dict[float, int] = {}   # t_join -> rows whose last token came from a prefill
        self.last_decode_end = 0.0
        self._order = 0

    # --- derived quantities -------------------------------------------------
    def __len__(self) -> int:
        return len(self.members)

    def generated(self, s: Seq) -> int:
        return s.g0 + self.D - s.d0

    def sum_ctx(self) -> int:
        """Tokens attended over by the next decode step (each row's full length)."""
        return self.s0 + self.n_compute * self.D

    def max_ctx(self) -> int:
        """The longest member's length (finished static rows no longer count)."""
        heap = self.len_heap
        while heap:
            key, _, epoch, s = heap[0]
            if epoch == s.epoch and s in self.members:
                return self.D - key
            heapq.heappop(heap)
        return 0

    def kv_tokens(self) -> int:
        """Tokens whose keys and values are stored now for live members."""
        n = len(self.members)
        return self.s0_live + n * (self.D - 1)

    def held_blocks(self, s: Seq) -> int:
        """KV blocks a paged member holds between steps (its window's too)."""
        return -(-(s.prompt + self.generated(s) - 1) // self.bs) + self.extra_blocks

    def lookahead(self) -> int:
        """Slots a decode step writes per sequence."""
        return 1

    def new_blocks_needed(self, lookahead: int = 0) -> int:
        """Blocks the next decode step must allocate (paged; the lookahead is always 1)."""
        return self.phase[self.D % self.bs] if self.paged else 0

    def needs_block(self, s: Seq) -> bool:
        return self.paged and (s.prompt + self.generated(s) - 1) % self.bs == 0

    def join_growth(self, s: Seq) -> int:
        """Blocks a request outside the batch would gain in its first step after joining."""
        return int(self.paged and (s.prompt + s.generated - 1) % self.bs == 0)

    def last_token_time(self, s: Seq) -> float:
        return self.last_decode_end if self.D > s.d0 else s.t_join

    # --- membership -----------------------------------------------------------
    def join(self, s: Seq, now: float) -> None:
        """`s` just produced a token at `now` (end of its prefill) and decodes from here."""
        D, g = self.D, s.generated
        s.d0, s.g0, s.t_join = D, g, now
        order = self._order = self._order + 1
        s.order = order
        s.state = RUNNING
        self.members[s] = None
        self.n_compute += 1
        length = s.prompt + g
        self.s0 += length - D
        self.s0_live += length - D
        if self.paged:
            self.phase[(D - length + 1) % self.bs] += 1
        epoch = s.epoch
        _push(self.finish_heap, (D + s.output - g, order, epoch, s))
        _push(self.len_heap, (D - length, order, epoch, s))
        fresh = self.fresh
        fresh[now] = fresh.get(now, 0) + 1

    def leave(self, s: Seq) -> None:
        """Remove a member (preempted or swapped out); materialises its counters."""
        g = self.generated(s)
        s.last_token_t = self.last_token_time(s)
        if self.D == s.d0:
            self.fresh[s.t_join] -= 1
        self._drop(s)
        s.generated = g
        s.epoch += 1

    def _drop(self, s: Seq, keep_row: bool = False) -> None:
        del self.members[s]
        if self.paged:
            self.phase[(s.d0 - s.prompt - s.g0 + 1) % self.bs] -= 1
        self.s0_live -= s.prompt + s.g0 - s.d0
        if not keep_row:
            self.n_compute -= 1
            self.s0 -= s.prompt + s.g0 - s.d0

    # --- one decode step ----------------------------------------------------
    def advance(self, t_end: float, gaps: list[float], weights: list[int]) -> list[Seq]:
        """Every member gains one token at `t_end`; returns the members that finished.

        Appends this step's inter-token gaps to (gaps, weights) in weighted form.
        (Called at every step that finishes a request: `_drop` inlined for a plain batch.)
        """
        n_fresh = 0
        fresh = self.fresh
        if fresh:
            for t_join, cnt in fresh.items():
                if cnt:
                    gaps.append(t_end - t_join)
                    weights.append(cnt)
                    n_fresh += cnt
            fresh.clear()
        members = self.members
        n_cont = len(members) - n_fresh
        if n_cont:
            gaps.append(t_end - self.last_decode_end)
            weights.append(n_cont)
        D = self.D = self.D + 1
        self.last_decode_end = t_end
        done = []
        heap = self.finish_heap
        if not heap or heap[0][0] > D:
            return done
        keep, paged = self.keep_finished, self.paged
        while heap and heap[0][0] <= D:
            _, _, epoch, s = _pop(heap)
            if epoch != s.epoch or s.state != RUNNING:
                continue
            s.generated = s.output
            s.finish_t = t_end
            s.epoch += 1
            if keep or not paged:
                self._drop(s, keep_row=keep)
            else:  # _drop(s)
                del members[s]
                self.phase[(s.d0 - s.prompt - s.g0 + 1) % self.bs] -= 1
                length = s.prompt + s.g0 - s.d0
                self.s0_live -= length
                self.n_compute -= 1
                self.s0 -= length
            done.append(s)
        return done

    def end_round(self, n: int) -> tuple[StepKind, int, int]:
        """After a decode step of `n` rows: (its step kind, tokens, KV blocks to give
        back). A plain decode step: DECODE, one token a row, nothing back."""
        return _DECODE, n, 0

    def clear_padding(self) -> None:
        """End of a static batch: drop the finished rows that were kept as padding."""
        if self.members:
            raise RuntimeError("clear_padding with live members")
        self.n_compute = 0
        self.s0 = 0
