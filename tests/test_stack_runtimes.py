"""Runtimes by stack and version: per-TP-worker host terms, and a stack's own defaults laid
under a scenario's settings (sim/config/stackdefaults.py)."""

from __future__ import annotations

import dataclasses
import typing

import pytest

from sim.config.scenario import load_scenario, scenario_from_dict
from sim.costmodel.latency import StepLatency
from sim.costmodel.models import load_model
from sim.costmodel.parallel import DTypeSpec
from sim.costmodel.profiles import load_profile
from sim.costmodel.runtime import RUNTIMES_DIR, RuntimeSpec, StackSettings, load_runtime
from sim.io.specload import SpecError, build, known_names
from sim.policies.scheduler import SchedulerSpec

STACKS = ("vllm-0.2", "vllm-0.6", "vllm-0.10", "sglang-0.4", "trtllm-0.18")


def scenario(**over) -> dict:
    base = {"name": "t", "model": "llama-3-8b", "gpu": "h200-sxm",
            "workload": {"num_requests": 4, "arrival": {"kind": "poisson", "rate": 1},
                         "prompt": {"kind": "fixed", "value": 64},
                         "output": {"kind": "fixed", "value": 4}}}
    base.update(over)
    return base


# ---- per-TP-worker host terms ------------------------------------------------------------

def test_remote_workers_count_the_ranks_the_driver_calls():
    rt = RuntimeSpec(name="x")
    assert [rt.remote_workers(t) for t in (1, 2, 4, 8)] == [0, 1, 3, 7]
    apart = RuntimeSpec(name="x", driver_is_rank0=False)  # every worker is a remote actor
    assert [apart.remote_workers(t) for t in (1, 2, 4, 8)] == [0, 2, 4, 8]


def test_rank_terms_add_their_serial_time_to_a_step():
    """Hand-worked: 3 remote workers x (1 ms + 0.1 ms x 10 sequences) = 6 ms more per step."""
    profile = load_profile("h200-sxm")
    model = load_model("llama-3-8b")
    base = RuntimeSpec(name="base")
    ranks = dataclasses.replace(base, serial_ms_per_rank=1.0, serial_ms_per_rank_seq=0.1)
    a = StepLatency(model, profile, base, tensor=4).decode(10, 10 * 500, 500)
    b = StepLatency(model, profile, ranks, tensor=4).decode(10, 10 * 500, 500)
    assert b - a == pytest.approx(6e-3, rel=1e-9)
    one = StepLatency(model, profile, ranks, tensor=1).decode(10, 10 * 500, 500)
    assert one == pytest.approx(StepLatency(model, profile, base, tensor=1).decode(10, 5000, 500))


def test_older_vllm_host_cost_grows_with_tensor_degree():
    """vLLM 0.2's Ray workers: the step's time above the kernels grows with TP (per worker
    and per sequence per worker), where vLLM 0.6's does not."""
    profile = load_profile("h100-sxm")
    model = load_model("llama-2-70b")

    def above_kernels(rt: str, tp: int) -> float:
        lat = StepLatency(model, profile, load_runtime(rt), tensor=tp)
        kernels = StepLatency(model, profile, load_runtime("cuda-graph"), tensor=tp)
        return lat.decode(32, 32 * 512, 512) - kernels.decode(32, 32 * 512, 512)

    old = [above_kernels("vllm-0.2", tp) for tp in (2, 4, 8)]
    assert old[0] < old[1] < old[2]
    assert old[2] - old[1] > 4 * (0.63 + 0.14 * 32) * 1e-3 * 0.99  # 4 more workers' serial terms
    new = [above_kernels("vllm-0.6", tp) for tp in (2, 4, 8)]
    assert max(new) < 5e-3


# ---- stack defaults ------------------------------------------------------------------------

def test_a_stack_runtime_brings_its_defaults():
    sc = scenario_from_dict(scenario(runtime="vllm-0.10"))
    assert (sc.scheduler.policy, sc.scheduler.max_num_batched_tokens, sc.scheduler.max_num_seqs) \
        == ("chunked", 8192, 1024)
    assert sc.kv.prefix_caching is True and sc.kv.gpu_memory_utilization == 0.9


def test_explicit_scenario_fields_override_the_stack():
    sc = scenario_from_dict(scenario(runtime="vllm-0.10",
                                     scheduler={"policy": "continuous", "max_num_seqs": 64},
                                     kv={"prefix_caching": False}))
    assert (sc.scheduler.policy, sc.scheduler.max_num_seqs) == ("continuous", 64)
    assert sc.scheduler.max_num_batched_tokens == 8192  # the stack's, not the window's
    assert sc.kv.prefix_caching is False


