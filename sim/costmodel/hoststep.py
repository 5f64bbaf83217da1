"""The host side of a step's time, and how it combines with the GPU's.

Host overhead comes from a runtime profile (`sim/costmodel/runtime.py`: `gpu_profiles/runtimes/`,
one per serving stack): the host issues kernels at a cost per step, per layer, and per
sequence and layer for the per-sequence attention launches of prefill and of
multi-token (verify) steps, and prepares inputs, samples and detokenises at a cost
per prefill and per decode sequence. That host work overlaps the GPU (the host runs
ahead of an asynchronous GPU until the GPU is the bottleneck, as with async output
processing), so the step takes the slower of the two; a serial part per step and per
sequence (what waits for the GPU's sampled tokens) adds to it, and so does a stall the
first time a replica sees a prefill shape (fitted from live logs by sim/fit/logfit.py):

    step = max(host, GPU) + serial_ms_per_step + serial_ms_per_seq · sequences
           + serial_ms_per_new_prefill_shape · new prefill shapes
           + remote workers · (serial_ms_per_rank + serial_ms_per_rank_seq · sequences)

(remote workers: the tensor-parallel workers the stack's driver calls by RPC every step,
`RuntimeSpec.remote_workers`; an older vLLM's Ray actors pay the most).

`HostPricing` is the part of `sim.costmodel.latency.StepLatency` that applies it.
"""

from __future__ import annotations

from sim.costmodel.runtime import RuntimeSpec


class HostPricing:
    """A step's seconds from its GPU milliseconds and its counts (a mixin of `StepLatency`,
    which sets `rt`, `m`, `data`, `remote`, `_hosts` and `_combines`; `_rank` comes from
    sim/costmodel/ranks.py)."""

    rt: RuntimeSpec
    data: int
    remote: int
    kernel_s: float
    _hosts: dict[tuple, tuple[float, float, float, bool]]
    _combines: dict[tuple, tuple[float, float]]

    def _combine(self, gpu_ms: float, prefill_seqs: int = 0, verify_seqs: int = 0,
                 decode_seqs: int = 0, decode: bool = False, new_shapes: int = 0) -> float:
        """Seconds of a step: combine(host, GPU) + the serial host part. The host issues
        kernels (per step, layer, and per-sequence attention launch) and prepares inputs,
        samples and detokenises per sequence (a verify sequence counts as a decode one).
        The host and serial parts depend on the counts alone: memoised on them (the same
        floats, from the same expressions, whenever they are computed)."""
        key = (prefill_seqs, verify_seqs, decode_seqs, decode, new_shapes)
        terms = self._hosts.get(key)
        if terms is None:
            terms = self._hosts[key] = self._host_terms(*key)
        host, serial, scale, summed = terms
        gpu = gpu_ms * scale
        self.kernel_s = gpu * 1e-3
        return ((host + gpu if summed else max(host, gpu)) + serial) * 1e-3

    def _host_terms(self, prefill_seqs: int, verify_seqs: int, decode_seqs: int, decode: bool,
                    new_shapes: int) -> tuple[float, float, float, bool]:
        """`_combine`'s parts that do not depend on the GPU time: (host ms, serial ms, the
        GPU time's scale, whether host and GPU add rather than overlap)."""
        rt, layers = self.rt, self.m.layers
        if self.data > 1:  # each attention rank's own host process: its share
            prefill_seqs, verify_seqs = self._rank(prefill_seqs), self._rank(verify_seqs)
            decode_seqs = self._rank(decode_seqs)
        seqs = decode_seqs + verify_seqs
        host = (rt.host_ms_per_step + rt.host_ms_per_layer * layers
                + rt.host_ms_per_prefill_seq * prefill_seqs + rt.host_ms_per_decode_seq * seqs)
        if decode:
            host += rt.host_ms_per_layer_decode_extra * layers
        if prefill_seqs or verify_seqs:
            host += layers * (rt.host_ms_per_prefill_seq_layer * prefill_seqs
                              + rt.host_ms_per_verify_seq_layer * verify_seqs)
        serial = (rt.serial_ms_per_step + rt.serial_ms_per_seq * (prefill_seqs + seqs)
                  + rt.serial_ms_per_new_prefill_shape * new_shapes)
        if self.remote:  # the driver's call to each tensor-parallel worker, and its sequences
            serial += self.remote * (rt.serial_ms_per_rank
                                     + rt.serial_ms_per_rank_seq * (prefill_seqs + seqs))
        return (host, serial, rt.gpu_scale_decode if decode else rt.gpu_scale,
                rt.combine == "sum")

    def _combined(self, gpu_ms: float, seqs: int, new_shapes: int) -> float:
        """`_combine` of a prefill step, memoised on its arguments (sets kernel_s; a mixed
        step's GPU time takes too many values to memoise)."""
        key = (gpu_ms, seqs, new_shapes)
        c = self._combines.get(key)
        if c is None:
            secs = self._combine(gpu_ms, prefill_seqs=seqs, new_shapes=new_shapes)
            c = self._combines[key] = (secs, self.kernel_s)
        self.kernel_s = c[1]
        return c[0]

    def _new_shapes(self, chunks: list[tuple[int, int]], seen: set | None) -> int:
        """How many of these prefill shapes the server that ran the shapes in `seen` has
        not run before (`seen` gains them); none when the caller keeps no such set."""
        if seen is None or not self.rt.serial_ms_per_new_prefill_shape:
            return 0
        before = len(seen)
        seen.update(chunks)
        return len(seen) - before
