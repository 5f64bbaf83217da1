"""What llmsim does with what it is given: reject reasons that name the binding limit, the
step budget continuous batching refuses, traces out of time order, `--set` through lists
and errors that name the override (user review findings 7, 9, 10, 14, 15)."""

from __future__ import annotations

from collections import deque
from pathlib import Path

import pytest

from sim.config.scenario import load_scenario, set_dotted
from sim.engine.runner import run
from sim.io.specload import SpecError
from sim.policies.batch import RunningBatch, Seq
from sim.policies.kv import make_kv
from sim.policies.scheduler import ContinuousPolicy, ReplicaState, SchedulerSpec
from tests.test_engine import scenario

ROOT = Path(__file__).resolve().parent.parent
FLEET = ROOT / "scenarios" / "hetero_fleet.yaml"
QUICK = ROOT / "scenarios" / "quickstart.yaml"


# ---- reject reasons name the limit that binds ------------------------------------------------

def _rejected(sc) -> str:
    reasons = set(run(sc).requests.reject_reason)
    assert len(reasons) == 1, reasons
    return reasons.pop()


def test_chunked_prefill_rejects_a_prompt_over_the_context_window_as_such():
    # the 512-token step budget never binds a chunked prompt; the 1000-token window does
    sc = scenario(scheduler={"policy": "chunked", "max_num_batched_tokens": 512},
                  kv={"max_model_len": 1000},
                  workload={"num_requests": 2, "prompt": {"kind": "fixed", "value": 1500}})
    assert _rejected(sc) == "prompt of 1500 tokens exceeds max_model_len 1000 (the context window)"


def test_static_batching_rejects_a_prompt_over_the_context_window_as_such():
    sc = scenario(scheduler={"policy": "static", "max_num_batched_tokens": 100},
                  kv={"max_model_len": 1000},
                  workload={"num_requests": 2, "prompt": {"kind": "fixed", "value": 1500}})
    assert _rejected(sc) == "prompt of 1500 tokens exceeds max_model_len 1000 (the context window)"


def test_a_prompt_larger_than_the_whole_kv_cache_is_rejected_as_such():
    # 600 tokens need 38 blocks of 16; the cache has 20 (no watermark)
    sc = scenario(scheduler={"watermark": 0.0}, kv={"num_blocks": 20, "block_size": 16},
                  workload={"num_requests": 2, "prompt": {"kind": "fixed", "value": 600}})
    assert _rejected(sc) == ("needs 38 KV slots/blocks, more than the 20 the whole (empty) KV "
                             "cache offers above its watermark")


def test_chunked_prompt_larger_than_the_whole_kv_cache_is_rejected_as_such():
    sc = scenario(scheduler={"policy": "chunked", "max_num_batched_tokens": 512, "watermark": 0.0},
                  kv={"num_blocks": 20, "block_size": 16},
                  workload={"num_requests": 1, "prompt": {"kind": "fixed", "value": 600}})
    assert _rejected(sc) == ("needs 38 KV slots/blocks, more than the 20 the whole (empty) KV "
                             "cache offers above its watermark")


def test_continuous_policy_names_the_step_budget_when_it_is_what_binds():
    # only reachable where the loader is bypassed (the loader refuses such a budget)
    kv = make_kv("paged", 16 * 1000, 16)
    st = ReplicaState(kv=kv, batch=RunningBatch(16, True), max_model_len=8192,
                      waiting=deque([Seq(0, 0.0, 300, 10, 10)]))
    plan = ContinuousPolicy(SchedulerSpec(max_num_batched_tokens=200), kv).admit(st)
    assert [r.reason for r in plan.reject] == [
        "prompt of 300 tokens exceeds the per-step token budget 200 (scheduler.max_num_batched_tokens)"]


# ---- continuous batching refuses a step budget below the context window ---------------------

def test_continuous_batching_refuses_a_step_budget_below_the_context_window():
    with pytest.raises(SpecError) as e:
        run(scenario(scheduler={"max_num_batched_tokens": 100}))
    assert str(e.value) == ("<input>: scheduler.max_num_batched_tokens: 100 is below the context "
                            "window 8192 (allowed: >= the context window, a smaller kv.max_model_len, or policy: chunked)")


def test_step_budget_is_checked_against_kv_max_model_len_when_set():
    with pytest.raises(SpecError, match="100 is below the context window 2048"):
        run(scenario(scheduler={"max_num_batched_tokens": 100}, kv={"max_model_len": 2048}))
    out = run(scenario(scheduler={"max_num_batched_tokens": 600}, kv={"max_model_len": 600},
                       workload={"num_requests": 2}))
    assert (out.requests.status == "finished").all()


@pytest.mark.parametrize("policy", ["chunked", "static"])
def test_a_small_step_budget_is_fine_where_vllm_allows_it(policy):
    out = run(scenario(scheduler={"policy": policy, "max_num_batched_tokens": 100},
                       workload={"num_requests": 2}))
    assert (out.requests.status == "finished").all()


