"""Reports render in a real browser (Debian's headless Chromium), and the Perfetto
trace is valid trace-event JSON."""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
from pathlib import Path

import pandas as pd
import pytest

from sim.cli.main import main
from sim.engine.runner import run
from sim.io.outputs import MANIFEST, write_atomically
from sim.report.pages import build_report, write_report
from sim.report.perfetto import EVENT_TYPES, write_trace

pytestmark = pytest.mark.xdist_group("test_report")

ROOT = Path(__file__).resolve().parent.parent
QUICK = str(ROOT / "scenarios" / "quickstart.yaml")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    out = run(ROOT / "scenarios" / "quickstart.yaml", {"workload.num_requests": 120})
    return out, out.write(tmp_path_factory.mktemp("run") / "quick")


@pytest.fixture(scope="module")
def browser():
    if not (CHROMIUM and CHROMEDRIVER):
        pytest.skip("no chromium + chromedriver here (CI installs Debian's)")
    webdriver = pytest.importorskip("selenium.webdriver")
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    profile = tempfile.mkdtemp(prefix="llmsim-chromium-")
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-dev-shm-usage", f"--user-data-dir={profile}"):
        opts.add_argument(flag)
    drv = webdriver.Chrome(options=opts, service=webdriver.ChromeService(executable_path=CHROMEDRIVER))
    yield drv
    drv.quit()
    shutil.rmtree(profile, ignore_errors=True)


def _open(browser, page: Path) -> dict:
    browser.get(page.resolve().as_uri())
    return browser.execute_script("""return {
        text: document.body.innerText,
        images: Array.from(document.images).map(i => [i.complete, i.naturalWidth]),
        external: Array.from(document.querySelectorAll('[src],[href]')).map(e => e.src || e.href)
                     .filter(u => u && !u.startsWith('data:'))};""")


def test_run_report_renders_with_its_numbers_and_every_image(browser, run_dir):
    out, folder = run_dir
    page = write_report(build_report(folder), folder)
    got = _open(browser, page)
    assert "llmsim run: quickstart" in got["text"]
    assert f"{out.summary['ttft_s']['p99']:.4g}" in got["text"]
    assert len(got["images"]) == 2 and all(ok and w > 0 for ok, w in got["images"])
    assert got["external"] == []  # nothing to fetch: opens with no network
    assert (folder / "report.md").read_text().startswith("# llmsim run: quickstart")


def test_plan_report_renders_recommendation_and_pareto_plot(browser, tmp_path):
    from sim.planning.plan import write_plan

    plan = json.loads((ROOT / "tests" / "fixtures" / "plan_result.json").read_text())
    folder = write_plan(plan, tmp_path / "plan")
    page = write_report(build_report(folder), folder)
    got = _open(browser, page)
    rec = plan["recommended"]
    assert rec["candidate"] in got["text"] and f"{rec['usd_per_hour']:.2f}" in got["text"]
    assert "holds" in got["text"] and "breaks them" in got["text"]
    assert got["images"] and all(ok and w > 0 for ok, w in got["images"])
    assert (folder / "report_candidates.csv").is_file()


