from __future__ import annotations

from dataclasses import replace

import pytest

from sim.costmodel.latency import StepLatency
from sim.costmodel.models import load_model
from sim.costmodel.profiles import load_profile
from sim.costmodel.runtime import RUNTIMES_DIR, RuntimeSpec, load_runtime
from sim.io.specload import known_names

SHIPPED = known_names(RUNTIMES_DIR)


def latency(runtime: str | RuntimeSpec, model: str = "llama-3-8b") -> StepLatency:
    rt = load_runtime(runtime) if isinstance(runtime, str) else runtime
    return StepLatency(load_model(model), load_profile("h200-sxm"), rt)


def kernels_of(stack: str) -> StepLatency:
    """`cuda-graph` (kernels only) running the stack's elementwise kernels (sim/costmodel/fused.py)."""
    return latency(replace(load_runtime("cuda-graph"), elementwise=load_runtime(stack).elementwise))


def test_the_serving_stacks_ship_as_runtimes():
    assert {"vllm", "trtllm", "h200-eager-reference", "cuda-graph"} <= set(SHIPPED)


@pytest.mark.parametrize("name", SHIPPED)
def test_every_shipped_runtime_loads_and_says_what_it_stands_on(name):
    rt = load_runtime(name)
    assert rt.name == name and rt.description
    assert len(rt.source) > 20


def test_vllm_host_cost_amortises_per_sequence_with_batch():
    vllm, kernels = latency("vllm"), kernels_of("vllm")
    per_seq = []
    for n in (1, 4, 16, 64, 256):
        host = vllm.decode(n, n * 1024) - kernels.decode(n, n * 1024)
        assert host > 0
        per_seq.append(host / n)
    assert all(a > b for a, b in zip(per_seq[:-1], per_seq[1:], strict=True))
    assert per_seq[0] >= 0.6e-3  # the serial part is never hidden behind the GPU
    rt = load_runtime("vllm")  # on the order of 2 ms of host time per step at light load
    light = (rt.host_ms_per_step + rt.host_ms_per_decode_seq + rt.serial_ms_per_step
             + rt.serial_ms_per_seq)
    assert 1.5 < light < 2.5


def test_trtllm_host_cost_is_well_below_vllms():
    vllm, trt, kernels = latency("vllm"), latency("trtllm"), kernels_of("trtllm")
    for n in (1, 64):
        base = kernels.decode(n, n * 1024)
        assert trt.decode(n, n * 1024) - base < 0.3 * (vllm.decode(n, n * 1024) - base)


def test_step_is_the_slower_of_host_and_gpu_plus_the_serial_part():
    rt = RuntimeSpec(name="t", host_ms_per_step=1.0, host_ms_per_decode_seq=0.5,
                     host_ms_per_prefill_seq=2.0, serial_ms_per_step=0.25, serial_ms_per_seq=0.125,
                     elementwise="fused")  # the kernels of cuda-graph below
    lat, gpu = latency(rt, "llama-3.2-1b"), latency("cuda-graph", "llama-3.2-1b")
    for n in (1, 8, 64):
        g = gpu.decode(n, n * 512)
        host = (1.0 + 0.5 * n) * 1e-3
        assert lat.decode(n, n * 512) == pytest.approx(max(host, g) + (0.25 + 0.125 * n) * 1e-3)
    g = gpu.prefill([(512, 0), (256, 0)])
    assert lat.prefill([(512, 0), (256, 0)]) == pytest.approx(max(5e-3, g) + 0.5e-3)
    g = gpu.mixed(3, 3 * 512, 512, [(128, 0)])
    host = (1.0 + 2.0 + 1.5) * 1e-3
    assert lat.mixed(3, 3 * 512, 512, [(128, 0)]) == pytest.approx(max(host, g) + 0.75e-3)


def test_a_steps_kernel_time_is_its_gpu_part_without_the_host_work():
    rt = RuntimeSpec(name="t", host_ms_per_step=1.0, host_ms_per_decode_seq=0.5,
                     serial_ms_per_step=0.25, gpu_scale_decode=1.5, elementwise="fused")
    lat, gpu = latency(rt, "llama-3.2-1b"), latency("cuda-graph", "llama-3.2-1b")
    for n in (1, 64, 1):  # the last one is a memo hit after another step was priced
        t, g = lat.decode(n, n * 512), gpu.decode(n, n * 512)
        assert lat.kernel_s == pytest.approx(1.5 * g)  # the runtime's GPU scale, no host part
        assert t == pytest.approx(max((1.0 + 0.5 * n) * 1e-3, 1.5 * g) + 0.25e-3)
    lat.prefill([(512, 0)])
    assert lat.kernel_s == pytest.approx(gpu.prefill([(512, 0)]))
    assert gpu.kernel_s == gpu.prefill([(512, 0)])  # kernels only: the step is its kernels


def test_the_decode_step_stays_a_single_dict_hit_when_warm():
    lat = latency("vllm")
    first = lat.decode(32, 32 * 1000, 2000)
    memo = len(lat._memo)
    assert lat.decode(32, 32 * 1000, 2000) == first and len(lat._memo) == memo


def test_python_generation_loop_pays_its_host_cost_serially():
    """trtllm-python: the vllm runtime's host cost per step and per sequence, none of it
    overlapped (the loop reads the stop flag back from the GPU every step)."""
    vllm, py = load_runtime("vllm"), load_runtime("trtllm-python")
    assert py.serial_ms_per_step == pytest.approx(vllm.host_ms_per_step + vllm.serial_ms_per_step)
    assert py.serial_ms_per_seq == pytest.approx(vllm.host_ms_per_decode_seq + vllm.serial_ms_per_seq)
    lat, kernels = latency("trtllm-python"), kernels_of("trtllm-python")
    for n in (1, 8, 64):
        gap = lat.decode(n, n * 512, 512) - kernels.decode(n, n * 512, 512)
        assert gap * 1e3 == pytest.approx(py.serial_ms_per_step + n * py.serial_ms_per_seq)