def test_no_shipped_scenario_sets_a_continuous_budget_below_its_window():
    from sim.engine.build import replica_configs

    for f in sorted((ROOT / "scenarios").glob("*.yaml")):
        replica_configs(load_scenario(f))  # raises if one does


# ---- traces replay in file order -------------------------------------------------------------

def _trace_scenario(tmp_path: Path, name: str, body: str, fmt: str = "csv") -> Path:
    (tmp_path / name).write_text(body)
    sc = tmp_path / "s.yaml"
    sc.write_text(f"name: t\nworkload:\n  trace: {{path: {name}, format: {fmt}}}\n")
    return sc


def test_trace_out_of_time_order_is_refused_naming_its_line(tmp_path):
    sc = _trace_scenario(tmp_path, "t.csv", "arrival_s,prompt_tokens,output_tokens\n0,10,5\n5,100,10\n1,100,20\n")
    with pytest.raises(SpecError) as e:
        run(load_scenario(sc))
    assert str(e.value) == (f"{tmp_path / 't.csv'}: line 4: arrival_s: 4 s before the previous "
                            "row's (line 3; allowed: non-decreasing arrival times)")


def test_mooncake_trace_out_of_time_order_is_refused_naming_its_line(tmp_path):
    rows = ['{"timestamp": 2000, "input_length": 10, "output_length": 2, "hash_ids": [1]}',
            '{"timestamp": 1000, "input_length": 10, "output_length": 2, "hash_ids": [2]}']
    sc = _trace_scenario(tmp_path, "m.jsonl", "\n".join(rows) + "\n", fmt="mooncake")
    with pytest.raises(SpecError, match=r"m.jsonl: line 2: timestamp: 1 s before the previous row's \(line 1;"):
        run(load_scenario(sc))


def test_trace_in_order_keeps_file_order_and_starts_at_zero(tmp_path):
    sc = _trace_scenario(tmp_path, "t.csv", "arrival_s,prompt_tokens,output_tokens\n"
                                            "3,100,10\n3,200,20\n4.5,300,30\n")
    req = run(load_scenario(sc)).requests.sort_values("id")
    assert list(req.arrival_s) == [0.0, 0.0, 1.5]
    assert list(req.prompt_tokens) == [100, 200, 300]


# ---- --set through lists, and errors that name the override ---------------------------------

@pytest.mark.parametrize("path", ["cluster.groups.1.gpu", "cluster.groups[1].gpu"])
def test_set_reaches_a_list_item_by_its_index(path):
    sc = load_scenario(FLEET, {path: "h100-sxm", "cluster.groups.0.count": 3})
    assert [g.gpu for g in sc.cluster.groups] == [None, "h100-sxm"]  # group 0: the top-level gpu
    assert sc.cluster.groups[0].count == 3


def test_set_index_out_of_range_is_one_line_naming_the_set():
    with pytest.raises(SpecError) as e:
        load_scenario(FLEET, {"cluster.groups.2.gpu": "h100-sxm"}, origins={"cluster.groups.2.gpu": "--set"})
    assert str(e.value) == ("--set cluster.groups.2.gpu=h100-sxm: cluster.groups[2]: index 2 is out "
                            "of range of a list of 2 (allowed: 0 to 1)")


def test_set_dotted_into_a_list_and_a_new_mapping():
    data = {"a": [{"x": 1}, {"x": 2}]}
    set_dotted(data, "a[1].x", 5)
    set_dotted(data, "a.0.y.z", 6)
    assert data == {"a": [{"x": 1, "y": {"z": 6}}, {"x": 5}]}
    with pytest.raises(SpecError, match=r"a.x: not an index of a list of 2 \(allowed: 0 to 1\)"):
        set_dotted(data, "a.x", 1)


def test_an_error_in_a_set_names_the_set_not_the_file():
    with pytest.raises(SpecError) as e:
        load_scenario(QUICK, {"workload.arival.rate": 3}, origins={"workload.arival.rate": "--set"})
    assert str(e.value).startswith("--set workload.arival.rate=3: workload.arival: unknown key (allowed: arrival, ")
    with pytest.raises(SpecError) as e:
        load_scenario(QUICK, {"workload.arrival.rate": True}, origins={"workload.arrival.rate": "--set"})
    assert str(e.value) == ("--set workload.arrival.rate=true: workload.arrival.rate: expected a "
                            "number, got true (allowed: a finite number > 0)")


def test_an_error_elsewhere_in_the_file_still_names_the_file(tmp_path):
    f = tmp_path / "s.yaml"
    f.write_text(QUICK.read_text().replace("max_num_seqs: 256", "max_num_seqs: lots"))
    with pytest.raises(SpecError) as e:
        load_scenario(f, {"workload.arrival.rate": 3}, origins={"workload.arrival.rate": "--set"})
    assert str(e.value) == (f"{f}: scheduler.max_num_seqs: expected an integer, got 'lots' "
                            "(allowed: an integer > 0)")


