"""Request records as columns: what the request table needs of each request, taken from
its `Seq` once the replica that served it has finished its run, then written to the run's
spill folder (sim/io/spill.py) replica by replica, by the process that simulated it
(`spill_records`; the parent adopts the file), so a fleet simulated replica by replica
(sim/engine/split.py) never holds its requests as objects (~0.8 KiB each; a record is
~100 B on disk and nothing in memory) nor sends them between processes.

`RequestRecords.table` is the request table as lazy columns (sim/io/spill.py `Lazy`), read
a block of requests at a time, in request order (each replica's rows are its requests in
id order; `choice` says which replica each request went to): the very values
`request_table` computes from the `Seq`s of a single-process run, so the files and the
summary made from them are the same bytes.
`SeqView` gives read-only request objects again, for code that walks `RunResult.seqs`.
"""

from __future__ import annotations

from operator import attrgetter
from typing import NamedTuple

import numpy as np

from sim.io import spill as spilling
from sim.io.spill import Coded, Lazy, SpillDir
from sim.io.tablefile import Labels
from sim.policies.batch import FINISHED

NUMBERS = {"rid": np.int64, "arrival": float, "prompt": np.int64, "output": np.int64,
           "first_token_t": float, "finish_t": float, "sched_t": float,
           "preemptions": np.int64, "generated": np.int64, "cached_tokens": np.int64,
           "replica": np.int64, "prefill_replica": np.int64}
TEXTS = ("state", "reject_reason")


def columns_of(seqs: list) -> dict:
    """The record fields of `seqs` as numpy columns; text fields as (codes, names)."""
    n = len(seqs)
    out: dict = {a: np.fromiter(map(attrgetter(a), seqs), dtype=t, count=n)
                 for a, t in NUMBERS.items()}
    for a in TEXTS:
        values = list(map(attrgetter(a), seqs))
        names = {x: i for i, x in enumerate(dict.fromkeys(values))}  # first seen, first
        out[a] = (np.fromiter(map(names.__getitem__, values), dtype=np.int32, count=n),
                  tuple(names))
    return out


def _unset(x: np.ndarray) -> np.ndarray:
    """Instants recorded as negative (never reached) as NaN, in place."""
    x[x < 0] = np.nan
    return x


def tpot_s(arrival: np.ndarray, first: np.ndarray, finish: np.ndarray,
          output: np.ndarray) -> np.ndarray:
    """Each request's time per output token after the first (NaN for one token or none;
    `first`/`finish` NaN where not reached): the one definition of TPOT in the tables."""
    ttft, e2e = first - arrival, finish - arrival
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(output > 1, (e2e - ttft) / np.maximum(output - 1, 1), np.nan)


def replica_table(cols: dict) -> dict:
    """The request table's columns that per_replica reads (sim/engine/metrics.py), of one
    replica's records (`columns_of`), computed as `RequestRecords.table` computes them."""
    codes, names = cols["state"]
    status = np.array(names or ("",), dtype=object)[codes]
    arrival = np.asarray(cols["arrival"], dtype=float)
    first = _unset(np.array(cols["first_token_t"], dtype=float))
    finish = np.array(cols["finish_t"], dtype=float)
    finish[status != FINISHED] = np.nan
    output = np.asarray(cols["output"], dtype=np.int64)
    return {"status": status, "arrival_s": arrival, "finish_s": finish,
            "ttft_s": first - arrival, "tpot_s": tpot_s(arrival, first, finish, output),
            "e2e_s": finish - arrival, "output_tokens": output,
            "preemptions": np.asarray(cols["preemptions"], dtype=np.int64)}


class Spilled(NamedTuple):
    """One replica's records as `spill_records` wrote them: how many, and each text field's
    names (its file's codes index them)."""
    rows: int
    names: tuple[tuple[str, ...], ...]  # TEXTS' order


def spill_records(spill: SpillDir, replica: int, cols: dict) -> Spilled:
    """Write replica `replica`'s records (columns_of all its requests, in id order) to the
    file `q<replica>` of the run's spill folder: its m records as m values of each field in
    turn (FIELDS' order), text fields as their codes into the returned names."""
    parts = [np.ascontiguousarray(cols[a], dtype=NUMBERS[a]) for a in NUMBERS]
    parts += [np.ascontiguousarray(cols[a][0], dtype=np.int32) for a in TEXTS]
    spill.append(f"q{replica}", np.concatenate([p.view(np.uint8) for p in parts]))
    return Spilled(len(cols["rid"]), tuple(tuple(cols[a][1]) for a in TEXTS))


