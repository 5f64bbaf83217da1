"""Runs of plain decode steps finished in one loop (sim/engine/decoderun.py) give the same
bytes as one SimPy event per step (LLMSIM_LEAP=0), whichever way a run ends: at a finish
(through finishes while nothing waits, at the first finish while requests wait), where the
next step's KV blocks do not fit (recompute and swap preemption, chunked prefill), at the
next arrival, at another replica's event in a fleet, at a finish a closed-loop client
must be told of; with jitter, static batches, chunked prefill, prefix caching, and a step
log that spills to disk in the middle of a run. Each case first checks that its runs are
long and do end that way (else the comparison would prove nothing)."""

from __future__ import annotations

import inspect
import sys

import pytest

import sim.engine.decoderun as decoderun
import sim.engine.feed as feed
import sim.engine.processes as processes
from sim.config.scenario import scenario_from_dict
from sim.engine import recorder
from sim.engine.results import COLUMN_TYPES
from sim.engine.runner import run
from sim.engine.steptally import StepTally
from sim.policies.plan import THROUGH_FINISH, UNTIL_FINISH
from tests.test_clients import closed
from tests.test_leap import assert_identical


def scenario(requests: int, rate: float, output: tuple[int, int], **over) -> dict:
    """One replica of llama-3-8b on an H200, `requests` at `rate` per second (constant
    spacing), prompts of 64 tokens, outputs uniform in `output`; `over`: top-level keys."""
    data = {
        "name": "runs", "seed": 5, "model": "llama-3-8b", "gpu": "h200-sxm",
        "runtime": "cuda-graph",
        "scheduler": {"policy": "continuous", "max_num_seqs": 256,
                      "max_num_batched_tokens": 8192},
        "workload": {"num_requests": requests,
                     "arrival": {"kind": "constant", "rate": rate},
                     "prompt": {"kind": "fixed", "value": 64},
                     "output": {"kind": "uniform", "low": output[0], "high": output[1]}},
    }
    for key, value in over.items():
        data[key] = {**data[key], **value} if isinstance(data.get(key), dict) else value
    return data


class Runs:
    """Watches `decode_run`: each run's steps, requests finished, and how it ended:
    "bound" (its last step ends at or after the engine's next event), "told" (its last
    step finishes a request a closed-loop client is told of), "kv" (the next step's
    blocks do not fit), "finish" (the policy plans again after a finish)."""

    def __init__(self, monkeypatch):
        self.ends: list[dict] = []
        real = processes.decode_run

        def watched(rep, plan, now, bound, repeats, quiet):
            rows, done = rep.rec.log.rows(), rep.done
            t, step = real(rep, plan, now, bound, repeats, quiet)
            batch, kv = rep.st.batch, rep.st.kv
            if step is not None:
                how = "bound" if t + step.seconds >= bound else "told"
            elif batch.paged and batch.new_blocks_needed() > kv.free_blocks:
                how = "kv"
            else:
                how = "finish"
            self.ends.append({"how": how, "steps": rep.rec.log.rows() - rows, "bound": bound,
                              "finished": rep.done - done, "repeats": repeats,
                              "waiting": len(rep.st.waiting)})
            return t, step
        monkeypatch.setattr(processes, "decode_run", watched)
        monkeypatch.setattr(feed, "decode_run", watched)  # a lone replica's (its feed's) runs

    def longest(self, how: str, **where) -> int:
        """The most steps a run that ended `how` (and matches `where`) finished."""
        return max((e["steps"] for e in self.ends if e["how"] == how
                    and all(e[k] == v for k, v in where.items())), default=0)


def check(data: dict, monkeypatch, tmp_path) -> Runs:
    """Watch the runs of one leaping run of `data`, then compare leaping with stepping."""
    runs = Runs(monkeypatch)
    sc = scenario_from_dict(data)
    monkeypatch.setenv("LLMSIM_LEAP", "1")
    run(sc)
    assert runs.ends, "no decode run"
    assert_identical(sc, None, tmp_path)
    return runs


