"""Reports of mixed-fleet and concurrency plans render in headless Chromium with their
comparison (mixed vs single type) and users-vs-latency plot, and escape every value a
shared plan.json carries. The fixtures are small real plans (tests/fixtures/*_plan_result.json:
a three-class mix on gamma arrivals, and a two-GPU closed-loop plan)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sim.report.pages import build_report, write_report
from tests.test_report import ROOT, _open, browser  # noqa: F401  (the headless Chromium fixture)
from tests.test_report_hostile import HOSTILE, _ran

MIXED = ROOT / "tests" / "fixtures" / "mixed_plan_result.json"
USERS = ROOT / "tests" / "fixtures" / "concurrency_plan_result.json"


def _mixed_folder(tmp: Path, plan: dict) -> Path:
    from sim.planning.mixed import write_mixed_plan

    return write_mixed_plan(plan, tmp / "mixed")


def _users_folder(tmp: Path, plan: dict) -> Path:
    from sim.planning.plan import write_plan

    return write_plan(plan, tmp / "users")


def test_a_mixed_plan_report_compares_the_mix_with_the_best_single_type(browser, tmp_path):  # noqa: F811
    plan = json.loads(MIXED.read_text())
    folder = _mixed_folder(tmp_path, plan)
    got = _open(browser, write_report(build_report(folder), folder))
    rec, single = plan["recommended"], plan["checks"]["best_single"]
    assert rec["fleet"] in got["text"] and f"{rec['usd_per_hour']:.4g}" in got["text"]
    assert single["fleet"] in got["text"] and "saves" in got["text"]
    assert "gamma" in got["text"]  # the arrival process it was sized on
    lo, hi = rec["usd_per_hour_interval90"]
    assert f"90 % interval ${lo:.2f} - {hi:.2f}" in got["text"]  # the recommendation's 90 % interval
    lo, hi = rec["ttft_p99_interval90_s"]
    assert f"{lo:.3g} - {hi:.3g}" in got["text"]
    # one word, one thing: no typical-error "band" and no separate "range" figures
    assert "band" not in got["text"].replace("step_error_bands", "") and "range" not in got["text"]
    assert "1025-4096" in got["text"]  # the middle class of the three-class split
    assert got["images"] and all(ok and w > 0 for ok, w in got["images"])
    assert got["external"] == []
    assert (folder / "report_fleet_checks.csv").is_file() and (folder / "report_options.csv").is_file()


def test_a_concurrency_plan_report_plots_users_against_latency(browser, tmp_path):  # noqa: F811
    plan = json.loads(USERS.read_text())
    folder = _users_folder(tmp_path, plan)
    got = _open(browser, write_report(build_report(folder), folder))
    rec = plan["recommended"]
    assert f"{rec['candidate']} x {rec['replicas']}" in got["text"]
    assert f"{plan['target_users']} users" in got["text"]
    assert got["images"] and all(ok and w > 0 for ok, w in got["images"])
    import pandas as pd

    probes = pd.read_csv(folder / "report_probes.csv")
    assert len(probes) == len(plan["probe_curves"]) and set(probes.candidate) == {"a100-80gb", "h200-sxm"}


def _hostile_mixed() -> dict:
    plan = json.loads(MIXED.read_text())
    plan["name"] = HOSTILE
    plan["arrival"]["label"] = HOSTILE
    plan["length_by"] = HOSTILE
    plan["mix"]["class_share"][HOSTILE] = 0.5
    for o in plan["options"][:3]:
        o["label"] = HOSTILE
    for key in ("best_mix", "best_single"):
        plan[key]["label"] = HOSTILE
        plan[key]["pools"][0]["gpu"] = HOSTILE
    for c in plan["checks"].values():
        c["fleet"], c["option"] = HOSTILE, HOSTILE
    plan["recommended"].update(fleet=HOSTILE, kind=HOSTILE, stands_on_lookups=HOSTILE)
    plan["capacity"][0].update(gpu=HOSTILE, broke=HOSTILE)
    return plan


def _hostile_users() -> dict:
    plan = json.loads(USERS.read_text())
    plan["name"] = HOSTILE
    for c in plan["candidates"]:
        c["candidate"], c["note"] = HOSTILE + c["candidate"], HOSTILE
    for c in plan["probe_curves"]:
        c["candidate"] = HOSTILE + c["candidate"]
    for c in plan["fleet_checks"]:
        c["candidate"] = HOSTILE + c["candidate"]
    plan["recommended"].update(candidate=HOSTILE, replicas=HOSTILE)
    plan["recommended"]["estimate"]["users_per_replica"] = HOSTILE
    return plan


@pytest.mark.parametrize("kind", ["mixed", "users"])
def test_hostile_values_in_mixed_and_concurrency_plan_reports_show_as_text(browser, tmp_path, kind):  # noqa: F811
    folder = (_mixed_folder(tmp_path, _hostile_mixed()) if kind == "mixed"
              else _users_folder(tmp_path, _hostile_users()))
    got = _ran(browser, write_report(build_report(folder), folder))
    assert got["flag"] is None, f"the {kind} plan report ran an injected script"
    assert got["scripts"] == 0
    assert HOSTILE in got["text"] and HOSTILE in got["title"]


def test_names_that_look_like_mathtext_draw_as_text_in_both_plots():
    from sim.report.concurrency_page import users_plot
    from sim.report.document import png
    from sim.report.mixed_page import comparison_plot

    bad = "a $\\bad{x$ b"  # an unknown TeX command: fails if parsed as mathtext
    plan = json.loads(MIXED.read_text())
    plan["best_mix"]["label"] = plan["best_single"]["label"] = bad
    users = json.loads(USERS.read_text())
    for c in users["probe_curves"]:
        c["candidate"] = bad + c["candidate"]
    assert png(comparison_plot(plan)).startswith(b"\x89PNG")
    assert png(users_plot(users)).startswith(b"\x89PNG")


def test_a_mixed_plan_written_before_its_kind_was_recorded_still_renders(tmp_path):
    plan = json.loads(MIXED.read_text())
    del plan["kind"]
    rep = build_report(_mixed_folder(tmp_path, plan))
    assert rep.title.startswith("llmsim plan (mixed fleet)")


def test_a_mixed_plan_written_before_its_90_percent_intervals_renders_them_as_dashes(tmp_path):
    def strip(v):
        if isinstance(v, dict):
            return {k: strip(x) for k, x in v.items() if "interval90" not in k and k != "measured_share"}
        return [strip(x) for x in v] if isinstance(v, list) else v

    plan = strip(json.loads(MIXED.read_text()))
    rep = build_report(_mixed_folder(tmp_path, plan))
    checks = rep.sections[0].tables[0][1]
    assert set(checks["usd_per_hour_interval90"]) == {"-"} and set(checks["interval90_model"]) == {"-"}


def _rewrite(folder: Path, plan: dict) -> None:
    """Replace a written folder's plan.json (its manifest's size and digest kept true)."""
    import hashlib

    text = json.dumps(plan)
    (folder / "plan.json").write_text(text)
    m = json.loads((folder / ".llmsim-output.json").read_text())
    m["written"]["plan.json"].update(size=len(text), sha256=hashlib.sha256(text.encode()).hexdigest())
    (folder / ".llmsim-output.json").write_text(json.dumps(m))


@pytest.mark.parametrize("kind", ["mixed", "users"])
def test_a_damaged_mixed_or_users_plan_is_one_line_that_never_quotes_the_file(tmp_path, capsys, kind):
    from sim.cli.main import main

    plan = json.loads((MIXED if kind == "mixed" else USERS).read_text())
    folder = (_mixed_folder if kind == "mixed" else _users_folder)(tmp_path, plan)
    plan["checks" if kind == "mixed" else "fleet_checks"] = ["s3cr3t"]
    _rewrite(folder, plan)
    assert main(["report", str(folder)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "damaged plan folder" in err, err
    assert "s3cr3t" not in err
