"""Real traffic shape: a plan sizes to a trace's own arrival process (replayed at a scaled
rate) or to Poisson, and says which; a bursty trace is not planned as if it were Poisson."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from sim.config.scenario import load_scenario
from sim.engine.runner import prepare
from sim.io.specload import SpecError
from sim.planning.plan import evaluate, load_prices, run_plan
from sim.planning.planspec import load_plan
from sim.planning.traffic import describe, interarrival_cv, label, probe_overrides
from sim.workload.traces import trace_window

ROOT = Path(__file__).resolve().parent.parent
BURSTY = ROOT / "tests" / "fixtures" / "bursty_code.yaml"  # the Azure 2023 code trace


def _plan(tmp_path: Path, arrival: str, scenario: Path = BURSTY, target: float = 8) -> Path:
    p = tmp_path / f"{arrival}.yaml"
    p.write_text(f"scenario: {scenario}\ntarget_rate: {target}\narrival: {arrival}\nslo: {{ttft_p99_s: 1.0}}\n"
                 "search: {seeds: 2, requests: 150, rate_start: 2}\n")
    return p


def test_a_trace_probe_replays_a_window_of_the_trace_scaled_to_the_probed_rate():
    sc = load_scenario(BURSTY)
    raw = trace_window(sc.workload.trace, ROOT / sc.workload.trace.path, None, "t").t
    for window, start in ((0, 0), (1, 300)):
        wl = prepare(load_scenario(BURSTY, probe_overrides(sc, "auto", 5.0, 300, window=window))).workload
        assert len(wl) == 300
        assert (len(wl) - 1) / (wl.arrival_s[-1] - wl.arrival_s[0]) == pytest.approx(5.0, rel=1e-12)
        rec = raw[start:start + 300] - raw[start]  # the recorded times of that window, scaled
        scale = wl.arrival_s[-1] / rec[-1]
        assert np.allclose(wl.arrival_s, rec * scale, rtol=1e-9, atol=1e-9)


def test_the_azure_code_trace_is_as_bursty_as_recorded_and_poisson_is_cv_one():
    info = describe(load_scenario(BURSTY), "auto")
    assert info["process"] == "trace" and info["interarrival_cv"] == pytest.approx(13, abs=0.5)  # data/traces/README
    assert label(info).startswith("trace replay (data/traces/azure_2023_code.csv, inter-arrival CV 13")
    assert describe(load_scenario(BURSTY), "poisson")["process"] == "poisson"
    gaps = np.random.default_rng(0).exponential(1.0, 200_000)
    assert interarrival_cv(np.cumsum(gaps)) == pytest.approx(1.0, abs=0.01)


def test_poisson_is_forced_only_when_asked_and_gamma_keeps_its_cv():
    quick = ROOT / "scenarios" / "quickstart.yaml"
    gamma = load_scenario(quick, {"workload.arrival": {"kind": "gamma", "rate": 2.0, "cv": 3.0}})
    assert probe_overrides(gamma, "auto", 4.0, 100)["workload.arrival"] == {"kind": "gamma", "rate": 4.0, "cv": 3.0}
    assert probe_overrides(gamma, "poisson", 4.0, 100)["workload.arrival"] == {"kind": "poisson", "rate": 4.0}
    over = probe_overrides(load_scenario(BURSTY), "poisson", 4.0, 100)
    assert over["workload.arrival"] == {"kind": "poisson", "rate": 4.0} and "workload.trace.time_scale" not in over


def test_a_bursty_trace_needs_at_least_as_many_replicas_as_poisson_at_the_same_mean_rate(tmp_path):
    prices = load_prices(None)
    trace = evaluate(load_plan(_plan(tmp_path, "auto")), {}, prices)
    poisson = evaluate(load_plan(_plan(tmp_path, "poisson")), {}, prices)
    assert trace["status"] == poisson["status"] == "ok"
    assert (trace["arrival"], poisson["arrival"]) == ("trace", "poisson")
    assert trace["sustained_rate"] <= poisson["sustained_rate"]
    assert trace["replicas"] >= poisson["replicas"]


def test_the_plan_output_names_the_arrival_process(tmp_path):
    result = run_plan(load_plan(_plan(tmp_path, "trace", target=1)), workers=1)
    assert result["arrival"]["process"] == "trace" and result["arrival"]["choice"] == "trace"
    assert result["arrival"]["trace"] == "data/traces/azure_2023_code.csv"
    assert all(r["arrival"] == "trace" for r in result["candidates"] if r["status"] == "ok")


def test_arrival_trace_on_a_scenario_without_a_trace_is_a_one_line_error(tmp_path):
    spec = load_plan(_plan(tmp_path, "trace", ROOT / "scenarios" / "quickstart.yaml"))
    with pytest.raises(SpecError, match="arrival: 'trace' needs a scenario with workload.trace"):
        run_plan(spec, workers=1)
