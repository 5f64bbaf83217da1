"""Columns that live on disk: a run's step log and inter-token gaps, written out a block at a
time while the run goes on (so a fleet-day's memory does not grow with its iterations),
read back a block at a time by the table writers and the summary.

A `SpillDir` is one run's private folder, `.llmsim-spill-<pid>@<host>-<random>` under the
system temp folder (named as `sim/io/tempdirs.py` names its folders, so `clean_stale`
removes one a killed run left); it is made at the first write and removed with the last
object that refers to it (or at exit). A column is a raw file of fixed-width numbers
(native order) that rows are appended to; `DiskColumn` is such a file
followed by the rows still in memory, read by slices (`col[lo:hi]`: one `np.fromfile`),
never mapped, so reading it back does not raise the process's resident memory beyond a
slice. `Chain` joins columns end to end (a fleet's pooled gaps); `Constant` is a column
of one repeated value; `Lazy` one a function makes a slice at a time (request records
gathered from their replicas' files, and columns computed from them).

An int64 column goes to disk in the narrowest integer type that holds every value written
to it so far (`NARROW`: uint8 .. int32, else int64), its type in its file's name
(`<name>~uint8`; int64 under the plain name), and `DiskColumn` widens what it reads back:
the same int64 values, in a fraction of the bytes. A fleet-day logs ~2 G steps, each with
five int64 step-log fields and one gap weight (a batch's row count: at most the
replica's max_num_seqs), most of them below 2^16: 48 bytes of integers a step on disk,
then ~8 (issue 19: the day's spill folder would not fit this machine's disk). A chunk
that needs a wider type than its file has rewrites the file in that type once (rare: a
column's range settles within its first chunks). Read int64 columns through
`DiskColumn` (`SpillDir.file(name)` is the plain file of the other types).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import weakref
from pathlib import Path

import numpy as np

from sim.io.tempdirs import SPILL_PREFIX, _temp_prefix, clean_stale


class SpillDir:
    """One run's folder of spilled columns (made on first use; removed with this object
    when `owned`, else left to whoever made it: a worker process writes into its parent's)."""

    def __init__(self, path: str | Path | None = None):
        self._path = Path(path) if path is not None else None
        self.owned = path is None
        self._stored: dict[str, np.dtype] = {}  # int64 columns written here: their type on disk

    @property
    def path(self) -> Path:
        if self._path is None:
            parent = Path(tempfile.gettempdir())
            clean_stale(parent)
            self._path = Path(tempfile.mkdtemp(prefix=_temp_prefix(SPILL_PREFIX), dir=parent))
            weakref.finalize(self, shutil.rmtree, str(self._path), True)
        return self._path

    def file(self, name: str) -> Path:
        return self.path / name

    def append(self, name: str, values) -> None:
        """Append `values` (an array.array or numpy array) to the column file `name`
        (int64 values: to its narrowest file, see the module's docstring)."""
        if memoryview(values).itemsize == 8 and np.asarray(values).dtype == np.int64:
            self._append_narrow(name, np.asarray(values))
            return
        with open(self.file(name), "ab") as f:
            f.write(memoryview(values).cast("B"))

    def _append_narrow(self, name: str, a: np.ndarray) -> None:
        old = self._stored.get(name)
        if old is None or not self.file(_typed(name, old)).exists():
            old = stored_type(self, name)  # (a file removed meanwhile: none, start afresh)
        lo, hi = (int(a.min()), int(a.max())) if len(a) else (0, 0)
        if old is not None:
            lo, hi = min(lo, int(np.iinfo(old).min)), max(hi, int(np.iinfo(old).max))
        kind = narrowest(lo, hi)
        if old is not None and kind != old:  # widen what the file holds, once
            before = self.file(_typed(name, old))
            self.file(_typed(name, kind)).write_bytes(
                np.fromfile(before, dtype=old).astype(kind).tobytes())
            before.unlink()
        with open(self.file(_typed(name, kind)), "ab") as f:
            f.write(a.astype(kind).tobytes())
        self._stored[name] = kind


NARROW = tuple(np.dtype(t) for t in (np.uint8, np.int8, np.uint16, np.int16, np.uint32, np.int32))
WIDE = np.dtype(np.int64)


def narrowest(lo: int, hi: int) -> np.dtype:
    """The first of NARROW that holds every integer from lo to hi, else int64."""
    for t in NARROW:
        info = np.iinfo(t)
        if info.min <= lo and hi <= info.max:
            return t
    return WIDE


def _typed(name: str, kind: np.dtype) -> str:
    """The file of int64 column `name` stored as `kind`."""
    return name if kind == WIDE else f"{name}~{kind.name}"


def stored_type(spill: SpillDir, name: str) -> np.dtype | None:
    """The type int64 column `name` has on disk (None: no file yet)."""
    base = os.path.join(spill.path, name)  # (os.path: a read checks this every block)
    for kind in (WIDE, *NARROW):
        if os.path.exists(base if kind == WIDE else f"{base}~{kind.name}"):
            return kind
    return None


