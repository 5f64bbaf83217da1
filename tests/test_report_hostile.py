"""Every report kind escapes what it reads: hostile names and values in a run, sweep,
curve or plan folder (results get shared between teams) show as text in headless
Chromium, and no script they carry runs."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from sim.engine.runner import run
from sim.io.outdir import write_output
from sim.report.document import Report, Section, markup, to_html
from sim.report.pages import build_report, write_report
from tests.test_report import ROOT, browser  # noqa: F401  (the headless Chromium fixture)

# each value a page takes from a file: a script, an event handler, a closed tag, a format
# field and mathtext, all of which must show as the characters they are
HOSTILE = ("x$ {0} </b></p></title><script>window.__pwned=1</script>"
           "<img src=nowhere onerror=window.__pwned=2> '\"&amp;")


def _png(folder: Path) -> bytes:
    from matplotlib.figure import Figure

    from sim.report.document import png

    return png(Figure(figsize=(1, 1)))


def _run_folder(tmp: Path) -> Path:
    out = run(ROOT / "scenarios" / "quickstart.yaml", {"workload.num_requests": 20, "name": HOSTILE})
    return out.write(tmp / "run")


def _sweep_folder(tmp: Path) -> Path:
    table = pd.DataFrame({"config_key": ["k1", "k2"], HOSTILE: [HOSTILE, 2],
                          "request_throughput": [HOSTILE, 1.5], "ttft_s.p99": [0.1, HOSTILE]})
    return write_output(tmp / "sweep", "sweep", lambda f: table.to_csv(f / "results.csv", index=False),
                        {"scenario": HOSTILE, "fields": [HOSTILE], "base": {}, "complete": True})


def _curve_folder(tmp: Path) -> Path:
    def write(f: Path) -> None:
        pd.DataFrame({"scenario": [HOSTILE], "rate": [1.0], HOSTILE: [HOSTILE]}).to_csv(
            f / "curve.csv", index=False)
        pd.DataFrame({"scenario": [HOSTILE], "knee_rate": [HOSTILE]}).to_csv(f / "knees.csv", index=False)
        (f / "curve.png").write_bytes(_png(f))
    return write_output(tmp / "curve", "curve", write)


def _hostile_plan() -> dict:
    plan = json.loads((ROOT / "tests" / "fixtures" / "plan_result.json").read_text())
    plan["name"] = HOSTILE
    plan["unchecked_within"] = HOSTILE
    plan["fleet_checks"] = None
    for c in plan["candidates"]:
        c["candidate"], c["note"], c["binding"] = HOSTILE + c["candidate"], HOSTILE, HOSTILE
    rec, check = plan["recommended"], plan["fleet_check"]
    rec["candidate"] = plan["candidates"][0]["candidate"]
    rec["replicas"] = HOSTILE  # a crafted plan.json: a string where a count belongs
    check.update(candidate=rec["candidate"], router_label=HOSTILE, seeds=HOSTILE,
                 estimated_replicas=HOSTILE, replicas=HOSTILE)
    for row in check["checks"]:
        row[HOSTILE] = HOSTILE  # a column named by the file
    return plan


def _plan_folder(tmp: Path) -> Path:
    from sim.planning.plan import write_plan

    return write_plan(_hostile_plan(), tmp / "plan")


MAKERS = {"run": _run_folder, "sweep": _sweep_folder, "curve": _curve_folder, "plan": _plan_folder}


def _ran(browser, page: Path) -> dict:  # noqa: F811
    browser.get(page.resolve().as_uri())
    return browser.execute_script(
        "return {flag: window.__pwned === undefined ? null : window.__pwned, title: document.title,"
        " text: document.body.innerText, scripts: document.scripts.length};")


@pytest.mark.parametrize("kind", sorted(MAKERS))
def test_hostile_values_in_every_report_kind_show_as_text_and_run_nothing(browser, tmp_path, kind):  # noqa: F811
    folder = MAKERS[kind](tmp_path)
    page = write_report(build_report(folder), folder)
    got = _ran(browser, page)
    assert got["flag"] is None, f"the {kind} report ran an injected script"
    assert got["scripts"] == 0
    assert HOSTILE in got["text"], got["text"][:2000]  # shown literally, character for character
    if kind in ("run", "plan"):
        assert HOSTILE in got["title"]


def test_section_text_is_escaped_unless_built_as_markup():
    rep = Report("t", [], [Section("s", ["<b>plain</b>", markup("<b>{}</b>", "<i>v</i>")])])
    page = to_html(rep)
    assert "<p>&lt;b&gt;plain&lt;/b&gt;</p>" in page
    assert "<p><b>&lt;i&gt;v&lt;/i&gt;</b></p>" in page


@pytest.mark.parametrize("damage", ["slo_list", "secret_number", "deep"])
def test_a_damaged_plan_is_one_line_that_never_quotes_the_file(tmp_path, capsys, damage):
    from sim.cli.main import main
    from sim.planning.plan import write_plan

    plan = json.loads((ROOT / "tests" / "fixtures" / "plan_result.json").read_text())
    if damage == "slo_list":
        plan["slo"] = ["s3cr3t"]
    elif damage == "secret_number":
        plan["target_rate"] = "s3cr3t"
    folder = write_plan(plan, tmp_path / "plan")
    if damage == "deep":  # nested past the JSON reader's recursion limit
        text = "[" * 100_000 + "]" * 100_000
        (folder / "plan.json").write_text(text)
        m = json.loads((folder / ".llmsim-output.json").read_text())
        m["written"]["plan.json"]["size"] = len(text)
        import hashlib

        m["written"]["plan.json"]["sha256"] = hashlib.sha256(text.encode()).hexdigest()
        (folder / ".llmsim-output.json").write_text(json.dumps(m))
    assert main(["report", str(folder)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "damaged plan folder" in err, err
    assert "s3cr3t" not in err
