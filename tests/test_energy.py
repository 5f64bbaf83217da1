"""Energy and cost of a run: the power model's arithmetic worked by hand, an idle
replica, a higher board power, the price table, and the report's sources (escaped)."""

from __future__ import annotations

import json
import shutil

import pytest

from sim.costmodel.power import PowerSpec, energy_figures, replica_energy
from sim.costmodel.prices import cost_figures, load_price_table
from sim.costmodel.profiles import load_profile
from sim.engine.energy import energy_and_cost
from sim.engine.runner import prepare, run
from sim.io.specload import SpecError
from tests.conftest import QUICK_YAML, ROOT

H200 = PowerSpec(board_w=700, idle_w=80, board_source="datasheet", idle_source="measured")
# many requests at once: the GPU's kernels run nearly all the time
FULL_LOAD = QUICK_YAML.replace("num_requests: 20", "num_requests: 200").replace("rate: 5", "rate: 1000")


def test_energy_per_million_tokens_at_full_load_is_board_power_times_time_over_tokens():
    # one GPU, kernels running all of 10 s, 10,000 output tokens from 5 requests:
    # 700 W x 10 s = 7,000 J; 0.7 J a token = 700,000 J per M = 0.19444 kWh per M
    e = energy_figures([replica_energy(H200, 1, 10.0, 10.0)], 10.0, 5, 10_000, ["s"])
    assert e["energy_j"] == pytest.approx(7000.0)
    assert e["kwh_per_m_output_tokens"] == pytest.approx(700_000 / 3.6e6)
    assert e["joules_per_request"] == pytest.approx(1400.0)
    assert e["average_power_w"] == pytest.approx(700.0)
    assert e["mwh_per_day"] == pytest.approx(700 * 24 / 1e6)  # 16.8 kWh a day


def test_a_saturated_run_draws_what_its_kernel_fraction_says(tmp_path):
    path = tmp_path / "full.yaml"
    path.write_text(FULL_LOAD)
    s = run(path).summary
    T, k = s["duration_s"], s["gpu_kernel_fraction"]
    tokens = 200 * 20
    assert k > 0.8  # full load
    p = load_profile("h200-sxm").facts.power
    watts = p.idle_w + (p.board_w - p.idle_w) * k  # the model's shape, applied by hand
    assert s["energy"]["average_power_w"] == pytest.approx(watts, rel=1e-9)
    assert s["energy"]["kwh_per_m_output_tokens"] == pytest.approx(
        watts * T / tokens * 1e6 / 3.6e6, rel=1e-6)
    # never above board power x time / tokens, never below idle power x time / tokens
    assert (p.idle_w * T / tokens * 1e6 / 3.6e6 < s["energy"]["kwh_per_m_output_tokens"]
            <= p.board_w * T / tokens * 1e6 / 3.6e6)


def test_an_idle_replica_draws_idle_power_for_the_whole_run(tmp_path):
    path = tmp_path / "q.yaml"
    path.write_text(QUICK_YAML)
    out = run(path)
    configs = prepare(out.scenario).configs
    for rep in out.result.replicas:
        rep.kernel_busy_s = 0.0  # no kernel ran
    T = out.summary["duration_s"]
    e = energy_and_cost(configs, out.result, out.summary)["energy"]
    assert e["energy_j"] == pytest.approx(80.0 * T)  # H200 idle 80 W x duration, one GPU
    assert e["average_power_w"] == pytest.approx(80.0)


def test_every_gpu_of_a_tensor_parallel_group_draws_power():
    two = replica_energy(H200, 2, 100.0, 50.0)
    one = replica_energy(H200, 1, 100.0, 50.0)
    assert two["energy_j"] == pytest.approx(2 * one["energy_j"])
    assert one["energy_j"] == pytest.approx(80 * 100 + 620 * 50)  # 39,000 J


