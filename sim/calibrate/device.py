"""The device under calibration: clocks, memory, random data and out-of-memory handling.

Timing follows the usual rules for kernel benchmarks:

* warm-up calls first (compilation, autotuning, allocator growth), then the median
  of repeated calls;
* on CUDA the call is captured once in a CUDA graph, and each timed replay of the
  graph sits between two CUDA events, after a 256 MiB buffer is written to flush the
  L2 cache (see `Device._cuda_times` for why a graph), so the time is the device's
  and excludes host launch cost; a call that cannot be captured is timed eagerly
  between events instead, and `Device.timing` counts which way each point went;
* on the CPU each call is timed with the calling thread's CPU clock
  (`time.thread_time`): PyTorch's CPU ops are synchronous and, at one intra-op
  thread, run in the calling thread, so this is the work's own time, and time the
  thread spends descheduled (a shared virtual machine's steal and neighbours, which
  here swing wall times by +-50 % over seconds) is not counted. The reference engine
  uses the same clock on the CPU (`Device.clock`), so profile and replay agree.
  Caches are not flushed on the CPU: a serving loop runs with warm caches there.

Peak memory of a call (`peak_bytes`): on CUDA, `torch.cuda.max_memory_allocated`
after `reset_peak_memory_stats`, less what was allocated before the call. On the
CPU no allocator keeps statistics, so the call runs under a dispatch mode that
records every tensor the ATen operators return (views and in-place results of
existing tensors excluded) and when it is freed; the peak of the live bytes is
the call's. Scratch that a kernel allocates internally and frees before returning
(e.g. the CPU flash kernel's per-thread tiles, a few KiB) is not seen.
"""

from __future__ import annotations

import gc
import math
import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from statistics import median

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

FLUSH_BYTES = 256 * 2**20
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


@contextmanager
def quiet_gc() -> Iterator[None]:
    """Collect garbage now and not while timing (a collection pause is not the device's)."""
    was = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


class DeviceError(Exception):
    """The requested device cannot be used (one line, for the CLI)."""


class TooLarge(Exception):
    """A shape does not fit in the device's free memory, or ran out of memory."""