def _width(attr: str) -> int:
    return 4 if attr in TEXTS else np.dtype(NUMBERS[attr]).itemsize


FIELDS = (*NUMBERS, *TEXTS)  # a replica's file: each field's rows in turn, in this order
# bytes of one record's fields before each field (its block starts at m times this)
BEFORE = {a: sum(_width(b) for b in FIELDS[:i]) for i, a in enumerate(FIELDS)}


def _by_replica(choice: np.ndarray) -> np.ndarray:
    """The rows of `choice` (replica indices) sorted by replica, stably: as int16 keys when
    they fit (numpy sorts those by radix, ~10x faster than int64 ones; the same order)."""
    small = len(choice) and 0 <= choice.min() and choice.max() < 1 << 15
    return np.argsort(choice.astype(np.int16) if small else choice, kind="stable")


class RequestRecords:
    """Every request's record, replica by replica in the file `q<replica>` of the run's
    spill folder (its m records as m values of each field in turn, FIELDS' order: one
    file a replica, as making a file costs more here than writing a few MB to it);
    `column` puts a field back in request order."""

    def __init__(self, n: int, choice: np.ndarray, spill: SpillDir):
        self.n, self.spill = n, spill
        self.choice = np.asarray(choice, dtype=np.int64)
        self.rows: dict[int, int] = {}  # replica -> records written
        self.names: dict[str, dict[str, int]] = {a: {} for a in TEXTS}
        # per text field, replica -> its file's codes as codes into self.names
        self.remap: dict[str, dict[int, np.ndarray]] = {a: {} for a in TEXTS}
        self._rank: np.ndarray | None = None
        # the last block's layout: its (lo, hi) and, per replica among its requests, (the
        # replica, the rank of its first request there, their rows in the block); the
        # summary reads a dozen fields of one block in turn, so it is worked out once
        self._layout: tuple = ((0, 0), [])
        self._fields: dict[str, np.ndarray] = {}  # the last block's fields read (`read`)

    def add(self, replica: int, cols: dict) -> None:
        """Write replica `replica`'s records (columns_of all its requests, in id order; once
        a replica)."""
        if replica in self.rows:
            raise ValueError(f"replica {replica}'s records were added already")
        self.adopt(replica, spill_records(self.spill, replica, cols))

    def adopt(self, replica: int, spilled: Spilled) -> None:
        """Take replica `replica`'s records as `spill_records` wrote them into this run's
        folder (in a worker, while it ran: they never travel); its text codes are mapped to
        this run's names as they are read."""
        if replica in self.rows:
            raise ValueError(f"replica {replica}'s records were added already")
        for a, names in zip(TEXTS, spilled.names, strict=True):
            known = self.names[a]
            self.remap[a][replica] = np.array([known.setdefault(x, len(known)) for x in names],
                                              dtype=np.int32)
        self.rows[replica] = spilled.rows

    def _offset(self, replica: int, attr: str) -> int:
        """Where field `attr` of replica `replica`'s records starts in its file, bytes."""
        return self.rows[replica] * BEFORE[attr]

    def _ranks(self) -> np.ndarray:
        """Each request's row among its replica's records."""
        if self._rank is None:
            order = _by_replica(self.choice)
            counts = np.bincount(self.choice, minlength=max(self.rows, default=0) + 1)
            starts = np.concatenate(([0], np.cumsum(counts)[:-1]))
            rank = np.empty(self.n, dtype=np.int32 if self.n < 1 << 31 else np.int64)
            rank[order] = np.arange(self.n) - starts[self.choice[order]]
            self._rank = rank
        return self._rank

    def read(self, attr: str, lo: int, hi: int) -> np.ndarray:
        """Field `attr` of requests lo..hi (text fields as codes into `self.names[attr]`):
        each replica's rows among them are consecutive in its file, read in one piece.
        The fields of the last block read (of at most READ_ROWS requests) are kept: the
        table's columns read several of them more than once (a copy each time)."""
        segs = self._segments(lo, hi)
        kept = self._fields.get(attr)
        if kept is not None:
            return kept.copy()
        kind = np.dtype(np.int32 if attr in TEXTS else NUMBERS[attr])
        out = np.empty(max(hi - lo, 0), dtype=kind)
        remap = self.remap.get(attr)
        path = str(self.spill.path)
        for r, first, seg in segs:
            x = np.fromfile(f"{path}/q{r}", dtype=kind, count=len(seg),
                            offset=self._offset(r, attr) + first * kind.itemsize)
            out[seg] = remap[r][x] if remap is not None else x
        if hi - lo <= spilling.READ_ROWS:
            self._fields[attr] = out.copy()
        return out

    def _segments(self, lo: int, hi: int) -> list:
        """(replica, rank of its first request, rows) of each replica among requests
        lo..hi, the rows in request order (a stable sort by replica)."""
        if self._layout[0] != (lo, hi):
            choice, rank = self.choice[lo:hi], self._ranks()[lo:hi]
            order = _by_replica(choice)
            cuts = np.flatnonzero(np.diff(choice[order])) + 1
            segs = [(int(choice[seg[0]]), int(rank[seg[0]]), seg)
                    for seg in (np.split(order, cuts) if len(order) else [])]
            self._layout = ((lo, hi), segs)
            self._fields = {}
        return self._layout[1]

    def column(self, attr: str, dtype=None) -> np.ndarray:
        """Field `attr` of every request, in request order (text fields as object arrays of
        strings), in memory."""
        out = self.read(attr, 0, self.n)
        if attr in TEXTS:
            return np.array(tuple(self.names[attr]), dtype=object)[out]
        return out if dtype is None else out.astype(dtype, copy=False)

    def table(self, replica_names: tuple[str, ...]) -> dict:
        """The request table (sim/engine/metrics.py REQUEST_COLUMNS) as lazy columns read
        a block at a time: the same values, computed the same way, as `request_table`
        computes from Seqs."""
        n, read = self.n, self.read
        finished = self.names["state"].get(FINISHED, -1)

        def field(attr: str) -> Lazy:
            return Lazy(n, NUMBERS[attr], lambda lo, hi: read(attr, lo, hi))

        def text(attr: str) -> Coded:
            names = np.array(tuple(self.names[attr]) or ("",), dtype=object)
            return Coded(n, names, lambda lo, hi: read(attr, lo, hi))

        def first(lo: int, hi: int) -> np.ndarray:
            return _unset(read("first_token_t", lo, hi))

        def finish(lo: int, hi: int) -> np.ndarray:
            x = read("finish_t", lo, hi)
            x[read("state", lo, hi) != finished] = np.nan
            return x

        def sched(lo: int, hi: int) -> np.ndarray:
            return _unset(read("sched_t", lo, hi))

        def tpot(lo: int, hi: int) -> np.ndarray:
            return tpot_s(read("arrival", lo, hi), first(lo, hi), finish(lo, hi),
                          read("output", lo, hi))

        def minus(f):
            return Lazy(n, float, lambda lo, hi: f(lo, hi) - read("arrival", lo, hi))

        return {
            "id": field("rid"), "arrival_s": field("arrival"), "prompt_tokens": field("prompt"),
            "output_tokens": field("output"), "status": text("state"),
            "first_token_s": Lazy(n, float, first), "finish_s": Lazy(n, float, finish),
            "ttft_s": minus(first), "tpot_s": Lazy(n, float, tpot), "e2e_s": minus(finish),
            "queue_s": minus(sched), "preemptions": field("preemptions"),
            "generated_tokens": field("generated"), "cached_tokens": field("cached_tokens"),
            "reject_reason": text("reject_reason"),
            "replica": Labels(self.choice, replica_names),
        }

    def __len__(self) -> int:
        return self.n


class Record:
    """One request's record, read-only, with a `Seq`'s field names."""

    __slots__ = (*NUMBERS, *TEXTS)


class SeqView:
    """`RunResult.seqs` of a run whose requests are records: request objects made on
    first use (the whole run's at once: for tests and small runs)."""

    def __init__(self, records: RequestRecords):
        self.records = records
        self._seqs: list[Record] | None = None

    def __len__(self) -> int:
        return self.records.n

    def _all(self) -> list[Record]:
        if self._seqs is None:
            cols = {a: self.records.column(a).tolist() for a in (*NUMBERS, *TEXTS)}
            seqs = []
            for i in range(self.records.n):
                r = Record()
                for a, c in cols.items():
                    setattr(r, a, c[i])
                seqs.append(r)
            self._seqs = seqs
        return self._seqs

    def __iter__(self):
        return iter(self._all())

    def __getitem__(self, i):
        return self._all()[i]


__all__ = ["NUMBERS", "TEXTS", "RequestRecords", "Record", "SeqView", "Spilled", "columns_of",
           "replica_table", "spill_records", "tpot_s"]
