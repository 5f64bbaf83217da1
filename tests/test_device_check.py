"""benchmarks/fidelity/device_check.py: issue 9's device checks in one budgeted command. The
comparison of measured CUDA-graph steps with the simulator on hand-made grids of known
error, the environment gate, the budget's skips, and one CPU dry run end to end."""

from __future__ import annotations

import re
import tarfile

import pytest

from benchmarks.fidelity import device_check as dc
from sim.costmodel.runtime import load_runtime
from sim.fit.runtime_fit import gpu_times

ROWS = [  # (model, batch, ctx, simulated / measured)
    ("llama-3-8b", 1, 1024, 1.1), ("llama-3-8b", 32, 4096, 1.1),
    ("llama-3.2-1b", 8, 256, 1.1), ("llama-3.2-1b", 64, 1024, 0.9),
]


def _decode_rows(ms: list[float] | None = None) -> list[dict]:
    return [{"model": m, "kind": "decode", "batch": b, "new_tokens": 1, "ctx": c,
             "ms": ms[i] if ms else 1.0} for i, (m, b, c, _) in enumerate(ROWS)]


def _write_grid(path, rows: list[dict]) -> None:
    lines = ["model,kind,batch,new_tokens,ctx,ms"]
    lines += [f"{r['model']},{r['kind']},{r['batch']},{r['new_tokens']},{r['ctx']},{r['ms']!r}"
              for r in rows]
    path.write_text("\n".join(lines) + "\n")


def test_graph_steps_are_predicted_as_the_reference_models_kernels_alone():
    rows = _decode_rows()
    graph = dc.report.graph_runtime()
    assert graph.elementwise == "unfused" and graph.host_ms_per_step == 0
    # kernels only: the warm-grid fit's kernel time of the same steps (unfused, paged_reference)
    assert dc.report.predicted_ms(rows, graph) == pytest.approx(list(gpu_times(rows, "h200-sxm")))
    # the reference model's unfused elementwise ops cost more than cuda-graph's fused ones
    fused = dc.report.predicted_ms(rows, load_runtime("cuda-graph"))
    assert all(u > f for u, f in zip(dc.report.predicted_ms(rows, graph), fused, strict=True))


def test_graph_step_errors_per_model_are_the_ones_built_into_the_grid(tmp_path):
    graph = dc.report.graph_runtime()
    pred = dc.report.predicted_ms(_decode_rows(), graph)
    measured = [p / ratio for p, (*_, ratio) in zip(pred, ROWS, strict=True)]
    _write_grid(tmp_path / "iter_grid_graphs.csv", _decode_rows(measured))
    result = dc.report.compare(tmp_path / "iter_grid_graphs.csv", graph)
    s = result["summary"]
    assert s["llama-3-8b decode"] == pytest.approx({"rows": 2, "mape": 0.1, "bias": 0.1,
                                                    "max": 0.1})
    assert s["llama-3.2-1b decode"] == pytest.approx({"rows": 2, "mape": 0.1, "bias": 0.0,
                                                      "max": 0.1}, abs=1e-12)
    assert s["all"]["rows"] == 4 and s["all"]["bias"] == pytest.approx(0.05)
    assert [r["err"] for r in result["rows"]] == pytest.approx([0.1, 0.1, 0.1, -0.1])


def test_an_absent_or_empty_grid_compares_no_rows(tmp_path):
    assert dc.report.compare(tmp_path / "missing.csv", dc.report.graph_runtime())["rows"] == []
    _write_grid(tmp_path / "empty.csv", [])
    assert dc.report.compare(tmp_path / "empty.csv", dc.report.graph_runtime())["rows"] == []


def test_the_environment_gate_names_what_is_missing():
    ok = {p: "1.0" for p in dc.PACKAGES} | {"cuda_available": True}
    assert dc.env_problem(ok, "cuda") == ""
    assert "simpy" in dc.env_problem(ok | {"simpy": "missing (ModuleNotFoundError)"}, "cuda")
    assert "sees no CUDA device" in dc.env_problem(ok | {"cuda_available": False}, "cuda")
    # a CPU dry run needs neither CUDA nor Triton
    assert dc.env_problem(ok | {"cuda_available": False, "triton": "missing (x)"}, "cpu") == ""


def test_cuda_asked_for_on_a_machine_without_it_stops_with_that_line(tmp_path):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    rc = dc.main(["--out", str(tmp_path / "out"), "--device", "cuda", "--work",
                  str(tmp_path / "work")])
    text = (tmp_path / "out" / "device_check.md").read_text()
    assert rc == 2
    assert "**Stopped: --device cuda, but PyTorch" in text and "torch: " in text
    assert "## 2. Live runs" not in text


