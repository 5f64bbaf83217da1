"""A run of plain decode steps, finished in one tight loop between the events others see.

Between the events that change a replica's batch from outside (an arrival, a KV hand-off,
a router report, a client told of an end), a batch that only decodes changes in ways known
in advance: each step every row gains one token (the batch's decode counter `D` moves on),
a row's new KV block falls due when `D` reaches its phase, a request finishes at the step
its entry in the finish heap names. `decode_run` runs such steps one after another on the
replica's own clock, as `Replica.start` and `Replica.finish` would for the plan the policy
returned, but without asking the policy again at each step (it said how long its plan
holds: `BatchPolicy.steady`), without a SimPy event and without the per-step method calls:
step times from the same `StepLatency` calls (so the same memo uses and the same jitter
draws, in the same order), the step log's rows, the inter-token gaps and the KV blocks
written and taken exactly as stepping writes and takes them. A step log of sums
(`step_log: summary`, sim/engine/steptally.py) gets a run's plain steps summed in locals,
folded into it at each other step and at the end, instead of seven appends a step.
Most steps are plain (no finish, no spill, the same shape): after a run's first step, a
stretch of them runs in a loop of its own (one for rows, one for sums), prices renewed and
jitter factors refilled inside it, the KV blocks free in a local (no prefix cache: no one
else reads them), each step's gap (with rows: its end and blocks used) gathered in a list
and moved into the recorder's arrays and the log in bulk when the stretch ends; the
general loop below does the same steps with the same floats (`stretches` false: a test's).

A run stops at the first step that
* ends at or after `bound` (the engine's next event, `env.peek()`): started, it is
  returned for the engine to finish at its end (`Clock.timeout_at`);
* finishes a request someone must be told of (a closed loop; `quiet` false): the same;
* would need more KV blocks than are free (the policy preempts), or follows a finish the
  plan does not outlive (`UNTIL_FINISH`: a waiting request might be admitted now), or
  finds the batch empty: nothing started, the policy plans the next step.
Every state change, row and random draw therefore comes in the same order, with the same
values, as one step at a time (`tests/test_leap.py`, `tests/test_decoderun.py`).
"""

from __future__ import annotations

from array import array

from sim.costmodel.jitter import BLOCK, FactorStream, JitteredLatency
from sim.costmodel.latency import StepLatency
from sim.engine.replica import Replica, Step
from sim.engine.steptally import StepTally
from sim.policies.plan import THROUGH_FINISH, StepKind, StepPlan

_DECODE = StepKind.DECODE
_NO_CHUNKS: list = []  # a plain mixed step's prefill chunks (never mutated)
_NEVER = 1 << 62
_NO_BLOCKS = [0]  # a batch without paging never takes a block (never mutated)
_DECODE_ROW = array("q", (int(_DECODE),))  # a decode step's kind in the log (never mutated)
_SHORT = (4, 1)  # steps (at the last step's seconds) a stretch is worth its start and end
# for: with rows (their lists to move into the log), with sums
_ONES = [1.0] * BLOCK  # an unjittered step's factors: x * 1.0 is x, exactly


