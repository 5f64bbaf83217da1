"""Command-line contract cases found by the QA harness: one line on stderr, exit 2,
nothing written, nothing of the user's replaced (each in an empty temporary folder)."""

from __future__ import annotations

import os

import pytest

from sim.cli.main import main
from tests.conftest import QUICK_YAML as B

PLAN = ("name: p\nscenario: b.yaml\ntarget_rate: 2\nslo: {ttft_p99_s: 1.0}\n"
        "search: {seeds: 1, requests: 20}\ncandidates: {gpu: [GPU], tensor: [1]}\n")


@pytest.fixture
def user_cwd(user_cwd):
    (user_cwd / "p.yaml").write_text(PLAN.replace("GPU", "h200-sxm"))
    return user_cwd


RUN = ["run", "b.yaml", "--out", "o", "--no-plots", "--no-progress"]


@pytest.mark.parametrize("trace", ["userdir", "user.txt", "user.txt/t.json", "/proc/t.json", "/dev/null"])
def test_trace_out_that_is_not_a_new_file_or_an_llmsim_trace_is_refused_before_the_run(
        user_cwd, refused, trace):
    refused(RUN + ["--trace-out", trace], user_cwd, "--trace-out")


def test_trace_out_replaces_a_trace_llmsim_wrote(user_cwd, capsys):
    assert main(RUN + ["--trace-out", "t.json"]) == 0
    first = (user_cwd / "t.json").read_bytes()
    assert main(RUN + ["--trace-out", "t.json", "--set", "seed=2"]) == 0
    assert (user_cwd / "t.json").read_bytes() != first
    assert (user_cwd / "user.txt").read_text() == "mine"


@pytest.mark.parametrize("argv, needle", [
    (["sweep", "b.yaml", "--field", "seed", "--values", "1,2", "--workers", "0", "--out", "sw"], "--workers"),
    (["sweep", "b.yaml", "--field", "seed", "--values", "1,2", "--workers", "-1", "--out", "sw"], "--workers"),
    (["curve", "b.yaml", "--rates", "1", "--workers", "0", "--out", "cv"], "--workers"),
    (["curve", "b.yaml", "--rates", "1", "--requests", "0", "--out", "cv"], "--requests"),
    (["curve", "b.yaml", "--rates", "1", "--ttft-bound", "-1", "--out", "cv"], "--ttft-bound"),
    (["curve", "b.yaml", "--rates", "1", "--ttft-bound", "nan", "--out", "cv"], "--ttft-bound"),
    (["plan", "p.yaml", "--workers", "0", "--out", "pl"], "--workers"),
    (["run", "b.yaml", "--workers", "0", "--out", "rn"], "--workers"),
    (["run", "b.yaml", "--workers", "many", "--out", "rn"], "auto or a whole number"),
])
def test_worker_counts_request_counts_and_bounds_out_of_range_are_usage_errors(user_cwd, capsys, argv, needle):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and needle in err
    assert not any((user_cwd / d).exists() for d in ("sw", "cv", "pl", "rn"))


def test_plan_whose_only_gpu_is_unknown_is_a_one_line_error(user_cwd, refused):
    (user_cwd / "p.yaml").write_text(PLAN.replace("GPU", "h200-sxmm"))
    refused(["plan", "p.yaml", "--workers", "1", "--out", "pl"], user_cwd, "h200-sxmm")


MANIFEST = '{"tool": "llmsim", "kind": "KIND", "files": []}'


@pytest.mark.parametrize("kind", ["sweep", "curve", "plan"])
def test_report_of_an_llmsim_folder_missing_its_tables_is_a_one_line_error(user_cwd, refused, kind):
    (user_cwd / "fk").mkdir()
    (user_cwd / "fk" / ".llmsim-output.json").write_text(MANIFEST.replace("KIND", kind))
    refused(["report", "fk"], user_cwd, "fk")


def test_report_of_a_run_folder_with_a_damaged_summary_is_a_one_line_error(user_cwd, refused):
    assert main(RUN) == 0
    (user_cwd / "o" / "summary.json").write_text("{")
    refused(["report", "o"], user_cwd, "damaged run folder")
    os.remove(user_cwd / "o" / "summary.json")


@pytest.mark.parametrize("transfer, needle", [
    ("{bandwidth_gbs: 1e-300}", "kv_transfer.bandwidth_gbs"),
    ("{bandwidth_gbs: 1e300}", "kv_transfer.bandwidth_gbs"),
    ("{latency_us: 1e300}", "kv_transfer.latency_us"),
])
def test_kv_transfer_link_figures_far_outside_any_link_are_one_line_errors(user_cwd, refused, transfer, needle):
    (user_cwd / "b.yaml").write_text(B + "cluster: {groups: [{name: p, role: prefill}, "
                                     f"{{name: d, role: decode}}], kv_transfer: {transfer}}}\n")
    refused(RUN, user_cwd, needle)
