"""A run whose step log and gaps go to disk (sim/io/spill.py) writes the same bytes and the
same summary as one that keeps them in memory; the block-wise statistics equal numpy's."""

from __future__ import annotations

import gc
import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import sim.engine.recorder as recorder
import sim.engine.runner as runner
from sim.engine import bigstats, metrics
from sim.engine.metrics import weighted_stats
from sim.engine.plots import _thin
from sim.io import spill
from sim.io.spill import Chain, Constant, DiskColumn, SpillDir

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("n", [0, 1, 7, 8, 129, 1000, 12345, 100003])
def test_pairwise_sum_in_pieces_is_numpys_sum_bit_for_bit(n):
    rng = np.random.default_rng(n)
    a = rng.exponential(size=n) * rng.integers(1, 300, size=n)
    got = bigstats.pairwise_sum(lambda lo, hi: a[lo:hi], n, piece=100)
    assert got == np.sum(a)  # exact: the same tree of additions


def _disk(tmp_spill: SpillDir, name: str, values: np.ndarray, on_disk: int) -> DiskColumn:
    tmp_spill.append(name, np.ascontiguousarray(values[:on_disk]))
    return DiskColumn(tmp_spill, name, values.dtype, on_disk, values[on_disk:])


def test_disk_column_slices_like_the_array_it_holds():
    sp = SpillDir()
    a = np.arange(5000, dtype=np.int64) * 3
    col = _disk(sp, "c", a, 3210)
    assert len(col) == 5000
    for key in (slice(0, 10), slice(3200, 3300), slice(4990, None), slice(None, None, 7),
                slice(100, 4000, 13)):
        assert np.array_equal(col[key], a[key])
    assert col[-1] == a[-1] and col[3210] == a[3210]
    assert np.array_equal(np.asarray(Chain([col, a[:5]])), np.concatenate([a, a[:5]]))
    assert np.array_equal(np.asarray(Constant(4, 3, np.int16)), np.full(3, 4, np.int16))


