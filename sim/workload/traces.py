"""Reading request files: traces (csv, azure, mooncake) and CSV length files.

Each file is parsed once while unchanged (see sim/io/filecache.py); columns come back as
read-only arrays, and a bad value is a SpecError naming the file, its line and the column,
never the file's content (a path mistyped as a system file must not print its lines). Trace
time is seconds since the trace's first request (mooncake's milliseconds converted,
azure's date-times subtracted): the first row arrives at t = 0. Rows must be in time
order (ties allowed); a row earlier than the one before it is refused, naming its line.
"""

from __future__ import annotations

import csv
import json
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import repeat
from pathlib import Path
from typing import Any, Literal, NamedTuple

import numpy as np

from sim.io.filecache import FileCache
from sim.io.specload import (
    MAX_REQUESTS,
    MAX_TIME_S,
    MAX_TOKENS,
    ROOT,
    SpecError,
    is_file,
    read_text,
    show,
)


@dataclass(frozen=True)
class TraceSpec:
    """A recorded request stream: timestamps and lengths (and prefix blocks, for mooncake)."""

    path: str
    format: Literal["csv", "azure", "mooncake"] = "csv"
    time_scale: float = field(default=1.0, metadata={"gt": 0})  # arrival_s = (t - start_s) * time_scale
    start_s: float = field(default=0.0, metadata={"ge": 0, "le": MAX_TIME_S})  # skip rows before this trace time
    limit: int = field(default=0, metadata={"ge": 0, "le": MAX_REQUESTS})  # keep at most this many rows; 0 = all



MOONCAKE_BLOCK_TOKENS = 512  # a Mooncake hash_id names one 512-token prompt block
_TRACE_COLUMNS = {  # format -> (time, prompt, output) column or key names
    "csv": ("arrival_s", "prompt_tokens", "output_tokens"),
    "azure": ("TIMESTAMP", "ContextTokens", "GeneratedTokens"),
    "mooncake": ("timestamp", "input_length", "output_length"),  # + hash_ids; time in ms
}


_JSON_TYPES = {bool: "boolean", str: "string", type(None): "null", list: "array", dict: "object"}


class Trace(NamedTuple):
    t: np.ndarray  # float64, seconds since the first request, non-decreasing
    prompt: np.ndarray  # int64
    output: np.ndarray  # int64
    hashes: tuple[tuple[int, ...], ...] | None
    acceptance: np.ndarray | None = None  # csv traces: optional per-request draft acceptance


_CACHE: FileCache[Any] = FileCache()  # parsed files, by (what, path), while the file is unchanged


def resolve(p: str, base: Path | None, file: Any, field_path: str) -> Path:
    """The file `p` names: absolute, else under `base` (the scenario's folder), else ROOT."""
    try:
        rel = Path(p).expanduser()
    except RuntimeError:  # ~user of no such user
        rel = Path(p)
    tries = [rel] if rel.is_absolute() else [d / rel for d in (base, ROOT) if d is not None]
    for c in tries:
        if is_file(c):
            return c.resolve()
    raise SpecError(file, field_path, f"file not found: {show(p)} (looked for {', '.join(show(str(c))[1:-1] for c in tries)})")


def length_column(src: Path, name: str, file: Any, field_path: str) -> np.ndarray:
    """An integer column (>= 1) of a CSV length file; `field_path` names it in errors."""
    cols, linenos = _cached(("csv",), src, lambda: _read_csv(src))
    if name not in cols:
        raise SpecError(file, field_path, f"no column {name!r} in {src.name} (line 1 names "
                        f"{len(cols)} column{'s' * (len(cols) != 1)}; allowed: a column of its header line)")
    return _cached(("col", name), src, lambda: _numbers(src, cols[name], linenos, name, integer=True, lo=1, hi=MAX_TOKENS))


def trace_window(ts: TraceSpec, p: Path, file: Any, path: str) -> Trace:
    """The trace's rows from start_s on, at most `limit` of them."""
    tr = _cached(("trace", ts.format), p, lambda: _parse_trace(p, ts.format))
    i0 = int(np.searchsorted(tr.t, ts.start_s, side="left"))
    if i0 == len(tr.t):
        raise SpecError(file, f"{path}.start_s", f"{ts.start_s} is past the last request (allowed: <= {tr.t[-1]:.3f})")
    window = slice(i0, i0 + ts.limit if ts.limit else None)
    return Trace(*(a[window] if a is not None else None for a in tr))


def _cached(key: tuple, p: Path, make: Callable[[], Any]) -> Any:
    def read(watch: Callable[[Path], Path]) -> Any:
        watch(p)  # stamped before it is read
        return make()
    return _CACHE.get((*key, str(p)), read)