def test_runs_go_through_finishes_while_nothing_waits(monkeypatch, tmp_path):
    # six requests at once, outputs of 100-600 tokens: after the prefills one run decodes
    # until the batch is empty, its requests finishing along the way
    runs = check(scenario(6, 1000.0, (100, 600)), monkeypatch, tmp_path)
    through = [e for e in runs.ends if e["repeats"] == THROUGH_FINISH and e["finished"] >= 2]
    assert through and max(e["steps"] for e in through) >= 300


def test_runs_stop_at_the_first_finish_while_requests_wait(monkeypatch, tmp_path):
    # two places, eight requests at once: each finish lets a waiting request in
    data = scenario(8, 1000.0, (150, 400), scheduler={"max_num_seqs": 2})
    runs = check(data, monkeypatch, tmp_path)
    assert runs.longest("finish", repeats=UNTIL_FINISH, finished=1) >= 100
    assert all(e["finished"] <= 1 for e in runs.ends if e["repeats"] == UNTIL_FINISH)


@pytest.mark.parametrize("policy,preemption", [("continuous", "recompute"),
                                               ("continuous", "swap"),
                                               ("chunked", "recompute")])
def test_runs_stop_where_the_next_steps_blocks_do_not_fit(policy, preemption, monkeypatch,
                                                          tmp_path):
    # eight requests growing to ~500 tokens in 60 blocks of 16: preemption after long runs
    data = scenario(8, 1000.0, (300, 500), kv={"num_blocks": 60, "block_size": 16},
                    scheduler={"policy": policy, "preemption": preemption})
    runs = check(data, monkeypatch, tmp_path)
    assert runs.longest("kv") >= 20


def test_runs_stop_at_the_next_arrival_with_jitter(monkeypatch, tmp_path):
    # a request a second, outputs of 200-900 tokens on the jittered live runtime
    data = scenario(10, 1.0, (200, 900), runtime="h200-eager-live")
    runs = check(data, monkeypatch, tmp_path)
    arrivals = {1.0 * i for i in range(10)}
    bounded = [e for e in runs.ends if e["how"] == "bound"]
    assert max(e["steps"] for e in bounded) >= 20
    assert any(min(abs(e["bound"] - a) for a in arrivals) < 1e-9 for e in bounded)


def test_runs_stop_at_another_replicas_event_in_a_fleet(monkeypatch, tmp_path):
    # a fast and a slow replica (eager steps on an A100): the fast one's runs end at
    # the slow one's step ends (a router that reads the replicas keeps them in one engine;
    # round robin would simulate each replica apart, sim/engine/split.py)
    data = scenario(12, 4.0, (200, 600), cluster={
        "router": {"policy": "least_outstanding"},
        "groups": [{"name": "fast", "count": 1},
                   {"name": "slow", "count": 1, "gpu": "a100-80gb",
                    "runtime": "h200-eager-reference"}]})
    runs = check(data, monkeypatch, tmp_path)
    arrivals = [i / 4.0 for i in range(12)]
    apart = [e for e in runs.ends if e["how"] == "bound"
             and min(abs(e["bound"] - a) for a in arrivals) > 1e-9]
    assert apart and max(e["steps"] for e in apart) >= 3


def test_runs_stop_before_a_finish_a_client_is_told_of(monkeypatch, tmp_path):
    data = closed({"concurrency": 3, "requests_per_client": 3},
                  output={"kind": "uniform", "low": 100, "high": 300})
    data["scheduler"] = {"max_num_seqs": 4}
    runs = check(data, monkeypatch, tmp_path)
    assert runs.longest("told") >= 50


@pytest.mark.parametrize("policy", ["static", "chunked"])
def test_runs_of_static_batches_and_chunked_prefill(policy, monkeypatch, tmp_path):
    data = scenario(16, 8.0, (50, 400), scheduler={"policy": policy, "max_batch_size": 4,
                                                   "max_wait_s": 0.2})
    runs = check(data, monkeypatch, tmp_path)
    assert max(e["steps"] for e in runs.ends) >= 50


