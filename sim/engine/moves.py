"""Requests leaving a replica's batch and coming back, as a plan says: rejections,
recompute preemption and swapping to host memory. Plain functions on the replica's
state and KV account (`sim/engine/replica.py` calls them and keeps the counts)."""

from __future__ import annotations

from sim.engine.kvaccount import KVAccount
from sim.policies.batch import REJECTED, SWAPPED, WAITING
from sim.policies.plan import StepPlan
from sim.policies.scheduler import ReplicaState, drop_from_head


def reject(st: ReplicaState, plan: StepPlan) -> int:
    """Drop the plan's rejected requests; returns how many. Policies reject while scanning
    their queue from the head, so each one lies among the first few entries:
    O(rejected + admitted)."""
    gone = [r.seq for r in plan.reject]
    from_swap = [s for s in gone if s.state == SWAPPED]
    if from_swap:
        drop_from_head(st.swapped, set(from_swap))
        st.swap_free_blocks += sum(s.reserved for s in from_swap)
    if len(from_swap) < len(gone):
        drop_from_head(st.waiting, {s for s in gone if s.state != SWAPPED})
    for r in plan.reject:
        s = r.seq
        s.state = REJECTED
        s.reject_reason = r.reason
    return len(gone)


def preempt(st: ReplicaState, kv: KVAccount, plan: StepPlan) -> None:
    """Recompute preemption: victims lose their KV and go back to the queue's front."""
    batch = st.batch
    for v in plan.preempt:
        held = kv.held(v)
        if v in batch.members:
            batch.leave(v)
        else:
            st.prefilling.remove(v)
        kv.free(v, held)
        v.prefilled = 0
        v.state = WAITING
        v.preemptions += 1
    st.waiting.extendleft(reversed(plan.preempt))


def swap(st: ReplicaState, kv: KVAccount, plan: StepPlan) -> int:
    """Swap victims out and swapped requests back in; returns the KV blocks moved."""
    batch = st.batch
    moved = 0
    for v in plan.swap_out:
        held = batch.held_blocks(v)
        batch.leave(v)
        st.kv.free(held)
        st.swap_free_blocks -= held
        v.reserved = held
        v.state = SWAPPED
        v.preemptions += 1
        st.swapped.append(v)
        moved += held
    for s in plan.swap_in:
        st.swapped.popleft()
        kv.take(s.reserved)
        st.swap_free_blocks += s.reserved
        moved += s.reserved
        batch.join(s, s.last_token_t)
    return moved