def test_blockwise_weighted_stats_equal_the_in_memory_ones(monkeypatch):
    """Ties, zero weights and a narrow cluster (one bin needing refinement) included."""
    monkeypatch.setattr(spill, "READ_ROWS", 257)
    rng = np.random.default_rng(3)
    n = 20000
    v = np.concatenate([rng.exponential(0.02, n // 2),
                        0.0125 + rng.integers(0, 50, n // 2) * 1e-12])  # a dense cluster
    rng.shuffle(v)
    v[::97] = v[5]  # ties
    w = rng.integers(1, 64, n)
    sp = SpillDir()
    cols = (Chain([_disk(sp, "v1", v[:9000], 8000), v[9000:]]),
            Chain([_disk(sp, "w1", w[:9000], 8000), w[9000:]]))
    assert bigstats.weighted_stats(*cols) == weighted_stats(v, w)
    w0 = w.copy()
    w0[::5] = 0
    cols0 = (cols[0], Chain([_disk(sp, "w2", w0[:9000], 8000), w0[9000:]]))
    assert bigstats.weighted_stats(*cols0) == weighted_stats(v, w0)


def test_a_long_column_in_memory_is_selected_with_the_same_floats(monkeypatch):
    """Past SELECT_ROWS, weighted_stats selects by binning (bigstats) instead of sorting:
    the same mean, percentiles and maximum as the sort, ties and zero weights included."""
    rng = np.random.default_rng(5)
    n = 5000
    v = np.concatenate([rng.gamma(2.0, 0.01, n - 1000), np.full(1000, 0.0125)])  # ties
    rng.shuffle(v)
    w = rng.integers(0, 40, n)
    sorted_ = weighted_stats(v, w)  # n < SELECT_ROWS: one argsort
    monkeypatch.setattr(metrics, "SELECT_ROWS", 100)
    monkeypatch.setattr(spill, "READ_ROWS", 333)
    calls = []
    monkeypatch.setattr(bigstats, "select", lambda *a, _s=bigstats.select, **k: calls.append(a[2]) or _s(*a, **k))
    assert weighted_stats(v, w) == sorted_ and len(calls) == 1 and len(calls[0]) == 3  # p50, p90, p99


def _inverted_cdf(v: np.ndarray, w: np.ndarray, target: float) -> float:
    """The known answer: sort, accumulate the weights, take the first value reaching it."""
    order = np.argsort(v, kind="stable")
    cum = np.cumsum(w[order])
    return float(v[order][min(int(np.searchsorted(cum, target)), len(v) - 1)])


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(1, 3000), st.sampled_from([7, 64, 500, 4096]))
def test_shared_pass_selection_is_the_sorted_selection(seed, n, rows):
    """All targets selected together (shared passes, one first level of bins) give each
    the value numpy's sorted cumulative weights give, on data with ties, clusters finer
    than a bin, negative values, zero weights and a few huge weights."""
    rng = np.random.default_rng(seed)
    kind = seed % 4
    if kind == 0:
        v = rng.exponential(0.02, n)
    elif kind == 1:  # a cluster inside one first-level bin: narrowed twice or more
        v = 0.0125 + rng.integers(0, 40, n) * 1e-15
    elif kind == 2:  # few distinct values: heavy ties
        v = rng.choice(np.array([-1.5, -0.0, 0.0, 0.25, 3.0]), n)
    else:
        v = rng.normal(0, 1, n) * 10.0 ** rng.integers(-5, 5, n)
    w = rng.integers(0, 5, n) * (rng.random(n) < 0.9)
    w[rng.integers(0, n, 3)] = 10**9  # heavy weights
    if w.sum() == 0:
        w[0] = 1
    total = float(w.sum())
    targets = [p / 100 * total for p in (0.01, 1, 50, 90, 99, 99.99, 100)]
    want = [_inverted_cdf(v, w, t) for t in targets]
    pos = w > 0
    cols = v[pos], w[pos]
    monkeypatch_rows = spill.READ_ROWS
    try:
        spill.READ_ROWS = rows
        got = bigstats.select(*cols, targets, float(cols[0].max()))
    finally:
        spill.READ_ROWS = monkeypatch_rows
    assert got == want


def test_weighted_stats_known_answer_on_a_small_table(monkeypatch):
    """Values 1..4 with weights 1, 2, 3, 4 (total 10): p50 is 3 (cumulative 1, 3, 6, 10
    first reaches 5 at 3), p90 and p99 are 4, the mean 3.0, read 2 rows at a time."""
    monkeypatch.setattr(spill, "READ_ROWS", 2)
    v, w = np.array([4.0, 1.0, 3.0, 2.0]), np.array([4, 1, 3, 2])
    assert bigstats.weighted_stats(v, w) == {"mean": 3.0, "p50": 3.0, "p90": 4.0, "p99": 4.0,
                                              "max": 4.0}


def _parts(sp: SpillDir, v: np.ndarray, w: np.ndarray, cuts: list[int], tag: str) -> list:
    """(values, weights) of a column cut into replicas' parts, each mostly on disk."""
    out = []
    for i, (a, b) in enumerate(zip([0, *cuts], [*cuts, len(v)], strict=True)):
        on_disk = (b - a) * 2 // 3
        out.append((_disk(sp, f"{tag}v{i}", v[a:b], on_disk), _disk(sp, f"{tag}w{i}", w[a:b], on_disk)))
    return out


def _counting_reads(monkeypatch) -> list:
    """Rows read from disk by DiskColumns, counted."""
    rows = [0]
    read = DiskColumn._read

    def counted(self, lo, hi):
        rows[0] += hi - lo
        return read(self, lo, hi)

    monkeypatch.setattr(DiskColumn, "_read", counted)
    return rows


def test_parts_first_levels_add_up_to_the_whole_columns():
    """FirstLevels counted part by part (a worker's replicas) merge into the very bins,
    weights, total, smallest weight and maximum of the whole column's."""
    rng = np.random.default_rng(11)
    v = np.concatenate([rng.exponential(0.03, 5000), -rng.exponential(1.0, 50), [0.0, -0.0]])
    w = rng.integers(1, 200, len(v))
    cuts = [1000, 1001, 4000]
    parts = [bigstats.first_level(v[a:b], w[a:b])
             for a, b in zip([0, *cuts], [*cuts, len(v)], strict=True)]
    whole, merged = bigstats.first_level(v, w), bigstats.merged([None, *parts])
    for k in ("w_min", "total", "vmax"):
        assert getattr(merged, k) == getattr(whole, k)
    for k in ("bins", "wsum", "count"):
        assert np.array_equal(getattr(merged, k), getattr(whole, k))
    assert bigstats.first_level(v[:0], w[:0]) is None and bigstats.merged([None]) is None


def test_worker_counted_bins_let_the_parent_read_the_gaps_once(monkeypatch):
    """Spilled parts with their FirstLevels (as workers count them): the same floats as
    numpy on the whole column in memory, the columns read once (mean's pieces and the
    targets' bins together); without them, twice (one pass more for the bins)."""
    monkeypatch.setattr(spill, "READ_ROWS", 512)
    rng = np.random.default_rng(12)
    n = 30000
    v = np.concatenate([rng.gamma(2.0, 0.01, n - 3000), np.full(3000, 0.0125)])  # ties
    rng.shuffle(v)
    w = rng.integers(1, 64, n)
    want = weighted_stats(v, w)
    parts = _parts(SpillDir(), v, w, [7000, 7001, 20000], "a")
    cols = Chain([p[0] for p in parts]), Chain([p[1] for p in parts])
    first = bigstats.merged([bigstats.first_level(*p) for p in parts])
    rows = _counting_reads(monkeypatch)
    assert bigstats.weighted_stats(*cols, first) == want
    once, rows[0] = rows[0], 0
    assert bigstats.weighted_stats(*cols) == want
    assert (once, rows[0]) == (2 * n, 4 * n)  # both columns, once; twice


@pytest.mark.parametrize("blocks", [0, 1, 16])
def test_bins_too_large_to_collect_are_narrowed_first_with_the_same_floats(monkeypatch, blocks):
    """However many rows the collection may hold (0: only a block's), the same floats: a
    dense cluster inside one first-level bin, ties, and weights of 0 filtered out."""
    monkeypatch.setattr(spill, "READ_ROWS", 300)
    monkeypatch.setattr(bigstats, "COLLECT_BLOCKS", blocks)
    rng = np.random.default_rng(13)
    n = 20000
    v = np.concatenate([rng.exponential(0.02, n // 2),
                        0.0125 + rng.integers(0, 3000, n // 2) * 1e-12])
    rng.shuffle(v)
    w = rng.integers(0, 64, n)
    want = weighted_stats(v, w)
    parts = _parts(SpillDir(), v, w, [5000], "b")
    cols = Chain([p[0] for p in parts]), Chain([p[1] for p in parts])
    first = bigstats.merged([bigstats.first_level(*p) for p in parts])
    assert first.w_min == 0  # filtered and counted again, as without worker bins
    assert bigstats.weighted_stats(*cols, first) == want == bigstats.weighted_stats(*cols)


@pytest.mark.parametrize("threads", [1, 2, 3, 7])
@pytest.mark.parametrize("blocks", [0, 8])
def test_a_pass_shared_among_threads_gives_the_same_floats(monkeypatch, threads, blocks):
    """The pass's pieces shared out among threads (each its own bins and collected rows,
    added up after): the same mean, percentiles and maximum as numpy on the whole column in
    memory, with the targets' bins collected at once or narrowed first; ties, a dense
    cluster and heavy weights."""
    monkeypatch.setattr(spill, "READ_ROWS", 256)
    monkeypatch.setattr(bigstats, "COLLECT_BLOCKS", blocks)
    monkeypatch.setattr(bigstats, "PASS_THREADS", threads)
    monkeypatch.setattr(bigstats, "cores", lambda: 8)
    rng = np.random.default_rng(14)
    n = 25000
    v = np.concatenate([rng.gamma(2.0, 0.01, n // 2), 0.0125 + rng.integers(0, 500, n // 2) * 1e-13])
    rng.shuffle(v)
    w = rng.integers(1, 40, n)
    w[rng.integers(0, n, 2)] = 10**6
    want = weighted_stats(v, w)
    parts = _parts(SpillDir(), v, w, [9000, 9001], f"t{threads}{blocks}")
    cols = Chain([p[0] for p in parts]), Chain([p[1] for p in parts])
    first = bigstats.merged([bigstats.first_level(*p) for p in parts])
    assert bigstats.weighted_stats(*cols, first) == want == bigstats.weighted_stats(*cols)


def _bin_start(x: float) -> float:
    """The smallest float of the first-level bin after x's (x > 0)."""
    bits = int(np.array([x]).view(np.uint64)[0])
    step = 1 << bigstats.TOP
    return float(np.array([(bits // step + 1) * step], dtype=np.uint64).view(np.float64)[0])


@pytest.mark.parametrize("edge", ["last", "first"])
def test_a_percentile_at_a_bin_edge_is_the_sorted_one(monkeypatch, edge):
    """Half the weight on the last float of a first-level bin (or the first float of the
    next), half just across the edge: p50 reached exactly at the edge; many rows tied on
    one float (narrowed down to one key) and 0 included."""
    monkeypatch.setattr(spill, "READ_ROWS", 64)
    monkeypatch.setattr(bigstats, "COLLECT_BLOCKS", 0)
    b = _bin_start(0.05)
    lo, hi = (np.nextafter(b, 0), b) if edge == "last" else (b, np.nextafter(b, 1))
    v = np.concatenate([np.full(700, lo), np.full(700, hi), np.full(50, 0.0), [0.2]])
    w = np.concatenate([np.full(700, 3), np.full(700, 3), np.full(50, 2), [100]])
    mix = np.random.default_rng(14).permutation(len(v))
    v, w = v[mix], w[mix]
    want = weighted_stats(v, w)
    parts = _parts(SpillDir(), v, w, [600], "c" + edge)
    cols = Chain([p[0] for p in parts]), Chain([p[1] for p in parts])
    first = bigstats.merged([bigstats.first_level(*p) for p in parts])
    assert bigstats.weighted_stats(*cols, first) == want
    assert bigstats._unkey(int(bigstats._keys(np.array([-lo]))[0])) == -lo


def _files(out, folder: Path) -> dict[str, bytes]:
    out.write(folder, plots=False)
    summary = json.loads((folder / "summary.json").read_text())
    for k in ("wall_s", "simulate_wall_s"):
        summary.pop(k)
    return {"requests": (folder / "requests.csv").read_bytes(),
            "steps": (folder / "steps.csv").read_bytes(), "summary": summary}


@pytest.mark.parametrize("scenario", ["scenarios/quickstart.yaml", "scenarios/fleet_routers.yaml",
                                      "scenarios/autoscale_day.yaml"])  # window power reads spilled steps
def test_a_spilled_run_writes_the_same_bytes(scenario, tmp_path, monkeypatch):
    kept_out = runner.run(ROOT / scenario)
    kept = _files(kept_out, tmp_path / "kept")
    monkeypatch.setattr(recorder, "MEMORY_ROWS", 64)
    monkeypatch.setattr(recorder, "MIN_REPLICA_ROWS", 50)
    out = runner.run(ROOT / scenario)
    ran = [r for r in out.result.replicas if r.steps.rows() > 64]  # an autoscaled fleet's
    assert ran and all(r.steps.spilled for r in ran)  # spares may never start
    assert isinstance(out.result.itl_gaps, Chain)  # the gaps went to disk too
    folder = out.result.replicas[0].steps.spill.path
    assert _files(out, tmp_path / "spilled") == kept
    assert len(out.steps) == sum(r.steps.rows() for r in out.result.replicas)
    thin, thin_kept = _thin(out.step_tables[-1], 300), _thin(kept_out.step_tables[-1], 300)
    assert all(np.array_equal(thin[c], thin_kept[c]) for c in thin)  # the timeline plot's rows
    del out, ran
    gc.collect()
    assert not folder.exists()  # the run's spill folder goes with its results


def test_a_killed_runs_spill_folder_is_removed_by_the_next(tmp_path):
    import subprocess
    import sys

    from sim.io.tempdirs import _HOST, SPILL_PREFIX, clean_stale

    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()
    dead = tmp_path / f"{SPILL_PREFIX}{gone}@{_HOST}-abc"
    dead.mkdir()
    (dead / "r0.t_end").write_bytes(b"\0" * 8)
    mine = SpillDir()
    assert mine.owned and mine.path.name.startswith(SPILL_PREFIX)
    assert clean_stale(tmp_path) == [dead.name] and not dead.exists()
    assert mine.path.exists()  # a live run's is kept


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 5), st.floats(0, 2)), min_size=1, max_size=60),
       st.integers(1, 7))
def test_window_busy_seconds_in_blocks_are_the_whole_columns_bits(gaps, block):
    from sim.engine.autoscale import _busy_until

    t0, t1, t = [], [], 0.0
    for gap, dur in gaps:  # steps in order, back to back or apart
        t += gap
        t0.append(t)
        t += dur
        t1.append(t)
    t0, t1 = np.array(t0), np.array(t1)
    edges = np.linspace(-1.0, t + 1.0, 9)
    cum = np.concatenate(([0.0], np.cumsum(t1 - t0)))
    k = np.searchsorted(t0, edges, side="right") - 1  # the whole-array rule, by hand
    want = np.where(k >= 0, cum[np.maximum(k, 0)] + np.clip(edges - t0[np.maximum(k, 0)], 0.0,
                                                              (t1 - t0)[np.maximum(k, 0)]), 0.0)
    got, total = _busy_until(edges, t0, t1, block=block)
    assert np.array_equal(got, want) and total == cum[-1]


def test_request_records_come_back_in_request_order_from_one_file_a_replica():
    """Requests 0..4 went to replicas 1, 0, 1, 0, 0; each replica's records (in id order)
    are written once, to one file, and read back per field in request order, text fields
    by their own names whatever codes each replica used."""
    from sim.engine.records import NUMBERS, RequestRecords

    def cols(rids, states):
        out = {a: np.asarray(rids, dtype=t) * (10 if a == "arrival" else 1)
               for a, t in NUMBERS.items()}
        names = tuple(dict.fromkeys(states))
        out["state"] = (np.array([names.index(x) for x in states], dtype=np.int32), names)
        out["reject_reason"] = (np.zeros(len(rids), dtype=np.int32), ("",))
        return out

    sp = SpillDir()
    recs = RequestRecords(5, np.array([1, 0, 1, 0, 0]), sp)
    recs.add(0, cols([1, 3, 4], ["finished", "rejected", "finished"]))
    recs.add(1, cols([0, 2], ["rejected", "finished"]))
    assert sorted(p.name for p in sp.path.iterdir()) == ["q0", "q1"]
    assert recs.column("rid").tolist() == [0, 1, 2, 3, 4]
    assert recs.column("arrival").tolist() == [0.0, 10.0, 20.0, 30.0, 40.0]
    assert recs.column("state").tolist() == ["rejected", "finished", "finished", "rejected",
                                             "finished"]
    assert recs.read("replica", 1, 4).tolist() == [1, 2, 3]  # a slice across both files
    status = recs.table(("r0", "r1"))["status"]  # its codes compare as its strings do
    assert isinstance(status, spill.Coded) and status[0:5].tolist() == recs.column("state").tolist()
    for name in ("finished", "rejected", "preempted"):
        assert ((status.codes(0, 5) == status.code(name)).tolist()
                == (status[0:5] == name).tolist())
    assert recs.read("rid", 0, 5).tolist() == [0, 1, 2, 3, 4]  # and the whole again
    with pytest.raises(ValueError, match="added already"):
        recs.add(1, cols([0, 2], ["finished", "finished"]))


def test_records_a_worker_spilled_are_read_with_the_runs_names_and_fresh_arrays():
    """Replicas' records written where they ran (`spill_records`, each with its own text
    codes) and adopted by the parent read back as `add`ed ones; a block's fields are kept
    for the next read of it, which gets its own copy."""
    from sim.engine.records import NUMBERS, RequestRecords, spill_records

    def cols(rids, states):
        out = {a: np.asarray(rids, dtype=t) for a, t in NUMBERS.items()}
        names = tuple(dict.fromkeys(states))
        out["state"] = (np.array([names.index(x) for x in states], dtype=np.int32), names)
        out["reject_reason"] = (np.zeros(len(rids), dtype=np.int32), ("",))
        return out

    sp = SpillDir()
    written = [spill_records(SpillDir(str(sp.path)), 0, cols([1, 3], ["rejected", "finished"])),
               spill_records(SpillDir(str(sp.path)), 1, cols([0, 2], ["finished", "rejected"]))]
    assert written[0].rows == 2 and written[0].names == (("rejected", "finished"), ("",))
    recs = RequestRecords(4, np.array([1, 0, 1, 0]), sp)
    for r, w in enumerate(written):
        recs.adopt(r, w)
    assert recs.column("state").tolist() == ["finished", "rejected", "rejected", "finished"]
    first = recs.read("arrival", 0, 4)
    first[:] = -1.0  # the caller's to change
    assert recs.read("arrival", 0, 4).tolist() == [0.0, 1.0, 2.0, 3.0]
    assert recs.read("rid", 1, 3).tolist() == [1, 2]
    with pytest.raises(ValueError, match="added already"):
        recs.adopt(1, written[1])


def test_first_level_bins_are_the_keys_top_bits_for_any_bit_pattern():
    """bigstats._top (signed arithmetic on the bits) is _keys(v) >> TOP for every float64
    bit pattern: negative and positive values, zeros of both signs, infinities, NaNs."""
    rng = np.random.default_rng(11)
    bits = rng.integers(np.iinfo(np.int64).min, np.iinfo(np.int64).max, 200_000, dtype=np.int64)
    v = np.concatenate([bits.view(float), [0.0, -0.0, np.inf, -np.inf, np.nan, 1e-310, -1e-310]])
    want = (bigstats._keys(v) >> np.uint64(bigstats.TOP)).astype(np.int64)
    assert np.array_equal(bigstats._top(v), want)
    assert bigstats._top(np.array([-1.0, -0.0, 0.0, 1.0])).tolist() == sorted(
        bigstats._top(np.array([-1.0, -0.0, 0.0, 1.0])).tolist())  # ordered as the values
