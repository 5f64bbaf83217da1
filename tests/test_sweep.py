"""Sweeps: the grid/zip expansion, identical rows whatever the executor, resume after
an interrupt, and throughput-latency curves with their knee."""

from __future__ import annotations

import importlib.util
import pickle
import subprocess
from pathlib import Path

import pandas as pd
import pytest

from sim.io.outputs import OutputError
from sim.io.specload import SpecError
from sim.planning.curve import knee, knee_table, run_curve
from sim.planning.sweep import configurations, execute, parse_axis, read_rows, run_sweep
from tests.conftest import run_llmsim

pytestmark = pytest.mark.xdist_group("test_sweep")

ROOT = Path(__file__).resolve().parent.parent
QUICK = str(ROOT / "scenarios" / "quickstart.yaml")
BASE = {"workload.num_requests": 60}
CONFIGS = configurations([("workload.arrival.rate", [2.0, 8.0])],
                         [("scheduler.policy", ["continuous", "chunked"]), ("seed", [1, 2])])


def test_grid_crosses_axes_and_zip_pairs_lists():
    assert CONFIGS == [
        {"workload.arrival.rate": 2.0, "scheduler.policy": "continuous", "seed": 1},
        {"workload.arrival.rate": 2.0, "scheduler.policy": "chunked", "seed": 2},
        {"workload.arrival.rate": 8.0, "scheduler.policy": "continuous", "seed": 1},
        {"workload.arrival.rate": 8.0, "scheduler.policy": "chunked", "seed": 2},
    ]
    assert parse_axis("kv.block_size=16,32", "--grid") == ("kv.block_size", [16, 32])
    with pytest.raises(SpecError, match="different lengths"):
        configurations([], [("a", [1, 2]), ("b", [1])])


@pytest.fixture(scope="module")
def sequential(tmp_path_factory):
    out = tmp_path_factory.mktemp("seq") / "s"
    return out, run_sweep(QUICK, CONFIGS, out, base=BASE, executor="sequential")


def test_results_have_one_row_per_configuration_with_fields_and_metrics(sequential):
    out, table = sequential
    assert len(table) == len(CONFIGS)
    for col in ("workload.arrival.rate", "scheduler.policy", "seed", "ttft_s.p99", "tpot_s.p50",
                "kv.util_peak", "steady.ratio", "config_key"):
        assert col in table.columns
    assert "wall_s" not in table.columns and "simulate_wall_s" not in table.columns  # machine-free rows
    assert table.config_key.is_unique
    disk = pd.read_csv(out / "results.csv")
    assert disk["ttft_s.p99"].tolist() == pytest.approx(table["ttft_s.p99"].tolist(), rel=1e-12)
    if importlib.util.find_spec("pyarrow"):
        assert pd.read_parquet(out / "results.parquet")["ttft_s.p99"].tolist() == table["ttft_s.p99"].tolist()


def test_process_pool_gives_the_same_bytes_as_sequential(sequential, tmp_path):
    out, _ = sequential
    run_sweep(QUICK, CONFIGS, tmp_path / "p", base=BASE, executor="process", workers=2)
    assert (tmp_path / "p" / "results.csv").read_bytes() == (out / "results.csv").read_bytes()


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="ray extra not installed")
def test_local_ray_gives_the_same_bytes_as_sequential(sequential, tmp_path):
    out, _ = sequential
    run_sweep(QUICK, CONFIGS, tmp_path / "r", base=BASE, executor="ray", workers=2)
    assert (tmp_path / "r" / "results.csv").read_bytes() == (out / "results.csv").read_bytes()


def test_interrupted_sweep_keeps_its_rows_and_resumes_to_the_same_table(sequential, tmp_path):
    out, _ = sequential
    dest = tmp_path / "i"
    seen = []

    def stop_after_two(key, row):
        seen.append(key)
        if len(seen) == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_sweep(QUICK, CONFIGS, dest, base=BASE, executor="sequential", on_row=stop_after_two)
    assert set(read_rows(dest / "rows.jsonl")) == set(seen)
    with (dest / "rows.jsonl").open("a") as f:
        f.write('{"key": "torn')  # a line cut by the interrupt is ignored
    rerun = []
    run_sweep(QUICK, CONFIGS, dest, base=BASE, executor="process", workers=2,
              on_row=lambda k, r: rerun.append(k))
    assert len(rerun) == len(CONFIGS) - 2 and not set(rerun) & set(seen)
    assert (dest / "results.csv").read_bytes() == (out / "results.csv").read_bytes()


