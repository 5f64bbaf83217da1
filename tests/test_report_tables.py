"""Reports a planner can send: the tables they hold, and how wide ones are shown."""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
import pytest

from sim.engine.runner import run
from sim.report.document import CSS, Report, Section, to_html
from sim.report.pages import build_report, write_report
from sim.report.text import REPLICA_COLUMNS, replica_table

pytestmark = pytest.mark.xdist_group("test_report_tables")

ROOT = Path(__file__).resolve().parent.parent
QUICK = ROOT / "scenarios" / "quickstart.yaml"


@pytest.fixture(scope="module")
def fleet_run(tmp_path_factory):
    out = run(QUICK, {"workload.num_requests": 40,
                      "cluster": {"router": {"policy": "round_robin"}, "groups": [{"count": 2}]}})
    return out, out.write(tmp_path_factory.mktemp("fleet") / "fleet")


def test_a_fleet_run_report_holds_the_replica_table_the_cli_prints(fleet_run):
    out, folder = fleet_run
    write_report(build_report(folder), folder)
    table = pd.read_csv(folder / "report_replicas.csv", dtype=str)
    assert list(table.columns) == list(REPLICA_COLUMNS)
    reps = out.summary["per_replica"]
    assert table.replica.tolist() == [r["replica"] for r in reps] and len(reps) == 2
    printed = replica_table(reps).splitlines()[2:]  # the CLI's lines, less header and rule
    for line, (_, row) in zip(printed, table.iterrows(), strict=True):
        assert line.split() == " ".join(row.tolist()).split()
    assert int(table.requests.astype(int).sum()) == 40
    assert "<table id='replicas'>" in (folder / "report.html").read_text()


def test_a_single_replica_run_report_has_no_replica_table(tmp_path):
    out = run(QUICK, {"workload.num_requests": 10})
    folder = out.write(tmp_path / "one")
    assert [s.title for s in build_report(folder).sections] == ["summary", "energy and cost"]


def test_wide_tables_scroll_inside_the_page_instead_of_being_cut_off():
    rule = re.search(r"(?:^|})\s*table\{([^}]*)\}", CSS)
    assert rule, CSS
    props = dict(p.split(":", 1) for p in rule.group(1).split(";") if p)
    assert props["display"] == "block" and props["overflow-x"] == "auto"
    assert props["max-width"] == "100%"
    wide = pd.DataFrame([[f"value {i}" for i in range(40)]], columns=[f"column {i}" for i in range(40)])
    html = to_html(Report("t", [], [Section("s", tables=[("wide", wide)])]))
    assert "column 39" in html and f"<style>{CSS}</style>" in html


def test_pareto_labels_of_candidates_sharing_a_cost_do_not_overlap():
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from sim.report.plan_page import pareto_plot

    names = ["h100-sxm tp1 continuous", "h100-sxm tp1 chunked", "h100-sxm tp1 continuous fp8",
             "h200-sxm tp1 continuous"]
    rows = pd.DataFrame({"candidate": names, "status": "ok", "usd_per_hour": [6.0, 6.0, 6.0, 9.0],
                         "ttft_p99_at_target_s": [0.300, 0.301, 0.302, 0.2],
                         "pareto": [True, False, False, True]})
    canvas = FigureCanvasAgg(pareto_plot(rows, None))
    canvas.draw()
    fig, renderer = canvas.figure, canvas.get_renderer()
    texts = {t.get_text(): t.get_window_extent(renderer) for t in fig.axes[0].texts}
    assert set(texts) == set(names)
    boxes = [texts[n] for n in names[:3]]
    for i, a in enumerate(boxes):
        for b in boxes[i + 1:]:
            assert not a.overlaps(b), (a, b)
    # a candidate alone at its cost keeps its label beside its point, as before
    assert texts[names[3]].y0 < max(b.y0 for b in boxes)


def test_the_perfetto_trace_names_replicas_as_the_csvs_do(tmp_path):
    import json

    from sim.cli.main import main

    assert main(["run", str(ROOT / "scenarios" / "disaggregated.yaml"), "--out", str(tmp_path / "d"),
                 "--trace-out", str(tmp_path / "d.json"), "--set", "workload.num_requests=20"]) == 0
    ev = json.loads((tmp_path / "d.json").read_text())["traceEvents"]
    procs = {e["pid"]: e["args"]["name"] for e in ev if e["name"] == "process_name"}
    steps = pd.read_csv(tmp_path / "d" / "steps.csv")
    assert list(procs.values()) == list(dict.fromkeys(steps.replica))  # prefill-0 ... decode-1
    requests = pd.read_csv(tmp_path / "d" / "requests.csv")
    for e in ev:
        if e["name"] == "kv transfer":  # drawn on its decode replica, from a named prefill one
            assert e["args"]["from"] in procs.values() and procs[e["pid"]].startswith("decode")
        if e.get("ph") == "b" and e["name"].startswith("request "):
            rid = int(e["name"].split()[1])
            assert procs[e["pid"]] == requests.replica[requests.id == rid].item()


def test_the_summary_quotes_the_longest_inter_token_gap(fleet_run):
    from sim.engine.metrics import itl_table, weighted_stats
    from sim.report.text import table

    out, _ = fleet_run
    gaps = itl_table(out.result)
    assert out.summary["itl_s"]["max"] == float(gaps["gap_s"].max()) >= out.summary["itl_s"]["p99"]
    line = next(x for x in table(["q"], [out.summary]).splitlines() if x.startswith("ITL"))
    assert line.split()[-1] == f"{out.summary['itl_s']['max'] * 1e3:#.3g}".rstrip(".")
    # gaps of weight 0 do not count; no gap at all: no maximum
    assert weighted_stats([0.5, 0.1, 0.2], [0, 3, 1])["max"] == 0.2
    assert weighted_stats([], [])["max"] is None
