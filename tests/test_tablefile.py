"""Tables of numpy columns: CSV bytes as pandas writes them, Parquet, frames, and a
`llmsim run` that imports neither pandas nor matplotlib unless asked for plots."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.engine.metrics import percentiles
from sim.engine.runner import run
from sim.io import tablefile
from sim.io.tablefile import Labels, frame, write_csv, write_parquet

ROOT = Path(__file__).resolve().parent.parent
QUICK = ROOT / "scenarios" / "quickstart.yaml"


def pandas_bytes(df: pd.DataFrame, path: Path) -> bytes:
    df.to_csv(path, index=False, float_format="%.6f")
    return path.read_bytes()


def test_csv_bytes_equal_pandas_with_nan_quotes_and_labels(tmp_path):
    table = {
        "id": np.arange(5, dtype=np.int64),
        "t": np.array([0.0, 1.5, np.nan, 1e9 + 1 / 3, -2.25]),
        "reason": np.array(["", 'says "no"', "a, b", "line\nbreak", "50%"], dtype=object),
        "kind": Labels(np.array([0, 1, 1, 0, 2]), ("prefill", "decode", "x,y")),
    }
    write_csv(tmp_path / "ours.csv", table)
    assert (tmp_path / "ours.csv").read_bytes() == pandas_bytes(frame(table), tmp_path / "pd.csv")


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.floats(allow_infinity=False, width=64), st.integers(-2**40, 2**40),
                          st.sampled_from(["finished", "rejected", ""])), max_size=60),
       st.integers(1, 7))
def test_csv_bytes_equal_pandas_for_any_rows_and_block_size(tmp_path_factory, rows, block):
    tmp = tmp_path_factory.mktemp("csv")
    table = {"x": np.array([r[0] for r in rows], dtype=float),
             "n": np.array([r[1] for r in rows], dtype=np.int64),
             "s": np.array([r[2] for r in rows], dtype=object)}
    old = tablefile.CHUNK_ROWS
    tablefile.CHUNK_ROWS = block  # many blocks, some with NaN and some without
    try:
        write_csv(tmp / "ours.csv", table)
    finally:
        tablefile.CHUNK_ROWS = old
    assert (tmp / "ours.csv").read_bytes() == pandas_bytes(frame(table), tmp / "pd.csv")


def test_run_writes_the_bytes_pandas_writes_for_its_frames(tmp_path):
    out = run(QUICK, {"workload.num_requests": 60})
    out.write(tmp_path / "run", plots=False)
    for name, df in (("requests", out.requests), ("steps", out.steps)):
        assert (tmp_path / "run" / f"{name}.csv").read_bytes() == \
            pandas_bytes(df, tmp_path / f"{name}-pd.csv")


def test_parquet_tables_read_back_as_the_frames(tmp_path):
    pytest.importorskip("pyarrow")
    out = run(QUICK, {"workload.num_requests": 40})
    out.write(tmp_path / "run", plots=False, fmt="parquet")
    req = pd.read_parquet(tmp_path / "run" / "requests.parquet")
    steps = pd.read_parquet(tmp_path / "run" / "steps.parquet")
    assert list(req.columns) == list(out.requests.columns) and len(req) == 40
    assert np.array_equal(req.ttft_s.to_numpy(), out.requests.ttft_s.to_numpy(), equal_nan=True)
    assert steps.kind.astype(str).tolist() == out.steps.kind.tolist()
    assert not (tmp_path / "run" / "requests.csv").exists()


def test_stacked_tables_write_one_header_and_every_row(tmp_path):
    parts = [{"a": np.array([1, 2]), "r": Labels(np.array([0, 0]), ("x", "y"))},
             {"a": np.array([3]), "r": Labels(np.array([1]), ("x", "y"))}]
    write_csv(tmp_path / "t.csv", parts)
    assert (tmp_path / "t.csv").read_text() == "a,r\n1,x\n2,x\n3,y\n"
    assert frame(parts).r.tolist() == ["x", "x", "y"]
    pytest.importorskip("pyarrow")
    write_parquet(tmp_path / "t.parquet", parts)
    assert pd.read_parquet(tmp_path / "t.parquet").a.tolist() == [1, 2, 3]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(-1e6, 1e6), min_size=1, max_size=200))
def test_percentiles_are_numpys_exactly(values):
    x = np.array(values)
    assert np.array_equal(percentiles(x, (0, 25, 50, 90, 99, 100)),
                          np.percentile(x, (0, 25, 50, 90, 99, 100)))


def test_run_command_imports_neither_pandas_nor_matplotlib_without_plots(tmp_path):
    code = ("import sys; from sim.cli.main import main; "
            f"rc = main(['run', {str(QUICK)!r}, '--out', {str(tmp_path / 'r')!r}, "
            "'--set', 'workload.num_requests=20']); "
            "print(sorted(m for m in ('pandas', 'matplotlib') if m in sys.modules))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[-1] == "[]"
    assert json.loads((tmp_path / "r" / "summary.json").read_text())["requests"]["total"] == 20
    assert not (tmp_path / "r" / "timeline.png").exists()