def test_sweep_refuses_a_folder_it_did_not_write(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(SpecError, match="notes.txt|not empty|llmsim"):
        run_sweep(QUICK, CONFIGS[:1], tmp_path, base=BASE, executor="sequential")


def test_spec_errors_survive_pickling_with_file_path_and_message():
    for err in (SpecError("a.yaml", "parallel.tensor", "3 does not divide heads=32 (allowed: 1, 2)"),
                SpecError(None, "", "no file"), OutputError("--out", "/x/y", "not empty")):
        back = pickle.loads(pickle.dumps(err))
        assert type(back) is type(err)
        assert (back.file, back.path, back.message, str(back)) == (err.file, err.path, err.message, str(err))


NO_RAY = pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="ray extra not installed")


@pytest.mark.parametrize("executor", ["process", "sequential", pytest.param("ray", marks=NO_RAY)])
def test_a_worker_spec_error_reaches_the_parent_as_itself(executor):
    bad = {**BASE, "parallel.tensor": 3}  # refused when resolved into replicas, in the worker
    tasks = [("a", QUICK, bad), ("b", QUICK, {**BASE, "parallel.tensor": 3, "seed": 2})]
    with pytest.raises(SpecError) as caught:
        list(execute(tasks, executor, workers=2))
    assert type(caught.value) is SpecError  # not a wrapper holding a traceback
    assert str(caught.value) == (f"{QUICK}: parallel.tensor: 3 does not divide heads=32 of llama-3-8b "
                                 "(allowed: 1, 2, 4, 8)")


def _sweep_cli(*args: str) -> subprocess.CompletedProcess:
    return run_llmsim("sweep", QUICK, "--set", "workload.num_requests=20", *args)


@pytest.mark.parametrize("executor", ["process", "sequential"])
def test_a_refused_configuration_stops_the_sweep_before_it_writes(tmp_path, executor):
    out = _sweep_cli("--grid", "parallel.tensor=1,3", "--out", str(tmp_path / "new"), "--executor", executor)
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr == ("llmsim: error: sweep configuration parallel.tensor=3: "
                          f"{QUICK}: parallel.tensor: 3 does not divide heads=32 of llama-3-8b "
                          "(allowed: 1, 2, 4, 8)\n")
    assert not (tmp_path / "new").exists()


def test_a_refused_configuration_leaves_an_earlier_sweep_untouched(tmp_path):
    dest = tmp_path / "s"
    run_sweep(QUICK, [{"parallel.tensor": 1}], dest, base={"workload.num_requests": 20}, executor="sequential")
    before = {f.name: f.read_bytes() for f in dest.iterdir()}
    with pytest.raises(SpecError, match=r"^--grid/--zip scheduler.policy=nope: scheduler.policy: unknown .nope."):
        run_sweep(QUICK, configurations([("parallel.tensor", [1, 2])], [("scheduler.policy", ["continuous", "nope"])]),
                  dest, base={"workload.num_requests": 20}, executor="process", workers=2)
    assert {f.name: f.read_bytes() for f in dest.iterdir()} == before


def test_knee_is_last_rate_before_ttft_bound_or_throughput_breaks():
    pts = pd.DataFrame({"rate": [1, 2, 4, 8], "ttft_s.p99": [0.1, 0.2, 0.5, 3.0],
                        "steady.ratio": [1.0, 0.99, 0.97, 0.6]})
    assert knee(pts, 1.0) == (4.0, 1.0)
    assert knee(pts, 0.3) == (2.0, 0.3)
    assert knee(pts.assign(**{"steady.ratio": [1.0, 0.5, 1.0, 1.0]}), 10.0)[0] == 1.0


def test_knee_honours_the_tpot_slo_too():
    pts = pd.DataFrame({"rate": [1, 2, 4, 8], "ttft_s.p99": [0.1, 0.2, 0.3, 0.4],
                        "tpot_s.p99": [0.02, 0.03, 0.08, 0.09], "steady.ratio": [1.0] * 4})
    assert knee(pts, 1.0) == (8.0, 1.0)  # no TPOT bound: TTFT and throughput alone
    assert knee(pts, 1.0, 0.05) == (2.0, 1.0)  # 80 ms p99 TPOT at 4 req/s breaks a 50 ms SLO
    assert knee(pts, 1.0, 0.01)[0] is None  # broken at the lowest rate tried


