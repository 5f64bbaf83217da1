"""The chunked policy's shortcuts on a fed replica's arrival path: `fit_max` (a length up
to the longest known to fit an empty replica is not asked again) plans what asking
every request (`why_never`) plans; `whole_arrival` finds a lone arrival's one-chunk step
only where `schedule` plans it."""

from __future__ import annotations

from collections import deque

from hypothesis import given, settings
from hypothesis import strategies as st

from sim.policies.batch import RunningBatch, Seq
from sim.policies.chunked import ChunkedPolicy
from sim.policies.kv import make_kv
from sim.policies.plan import StepKind
from sim.policies.scheduler import ReplicaState, SchedulerSpec

limits = st.fixed_dictionaries({
    "block": st.sampled_from([1, 16, 32]), "blocks": st.integers(4, 400),
    "extra": st.integers(0, 3), "window": st.integers(64, 6000),
    "budget": st.integers(16, 4000), "watermark": st.sampled_from([0.0, 0.01, 0.2]),
})


def setup(lim: dict, lengths: list[int]) -> tuple[ChunkedPolicy, ReplicaState]:
    kv = make_kv("paged", lim["blocks"] * lim["block"], lim["block"], lim["extra"])
    spec = SchedulerSpec(max_num_batched_tokens=lim["budget"], watermark=lim["watermark"],
                         max_num_seqs=8)
    state = ReplicaState(kv=kv, batch=RunningBatch(lim["block"], True),
                         max_model_len=lim["window"])
    state.waiting = deque(Seq(i, 0.0, n, 4, 4) for i, n in enumerate(lengths))
    return ChunkedPolicy(spec, kv), state


def plan_of(policy: ChunkedPolicy, state: ReplicaState) -> tuple:
    plan = policy.schedule(state, 0.0)
    return (plan.kind, [(a.seq.rid, a.cached_blocks, a.chunk_tokens) for a in plan.admit],
            [(c.seq.rid, c.tokens) for c in plan.chunks],
            [(r.seq.rid, r.reason) for r in plan.reject])


@settings(max_examples=200, deadline=None)
@given(limits, st.lists(st.integers(1, 9000), min_size=1, max_size=12),
       st.lists(st.integers(1, 9000), max_size=40))
def test_a_policy_that_knows_longer_lengths_fit_plans_as_one_that_asks(lim, lengths, seen):
    fresh, state = setup(lim, lengths)
    warm, _ = setup(lim, [])
    for n in seen:  # what earlier requests taught it
        warm.why_never(state, Seq(-1, 0.0, n, 4, 4))
    asked = plan_of(fresh, state)
    assert plan_of(warm, state) == asked


@settings(max_examples=200, deadline=None)
@given(limits, st.integers(1, 9000), st.integers(1, 9000))
def test_a_shorter_prefill_fits_wherever_a_longer_one_does(lim, a, b):
    policy, state = setup(lim, [])
    short, long_ = sorted((a, b))
    if not policy.why_never(state, Seq(0, 0.0, long_, 4, 4)):
        assert not policy.why_never(state, Seq(1, 0.0, short, 4, 4))
    assert policy.fit_max in (-1, long_, short)


@settings(max_examples=300, deadline=None)
@given(limits, st.integers(1, 200) | st.integers(1, 9000),
       st.lists(st.integers(1, 3000), max_size=10), st.integers(0, 400) | st.just(0),
       st.integers(0, 2), st.sampled_from([True] * 3 + [False]),
       st.sampled_from([False] * 3 + [True]))
def test_a_lone_arrival_is_taken_whole_only_where_the_policy_plans_its_whole_prefill_alone(
        lim, n, running, taken, held, warm, prefilling):
    """`whole_arrival` names the waiting request only where `schedule` would plan exactly
    its whole prefill in one chunk beside the decodes (nothing rejected or preempted), and
    misses such a plan only for a length longer than any known to fit (`fit_max`)."""
    policy, state = setup(lim, [n])
    for i, m in enumerate(running):  # decoding requests
        s = Seq(100 + i, 0.0, m, 50, 50)
        s.generated = 1 + i % 3
        state.batch.join(s, 0.0)
    state.kv.free_blocks = max(0, state.kv.free_blocks - taken)
    state.held_places = held
    if prefilling:
        state.prefilling.append(Seq(99, 0.0, 300, 4, 4))
    if warm:
        policy.why_never(state, state.waiting[0])
    lone = state.waiting[0]
    found, known = policy.whole_arrival(state), policy.fit_max
    plan = policy.schedule(state, 0.0)
    whole = plan_of(policy, state) == (StepKind.MIXED, [(0, 0, n)], [(0, n)], []) and not (
        plan.preempt or prefilling)
    if found is not None:
        assert found is lone and whole
    elif whole:
        assert n > known
