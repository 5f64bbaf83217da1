"""Request records as columns: what the request table needs of each request, taken from
its `Seq` once the replica that served it has finished its run, then written to the run's
spill folder (sim/io/spill.py) replica by replica, so a fleet simulated replica by replica
(sim/engine/split.py) never holds its requests as objects (~0.8 KiB each; a record is
~100 B on disk and nothing in memory).

`RequestRecords.column(attr)` reads one field back for every request, in request order
(each replica's rows are its requests in id order; `choice` says which replica each
request went to): the very values `request_table` reads off the `Seq`s of a
single-process run, so the tables and the summary computed from them are the same bytes.
`SeqView` gives read-only request objects again, for code that walks `RunResult.seqs`.
"""

from __future__ import annotations

import numpy as np

from sim.io.spill import SpillDir

NUMBERS = {"rid": np.int64, "arrival": float, "prompt": np.int64, "output": np.int64,
           "first_token_t": float, "finish_t": float, "sched_t": float,
           "preemptions": np.int64, "generated": np.int64, "cached_tokens": np.int64,
           "replica": np.int64, "prefill_replica": np.int64}
TEXTS = ("state", "reject_reason")


def columns_of(seqs: list) -> dict:
    """The record fields of `seqs` as numpy columns; text fields as (codes, names)."""
    n = len(seqs)
    out: dict = {a: np.fromiter((getattr(s, a) for s in seqs), dtype=t, count=n)
                 for a, t in NUMBERS.items()}
    for a in TEXTS:
        names: dict[str, int] = {}
        codes = np.fromiter((names.setdefault(getattr(s, a), len(names)) for s in seqs),
                            dtype=np.int32, count=n)
        out[a] = (codes, tuple(names))
    return out


class RequestRecords:
    """Every request's record, replica by replica in the files `q<replica>.<field>` of the
    run's spill folder; `column` puts a field back in request order."""

    def __init__(self, n: int, choice: np.ndarray, spill: SpillDir):
        self.n, self.spill = n, spill
        self.choice = np.asarray(choice, dtype=np.int64)
        self.rows: dict[int, int] = {}  # replica -> records written
        self.names: dict[str, dict[str, int]] = {a: {} for a in TEXTS}

    def add(self, replica: int, cols: dict) -> None:
        """Write replica `replica`'s records (columns_of its requests, in id order)."""
        for a in NUMBERS:
            self.spill.append(f"q{replica}.{a}", np.ascontiguousarray(cols[a]))
        for a in TEXTS:
            codes, names = cols[a]
            known = self.names[a]
            remap = np.array([known.setdefault(x, len(known)) for x in names], dtype=np.int32)
            self.spill.append(f"q{replica}.{a}", remap[codes] if len(codes) else codes)
        self.rows[replica] = self.rows.get(replica, 0) + len(cols["rid"])

    def column(self, attr: str, dtype=None) -> np.ndarray:
        """Field `attr` of every request, in request order (text fields as object arrays of
        strings); `dtype` as the caller would have read it off the Seqs."""
        text = attr in TEXTS
        kind = np.int32 if text else np.dtype(NUMBERS[attr])
        order = np.argsort(self.choice, kind="stable")  # requests replica by replica, in id order
        parts = [np.fromfile(self.spill.file(f"q{r}.{attr}"), dtype=kind)
                 for r in sorted(self.rows)]
        stacked = np.concatenate(parts) if parts else np.zeros(0, dtype=kind)
        if len(stacked) != self.n:
            raise RuntimeError(f"request records: {len(stacked)} rows for {self.n} requests")
        out = np.empty(self.n, dtype=kind)
        out[order] = stacked
        if text:
            return np.array(tuple(self.names[attr]), dtype=object)[out]
        return out if dtype is None else out.astype(dtype, copy=False)

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


__all__ = ["NUMBERS", "TEXTS", "RequestRecords", "Record", "SeqView", "columns_of"]