def test_knee_table_says_when_the_curve_has_no_knee_up_to_the_highest_rate_tried():
    table = pd.DataFrame({"scenario": ["a"] * 3 + ["b"] * 3 + ["c"] * 3, "rate": [1, 2, 4] * 3,
                          "ttft_s.p99": [0.1, 0.2, 0.3, 0.1, 0.2, 5.0, 9.0, 9.0, 9.0],
                          "tpot_s.p99": [0.01] * 9, "steady.ratio": [1.0] * 9})
    k = knee_table(table, {"a": 1.0, "b": 1.0, "c": 1.0}, {"a": 0.05})
    assert k.knee.tolist() == ["no knee up to the highest rate tried (4 req/s)", "2 req/s",
                               "below the lowest rate tried (1 req/s)"]
    assert k.knee_rate.tolist()[:2] == [4.0, 2.0] and pd.isna(k.knee_rate[2])
    assert k.tpot_bound_s.tolist()[0] == 0.05 and pd.isna(k.tpot_bound_s[1])


def test_curve_marks_static_batching_knee_below_continuous(tmp_path):
    batching = str(ROOT / "scenarios" / "batching.yaml")
    static = tmp_path / "static.yaml"
    static.write_text(Path(batching).read_text().replace("policy: continuous", "policy: static")
                      .replace("name: batching", "name: static"))
    (tmp_path / "data").symlink_to(ROOT / "data")
    table, knees = run_curve([batching, str(static)], [0.25, 0.5, 1, 2, 4], tmp_path / "c",
                             requests=120, ttft_bound=5.0, workers=2)
    k = dict(zip(knees.scenario, knees.knee_rate, strict=True))
    assert len(table) == 10 and (tmp_path / "c" / "curve.png").stat().st_size > 0
    assert k["batching"] >= 1.0
    assert pd.isna(k["static"]) or k["static"] < k["batching"]


def test_a_curve_checks_every_point_before_it_runs_one(tmp_path):
    # TP 3 loads as a scenario but no Llama-3-8B replica can be built: refused at the
    # up-front check, named by its curve point, before any simulation or folder
    sc = tmp_path / "tp3.yaml"
    sc.write_text(Path(QUICK).read_text().replace("gpu: h200-sxm", "gpu: h200-sxm\nparallel: {tensor: 3}", 1))
    with pytest.raises(SpecError, match=r"^curve point 1 req/s: .*tp3.yaml: parallel.tensor: 3 does not divide"):
        run_curve([str(sc)], [1, 2], tmp_path / "out", requests=20, executor="sequential")
    assert not (tmp_path / "out").exists()


def test_sweep_prints_the_metric_its_swept_field_moves(tmp_path, capsys):
    from sim.cli.main import main
    from sim.planning.sweep import swept_metrics

    frame = pd.DataFrame({"kv.block_size": [16, 64], "kv.reserved_unused_share": [0.01, 0.04],
                          "kv.util_peak": [0.2, 0.2], "speculative.speedup_vs_decode": [None, None],
                          "prefix_cache.hit_rate": [0.3, 0.3]})
    assert swept_metrics(["kv.block_size"], frame) == ["kv.reserved_unused_share", "kv.util_peak"]
    assert swept_metrics(["kv.prefix_caching"], frame) == ["prefix_cache.hit_rate", "kv.util_peak"]
    assert swept_metrics(["speculative.k"], frame) == []  # no value: not shown
    assert swept_metrics(["workload.arrival.rate"], frame) == []
    assert main(["sweep", QUICK, "--grid", "kv.block_size=16,64", "--set", "workload.num_requests=20",
                 "--executor", "sequential", "--out", str(tmp_path / "sw")]) == 0
    head, *rows = capsys.readouterr().out.splitlines()[:3]
    assert "kv.reserved_unused_share" in head.split()
    waste = pd.read_csv(tmp_path / "sw" / "results.csv")["kv.reserved_unused_share"]
    col = head.split().index("kv.reserved_unused_share")
    assert [float(r.split()[col]) for r in rows] == pytest.approx(waste.tolist(), rel=0.01)
    assert waste[1] > waste[0]  # 64-token blocks leave more of the last block empty


def test_a_concurrency_curve_runs_closed_loop_users_and_throughput_grows_with_them(tmp_path):
    # an open-loop scenario run as C users (vLLM's --max-concurrency): one user keeps the
    # replica at batch 1; four users share steps, so throughput grows with C
    table, knees = run_curve([QUICK], concurrency=[4, 1], out_dir=tmp_path / "c", requests=24,
                             executor="sequential")
    assert list(table.concurrency) == [1, 4] and "rate" not in table
    assert table.mean_batch_size.iloc[0] == pytest.approx(1.0)
    assert table.request_throughput.iloc[1] > 2 * table.request_throughput.iloc[0]
    assert "knee_concurrency" in knees and (tmp_path / "c" / "curve.png").stat().st_size > 0
