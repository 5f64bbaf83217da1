"""Disaggregated prefill/decode, one replica's side of a KV hand-off.

A prefill replica computes a request's prompt and first token, then keeps its KV
(`Port.outside_tokens` counts it in the step log) until the engine's KV link
(`sim/engine/processes.py: kv_link`) has moved it to a decode replica. The decode replica first
reserves blocks for the incoming KV (`reserve_transfer`); when the bytes have arrived the
prefill replica frees its copy (`hand_over`) and the decode replica takes the request
over (`take_over`), joining it to its running batch at its next step boundary
(`join_arrived`). A prompt whose KV no decode replica could ever hold is rejected at the
hand-off (`reject_at_handoff`). These are plain verbs on a `Replica`: no clock.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sim.policies.batch import REJECTED, Seq

if TYPE_CHECKING:
    from sim.engine.replica import Replica

__all__ = ["hand_over", "join_arrived", "reject_at_handoff", "reserve_transfer", "take_over"]


def hand_over(rep: Replica, s: Seq) -> None:
    """Prefill side: `s`'s KV reached its decode replica; free it here."""
    _free_handoff(rep, s)


def reject_at_handoff(rep: Replica, s: Seq, reason: str) -> None:
    """Prefill side: no decode replica can ever hold `s`'s KV: free it here and reject the
    request (it keeps its first token, as a preempted one does)."""
    _free_handoff(rep, s)
    s.state = REJECTED
    s.reject_reason = reason
    rep.done += 1


def _free_handoff(rep: Replica, s: Seq) -> None:
    rep.kv.release(s)
    rep.port.outside_tokens -= s.prompt
    rep.port.load.outstanding -= 1


def reserve_transfer(rep: Replica, s: Seq) -> int:
    """Decode side: take the blocks and a batch place for `s`'s incoming KV; returns its
    tokens."""
    tokens = s.prompt + s.generated - 1
    rep.kv.take(rep.st.kv.blocks_for(tokens))
    rep.port.outside_tokens += s.prompt
    rep.st.held_places += 1
    return tokens


def take_over(rep: Replica, s: Seq, t: float) -> None:
    """Decode side: `s`'s KV arrived at `t` (its blocks were taken when the transfer
    started); its first token streams out now (TTFT ends here, as in DistServe). It joins
    the running batch at the next step boundary (`join_arrived`)."""
    s.first_token_t = t
    rep.port.arrived.append((s, t))


def join_arrived(rep: Replica) -> None:
    """Decode side, at a step boundary: requests whose KV arrived join the running batch."""
    port, st = rep.port, rep.st
    for s, t in port.arrived:
        st.batch.join(s, t)
        port.outside_tokens -= s.prompt
    st.held_places -= len(port.arrived)
    port.arrived.clear()
