"""`step_log: summary` (sim/engine/steptally.py): each replica keeps its step log's sums,
not its rows, and the run's figures are the rows mode's: the counts and peaks exactly, the
float sums within the tally's stated TOLERANCE (another order of the same additions), the
requests, gaps and everything else byte for byte. What reads the rows refuses cleanly."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest

import sim.engine.recorder as recorder
from sim.config.scenario import load_scenario, replace_scenario
from sim.engine.metrics import step_sums
from sim.engine.prepare import prepare
from sim.engine.runner import run
from sim.engine.steptally import TOLERANCE, StepTally
from sim.io.specload import SpecError
from tests.test_split_fleet import _split, _tied_fleet

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks" / "speed"))
from fleet_speed import scenario as fleet_scenario  # noqa: E402

SHORT = {"workload.duration_s": 60.0}
WALL = ("wall_s", "simulate_wall_s")


def _close(a, b, where: str = "") -> None:
    """Summaries equal: integers, text and structure exactly, floats within TOLERANCE."""
    if isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for k in a:
            if k not in WALL:
                _close(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, list):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _close(x, y, f"{where}[{i}]")
    elif isinstance(a, float) and isinstance(b, float):
        assert math.isclose(a, b, rel_tol=TOLERANCE, abs_tol=1e-300), (where, a, b)
    else:
        assert a == b and type(a) is type(b), (where, a, b)


def _same_figures(rows, summed) -> None:
    """Two runs of one scenario, in the rows and the summary mode: the same figures."""
    for x, y in zip(step_sums(rows.result), step_sums(summed.result), strict=True):
        assert (x.n, x.by_kind.tolist(), x.used_peak) == (y.n, y.by_kind.tolist(), y.used_peak)
        for k in ("busy", "seqs_dur", "used_dur", "toks_dur"):
            assert math.isclose(getattr(x, k), getattr(y, k), rel_tol=TOLERANCE), k
    _close(rows.summary, summed.summary)
    assert rows.requests.equals(summed.requests)
    assert rows.itl.equals(summed.itl)


def _both(path, sets=None, **kw):
    sets = dict(sets or {})
    return (run(load_scenario(path, sets), **kw),
            run(load_scenario(path, {**sets, "step_log": "summary"}), **kw))


@pytest.mark.parametrize("name", ["quickstart", "batching", "speculative", "llama405b_tp8_pp2",
                                  "deepseek_r1_disaggregated", "kv_paged_vs_contiguous",
                                  "hetero_fleet"])
def test_summary_figures_equal_the_rows_figures_on_shipped_scenarios(name):
    rows, summed = _both(ROOT / "scenarios" / f"{name}.yaml")
    assert rows.step_tables is not None and summed.step_tables is None
    _same_figures(rows, summed)


def test_summary_stepping_equals_leaping(monkeypatch):
    # without leaps every step is summed by `add`, with them mostly by decode_run's locals
    path = ROOT / "scenarios" / "quickstart.yaml"
    leap = run(load_scenario(path, {"step_log": "summary"}))
    monkeypatch.setenv("LLMSIM_LEAP", "0")
    rows, step = _both(path)
    _same_figures(rows, step)
    _same_figures(rows, leap)


@pytest.mark.parametrize("kw", [{"workers": 1}, {"workers": 2}, {"split": False},
                                {"workers": 2, "executor": "ray"}])
def test_a_split_fleet_sums_as_the_rows_do(kw):
    if kw.get("executor") == "ray":
        pytest.importorskip("ray")
    sc = fleet_scenario(4, "round_robin", 0.01)
    rows = run(sc, **kw)
    summed = run(replace_scenario(sc, step_log="summary"), **kw)
    assert ("apart" in summed.engine) == kw.get("split", True)
    _same_figures(rows, summed)


def test_gaps_still_go_to_disk_without_rows(monkeypatch):
    # the tally runs the recorder's gap spill every `limit` steps, as the log's flush does
    monkeypatch.setattr(recorder, "MEMORY_ROWS", 64)
    monkeypatch.setattr(recorder, "MIN_REPLICA_ROWS", 16)
    rows, summed = _both(ROOT / "scenarios" / "quickstart.yaml", {"workload.num_requests": 300})
    assert summed.result.replicas[0].steps.spill is not None
    assert type(summed.itl_table["gap_s"]).__name__ != "ndarray"  # read back from disk
    _same_figures(rows, summed)


def test_a_tied_arrival_is_found_without_the_rows():
    sc, _, wl = _tied_fleet()
    rows_res, every = _split(sc, prepare(sc).configs, wl)
    summed = replace_scenario(sc, step_log="summary")
    sums_res, every_summed = _split(summed, prepare(summed).configs, wl)
    assert every == every_summed == [True, False]
    assert np.array_equal(np.asarray(rows_res.records.column("first_token_t")),
                          np.asarray(sums_res.records.column("first_token_t")))


def test_the_tally_notes_a_step_end_at_an_own_instant():
    t = StepTally()
    t.watch([1.0, 2.0, 3.0])
    t.add(0.5, 0.75, 1, 2, 2, 3, 40)
    t.fold(4, 0.2, 2, 1.0, 9.0, 5, 2.0, 2.9)  # steps ending in (2.0, 2.9]: no instant
    assert not t.tied
    t.add(2.9, 3.0, 1, 2, 2, 5, 44)  # ends at 3.0
    assert t.tied
    u = StepTally()
    u.watch([1.0, 2.5])
    u.fold(3, 0.6, 1, 1.0, 9.0, 5, 2.0, 2.6)  # a step of those may end at 2.5
    assert u.tied and (u.n, u.by_kind, u.used_peak, u.seqs_peak) == (3, [0, 3, 0, 0], 5, 1)


def test_the_tally_checks_the_step_limits():
    t = StepTally()
    t.add(0.0, 1.0, 0, 3, 9000, 10, 100)  # a prefill of 9,000 tokens
    t.check_limits("r0", 3, 10_000)
    with pytest.raises(RuntimeError, match="ran 3 sequences, more than its limit of 2"):
        t.check_limits("r0", 2, None)
    with pytest.raises(RuntimeError, match="computed 9000 tokens, more than its budget of 8192"):
        t.check_limits("r0", 3, 8192)


def test_the_field_is_checked_in_one_line():
    path = ROOT / "scenarios" / "quickstart.yaml"
    with pytest.raises(SpecError, match=r"step_log: unknown 'sums' \(allowed: rows, summary\)"):
        load_scenario(path, {"step_log": "sums"})
    with pytest.raises(SpecError, match="step_log: 'summary' keeps no step rows, and "
                                        "cluster.autoscale's power per window reads them"):
        load_scenario(ROOT / "scenarios" / "autoscale_day.yaml", {"step_log": "summary"})
    with pytest.raises(SpecError, match="closed loop's warm-up"):
        load_scenario(ROOT / "scenarios" / "closed_loop.yaml", {"step_log": "summary"})


def test_the_api_refuses_what_needs_rows(tmp_path):
    out = run(load_scenario(ROOT / "scenarios" / "quickstart.yaml",
                            {"step_log": "summary", "workload.num_requests": 50}))
    with pytest.raises(ValueError, match="step_log: summary keeps no step rows"):
        out.steps  # noqa: B018
    with pytest.raises(ValueError, match="timeline plot needs the step rows"):
        out.write(tmp_path / "a")
    assert not (tmp_path / "a").exists()
    folder = out.write(tmp_path / "b", plots=False)
    assert sorted(p.name for p in folder.iterdir()) == [".llmsim-output.json", "requests.csv",
                                                      "summary.json"]


def test_run_writes_no_steps_table_and_says_so(tmp_path, llmsim):
    out = tmp_path / "run"
    r = llmsim("run", str(ROOT / "scenarios" / "quickstart.yaml"), "--out", str(out),
               "--set", "workload.num_requests=100", "--step-log", "summary", "--no-progress")
    assert r.returncode == 0, r.stderr
    assert not (out / "steps.csv").exists() and (out / "requests.csv").exists()
    assert json.loads((out / ".llmsim-output.json").read_text())["step_log"] == "summary"
    assert "no steps table: step_log summary" in r.stdout
    assert "steps.csv" not in r.stdout.splitlines()[-1]


@pytest.mark.parametrize("flag", [["--plots"], ["--trace-out", "t.json"]])
def test_flags_that_draw_from_rows_are_refused(tmp_path, refused, flag):
    line = refused(["run", str(ROOT / "scenarios" / "quickstart.yaml"), "--out",
                    str(tmp_path / "o"), "--step-log", "summary", *flag], tmp_path,
                   "--step-log step_log=summary: step_log: 'summary' keeps no step rows",
                   f"{flag[0]} needs them")
    assert "allowed: rows" in line


def test_a_closed_loop_without_warm_up_sums_all_its_steps():
    # its measured window opens at its first send, before any step ends
    rows, summed = _both(ROOT / "scenarios" / "closed_loop.yaml",
                         {"workload.clients.warmup_requests": 0})
    assert "warmup" in rows.request_table
    _same_figures(rows, summed)
    t = StepTally()
    t.add(1.0, 2.0, 1, 1, 1, 1, 16)
    assert t.covers(1.5) is True and t.covers(2.0) is False
