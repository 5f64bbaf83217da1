"""Tables of numpy columns, and writing them as CSV or Parquet without pandas.

A table is a dict of equal-length columns: numpy arrays (floats, ints, or objects holding
strings; or columns read from disk by slices, sim/io/spill.py) or `Labels` (a string column kept as small integer codes, e.g. a step's kind).
The run's outputs are built this way (sim/engine/metrics.py) so that `llmsim run` neither
imports pandas nor copies its step log (a fleet's can hold 10^7 rows); pandas frames
are made from the tables on request (`frame`).

`write_csv` writes the bytes `DataFrame.to_csv(index=False, float_format="%.6f")` writes
(floats as %.6f, NaN as an empty field, strings quoted only when they hold a comma, a
quote or a line break; '\\n' line ends), a block of rows at a time, made in numpy: each
column as a matrix of bytes (numbers digit by digit, strings from a table of their
distinct fields), padded with a byte UTF-8 never holds, side by side with the commas and
line ends, the padding then dropped; ~2.5x faster than formatting each value in Python
(which prints what numpy cannot: other float formats, huge values, exact halves).
`write_parquet`
needs pyarrow (an optional dependency: `pip install llmsim[parquet]`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
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


_FILL = 0xFF  # never a byte of UTF-8 text: marks the unused bytes of a fixed-width field
_FIXED = re.compile(r"%\.([0-9])f")  # a float format the fields are made for in numpy


def _digits(a: np.ndarray, shown: int, point: int) -> np.ndarray:
    """Bytes (m, w) of the whole numbers `a` (int64, >= 0) in decimal, right-aligned in
    _FILL, at least `shown` digits, a '.' before the last `point` digits (0: none)."""
    top = int(a.max()) if len(a) else 0
    n = max(len(str(top)), shown)
    out = np.empty((len(a), n + (point > 0)), np.uint8)
    rest = a.astype(np.int32 if top < 2**31 else np.int64)  # int32: the same digits, faster
    higher, digit = np.empty_like(rest), np.empty_like(rest)  # large temporaries fault pages
    j = out.shape[1] - 1
    for k in range(n):
        if point and k == point:
            out[:, j] = ord(".")
            j -= 1
        np.floor_divide(rest, 10, out=higher)
        np.multiply(higher, -10, out=digit)
        digit += rest
        digit += 48
        if k >= shown:  # a leading zero is no digit
            np.copyto(digit, _FILL, where=a < 10**k)
        out[:, j] = digit
        rest, higher, j = higher, rest, j - 1
    return out


def _signed(negative: np.ndarray, magnitude: np.ndarray) -> np.ndarray:
    if not negative.any():
        return magnitude
    sign = np.where(negative, ord("-"), _FILL).astype(np.uint8)
    return np.concatenate([sign[:, None], magnitude], axis=1)


def _text(fields: list[str], codes) -> np.ndarray:
    """Bytes (m, w) of row i's field fields[codes[i]], left-aligned in _FILL."""
    enc = [f.encode("utf-8") for f in fields]
    w = max(map(len, enc), default=0)
    table = np.frombuffer(b"".join(e.ljust(w, b"\xff") for e in enc), np.uint8)
    return table.reshape(len(enc), w)[np.asarray(codes)]


def _field(value) -> str:
    """A Python value as a CSV field (None and NaN empty, as pandas writes them)."""
    return "" if value is None or value != value else _quoted(str(value))


def _string_field(values: list) -> np.ndarray:
    index: dict = {}
    fields: list[str] = []
    codes = []
    for v in values:
        c = index.get(v)
        if c is None:
            c = index[v] = len(fields)
            fields.append(_field(v))
        codes.append(c)
    return _text(fields, codes)


def _float_field(x: np.ndarray, float_format: str) -> np.ndarray:
    """`float_format % v` of each value, NaN an empty field: in numpy for '%.Nf' with
    |v| 10^N < 2^52, by Python otherwise. printf rounds the exact binary value; the product
    |v| 10^N is rounded once, and monotonically, so it lies on the same side of every
    half (k + 1/2 is a float here) unless it is one: only those are printed by Python."""
    fixed = _FIXED.fullmatch(float_format)
    nan = np.isnan(x)
    mag = np.abs(np.where(nan, 0.0, x)) if x.dtype.itemsize <= 8 else x
    places = int(fixed[1]) if fixed else 0
    if fixed is None or x.dtype.itemsize > 8 or not np.all(mag < 2.0**52 / 10**places):
        return _text(["" if v != v else float_format % v for v in x.tolist()], np.arange(len(x)))
    y = mag.astype(np.float64) * 10.0**places
    q = np.rint(y).astype(np.int64)
    for i in np.flatnonzero(y - np.floor(y) == 0.5).tolist():
        q[i] = int((float_format % mag[i]).replace(".", ""))
    out = _signed(np.signbit(x) & ~nan, _digits(q, places + 1, places))
    out[nan] = _FILL
    return out


def _int_field(v: np.ndarray) -> np.ndarray:
    if len(v) and (v.min() < -(2**63) + 1 if v.dtype.kind == "i" else v.max() >= 2**63):
        return _string_field(v.tolist())
    a = v.astype(np.int64)
    return _signed(a < 0, _digits(np.abs(a), 1, 0))


def _chunk_bytes(table: Table, lo: int, hi: int, float_format: str) -> bytes:
    """Rows lo..hi of a table as CSV bytes: every field as fixed-width bytes padded with
    _FILL, laid side by side with the commas and line ends, the padding then dropped."""
    parts = []
    for col in table.values():
        if isinstance(col, Labels):
            part = _text([_field(n) for n in col.names], col.codes[lo:hi])
        else:
            values = col[lo:hi]
            kind = values.dtype.kind
            part = (_float_field(values, float_format) if kind == "f" else
                    _int_field(values) if kind in "iu" else _string_field(values.tolist()))
        parts += [part, np.full((hi - lo, 1), ord(","), np.uint8)]
    parts[-1] = np.full((hi - lo, 1), ord("\n"), np.uint8)
    flat = np.concatenate(parts, axis=1).ravel()
    return flat[flat != _FILL].tobytes()


def write_csv(path: str | Path, tables: Table | Sequence[Table],
              float_format: str = "%.6f") -> None:
    """One table, or several with the same columns one after another, as one CSV file."""
    parts = [tables] if isinstance(tables, Mapping) else list(tables)
    with open(path, "wb") as f:
        f.write((",".join(_quoted(name) for name in parts[0]) + "\n").encode("utf-8"))
        for table in parts:
            n = num_rows(table)
            for lo in range(0, n, CHUNK_ROWS):
                f.write(_chunk_bytes(table, lo, min(n, lo + CHUNK_ROWS), float_format))


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
