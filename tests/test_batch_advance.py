"""RunningBatch.advance (its `_drop` inlined for a plain paged batch) leaves the batch, its
requests and the gaps as the plain form below does, whatever joins, leaves and finishes."""

from __future__ import annotations

import heapq

from hypothesis import given, settings
from hypothesis import strategies as st

from sim.policies.batch import RUNNING, RunningBatch, Seq


def advance_reference(b: RunningBatch, t_end: float, gaps: list, weights: list) -> list[Seq]:
    """The step written plainly: fresh rows' gaps, the others' gap, then each finish
    dropped by `_drop`."""
    n_fresh = 0
    for t_join, cnt in b.fresh.items():
        if cnt:
            gaps.append(t_end - t_join)
            weights.append(cnt)
            n_fresh += cnt
    n_cont = len(b.members) - n_fresh
    if n_cont:
        gaps.append(t_end - b.last_decode_end)
        weights.append(n_cont)
    b.fresh.clear()
    b.D += 1
    b.last_decode_end = t_end
    done = []
    while b.finish_heap and b.finish_heap[0][0] <= b.D:
        _, _, epoch, s = heapq.heappop(b.finish_heap)
        if epoch != s.epoch or s.state != RUNNING:
            continue
        s.generated, s.finish_t = s.output, t_end
        s.epoch += 1
        b._drop(s, keep_row=b.keep_finished)
        done.append(s)
    return done


def state(b: RunningBatch, seqs: list[Seq]) -> tuple:
    return (b.D, b.s0, b.s0_live, b.n_compute, list(b.phase), [s.rid for s in b.members],
            dict(b.fresh), b.last_decode_end, b.max_ctx(), b.kv_tokens(),
            [(s.generated, s.finish_t, s.epoch, s.state, s.d0, s.g0) for s in seqs])


ops = st.lists(st.tuples(st.sampled_from(["join", "step", "step", "leave"]),
                         st.integers(1, 300), st.integers(1, 40)), max_size=60)


@settings(max_examples=300, deadline=None)
@given(ops, st.sampled_from([(16, True, False), (1, False, False), (16, True, True)]))
def test_advance_changes_what_the_plain_form_changes(script, kind):
    bs, paged, keep = kind
    runs = []
    for step in (RunningBatch.advance, advance_reference):
        b = RunningBatch(bs, paged, keep_finished=keep)
        seqs, gaps, weights, done, t = [], [], [], [], 0.0
        for op, prompt, output in script:
            t += 0.25
            if op == "join":
                s = Seq(len(seqs), 0.0, prompt, output + 1, output + 1)
                s.generated = 1
                seqs.append(s)
                b.join(s, t)
            elif op == "step" and b.members:
                done.append([s.rid for s in step(b, t, gaps, weights)])
            elif op == "leave" and b.members:
                b.leave(next(iter(b.members)))
        runs.append((state(b, seqs), gaps, weights, done))
    assert runs[0] == runs[1]
