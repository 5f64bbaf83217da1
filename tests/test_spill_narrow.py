"""int64 columns go to disk in the narrowest integer type that holds them (sim/io/spill.py):
they read back as the same int64 values, a spilled run's step-log integers and gap weights
take a byte or two a row, and the gaps' weighted percentiles are those of the old path
(the weights on disk as int64)."""

from __future__ import annotations

from array import array
from pathlib import Path

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import sim.engine.recorder as recorder
import sim.engine.runner as runner
from sim.engine import bigstats, metrics
from sim.io import spill
from sim.io.spill import Chain, DiskColumn, SpillDir, stored_type

ROOT = Path(__file__).resolve().parents[1]
RANGES = [(0, 255), (-128, 127), (0, 70_000), (-40_000, 40_000), (0, 2**32 - 1),
          (-2**63, 2**63 - 1)]
chunk = st.sampled_from(RANGES).flatmap(lambda b: st.lists(st.integers(*b), max_size=30))


@settings(max_examples=80, deadline=None)
@given(st.lists(chunk, min_size=1, max_size=6), st.lists(st.integers(-9, 9), max_size=5))
def test_int64_chunks_read_back_the_same_whatever_their_ranges(chunks, tail):
    sp = SpillDir()
    for c in chunks:
        sp.append("c", array("q", c))
    disk = np.array([x for c in chunks for x in c], dtype=np.int64)
    col = DiskColumn(sp, "c", np.int64, len(disk), np.array(tail, dtype=np.int64))
    back = np.asarray(col)
    assert back.dtype == np.int64 and back.tolist() == disk.tolist() + tail
    assert col[1:len(back) - 1:3].tolist() == back[1:-1:3].tolist()
    kind = stored_type(sp, "c")
    files = list(sp.path.iterdir())
    assert len(files) == 1 and files[0].stat().st_size == len(disk) * kind.itemsize
    if len(disk):  # the type on disk holds every value
        assert np.iinfo(kind).min <= disk.min() and disk.max() <= np.iinfo(kind).max


def test_batch_row_counts_take_a_byte_and_wider_values_widen_the_file_once():
    sp = SpillDir()
    sp.append("w", array("q", range(1, 256)))  # batch rows up to 255: uint8
    assert [p.name for p in sp.path.iterdir()] == ["w~uint8"]
    assert sp.file("w~uint8").stat().st_size == 255
    sp.append("w", array("q", [300, 1]))  # past 255: the file rewritten as uint16
    assert [p.name for p in sp.path.iterdir()] == ["w~uint16"]
    sp.append("w", array("q", [-5]))  # a negative value past uint16's range: int32
    sp.append("big", array("q", [2**40]))  # past int32: int64, under the plain name
    assert sorted(p.name for p in sp.path.iterdir()) == ["big", "w~int32"]
    w = DiskColumn(sp, "w", np.int64, 258, np.zeros(0, dtype=np.int64))
    assert np.asarray(w).tolist() == [*range(1, 256), 300, 1, -5]
    assert np.asarray(DiskColumn(sp, "big", np.int64, 1, np.zeros(0, np.int64))).tolist() == [2**40]
    sp.file("w~int32").unlink()  # removed (a replica simulated again): written afresh
    sp.append("w", array("q", [7]))
    assert sorted(p.name for p in sp.path.iterdir()) == ["big", "w~uint8"]


def test_narrow_weights_give_the_old_paths_percentiles(monkeypatch):
    """Gaps weighted by batch rows (1..512, ties and a dense cluster), spilled in chunks:
    the weights stored narrow give the very stats of the weights stored as int64 (the
    old format, written here by hand) and of the columns in memory."""
    monkeypatch.setattr(spill, "READ_ROWS", 311)
    rng = np.random.default_rng(19)
    n = 30_000
    v = np.concatenate([rng.exponential(0.02, n // 2), 0.0125 + rng.integers(0, 40, n // 2) * 1e-12])
    rng.shuffle(v)
    v[::89] = v[3]
    w = rng.integers(1, 513, n)
    w[:10_000] = rng.integers(1, 200, 10_000)  # a first chunk within uint8, then widened
    sp = SpillDir()
    cut = [0, 10_000, 17_000, 26_000]
    for a, b in zip(cut[:-1], cut[1:], strict=True):
        sp.append("v", np.ascontiguousarray(v[a:b]))
        sp.append("w", array("q", w[a:b].tolist()))
    sp.file("w_old").write_bytes(w[:26_000].astype(np.int64).tobytes())
    assert stored_type(sp, "w").itemsize == 2 and stored_type(sp, "w_old").itemsize == 8
    vals = Chain([DiskColumn(sp, "v", float, 26_000, v[26_000:])])
    narrow = Chain([DiskColumn(sp, "w", np.int64, 26_000, w[26_000:])])
    old = Chain([DiskColumn(sp, "w_old", np.int64, 26_000, w[26_000:])])
    got = bigstats.weighted_stats(vals, narrow)
    assert got == bigstats.weighted_stats(vals, old) == metrics.weighted_stats(v, w)
    assert got["p99"] is not None


def test_a_spilled_runs_integers_are_narrow_on_disk(monkeypatch):
    monkeypatch.setattr(recorder, "MEMORY_ROWS", 64)
    monkeypatch.setattr(recorder, "MIN_REPLICA_ROWS", 50)
    out = runner.run(ROOT / "scenarios/quickstart.yaml")
    folder = out.result.replicas[0].steps.spill.path
    names = {p.name for p in folder.iterdir()}
    for c in ("kind", "num_seqs", "weights"):  # a step kind, a batch's rows: a byte each
        assert f"r0.{c}~uint8" in names and f"r0.{c}" not in names, names
    for c in ("num_tokens", "kv_blocks_used", "kv_tokens"):
        assert any(n.startswith(f"r0.{c}~") for n in names), names
    assert {"r0.t_start", "r0.t_end", "r0.gaps"} <= names  # floats as they are
    rows = out.result.replicas[0].steps.spilled
    assert (folder / "r0.kind~uint8").stat().st_size == rows