class DiskColumn:
    """`rows` values of `dtype` in the file `name` of `spill`, then `tail` (in memory)."""

    def __init__(self, spill: SpillDir, name: str, dtype, rows: int, tail: np.ndarray):
        self.spill, self.name, self.dtype, self.rows = spill, name, np.dtype(dtype), rows
        self.tail = np.asarray(tail, dtype=self.dtype)

    def __len__(self) -> int:
        return self.rows + len(self.tail)

    def _read(self, lo: int, hi: int) -> np.ndarray:
        parts = []
        if lo < self.rows:
            end = min(hi, self.rows)
            kind, file = self.dtype, self.name
            if kind == WIDE:  # stored narrower (SpillDir.append): widened as read
                kind = stored_type(self.spill, self.name) or WIDE
                file = _typed(file, kind)
            a = np.fromfile(self.spill.file(file), dtype=kind, count=end - lo,
                            offset=lo * kind.itemsize)
            parts.append(a if kind == self.dtype else a.astype(self.dtype))
        if hi > self.rows:
            parts.append(self.tail[max(lo - self.rows, 0):hi - self.rows])
        if len(parts) == 1:
            return parts[0]
        return np.concatenate(parts) if parts else np.zeros(0, dtype=self.dtype)

    def __getitem__(self, key):
        return _getitem(self, key)

    def __array__(self, dtype=None, copy=None):
        a = self._read(0, len(self))
        return a if dtype is None else a.astype(dtype)


class Chain:
    """Columns (numpy arrays or DiskColumns) of one dtype, end to end."""

    def __init__(self, parts: list):
        self.parts = [p for p in parts if len(p)]
        self.dtype = np.dtype(parts[0].dtype) if parts else np.dtype(float)
        self.starts = np.cumsum([0] + [len(p) for p in self.parts])

    def __len__(self) -> int:
        return int(self.starts[-1])

    def _read(self, lo: int, hi: int) -> np.ndarray:
        out = []
        for p, start in zip(self.parts, self.starts[:-1].tolist(), strict=True):
            a, b = max(lo - start, 0), min(hi - start, len(p))
            if a < b:
                out.append(np.asarray(p[a:b]))
        if len(out) == 1:
            return out[0]
        return np.concatenate(out) if out else np.zeros(0, dtype=self.dtype)

    def __getitem__(self, key):
        return _getitem(self, key)

    def __array__(self, dtype=None, copy=None):
        a = self._read(0, len(self))
        return a if dtype is None else a.astype(dtype)


class Constant:
    """A column of `rows` copies of `value`."""

    def __init__(self, value, rows: int, dtype):
        self.value, self.rows, self.dtype = value, rows, np.dtype(dtype)

    def __len__(self) -> int:
        return self.rows

    def _read(self, lo: int, hi: int) -> np.ndarray:
        return np.full(max(hi - lo, 0), self.value, dtype=self.dtype)

    def __getitem__(self, key):
        return _getitem(self, key)

    def __array__(self, dtype=None, copy=None):
        return self._read(0, self.rows) if dtype is None else self._read(0, self.rows).astype(dtype)


class Lazy:
    """A column of `rows` values of `dtype` that `read(lo, hi)` makes a slice at a time
    (a column computed from others, or gathered from several files)."""

    def __init__(self, rows: int, dtype, read):
        self.rows, self.dtype, self._read = rows, np.dtype(dtype), read

    def __len__(self) -> int:
        return self.rows

    def __getitem__(self, key):
        return _getitem(self, key)

    def __array__(self, dtype=None, copy=None):
        return self._read(0, self.rows) if dtype is None else self._read(0, self.rows).astype(dtype)


class Coded(Lazy):
    """A text column kept as codes: `read(lo, hi)` gives the codes of rows lo..hi, `names`
    (an object array) their strings; `codes` reads the codes alone (comparing them against
    a name's `code` costs an integer compare a row, not a string compare)."""

    def __init__(self, rows: int, names: np.ndarray, read):
        super().__init__(rows, object, lambda lo, hi: names[read(lo, hi)])
        self.names, self.codes = names, read

    def code(self, name: str) -> int:
        """The code of `name` (-1: no row can hold it)."""
        hits = np.flatnonzero(self.names == name)
        return int(hits[0]) if len(hits) else -1


READ_ROWS = 1 << 20  # rows read at a time when a strided slice walks a column


def _getitem(col, key):
    """A slice reads its rows (a strided one block by block); an index or an index array
    reads the whole column first."""
    n = len(col)
    if isinstance(key, slice):
        lo, hi, step = key.indices(n)
        if step == 1:
            return col._read(lo, max(lo, hi))
        if step > 1:
            out = [col._read(a, min(hi, a + READ_ROWS))[::step]
                   for a in range(lo, hi, READ_ROWS - READ_ROWS % step)]
            return np.concatenate(out) if out else np.zeros(0, dtype=col.dtype)
    if isinstance(key, (int, np.integer)):
        k = int(key) + n if key < 0 else int(key)
        if not 0 <= k < n:
            raise IndexError(f"index {key} out of range for {n} rows")
        return col._read(k, k + 1)[0]
    return np.asarray(col)[key]


def blocks(col, lo: int = 0, hi: int | None = None, rows: int | None = None):
    """(start, values) of consecutive blocks of `rows` rows (READ_ROWS) of a column (any of
    the above or a numpy array) from `lo` to `hi`."""
    hi = len(col) if hi is None else hi
    rows = rows or READ_ROWS
    for a in range(lo, hi, rows):
        yield a, np.asarray(col[a:min(hi, a + rows)])


def is_lazy(col) -> bool:
    return isinstance(col, (DiskColumn, Chain, Constant, Lazy))


__all__ = ["SpillDir", "DiskColumn", "Chain", "Constant", "Lazy", "Coded", "blocks", "is_lazy",
           "READ_ROWS", "NARROW", "narrowest", "stored_type"]