def test_set_overrides_the_stack(tmp_path):
    import yaml

    f = tmp_path / "s.yaml"
    f.write_text(yaml.safe_dump(scenario(runtime="vllm-0.10")))
    sc = load_scenario(f, {"scheduler.max_num_batched_tokens": 4096})
    assert sc.scheduler.max_num_batched_tokens == 4096 and sc.scheduler.policy == "chunked"


def test_stack_defaults_follow_the_gpu_and_tensor_degree():
    a100 = scenario_from_dict(scenario(runtime="vllm-0.10", gpu="a100-80gb"))
    assert (a100.scheduler.max_num_batched_tokens, a100.scheduler.max_num_seqs) == (2048, 256)
    fractions = [scenario_from_dict(scenario(runtime="sglang-0.4", model="llama-2-70b",
                                             parallel={"tensor": t})).kv.gpu_memory_utilization
                 for t in (1, 2, 4, 8)]
    assert fractions == [0.88, 0.87, 0.85, 0.81]


def test_a_runtime_without_a_stack_changes_no_default():
    plain = scenario_from_dict(scenario())
    for rt in ("cuda-graph", "vllm", "trtllm"):
        sc = scenario_from_dict(scenario(runtime=rt))
        assert (sc.scheduler, sc.kv, sc.dtype) == (plain.scheduler, plain.kv, plain.dtype)


def test_a_cluster_group_gets_its_own_runtimes_defaults():
    sc = scenario_from_dict(scenario(
        runtime="cuda-graph", scheduler={"max_num_seqs": 32},
        cluster={"groups": [{"name": "plain", "count": 1},
                            {"name": "v1", "count": 1, "runtime": "vllm-0.10"},
                            {"name": "v1-own", "count": 1, "runtime": "vllm-0.10",
                             "scheduler": {"max_num_batched_tokens": 1024}}]}))
    plain, v1, own = sc.cluster.groups
    assert plain.scheduler is None
    assert v1.scheduler == {"policy": "chunked", "max_num_batched_tokens": 8192}  # max_num_seqs: the scenario's
    assert v1.kv == {"prefix_caching": True, "gpu_memory_utilization": 0.9}
    assert own.scheduler["max_num_batched_tokens"] == 1024 and own.scheduler["policy"] == "chunked"


def test_an_unknown_runtime_is_named_with_its_field(tmp_path):
    with pytest.raises(SpecError) as e:
        scenario_from_dict(scenario(runtime="vllm-9"), file=tmp_path / "s.yaml")
    assert e.value.path == "runtime" and "unknown 'vllm-9'" in str(e.value)


def test_every_stack_setting_has_its_source():
    for name in known_names(RUNTIMES_DIR):
        rt = load_runtime(name)
        if rt.stack is None:
            continue
        blocks = [rt.stack.defaults, *rt.stack.by_gpu.values(), *rt.stack.by_tensor.values()]
        assert all(b.source.strip() for b in blocks if b.values()), name
        assert rt.source.strip(), name
    with pytest.raises(SpecError, match="source"):
        build(StackSettings, {"max_num_seqs": 8})


def test_every_stack_preset_is_shipped_and_runs():
    from sim.engine.runner import run

    for name in STACKS:
        rt = load_runtime(name)
        assert rt.stack is not None, name
        out = run(scenario_from_dict(scenario(runtime=name, seed=1)), progress=False)
        assert len(out.requests) == 4, name


def test_stack_settings_allow_what_the_scenario_allows():
    def args(cls, name):
        tp = typing.get_type_hints(cls)[name]
        return {a for a in typing.get_args(tp) if a is not type(None)}

    (policy,) = [args(StackSettings, "policy")]
    assert {a for t in policy for a in typing.get_args(t)} == set(typing.get_args(
        typing.get_type_hints(SchedulerSpec)["policy"]))
    (kv,) = [args(StackSettings, "kv_cache_dtype")]
    assert {a for t in kv for a in typing.get_args(t)} == set(typing.get_args(
        typing.get_type_hints(DTypeSpec)["kv_cache"]))


def test_runtimes_command_lists_every_runtime_with_its_stack(llmsim):
    out = llmsim("runtimes")
    assert out.returncode == 0, out.stderr
    for name in known_names(RUNTIMES_DIR):
        assert f"\n{name} " in out.stdout, name
    one = llmsim("runtimes", "vllm-0.10")
    assert one.returncode == 0 and "stack vllm 0.10" in one.stdout and "arg_utils.py" in one.stdout


def test_an_unknown_runtime_name_is_one_line_naming_the_argument(llmsim):
    out = llmsim("runtimes", "nope")
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.count("\n") == 1, out.stderr
    assert "llmsim runtimes: NAME: unknown 'nope'" in out.stderr and "vllm-0.10" in out.stderr