def decode_run(rep: Replica, plan: StepPlan, now: float, bound: float,  # noqa: PLR0915
               repeats: int, quiet: bool, stretches: bool = True) -> tuple[float, Step | None]:
    """Run `plan`, a plain decode plan the policy just returned at `now` (`repeats`: how
    long it holds, `BatchPolicy.steady`), step after step while each ends before `bound`.
    Returns the replica's clock after the steps it finished, and the step it started but
    did not finish (ends at or after `bound`, or finishes a request to tell of when not
    `quiet`), or None where the policy must plan the next step. (One function on purpose:
    the hot loop of a run, its per-step calls inlined.) `stretches` false: every step by
    the general loop below, none by the stretch loops (the same floats: a test's check)."""
    st, rec, kva, lat = rep.st, rep.rec, rep.kv, rep.lat
    batch, kv, prefix, log = st.batch, st.kv, kva.prefix, rec.log
    members, heap, phase, bs = batch.members, batch.finish_heap, batch.phase, batch.bs
    paged, holds, mixed = batch.paged, rep.holds_batch, plan.kind is not _DECODE
    num_blocks = kv.num_blocks
    # step_log: summary (sim/engine/steptally.py): a plain step's row as running sums in
    # locals (seconds, blocks used and tokens held times seconds, peak blocks used), folded
    # into the tally at each other step and at the end (`fold`), instead of 7 appends
    keep_rows = type(log) is not StepTally
    tally = None if keep_rows else log
    sum_busy = sum_used = sum_toks = 0.0
    used = peak = 0
    mark, since = batch.D, now  # the first step not folded yet, and its start
    add_start, add_end, add_kind, add_seqs, add_tokens, add_used, add_held = (
        log.t_start.append, log.t_end.append, log.kind.append, log.num_seqs.append,
        log.num_tokens.append, log.kv_blocks_used.append, log.kv_tokens.append
    ) if keep_rows else (None,) * 7
    add_gap, add_weight = rec.gaps.append, rec.weights.append
    # a jittered step: the model's seconds * the stream's next factor * the batch size's
    # level (JitteredLatency.decode, inlined; .mixed multiplies by the factor * the level);
    # without jitter factors of exactly 1
    span, draws, spread = _pricing(rep, mixed)
    jitter = lat if draws else None
    stream = jitter.decode_f if jitter is not None else None
    factors, fi = (stream.block, stream.i) if stream is not None else (_ONES, 0)
    left = log.room()  # rows before the log spills (StepLog.add)
    D = first = batch.D  # (the first step's blocks fit: the policy just planned it)
    n, s0, live, rows, longest, outside = _shape(rep, D)  # (what changes when one finishes)
    wrow = nrow = None  # a stretch's weight and n as arrays of one (made at its first)
    level = _level(jitter, n)
    finish_at = heap[0][0] if heap else _NEVER  # the decode count of the next finish (or stale)
    busy, last, decode = rec.kernel_busy_s, batch.last_decode_end, _DECODE
    # the price of a step holds until step `fresh_at` (StepLatency.decode_span): its other
    # `reused` steps' uses are added to its memo entry's count once
    fresh_at, entry, reused, base, ks = D, None, 0, 0.0, 0.0
    # steps before `calm` are plain: they finish no one, spill no rows and (static
    # batching aside) nothing follows them; their rows' tokens held go up by `rows` a step
    calm = -1 if holds or batch.fresh else min(finish_at - 1, D + left - 1)
    held = live + rows * (D - 1) + outside
    # steps before `fast` need no refill of factors, no new price and are plain (`calm`):
    # one test instead of three (set where any of the three bounds moves: the else below)
    fast, secs = -1, 0.0
    # a stretch of plain steps (`calm`) after the run's first, with the blocks free in a
    # local (no prefix cache: no one else reads them) and each step's gap and row kept in
    # local lists, moved into the recorder's arrays and the log when the stretch ends
    gaps, weights, t_starts, t_ends, kinds, seqs, tokens, useds, helds = (
        rec.gaps, rec.weights, log.t_start, log.t_end, log.kind, log.num_seqs, log.num_tokens,
        log.kv_blocks_used, log.kv_tokens) if keep_rows else (rec.gaps, rec.weights) + (None,) * 7
    stretch, short = prefix is None and stretches, _SHORT[tally is not None]
    ph, m = (phase, bs) if paged else (_NO_BLOCKS, 1)  # blocks due at step D: ph[D % m]
    try:
        while True:
            if (D + short < calm and stretch and rows and D != first
                    and now + short * secs < bound):
                # ---- a stretch of plain steps: what the steps below do, in short ----
                # (a step's blocks taken first; at `calm` given back, for the step below)
                free, used, k0, stop = kv.free_blocks, num_blocks - kv.free_blocks, D, D
                nf = len(factors)
                if wrow is None:
                    wrow = array("q", (rows,))
                    nrow = array("q", (n,)) if keep_rows else None
                ends = [now] if keep_rows else []  # (rows: the steps' ends; else their gaps)
                try:
                    if keep_rows:
                        held0, blocks = held, []
                        while True:
                            need = ph[D % m]
                            if need:
                                if need > free:  # the policy preempts
                                    reused += D - k0
                                    return now, None
                                free -= need
                                used += need
                            if D >= stop:  # no factor left, a new price, or not plain
                                if D >= calm:
                                    free += need
                                    used -= need
                                    reused += D - k0
                                    break
                                if draws and fi == nf:
                                    factors, fi = _refill(stream, fi)
                                    nf = len(factors)
                                if D >= fresh_at:
                                    reused += D - k0
                                    if reused:
                                        entry[2] += reused
                                        reused = 0
                                    base, ks, entry, steps = span(n, s0 + n * D, D + longest)
                                    fresh_at, k0 = D + steps, D + 1
                                stop = calm if calm < fresh_at else fresh_at
                                if draws and D + nf - fi < stop:
                                    stop = D + nf - fi
                            if draws:
                                secs = (base * (factors[fi] * level) if spread
                                        else base * factors[fi] * level)
                                fi += 1
                            else:  # (base * 1.0 * 1.0: the same float)
                                secs = base
                            busy += ks
                            t_end = now + secs
                            if t_end >= bound:
                                reused += D + 1 - k0
                                return now, _started(rep.step, plan, secs, n)
                            D += 1
                            ends.append(t_end)
                            blocks.append(used)
                            now = t_end
                    else:  # the same, the rows' sums in locals (tokens held as a float:
                        # the same number, float * float the faster product)
                        held_f, rows_f = float(held), float(rows)
                        while True:
                            need = ph[D % m]
                            if need:
                                if need > free:
                                    reused += D - k0
                                    return now, None
                                free -= need
                                used += need
                            if D >= stop:
                                if D >= calm:
                                    free += need
                                    used -= need
                                    reused += D - k0
                                    break
                                if draws and fi == nf:
                                    factors, fi = _refill(stream, fi)
                                    nf = len(factors)
                                if D >= fresh_at:
                                    reused += D - k0
                                    if reused:
                                        entry[2] += reused
                                        reused = 0
                                    base, ks, entry, steps = span(n, s0 + n * D, D + longest)
                                    fresh_at, k0 = D + steps, D + 1
                                stop = calm if calm < fresh_at else fresh_at
                                if draws and D + nf - fi < stop:
                                    stop = D + nf - fi
                            if draws:
                                secs = (base * (factors[fi] * level) if spread
                                        else base * factors[fi] * level)
                                fi += 1
                            else:  # (base * 1.0 * 1.0: the same float)
                                secs = base
                            busy += ks
                            t_end = now + secs
                            if t_end >= bound:
                                reused += D + 1 - k0
                                used -= need  # (the peak of the steps finished)
                                return now, _started(rep.step, plan, secs, n)
                            D += 1
                            dur = t_end - now
                            ends.append(dur)
                            held_f += rows_f
                            sum_busy += dur
                            sum_used += used * dur
                            sum_toks += held_f * dur
                            now = t_end
                finally:
                    kv.free_blocks, last = free, now
                    if keep_rows:
                        k = len(blocks)
                        if k:
                            starts, ends = ends[:k], ends[1:]
                            gaps.fromlist([e - s for s, e in zip(starts, ends, strict=True)])
                            weights.extend(wrow * k)
                            t_starts.fromlist(starts)
                            t_ends.fromlist(ends)
                            kinds.extend(_DECODE_ROW * k)
                            seqs.extend(nk := nrow * k)
                            tokens.extend(nk)
                            useds.fromlist(blocks)
                            held = held0 + rows * k
                            helds.extend(range(held0 + rows, held + 1, rows))
                    else:
                        k = len(ends)
                        if k:
                            held += rows * k
                            gaps.fromlist(ends)
                            weights.extend(wrow * k)
                            if used > peak:
                                peak = used
                continue
            # ---- start (Replica.start, or mixed_step, for a plain plan) ----
            need = phase[D % bs] if paged else 0
            if need:
                if need > kv.free_blocks and D != first:  # the policy preempts: another plan
                    return now, None
                if prefix is None and need <= kv.free_blocks:
                    kv.free_blocks -= need
                else:
                    kva.take(need)
            if D < fast:  # factors left, the price holds, no finish due (all three, at once)
                reused += 1
            else:
                if fi == len(factors):
                    factors, fi = _refill(stream, fi)
                if D >= fresh_at:
                    if reused:
                        entry[2] += reused
                        reused = 0
                    base, ks, entry, steps = span(n, s0 + n * D, D + longest)
                    fresh_at = D + steps
                else:
                    reused += 1
                fast = calm if calm < fresh_at else fresh_at
                if D + len(factors) - fi < fast:
                    fast = D + len(factors) - fi
            secs = base * (factors[fi] * level) if spread else base * factors[fi] * level
            fi += 1
            busy += ks
            t_end = now + secs
            if t_end >= bound:
                return now, _started(rep.step, plan, secs, n)
            if D < calm:  # a plain step: the finish below, in short
                if rows:
                    add_gap(t_end - last)
                    add_weight(rows)
                D, last, held = D + 1, t_end, held + rows
                if keep_rows:
                    add_start(now)
                    add_end(t_end)
                    add_kind(decode)
                    add_seqs(n)
                    add_tokens(n)
                    add_used(num_blocks - kv.free_blocks)
                    add_held(held)
                else:
                    dur = t_end - now
                    sum_busy += dur
                    used = num_blocks - kv.free_blocks
                    sum_used += used * dur
                    sum_toks += held * dur
                    if used > peak:
                        peak = used
                now = t_end
                continue
            if not quiet and finish_at <= D + 1:
                return now, _started(rep.step, plan, secs, n)
            # ---- finish (Replica.finish: RunningBatch.advance, release, the log's row) ----
            if finish_at <= D + 1 or batch.fresh:
                batch.D, batch.last_decode_end = D, last
                done = batch.advance(t_end, rec.gaps, rec.weights)
                for s in done:
                    rep.release(s)
                finish_at = heap[0][0] if heap else _NEVER
            else:
                done = None
                if rows:
                    add_gap(t_end - last)
                    add_weight(rows)
            D, last = D + 1, t_end
            step_n = n
            if keep_rows:
                add_start(now)
                add_end(t_end)
                add_kind(decode)
                add_seqs(n)
                add_tokens(n)
            if done:
                n, s0, live, rows, longest, outside = _shape(rep, D)
                wrow = nrow = None
                level = _level(jitter, n)
                fresh_at = D  # another shape: another price
            held = live + rows * (D - 1) + outside
            if keep_rows:
                add_used(num_blocks - kv.free_blocks)
                add_held(held)
            else:  # the plain steps before this one, then its own row
                tally.fold(D - 1 - mark, sum_busy, step_n, sum_used, sum_toks, peak, since, now)
                tally.add(now, t_end, decode, step_n, step_n, num_blocks - kv.free_blocks, held)
                sum_busy = sum_used = sum_toks = 0.0
                peak, mark, since = 0, D, t_end
            now = t_end
            left = log.room()
            if left <= 0:
                log.flush()
                left = log.room()
            if holds:
                batch.D, batch.last_decode_end = D, last
                rep.end_of_step()
            if done and (repeats != THROUGH_FINISH or not len(members)):
                return now, None
            calm = -1 if holds else finish_at - 1 if finish_at < D + left else D + left - 1
    finally:  # what the loop kept in locals
        rec.kernel_busy_s, batch.D, batch.last_decode_end = busy, D, last
        if tally is not None:
            tally.fold(D - mark, sum_busy, n, sum_used, sum_toks, peak, since, now)
        if reused:
            entry[2] += reused
        if stream is not None:
            stream.i = fi