def test_runs_with_a_prefix_cache_and_requests_waiting(monkeypatch, tmp_path):
    data = scenario(10, 50.0, (100, 300), kv={"prefix_caching": True, "num_blocks": 80},
                    scheduler={"max_num_seqs": 3})
    data["workload"]["shared_prefix"] = {"tokens": 48, "fraction": 1.0, "groups": 2}
    runs = check(data, monkeypatch, tmp_path)
    assert max(e["steps"] for e in runs.ends) >= 20


def test_a_step_log_spilling_in_the_middle_of_runs(monkeypatch, tmp_path):
    monkeypatch.setattr(recorder, "MEMORY_ROWS", 64)
    monkeypatch.setattr(recorder, "MIN_REPLICA_ROWS", 50)
    runs = check(scenario(6, 1000.0, (100, 600)), monkeypatch, tmp_path)
    assert max(e["steps"] for e in runs.ends) > 64


def _outcome(data: dict, stretches: bool, monkeypatch) -> dict:
    """What one run of `data` leaves, each decode run called with `stretches`: every
    replica's step log (rows, or a tally's sums), gaps, weights, kernel seconds, KV blocks
    free and memo uses, and the run's summary."""
    real, reps = decoderun.decode_run, {}

    def runs(rep, plan, now, bound, repeats, quiet):
        reps[rep.name] = rep
        return real(rep, plan, now, bound, repeats, quiet, stretches)
    monkeypatch.setattr(processes, "decode_run", runs)
    monkeypatch.setattr(feed, "decode_run", runs)
    out = run(scenario_from_dict(data))
    seen = {}
    for name, rep in sorted(reps.items()):
        log, rec, lat = rep.rec.log, rep.rec, rep.lat
        model = getattr(lat, "base", lat)
        steps = ({k: getattr(log, k) for k in StepTally.__slots__ if k not in ("then", "spill")}
                 if isinstance(log, StepTally) else
                 {k: bytes(getattr(log, k)) for k in COLUMN_TYPES})
        seen[name] = (steps, bytes(rec.gaps), bytes(rec.weights), rec.kernel_busy_s,
                      rep.st.kv.free_blocks, {k: e[2] for k, e in model._memo.items()})
    seen["summary"] = {k: v for k, v in out.summary.items() if "wall" not in k}
    return seen


@pytest.mark.parametrize("runtime", ["cuda-graph", "h200-eager-live"])
@pytest.mark.parametrize("step_log", ["rows", "summary"])
def test_stretches_of_plain_steps_give_the_general_loops_floats(step_log, runtime, monkeypatch):
    # a stretch of plain steps runs in a loop of its own (blocks free in a local, gaps and
    # rows gathered in lists); the same steps by the general loop: the same sums, rows,
    # gaps, weights, kernel seconds, blocks and memo uses, to the bit (with jitter too)
    data = scenario(40, 3.0, (100, 900), runtime=runtime, step_log=step_log)
    fast = _outcome(data, True, monkeypatch)
    assert fast["summary"]["iterations"]["decode"] > 1000
    assert _stretches(data, monkeypatch) > 10  # (else the comparison would prove nothing)
    assert fast == _outcome(data, False, monkeypatch)


def _stretches(data: dict, monkeypatch) -> int:
    """How many stretches of plain steps a run of `data` starts (its first line, traced)."""
    code = decoderun.decode_run.__code__
    lines, _ = inspect.getsourcelines(code)
    start = code.co_firstlineno + next(i for i, line in enumerate(lines)
                                       if "free, used, k0, stop =" in line)
    count = [0]

    def local(frame, event, arg):
        if event == "line" and frame.f_lineno == start:
            count[0] += 1
        return local

    def trace(frame, event, arg):
        return local if frame.f_code is code else None
    sys.settrace(trace)
    try:
        run(scenario_from_dict(data))
    finally:
        sys.settrace(None)
    return count[0]