def pick_device(name: str) -> torch.device:
    """auto -> cuda when PyTorch sees a GPU, else cpu; cuda without one is a DeviceError."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise DeviceError(f"--device cuda: PyTorch {torch.__version__} sees no CUDA device "
                          "(torch.cuda.is_available() is False; use --device cpu or auto)")
    if name not in ("cuda", "cpu"):
        raise DeviceError(f"--device: unknown {name!r} (allowed: auto, cuda, cpu)")
    return torch.device(name)


def set_threads(device: torch.device, threads: int | None) -> int:
    """CPU: use `threads` intra-op threads (default 1). With several OpenMP threads on a
    shared or virtual machine, a parallel region waits for whichever thread the
    hypervisor has descheduled, and small ops then take milliseconds in bursts; one
    thread times steadily. calibrate and validate must use the same count."""
    if device.type == "cpu":
        torch.set_num_threads(threads or 1)
    return torch.get_num_threads()


def pick_dtype(name: str, device: torch.device) -> torch.dtype:
    """auto: bf16 on CUDA, fp32 on the CPU (CPU bf16 matmuls are emulated on most parts)."""
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return DTYPES[name]


def is_oom(e: BaseException) -> bool:
    if isinstance(e, torch.cuda.OutOfMemoryError | MemoryError):
        return True
    text = str(e).lower()
    return isinstance(e, RuntimeError) and ("out of memory" in text or "can't allocate" in text
                                            or "failed to allocate" in text)


def host_available_bytes() -> int:
    """MemAvailable from /proc/meminfo (Linux); else total physical memory."""
    import os

    from sim.engine.hostmem import meminfo_available

    available = meminfo_available()
    return available if available is not None else os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


class _LiveBytes(TorchDispatchMode):
    """Peak bytes of the tensors returned by ATen operators while active."""

    def __init__(self) -> None:
        super().__init__()
        self.refs: dict[int, list[int]] = {}  # storage pointer -> [tensors alive, bytes]
        self.cur = self.peak = 0

    def _dead(self, key: int) -> None:
        entry = self.refs.get(key)
        if entry is None:
            return
        entry[0] -= 1
        if entry[0] == 0:
            self.cur -= self.refs.pop(key)[1]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {a.untyped_storage().data_ptr() for a in tree_flatten((args, kwargs))[0]
                  if isinstance(a, torch.Tensor)}
        for t in tree_flatten(out)[0]:
            if not isinstance(t, torch.Tensor):
                continue
            key = t.untyped_storage().data_ptr()
            if key in self.refs:
                self.refs[key][0] += 1
            elif key in inputs or key == 0:
                continue  # a view or an in-place result of an existing tensor
            else:
                nbytes = t.untyped_storage().nbytes()
                self.refs[key] = [1, nbytes]
                self.cur += nbytes
                self.peak = max(self.peak, self.cur)
            weakref.finalize(t, self._dead, key)
        return out


class Device:
    """Timing, memory and random data on one torch device."""

    def __init__(self, device: torch.device, dtype: torch.dtype, *, warmup: int = 3,
                 repeats: int = 10, max_s_per_point: float = 1.0, seed: int = 0):
        self.device, self.dtype = device, dtype
        self.cuda = device.type == "cuda"
        self.warmup, self.repeats, self.max_s = warmup, repeats, max_s_per_point
        self.gen = torch.Generator(device=device).manual_seed(seed)
        # seconds: wall time on a GPU (events time the kernels); the thread's CPU time on
        # the CPU (see the module docstring)
        self.clock: Callable[[], float] = time.perf_counter if self.cuda else time.thread_time
        # the L2 is flushed by READING this buffer (written once, here): a read leaves clean
        # lines, which the timed op evicts for free; a write (Triton's do_bench zeroes its
        # buffer) leaves ~L2-size dirty lines that the timed op must write back to memory,
        # up to ~10 us per kernel that a real forward pass does not pay (sim/costmodel/l2flush.py)
        self._flush = torch.ones(FLUSH_BYTES // 4, dtype=torch.float32, device=device) \
            if self.cuda else None
        self._flush_sum = torch.zeros((), dtype=torch.float32, device=device) \
            if self.cuda else None
        self._capture_stream = torch.cuda.Stream(device=device) if self.cuda else None
        # how each time_ms call was timed: "graph", "events" (capture failed), "cpu clock"
        self.timing: dict[str, int] = {}
        self.checked: dict[str, float] = {}  # kernel checks passed on this device: max error

    # ---- facts ------------------------------------------------------------------------
    @property
    def name(self) -> str:
        if self.cuda:
            return torch.cuda.get_device_name(self.device)
        try:
            with open("/proc/cpuinfo") as f:
                for line in f:
                    if line.startswith("model name"):
                        return line.split(":", 1)[1].strip()
        except OSError:
            pass
        import platform

        return platform.processor() or platform.machine() or "cpu"

    def total_bytes(self) -> int:
        if self.cuda:
            return torch.cuda.get_device_properties(self.device).total_memory
        import os

        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")

    def free_bytes(self) -> int:
        if self.cuda:
            free, _ = torch.cuda.mem_get_info(self.device)
            return free + torch.cuda.memory_reserved(self.device) \
                - torch.cuda.memory_allocated(self.device)
        return host_available_bytes()

    def units(self) -> int:
        """Streaming multiprocessors (CUDA) or CPU threads PyTorch uses."""
        if self.cuda:
            return torch.cuda.get_device_properties(self.device).multi_processor_count
        return torch.get_num_threads()

    # ---- data -------------------------------------------------------------------------
    def check_fits(self, nbytes: float, what: str) -> None:
        """TooLarge unless `nbytes` fit in 90 % of the free memory (checked before allocating)."""
        free = self.free_bytes()
        if nbytes > 0.9 * free:
            raise TooLarge(f"{what} needs {nbytes / 2**30:.2f} GiB, "
                           f"{free / 2**30:.2f} GiB free")

    def randn(self, *shape: int, dtype: torch.dtype | None = None, scale: float = 1.0):
        """Normal random data (never zeros: some kernels skip zero work)."""
        t = torch.empty(*shape, device=self.device, dtype=dtype or self.dtype)
        return t.normal_(0.0, scale, generator=self.gen)  # in place: no fp32 copy of a pool

    def randint(self, high: int, *shape: int):
        return torch.randint(0, high, shape, generator=self.gen, device=self.device)

    def randperm(self, n: int):
        return torch.randperm(n, generator=self.gen, device=self.device)

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)

    def release(self) -> None:
        if self.cuda:
            torch.cuda.empty_cache()

    # ---- clocks -----------------------------------------------------------------------
    def time_ms(self, fn: Callable[[], object], *, flush: bool = True) -> float:
        """Median milliseconds of `fn()` after warm-up; fewer repeats for slow calls.
        (Callers run this inside `quiet_gc()`: a collection pause is not the device's.)"""
        clock = self.clock
        t0 = clock()
        for _ in range(self.warmup):
            fn()
        self.sync()
        first = (clock() - t0) / max(1, self.warmup)
        reps = max(3, min(self.repeats, math.ceil(self.max_s / max(first, 1e-9))))
        if self.cuda:
            return median(self._cuda_times(fn, reps, flush))
        self._count("cpu clock")
        times = []
        for _ in range(reps):
            t = clock()
            fn()
            times.append((clock() - t) * 1e3)
        return median(times)

    def _count(self, how: str) -> None:
        self.timing[how] = self.timing.get(how, 0) + 1

    def _capture(self, fn: Callable[[], object]) -> Callable[[], None] | None:
        """`fn` captured in a CUDA graph: returns the graph's replay (which keeps the graph
        and its outputs alive), or None when `fn` cannot be captured."""
        stream, current = self._capture_stream, torch.cuda.current_stream(self.device)
        stream.wait_stream(current)
        with torch.cuda.stream(stream):  # lazy per-stream set-up (cuBLAS workspace) first
            fn()
        current.wait_stream(stream)
        self.sync()
        torch.cuda.empty_cache()  # the warm-up's cached blocks, for the graph's own pool
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph, stream=stream):
                out = fn()
        except RuntimeError:  # e.g. a host synchronisation, or a non-default RNG generator
            del graph
            self.sync()
            return None

        def replay() -> None:
            graph.replay()
            _ = out  # the outputs live in the graph's pool as long as the replay does
        return replay

    def _cuda_times(self, fn: Callable[[], object], reps: int, flush: bool) -> list[float]:
        """Event-timed replays of `fn` captured in a CUDA graph (eager calls if it cannot be).

        Why a graph: events time the stream, not the kernels. An op of several kernels
        (naive attention, RMSNorm as unfused ops, sampling) launched eagerly at a small
        size runs each kernel faster than the host launches the next one, so the GPU
        idles between them and the events count those gaps: the host's launch cost,
        which the runtime profile models separately, would be counted twice. Timing
        many back-to-back repetitions and subtracting an empty launch removes a constant
        latency, not gaps that grow with the op's kernel count and the host's speed at
        that moment, and when the host is the slower side back-to-back calls queue
        nothing ahead. A graph replays all of the op's kernels from one launch with
        device-side dependencies, so none waits for the host; the L2 flush (a 256 MiB read)
        before each replay (~60 µs on an H200) keeps the GPU busy while the host records the start
        event and launches the graph, so the start event does not wait either. The
        replay is the warm, compiled op (warm-up and one side-stream call come first).
        """
        launch = self._capture(fn)
        self._count("graph" if launch is not None else "events")
        launch = launch or fn
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                  for _ in range(reps)]
        for start, end in events:
            if flush:
                torch.sum(self._flush, dim=0, out=self._flush_sum)  # evict the L2 (a 256 MiB read)
            start.record()
            launch()
            end.record()
        torch.cuda.synchronize(self.device)
        return [s.elapsed_time(e) for s, e in events]

    def wall_ms(self, fn: Callable[[], object], max_s: float | None = None,
                repeats: int | None = None) -> float:
        """Median wall milliseconds of `fn()` including host time, synchronised."""
        max_s, repeats = max_s or self.max_s, repeats or self.repeats
        for _ in range(self.warmup):
            fn()
        self.sync()
        clock = self.clock
        times = []
        t_start = clock()
        for i in range(repeats):
            t = clock()
            fn()
            self.sync()
            times.append((clock() - t) * 1e3)
            if i >= 2 and clock() - t_start > max_s:
                break
        return median(times)

    def peak_bytes(self, fn: Callable[[], object]) -> int:
        """Extra memory a call allocates at its peak (see the module docstring)."""
        self.sync()
        if self.cuda:
            torch.cuda.reset_peak_memory_stats(self.device)
            base = torch.cuda.memory_allocated(self.device)
            out = fn()
            self.sync()
            peak = torch.cuda.max_memory_allocated(self.device) - base
            del out
            return peak
        tracker = _LiveBytes()
        with tracker:
            out = fn()
        del out
        return tracker.peak