def test_steps_the_budget_cannot_cover_are_skipped_and_the_summary_still_written(tmp_path):
    pytest.importorskip("torch")
    rc = dc.main(["--out", str(tmp_path / "out"), "--device", "cpu", "--quick",
                  "--budget-s", "20", "--work", str(tmp_path / "work")])
    text = (tmp_path / "out" / "device_check.md").read_text()
    assert rc == 0
    assert re.search(r"\| iterations \| skipped \|", text)
    assert re.search(r"\| validate tiny \| skipped \| 0 \| needs ~\d+ s, \d+ s left \|", text)


@pytest.mark.slow
def test_a_cpu_dry_run_writes_every_section_with_error_tables(tmp_path):
    """The whole command on the CPU (~25 s): iteration grid, comparisons, one validation.
    The budget is a ceiling far above that (the quick grid is the same whatever it is), so a
    loaded machine (parallel tests, other jobs) does not time a step out."""
    pytest.importorskip("torch")
    out = tmp_path / "out"
    rc = dc.main(["--out", str(out), "--device", "cpu", "--quick", "--budget-s", "900",
                  "--work", str(tmp_path / "work")])
    text = (out / "device_check.md").read_text()
    assert rc == 0, text
    for section in ("## Environment", "## Steps", "## 1. CUDA-graph decode steps",
                    "## 1b. Eager steps", "## 2. Live runs", "### tiny", "## Files"):
        assert section in text
    assert "No rows in `iter_grid_graphs.csv` (CUDA only)." in text
    eager_rows = re.findall(r"^\| tiny-llama (?:decode|prefill) \| (\d+) \|", text, re.M)
    assert len(eager_rows) == 2 and all(int(n) > 0 for n in eager_rows)
    assert re.search(r"^\| TPOT p50 \(ms\) \| [\d.]+ \| [\d.]+ \| [+−][\d.]+ % \| ±10 % \|",
                     text, re.M)
    with tarfile.open(out / "device_check.tar.gz") as tar:
        names = set(tar.getnames())
    assert {"iter/iter_grid_eager.csv", "iter/calibration.json", "validate-tiny/report.md",
            "logs/iterations.out"} <= names
    assert (out / "iter_grid_eager.csv").is_file() and (out / "device_check.json").is_file()


class _Dev:
    released = 0

    def release(self) -> None:
        self.released += 1


def test_a_point_that_raises_is_recorded_and_the_next_one_still_runs(tmp_path):
    pytest.importorskip("torch")
    from sim.calibrate.bench import Point
    from sim.calibrate.device import TooLarge
    from sim.calibrate.output import TableWriter

    def row(ms: float):
        return lambda dev: [{"_table": "iter_grid_graphs", "model": "m", "kind": "decode",
                             "batch": 1, "new_tokens": 1, "ctx": 8, "ms": ms}]

    def fails(exc):
        def run(dev):
            raise exc
        return run

    points = [Point("iteration", 0, "a", row(1.0)),
              Point("iteration", 0, "capture", fails(RuntimeError("graph capture failed"))),
              Point("iteration", 0, "big", fails(TooLarge("needs 9 blocks"))),
              Point("iteration", 0, "oom", fails(RuntimeError("CUDA out of memory. Tried"))),
              Point("iteration", 1, "b", row(2.0))]
    w, dev = TableWriter(tmp_path), _Dev()
    counts, stopped = dc.run_points(points, dev, w, dc.time.perf_counter(), 60.0)
    w.close()
    assert stopped == "complete"
    assert counts == {"measured": 2, "skipped": 3, "errors": 1, "total": 5}
    assert (tmp_path / "iter_grid_graphs.csv").read_text().splitlines()[1:] == \
        ["m,decode,1,1,8,1", "m,decode,1,1,8,2"]
    reasons = (tmp_path / "skipped.csv").read_text()
    assert "capture,error: RuntimeError: graph capture failed" in reasons
    assert "big,too large: needs 9 blocks" in reasons and "oom,out of memory: CUDA" in reasons
    assert dev.released == 2  # after each error, the allocator's cache is returned
    # a spent budget stops before the next point
    counts, stopped = dc.run_points(points, dev, TableWriter(tmp_path / "b"),
                                    dc.time.perf_counter() - 10.0, 1.0)
    assert (stopped, counts["measured"]) == ("budget", 0)


def test_it_never_writes_over_a_users_files(tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    assert dc.main(["--out", str(out), "--device", "cpu", "--quick"]) == 2
    assert "--out" in capsys.readouterr().err
    assert [p.name for p in out.iterdir()] == ["notes.txt"]
    work = tmp_path / "work"
    work.mkdir()
    (work / "data.csv").write_text("mine")
    assert dc.main(["--out", str(tmp_path / "o2"), "--device", "cpu", "--quick",
                    "--work", str(work)]) == 2
    assert [p.name for p in work.iterdir()] == ["data.csv"] and not (tmp_path / "o2").exists()


def test_its_work_folder_must_be_apart_from_out(tmp_path, capsys):
    for work in (tmp_path / "out", tmp_path / "out" / "w", tmp_path):
        assert dc.main(["--out", str(tmp_path / "out"), "--device", "cpu", "--quick",
                        "--work", str(work)]) == 2
        assert "--work" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
