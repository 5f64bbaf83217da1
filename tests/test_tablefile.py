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


# values the numpy field writer must print as printf does: halves of the last place (exact
# binary ties such as 1/128 and near ones such as 2.5e-6), -0.0, tiny negatives, values too
# large for micro-units in 2^52, infinities, subnormals, NaN
_USUAL = st.one_of(st.floats(-1e9, 1e9), st.integers(-2**30, 2**30).map(lambda k: k / 2**20),
                   st.integers(-10**12, 10**12).map(lambda k: (k + 0.5) / 1e6),
                   st.sampled_from([0.0, -0.0, -1e-9, 5e-7, 4.5e9, 5e-324, 0.0078125,
                                    999999.9999995, np.nan]))
_EDGY = st.one_of(st.floats(width=64), st.floats(width=32), _USUAL,
                  st.sampled_from([2.0**52, 1e300, -np.inf]))


def test_csv_floats_round_halves_as_printf(tmp_path):
    """x.5 millionths: printf rounds the binary value (2.5e-6 is a little over, 3.5e-6 a
    little under, 0.0078125 an exact tie, to even), not the product x * 10^6."""
    x = np.array([(k + 0.5) / 10**6 for k in range(-300, 300)]
                 + [(k + 0.5) / 10**6 for k in range(10**12, 10**12 + 300)]
                 + [0.0078125, -0.0, -1e-9, 1e-9, 4503599627.370495, np.nan])
    big = np.full(len(x), 4503599627.3705)  # too large for micro-units in 2^52: by Python
    write_csv(tmp_path / "x.csv", {"x": x, "big": big})
    want = "x,big\n" + "".join(f"{v:.6f},{b:.6f}\n".replace("nan", "")
                                for v, b in zip(x.tolist(), big.tolist(), strict=True))
    assert (tmp_path / "x.csv").read_text() == want


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(_USUAL, _EDGY, st.integers(-2**63, 2**63 - 1),
                          # (no lone surrogates: UTF-8 cannot encode them, for pandas either)
                          st.text(st.characters(exclude_characters="\r",
                                                exclude_categories=("Cs",)), max_size=4),
                          st.integers(0, 2**64 - 1)), max_size=40),
       st.sampled_from(["%.6f", "%.3f", "%.0f", "%.9f", "%g", "%.2e"]),
       st.sampled_from([np.float64, np.float32]))
def test_csv_bytes_equal_pandas_at_the_edges(tmp_path_factory, rows, fmt, ftype):
    """Any float format, printf's rounding of halves, int64 and uint64 extremes, any text
    (NUL, 0xFF's character, quotes, non-ASCII), float32 columns."""
    tmp = tmp_path_factory.mktemp("csv")
    with np.errstate(over="ignore"):  # float32: a large value is inf, an edge as well
        x = np.array([r[0] for r in rows]).astype(ftype)
        edgy = np.array([r[1] for r in rows]).astype(ftype)
    table = {"x": x, "edgy": edgy,
             "n": np.array([r[2] for r in rows], dtype=np.int64),
             "s": np.array([r[3] for r in rows], dtype=object),
             "u": np.array([r[4] for r in rows], dtype=np.uint64),
             "k": Labels(np.arange(len(rows)) % 2, ("\x00\xff", "ü,\"")),
             "b": np.array([r[2] % 2 == 0 for r in rows], dtype=bool)}
    write_csv(tmp / "ours.csv", table, float_format=fmt)
    df = frame(table)
    df.to_csv(tmp / "pd.csv", index=False, float_format=fmt)
    assert (tmp / "ours.csv").read_bytes() == (tmp / "pd.csv").read_bytes()


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