def _pricing(rep: Replica, mixed: bool):
    """How a run prices its steps: (`span`, whether the run draws the jitter factors,
    whether a factor multiplies the level first). `span(n, sum_ctx, max_ctx)` gives
    (seconds before the run's jitter, kernel seconds, memo entry, steps the price holds
    for): StepLatency.decode_span. A jittered plan multiplies it by the stream's next
    factor and the batch size's level (JitteredLatency.decode, a mixed plan's
    JitteredLatency.mixed: the factor times the level). A step model of its own decode
    (a pipelined replica's) prices each step by its own call, as Replica.start does, a
    mixed plan with its jitter inside."""
    lat, kernels = rep.lat, rep.kernels
    jittered = type(lat) is JitteredLatency
    model = lat.base if jittered else lat
    if type(model).decode is StepLatency.decode:  # (not a subclass's own)
        return model.decode_span, jittered, mixed and jittered
    if mixed:
        def span(n: int, sum_ctx: int, max_ctx: int) -> tuple[float, float, None, int]:
            return (lat.mixed(n, sum_ctx, max_ctx, _NO_CHUNKS, rep.prefill_shapes),
                    kernels.kernel_s, None, 1)
        return span, False, False
    price = model.decode

    def one(n: int, sum_ctx: int, max_ctx: int) -> tuple[float, float, None, int]:
        return price(n, sum_ctx, max_ctx), kernels.kernel_s, None, 1
    return one, jittered, False


def _shape(rep: Replica, D: int) -> tuple[int, int, int, int, int, int]:
    """What a step's time and row stand on that changes only when a request leaves: rows
    computed, their lengths less D (all rows; members only), members, the longest member's
    length less D, tokens held outside the batch less those counted twice (shared)."""
    batch = rep.st.batch
    return (batch.n_compute, batch.s0, batch.s0_live, len(batch.members),
            batch.max_ctx() - D, rep.port.outside_tokens - rep.kv.shared_tokens())


def _level(jitter: JitteredLatency | None, n: int) -> float:
    """The decode level factor of a step of `n` rows (1 without jitter)."""
    if jitter is None:
        return 1.0
    return jitter.levels[n if n < jitter.top else jitter.top]


def _refill(stream: FactorStream | None, i: int) -> tuple[list[float], int]:
    """The next block of factors, and where to read it from."""
    if stream is None:
        return _ONES, 0
    stream.i = i
    stream.refill()
    return stream.block, stream.i


def _started(step: Step, plan: StepPlan, seconds: float, n: int) -> Step:
    """The replica's step under way, as `Replica.start` leaves it for a plain plan."""
    step.plan, step.seconds, step.seqs, step.tokens, step.kind = plan, seconds, n, n, _DECODE
    return step