def test_report_of_a_foreign_folder_is_one_line_error(tmp_path, capsys):
    from sim.cli.main import main

    (tmp_path / "x.txt").write_text("hi")
    assert main(["report", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"llmsim: error: {tmp_path}") and len(err.strip().splitlines()) == 1, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.txt"]  # nothing written


def _manifest(folder: Path) -> dict:
    return json.loads((folder / MANIFEST).read_text())


def test_report_of_a_sweep_folder_holds_its_results_table(tmp_path, llmsim):
    made = llmsim("sweep", QUICK, "--grid", "scheduler.policy=continuous,chunked", "--set",
                  "workload.num_requests=20", "--executor", "sequential", "--out", "sw", cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    rep = llmsim("report", "sw", cwd=tmp_path)
    assert rep.returncode == 0 and rep.stderr == "", rep.stderr
    assert rep.stdout == "sw/report.html\n"
    folder = tmp_path / "sw"
    results = pd.read_csv(folder / "results.csv")
    table = pd.read_csv(folder / "report_results.csv")
    assert table["scheduler.policy"].tolist() == ["continuous", "chunked"]
    assert table["ttft_s.p99"].tolist() == pytest.approx(results["ttft_s.p99"].tolist(), rel=1e-12)
    html = (folder / "report.html").read_text()
    assert "<table id='results'>" in html and f"2 configurations of <code>{QUICK}</code>" in html
    assert (folder / "report.md").read_text().startswith("# llmsim sweep: sw")
    assert {"report.html", "report.md", "report_results.csv", "results.csv"} <= set(_manifest(folder)["files"])


def test_report_of_a_curve_or_plan_folder_holds_its_tables(tmp_path):
    from sim.planning.curve import run_curve
    from sim.planning.plan import write_plan

    _, knees = run_curve([QUICK], [1, 2], tmp_path / "c", requests=20, executor="sequential")
    assert main(["report", str(tmp_path / "c")]) == 0
    assert pd.read_csv(tmp_path / "c" / "report_knees.csv").scenario.tolist() == knees.scenario.tolist()
    assert "<table id='curve'>" in (tmp_path / "c" / "report.html").read_text()
    plan = json.loads((ROOT / "tests" / "fixtures" / "plan_result.json").read_text())
    folder = write_plan(plan, tmp_path / "p")
    assert main(["report", str(folder)]) == 0
    assert plan["recommended"]["candidate"] in (folder / "report.md").read_text()
    assert (folder / "report_candidates.csv").is_file() and "report.html" in _manifest(folder)["files"]


def test_report_keeps_the_provenance_of_the_results_and_records_itself(tmp_path, llmsim):
    assert llmsim("run", QUICK, "--set", "workload.num_requests=20", "--out", "r", cwd=tmp_path).returncode == 0
    before = _manifest(tmp_path / "r")
    for _ in range(2):
        rep = llmsim("report", "r", cwd=tmp_path)
        assert rep.returncode == 0, rep.stderr
    after = _manifest(tmp_path / "r")
    assert after["command"] == before["command"] == f"llmsim run {QUICK} --set workload.num_requests=20 --out r"
    assert (after["created"], after["version"], after["scenario"]) == (
        before["created"], before["version"], before["scenario"])
    assert [r["command"] for r in after["reports"]] == ["llmsim report r"] * 2
    assert all(r["created"] >= before["created"] and r["version"] for r in after["reports"])
    assert set(before["files"]) < set(after["files"])


def test_a_new_report_replaces_the_files_of_the_last_one(tmp_path):
    run(QUICK, {"workload.num_requests": 20}).write(tmp_path / "r")
    write_report(build_report(tmp_path / "r"), tmp_path / "r")
    # a table the earlier report had and the next one does not write
    (tmp_path / "r" / "report_gone.csv").write_text("a\n1\n")
    manifest = _manifest(tmp_path / "r")
    manifest["files"].append("report_gone.csv")
    manifest["written"]["report_gone.csv"] = {  # as llmsim records what it wrote
        "size": 4, "sha256": hashlib.sha256(b"a\n1\n").hexdigest()}
    (tmp_path / "r" / MANIFEST).write_text(json.dumps(manifest))
    write_report(build_report(tmp_path / "r"), tmp_path / "r")
    files = _manifest(tmp_path / "r")["files"]
    assert not (tmp_path / "r" / "report_gone.csv").exists() and "report_gone.csv" not in files
    assert {"requests.csv", "steps.csv", "summary.json", "report.html", "report.md"} <= set(files)


def test_report_of_a_compare_or_validate_folder_says_they_have_none(tmp_path, capsys):
    assert main(["compare", QUICK, "--set", "workload.num_requests=10", "--out", str(tmp_path / "cmp")]) == 0
    write_atomically(tmp_path / "val", lambda f: (f / "report.json").write_text("{}"),
                     {"scenario": "quickstart", "profile": "gpu_profiles/h200"})  # as validate writes
    capsys.readouterr()
    for folder, kind in (("cmp", "compare"), ("val", "validate")):
        before = {p: p.read_bytes() for p in (tmp_path / folder).rglob("*") if p.is_file()}
        assert main(["report", str(tmp_path / folder)]) == 2
        assert capsys.readouterr().err == (f"llmsim: error: {tmp_path / folder}: an llmsim {kind} folder has "
                                           "no report (allowed: a run, sweep, curve or plan folder)\n")
        assert {p: p.read_bytes() for p in (tmp_path / folder).rglob("*") if p.is_file()} == before


def test_perfetto_trace_is_trace_event_json_with_documented_events(run_dir, tmp_path):
    out, _ = run_dir
    doc = json.loads(write_trace(tmp_path / "t.json", [(out.steps, out.requests)]).read_text())
    ev = doc["traceEvents"]
    assert {e["ph"] for e in ev} <= set(EVENT_TYPES)
    iters = [e for e in ev if e["ph"] == "X"]
    assert len(iters) == len(out.steps)
    assert {e["name"] for e in iters} <= {"prefill", "decode", "verify", "mixed"}
    assert all(e["dur"] >= 0 and "num_seqs" in e["args"] for e in iters)
    begins = [e for e in ev if e["ph"] == "b"]
    ends = [e for e in ev if e["ph"] == "e"]
    assert len(begins) == len(ends) and len(begins) >= len(out.requests)
    names = {e["name"] for e in begins}
    assert {"queued", "prefill", "decode"} <= names
    finished = out.requests[out.requests.status == "finished"]
    decode_end = max(e["ts"] for e in ends if e["name"] == "decode")
    assert decode_end == pytest.approx(finished.finish_s.max() * 1e6)


def test_fleet_trace_has_one_process_per_replica(tmp_path):
    from sim.config.scenario import load_scenario
    from sim.planning.fleet import simulate_fleet

    sc = load_scenario(ROOT / "scenarios" / "quickstart.yaml", {"workload.num_requests": 90})
    fleet = simulate_fleet(sc, 3, seed=2)
    parts = [(st, fleet.requests[fleet.requests.replica == i]) for i, st in enumerate(fleet.replica_steps)]
    ev = json.loads(write_trace(tmp_path / "f.json", parts).read_text())["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in ev if e["name"] == "process_name"}
    assert names == {1: "replica 0", 2: "replica 1", 3: "replica 2"}
    first = {pid: min(e["ts"] for e in ev if e["pid"] == pid and e["ph"] == "X") for pid in names}
    # a replica's first iteration starts when its first request reaches the engine: sent at
    # arrival_s, received after the runtime's per-request receive latency
    from sim.costmodel.runtime import load_runtime

    receive = load_runtime(sc.runtime).request.receive_ms.value / 1e3
    for pid, t in first.items():
        arrivals = fleet.requests[fleet.requests.replica == pid - 1].arrival_s
        assert t == pytest.approx((arrivals.min() + receive) * 1e6)


def test_cluster_run_trace_splits_into_one_process_per_replica(tmp_path):
    from sim.report.perfetto import replica_parts

    out = run(ROOT / "scenarios" / "quickstart.yaml", {
        "workload.num_requests": 60, "cluster": {"router": {"policy": "round_robin"}, "groups": [{"count": 2}]}})
    parts = replica_parts(out.steps, out.requests)
    assert len(parts) == 2 and sum(len(r) for _, r in parts) == 60
    ev = json.loads(write_trace(tmp_path / "c.json", parts).read_text())["traceEvents"]
    assert {e["pid"] for e in ev} == {1, 2}


def test_trace_places_preemptions_at_their_times_and_draws_kv_transfers(tmp_path):
    from sim.cli.main import main

    tight = ROOT / "scenarios" / "quickstart.yaml"
    assert main(["run", str(tight), "--out", str(tmp_path / "r"), "--trace-out", str(tmp_path / "p.json"),
                 "--set", "workload.num_requests=200", "--set", "workload.arrival.rate=50",
                 "--set", "kv.num_blocks=400"]) == 0
    ev = json.loads((tmp_path / "p.json").read_text())["traceEvents"]
    req = pd.read_csv(tmp_path / "r" / "requests.csv")
    pre = [e for e in ev if e["ph"] == "i" and e["name"] == "preempted"]
    assert len(pre) == req.preemptions.sum() > 0
    arrival = dict(zip(req.id, req.arrival_s, strict=True))
    finish = dict(zip(req.id, req.finish_s.fillna(float("inf")), strict=True))  # rejected: no finish
    for e in pre:  # while the request was in the system, not at a marker
        assert arrival[e["args"]["request"]] * 1e6 <= e["ts"] <= finish[e["args"]["request"]] * 1e6

    assert main(["run", str(ROOT / "scenarios" / "disaggregated.yaml"), "--out", str(tmp_path / "d"),
                 "--trace-out", str(tmp_path / "d.json"), "--set", "workload.num_requests=40"]) == 0
    ev = json.loads((tmp_path / "d.json").read_text())["traceEvents"]
    moves = [e for e in ev if e["name"] == "kv transfer"]
    req = pd.read_csv(tmp_path / "d" / "requests.csv")
    assert len(moves) == (req.output_tokens > 1).sum()
    by_id = dict(zip(req.id, req.first_token_s, strict=True))
    for e in moves:  # the first token streams when the transfer ends (DistServe's TTFT)
        assert (e["ts"] + e["dur"]) / 1e6 == pytest.approx(by_id[e["args"]["request"]], abs=1e-6)