def _plain_columns(text: str, lines: list[str], width: int) -> list[tuple[str, ...]] | None:
    """The data columns as the csv module reads them where that is splitting at commas (no
    quote, no blank line, every row `width` fields, none past the csv module's field size
    limit); None otherwise. One split of the rows joined by commas gives each row's fields
    in turn (once every row is known to have `width - 1` commas): 3x faster than a split
    per row (a 19 k-row trace in ~3 ms instead of ~10)."""
    body = lines[1:]
    if ('"' in text or not body or "" in lines
            or max(map(len, lines)) > csv.field_size_limit()
            or set(map(str.count, body, repeat(","))) != {width - 1}):
        return None
    fields = ",".join(body).split(",")
    return [tuple(fields[j::width]) for j in range(width)]


def _read_csv(p: Path, need: Sequence[str] = ()) -> tuple[dict[str, tuple[str, ...]], np.ndarray]:
    """A CSV's columns (as strings) by header name, and each data row's line number."""
    text = read_text(p)
    lines = text.splitlines()
    if not lines or not lines[0].strip():
        raise SpecError(p, "line 1", "missing header line (allowed: a CSV with column names)")
    header = [h.strip() for h in lines[0].split(",")]
    plain = None if set(need) - set(header) else _plain_columns(text, lines, len(header))
    if plain is not None:  # the common case, 3x faster; anything else (errors too) below
        return dict(zip(header, plain, strict=True)), np.arange(2, len(lines) + 1)
    reader = csv.reader(lines)
    rows, linenos = [], []
    try:
        header = [h.strip() for h in next(reader)]
        missing = [c for c in need if c not in header]
        if missing:
            raise SpecError(p, "line 1", f"no column {missing[0]!r} (needed: {', '.join(need)}; is trace.format right?)")
        for row in reader:
            if row and len(row) != len(header):
                raise SpecError(p, f"line {reader.line_num}", f"{len(row)} fields, expected {len(header)} "
                                "(as many as the header line names)")
            if row:
                rows.append(row)
                linenos.append(reader.line_num)
    except csv.Error as e:  # e.g. a field over the csv module's size limit
        raise SpecError(p, f"line {reader.line_num}", f"malformed CSV: {show(str(e))[1:-1]} (allowed: comma-separated values)") from None
    if not rows:
        raise SpecError(p, "", "no data rows (allowed: a header line, then one row per request)")
    return dict(zip(header, zip(*rows, strict=True), strict=True)), np.array(linenos)


def _first_bad(raw: Sequence[Any], convert: Callable[[Any], Any]) -> int:
    for i, s in enumerate(raw):
        try:
            convert(s)
        except (ValueError, TypeError, OverflowError):
            return i
    return 0


def _digits_only(raw: Sequence[Any]) -> bool:
    """Every value a string of 1 to 18 ASCII digits (an int64, exactly a float64 up to 2^53:
    larger ones are past any bound a column has)."""
    if not set(map(type, raw)) <= {str}:  # all(type(s) is str ...), 5x faster
        return False
    joined = "".join(raw)
    return 0 < min(map(len, raw)) and max(map(len, raw)) <= 18 and joined.isascii() and joined.isdigit()


def _numbers(p: Path, raw: Sequence[Any], linenos: np.ndarray, name: str, *,
             integer: bool, lo: float, hi: float) -> np.ndarray:
    """A column as float64 (int64 if `integer`), every value finite and in [lo, hi]; read-only."""
    what = f"allowed: {'integers' if integer else 'numbers'} from {lo:,g} to {hi:,.0f}"
    if integer and _digits_only(raw):  # read as int() reads them: 5x faster, the same values
        v = np.array(list(map(int, raw)), dtype=np.int64)
        if not ((v >= lo) & (v <= hi)).all():
            i = int(np.flatnonzero(~((v >= lo) & (v <= hi)))[0])
            raise SpecError(p, f"line {linenos[i]}", f"{name}: out of range ({what})")
        v.flags.writeable = False
        return v
    try:
        v = np.array(raw, dtype=str if isinstance(raw[0], str) else object).astype(np.float64)
    except (ValueError, TypeError, OverflowError):
        i = _first_bad(raw, float)
        huge = isinstance(raw[i], int) and not isinstance(raw[i], bool)  # a JSON integer past float
        raise SpecError(p, f"line {linenos[i]}", f"{name}: {'out of range' if huge else 'not a number'} "
                        f"({what})") from None
    ok = np.isfinite(v) & (v >= lo) & (v <= hi) & ((v == np.floor(v)) if integer else True)
    if not ok.all():
        i = int(np.flatnonzero(~ok)[0])
        raise SpecError(p, f"line {linenos[i]}", f"{name}: out of range ({what})")
    v = v.astype(np.int64) if integer else v
    v.flags.writeable = False
    return v