def test_a_higher_board_power_at_the_same_work_draws_more():
    h100 = load_profile("h100-sxm").facts.power
    a100 = load_profile("a100-80gb").facts.power
    assert h100.board_w == 700 and a100.board_w == 400  # the datasheets
    for kernel in (1.0, 30.0, 60.0):
        assert h100.energy_j(60.0, kernel) > a100.energy_j(60.0, kernel)


def test_every_shipped_profile_states_its_power_sources():
    for gpu, board in (("a100-80gb", 400), ("h100-sxm", 700), ("h200-sxm", 700), ("l40s", 350)):
        p = load_profile(gpu).facts.power
        assert p.board_w == board
        assert 0 < p.idle_w < p.board_w
        assert p.board_source and p.idle_source and p.idle_basis in ("measured", "assumed", "derived")


def test_a_profile_without_a_power_block_loads_and_the_run_says_energy_is_unavailable(tmp_path):
    folder = tmp_path / "h200-sxm"
    shutil.copytree(ROOT / "gpu_profiles" / "h200-sxm", folder)
    text = (folder / "profile.yaml").read_text()
    (folder / "profile.yaml").write_text(text[:text.index("\npower:")] + "\n")
    path = tmp_path / "q.yaml"
    path.write_text(QUICK_YAML + f"gpu: {folder}\n")
    s = run(path).summary
    assert s["energy"]["available"] is False and "power" in s["energy"]["note"]
    assert s["cost"]["available"] is True  # the price still applies


def test_cost_is_gpu_hours_times_the_price():
    prices = {"gpus": {"x": {"on_demand": 2.0, "spot": 1.0}}, "sources": {"x": ["p"]},
              "date": "2026-01", "file": "prices.yaml"}
    # 4 GPUs for 900 s = 1 GPU-hour; 10,000 tokens
    c = cost_figures({"x": 4 * 900.0}, 900.0, 10_000, prices)
    assert c["gpu_hours"] == pytest.approx(1.0)
    assert c["usd"] == pytest.approx({"on_demand": 2.0, "spot": 1.0})
    assert c["usd_per_m_output_tokens"]["on_demand"] == pytest.approx(200.0)
    assert c["usd_per_day"]["on_demand"] == pytest.approx(2.0 * 96)
    assert cost_figures({"y": 1.0}, 1.0, 1, prices)["available"] is False


def test_the_price_file_loads_and_a_bad_price_is_one_error(tmp_path):
    table = load_price_table()
    assert table["gpus"]["h200-sxm"]["on_demand"] > 0 and table["date"]
    bad = tmp_path / "prices.yaml"
    bad.write_text("gpus:\n  h200-sxm: {usd_per_hour: 4, spot_usd_per_hour: -1}\n")
    with pytest.raises(SpecError, match="spot_usd_per_hour"):
        load_price_table(bad)


def test_a_power_block_with_idle_above_board_power_is_refused(tmp_path):
    from sim.io.specload import build

    with pytest.raises(SpecError, match="idle_w"):
        build(PowerSpec, {"board_w": 300, "idle_w": 400}, file=tmp_path / "profile.yaml",
              path="power")


def test_the_report_states_the_sources_escaped(tmp_path):
    from sim.report.document import to_html
    from sim.report.pages import build_report

    path = tmp_path / "q.yaml"
    path.write_text(QUICK_YAML)
    out = run(path)
    folder = out.write(tmp_path / "r", plots=False)
    s = json.loads((folder / "summary.json").read_text())
    s["energy"]["sources"].append("<script>alert(1)</script> & more")
    (folder / "summary.json").write_text(json.dumps(s))
    page = to_html(build_report(folder))
    assert "Serial Alice" in page and "NVIDIA H200 Tensor Core GPU datasheet" in page
    assert "Mercatus" in page  # the price's source
    assert "<script>alert" not in page and "&lt;script&gt;alert(1)&lt;/script&gt; &amp; more" in page
    assert "kWh" in page
