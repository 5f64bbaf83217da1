"""Tables of numpy columns, and writing them as CSV or Parquet without pandas.

A table is a dict of equal-length columns: numpy arrays (floats, ints, or objects holding
strings; or columns read from disk by slices, sim/io/spill.py) or `Labels` (a string column kept as small integer codes, e.g. a step's kind).
The run's outputs are built this way (sim/engine/metrics.py) so that `llmsim run` neither
imports pandas nor copies its step log (a fleet's can hold 10^7 rows); pandas frames
are made from the tables on request (`frame`).

`write_csv` writes the bytes `DataFrame.to_csv(index=False, float_format="%.6f")` writes
(floats as %.6f, NaN as an empty field, strings quoted only when they hold a comma, a
quote or a line break; '\\n' line ends), a block of rows at a time: one C-level `%`
over a format string repeated per row, 3-8x faster than pandas. `write_parquet`
needs pyarrow (an optional dependency: `pip install llmsim[parquet]`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

CHUNK_ROWS = 1 << 16  # rows formatted at a time: bounds the memory a write takes


@dataclass(frozen=True)
class Labels:
    """A string column as integer codes into `names` (names[codes[i]] is row i's value)."""

    codes: np.ndarray
    names: tuple[str, ...]

    def __len__(self) -> int:
        return len(self.codes)

    def strings(self) -> np.ndarray:
        """The column as an object array of Python strings."""
        return np.array(self.names, dtype=object)[np.asarray(self.codes)]

    def take(self, index) -> Labels:
        return Labels(self.codes[index], self.names)


Column = np.ndarray | Labels
Table = Mapping[str, Column]


def num_rows(table: Table) -> int:
    return len(next(iter(table.values()))) if table else 0


def frame(tables: Table | Sequence[Table]):
    """A pandas DataFrame of one table or of several stacked (columns in the first's
    order; Labels become string columns). Imports pandas."""
    import pandas as pd

    parts = [tables] if isinstance(tables, Mapping) else list(tables)
    cols = {}
    for name in parts[0]:
        pieces = [p[name].strings() if isinstance(p[name], Labels) else np.asarray(p[name])
                  for p in parts]
        cols[name] = pieces[0] if len(pieces) == 1 else np.concatenate(pieces)
    return pd.DataFrame(cols, copy=False)


def _quoted(text: str) -> str:
    if any(c in text for c in ',"\n\r'):
        return '"' + text.replace('"', '""') + '"'
    return text


def _strings(values: Iterable) -> list[str]:
    """Python strings as CSV fields (None and NaN as empty ones, as pandas writes them)."""
    seen: dict = {}
    out = []
    for v in values:
        s = seen.get(v)
        if s is None:
            s = seen[v] = "" if v is None or v != v else _quoted(str(v))
        out.append(s)
    return out


def _chunk_rows(table: Table, lo: int, hi: int, float_format: str) -> str:
    """Rows lo..hi of a table as CSV text."""
    m = hi - lo
    cells = np.empty((m, len(table)), dtype=object)
    fmts = []
    for j, col in enumerate(table.values()):
        if isinstance(col, Labels):
            cells[:, j] = np.array(_strings(col.names), dtype=object)[col.codes[lo:hi]]
            fmts.append("%s")
            continue
        part = col[lo:hi]
        kind = part.dtype.kind
        if kind == "f":
            nan = np.isnan(part)
            if nan.any():  # NaN is an empty field: the others formatted, then placed
                values = part[~nan].tolist()
                text = np.full(m, "", dtype=object)
                text[~nan] = ((float_format + "\n") * len(values) % tuple(values)).split("\n")[:-1]
                cells[:, j] = text
                fmts.append("%s")
            else:
                cells[:, j] = part
                fmts.append(float_format)
        elif kind in "iu":
            cells[:, j] = part
            fmts.append("%d")
        else:
            cells[:, j] = np.array(_strings(part.tolist()), dtype=object)
            fmts.append("%s")
    row = ",".join(fmts) + "\n"
    return (row * m) % tuple(cells.ravel().tolist())


def write_csv(path: str | Path, tables: Table | Sequence[Table],
              float_format: str = "%.6f") -> None:
    """One table, or several with the same columns one after another, as one CSV file."""
    parts = [tables] if isinstance(tables, Mapping) else list(tables)
    with open(path, "w", encoding="utf-8", newline="") as f:
        f.write(",".join(_quoted(name) for name in parts[0]) + "\n")
        for table in parts:
            n = num_rows(table)
            for lo in range(0, n, CHUNK_ROWS):
                f.write(_chunk_rows(table, lo, min(n, lo + CHUNK_ROWS), float_format))


def write_parquet(path: str | Path, tables: Table | Sequence[Table]) -> None:
    """One table, or several with the same columns (one row group each), as Parquet;
    Labels become dictionary-encoded strings, NaN stays NaN."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    parts = [tables] if isinstance(tables, Mapping) else list(tables)

    def arrow(col: Column):
        if isinstance(col, Labels):
            return pa.DictionaryArray.from_arrays(pa.array(np.asarray(col.codes, dtype=np.int32)),
                                                  pa.array(list(col.names), pa.string()))
        if col.dtype.kind == "O":
            return pa.array(col.tolist(), pa.string())
        return pa.array(np.asarray(col))

    first = pa.table({name: arrow(col) for name, col in parts[0].items()})
    with pq.ParquetWriter(path, first.schema) as writer:
        writer.write_table(first)
        for table in parts[1:]:
            writer.write_table(pa.table({name: arrow(col) for name, col in table.items()},
                                        schema=first.schema))


def parquet_available() -> bool:
    try:
        import pyarrow.parquet  # noqa: F401
    except ImportError:
        return False
    return True