def _parse_trace(p: Path, fmt: str) -> Trace:
    tcol, pcol, ocol = _TRACE_COLUMNS[fmt]
    hashes = None
    if fmt == "mooncake":
        cols, linenos, hashes = _read_jsonl(p)
    else:
        cols, linenos = _read_csv(p, need=_TRACE_COLUMNS[fmt])
    if fmt == "azure":  # date-times (2023-11-16 18:15:46.6805900)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # numpy warns about (and ignores) time zones
            try:
                ts = np.array(cols[tcol], dtype="datetime64[ns]")
                i = int(np.argmax(np.isnat(ts))) if np.isnat(ts).any() else -1
            except ValueError:
                i = _first_bad(cols[tcol], lambda s: np.datetime64(s, "ns"))
        if i >= 0:
            raise SpecError(p, f"line {linenos[i]}", f"{tcol}: not a date-time (allowed: YYYY-MM-DD HH:MM:SS.fffffff)")
        t = (ts - ts.min()) / np.timedelta64(1, "s")
        if not (t <= MAX_TIME_S).all():  # a span past MAX_TIME_S (or one that overflows)
            i = int(np.argmax(~(t <= MAX_TIME_S)))
            raise SpecError(p, f"line {linenos[i]}", f"{tcol}: {t[i]:.3g} s after the first request (allowed: at most {MAX_TIME_S:.0e} s)")
    else:
        per_s = 1000.0 if fmt == "mooncake" else 1.0
        t = _numbers(p, cols[tcol], linenos, tcol, integer=False, lo=0, hi=MAX_TIME_S * per_s) / per_s
    prompt = _numbers(p, cols[pcol], linenos, pcol, integer=True, lo=1, hi=MAX_TOKENS)
    output = _numbers(p, cols[ocol], linenos, ocol, integer=True, lo=1, hi=MAX_TOKENS)
    back = np.flatnonzero(np.diff(t) < 0)
    if back.size:  # replayed in file order (as vLLM's benchmark does), so refused, not sorted
        i = int(back[0]) + 1
        raise SpecError(p, f"line {linenos[i]}", f"{tcol}: {t[i - 1] - t[i]:.6g} s before the previous "
                        f"row's (line {linenos[i - 1]}; allowed: non-decreasing arrival times)")
    arrays = [t - t[0], prompt, output]
    acc = None
    if "acceptance" in cols:  # speculative decoding: per-request draft acceptance rate
        acc = _numbers(p, cols["acceptance"], linenos, "acceptance", integer=False, lo=0, hi=1)
        acc.flags.writeable = False
    for a in arrays:
        a.flags.writeable = False
    return Trace(*arrays, hashes, acc)


def _read_jsonl(p: Path) -> tuple[dict[str, tuple], np.ndarray, tuple[tuple[int, ...], ...]]:
    """Mooncake JSON lines: {timestamp (ms), input_length, output_length, hash_ids}."""
    keys = (*_TRACE_COLUMNS["mooncake"], "hash_ids")
    rows, linenos = [], []
    for ln, line in enumerate(read_text(p).splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except (ValueError, RecursionError):  # JSONDecodeError is a ValueError
            raise SpecError(p, f"line {ln}", f"not valid JSON (expected a JSON object with keys {', '.join(keys)})") from None
        if not isinstance(obj, dict):
            raise SpecError(p, f"line {ln}", f"a JSON {type(obj).__name__} (expected a JSON object with keys {', '.join(keys)})")
        missing = [k for k in keys if k not in obj]
        if missing:
            raise SpecError(p, f"line {ln}", f"no key {missing[0]!r} (expected a JSON object with keys {', '.join(keys)})")
        values = tuple(obj[k] for k in keys)
        for k, v in zip(keys[:3], values, strict=False):
            if isinstance(v, bool) or not isinstance(v, int | float):
                raise SpecError(p, f"line {ln}", f"{k}: a JSON {_JSON_TYPES.get(type(v), 'value')} "
                                "(allowed: a number)")
        hashes = values[-1]
        if not isinstance(hashes, list) or not all(type(x) is int and abs(x) < 2**63 for x in hashes):
            raise SpecError(p, f"line {ln}", "hash_ids: not a list of integers below 2**63 (allowed: "
                            "a list of integers below 2**63)")
        rows.append(values)
        linenos.append(ln)
    if not rows:
        raise SpecError(p, "", "no data rows (allowed: one JSON object per line)")
    cols = dict(zip(keys, zip(*rows, strict=True), strict=True))
    return cols, np.array(linenos), tuple(map(tuple, cols["hash_ids"]))