def test_sweep_grid_reaches_list_items():
    from sim.planning.sweep import configurations, parse_axis

    axis = parse_axis("cluster.groups.1.gpu=h100-sxm,a100-80gb", "--grid")
    configs = configurations([axis], [])
    gpus = [load_scenario(FLEET, c).cluster.groups[1].gpu for c in configs]
    assert gpus == ["h100-sxm", "a100-80gb"]


@pytest.mark.parametrize(("key", "path"), [
    ("scheduler.max_num_batched_tokens", "scheduler.max_num_batched_tokens"),  # every group's
    ("cluster.groups.1.scheduler.max_num_batched_tokens", "cluster.groups[1].scheduler.max_num_batched_tokens"),
])
def test_a_fleet_step_budget_below_the_window_names_where_it_is_set(key, path):
    with pytest.raises(SpecError) as e:
        load_scenario(FLEET, {key: 100}, origins={key: "--set"})
    assert str(e.value) == (f"--set {key}=100: {path}: 100 is below the context window 8192 "
                            "(allowed: >= the context window, a smaller kv.max_model_len, or policy: chunked)")


def test_validation_refuses_a_sweep_of_step_budgets_below_the_window_before_any_run(tmp_path):
    from sim.planning.sweep import run_sweep

    with pytest.raises(SpecError, match="--grid/--zip scheduler.max_num_batched_tokens=512: "):
        run_sweep(QUICK, [{"scheduler.policy": "continuous", "scheduler.max_num_batched_tokens": 8192},
                          {"scheduler.policy": "continuous", "scheduler.max_num_batched_tokens": 512}],
                  tmp_path / "out")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("policy, max_model_len, budget", [
    ("continuous", None, 131072),   # raised to Llama-3.2-1B's window: one-step prefill
    ("continuous", 4096, 8192),     # a shorter window keeps the default
    ("chunked", None, 8192),        # chunks spread a prompt over steps
    ("static", None, 8192),
])
def test_an_unset_step_budget_defaults_to_what_the_policy_needs(policy, max_model_len, budget):
    sc = scenario(model="llama-3.2-1b", scheduler={"policy": policy}, kv={"max_model_len": max_model_len})
    assert sc.scheduler.max_num_batched_tokens == budget


def test_a_clusters_groups_resolve_their_own_default_step_budget():
    from sim.config.scenario import group_scenario

    sc = scenario(model="llama-3.2-1b", cluster={"groups": [
        {"name": "a", "count": 1}, {"name": "b", "count": 1, "scheduler": {"policy": "chunked"}}]})
    a, b = (group_scenario(sc, g, f"cluster.groups[{i}]") for i, g in enumerate(sc.cluster.groups))
    assert (a.scheduler.max_num_batched_tokens, b.scheduler.max_num_batched_tokens) == (131072, 8192)


def test_a_set_through_a_yaml_alias_changes_only_the_place_it_names(tmp_path):
    p = tmp_path / "s.yaml"
    p.write_text(QUICK.read_text() + "\ncluster:\n  groups:\n"
                 "    - {name: a, count: 1, scheduler: &s {max_num_seqs: 64}}\n"
                 "    - {name: b, count: 1, scheduler: *s}\n")
    sc = load_scenario(p, {"cluster.groups.0.scheduler.max_num_seqs": 8})
    assert [g.scheduler["max_num_seqs"] for g in sc.cluster.groups] == [8, 64]


@pytest.mark.parametrize("args, says", [
    (["sweep", str(QUICK), "--values", "1,2"],
     "llmsim sweep: --field/--values: both are needed"),
    (["run", str(QUICK), "--set", "cluster.groups[-1].gpu=h100-sxm"],
     "--set cluster.groups[-1].gpu=h100-sxm: cluster.groups: not in the scenario, so it has no item -1"),
    (["run", str(QUICK), "--set", "cluster.groups.0.gpu=h100-sxm"],
     "--set cluster.groups.0.gpu=h100-sxm: cluster.groups: not in the scenario, so it has no item 0"),
    (["report", "no-such-folder"], "no-such-folder: folder not found (allowed: a run, sweep"),
])
def test_more_mistakes_are_one_line_that_says_what_is_wrong(args, says, tmp_path, capsys, monkeypatch):
    from sim.cli.main import main

    monkeypatch.chdir(tmp_path)
    assert main([*args, *(["--out", "o"] if args[0] in ("run", "sweep") else [])]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and says in err, err
    assert not (tmp_path / "o").exists()


def test_a_negative_list_index_is_out_of_range_and_keys_keep_their_order(tmp_path):
    from sim.config.scenario import yaml_text

    p = tmp_path / "s.yaml"
    p.write_text(QUICK.read_text() + "\ncluster:\n  groups:\n    - {name: a, count: 1}\n")
    with pytest.raises(SpecError, match=r"cluster.groups\[-1\]: index -1 is out of range of a list of 1 "
                                        r"\(allowed: 0 to 0\)"):
        load_scenario(p, {"cluster.groups[-1].gpu": "h100-sxm"})
    assert yaml_text({"name": "a", "count": 1}) == "{name: a, count: 1}"
