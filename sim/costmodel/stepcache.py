"""Step times remembered on disk between runs of the same replica configuration.

A cold `StepLatency` prices each new batch shape by walking the model's operations
through the GPU profile's grids (a quarter of a one-replica run's engine time); the
values are a pure function of the model, the profile's files, the runtime, the layout
arguments and the cost-model code. `warm(folder, latencies)` fills each latency's memo
from `folder/<key>.npz` before a run and `StepCache.save()` writes the memo back after
it, so the next run of that configuration starts warm. The values are float64 as
computed, so a warm run gives the same bytes as a cold one.

The key is a sha256 over: the source of every module of `sim/costmodel/` and `sim/io/`
(the code that computes a step time and reads the tables), `repr` of the model and
runtime specs and of the layout arguments (impls, tensor, expert, data, fp8, network),
and the path and content of every file the GPU profile was read from (as
`sim/io/filecache.py` recorded them; a file changed since it was read, or a profile not
loaded from files, means no cache). An edited profile, model or code gives another key,
so a stale file is never read; files are safe to delete at any time.

The folder is `$LLMSIM_STEP_CACHE`, or `llmsim-steptimes-<uid>` in the system temp
folder (never a user's folder); `LLMSIM_STEP_CACHE=off` turns the cache off. A folder
that is not ours (another owner, writable by others, a link) is not used. Files are
numbers only (`np.load(allow_pickle=False)`); at most `KEEP_FILES` files and `KEEP_BYTES`
are kept, the least recently used removed first.
"""

from __future__ import annotations

import gc
import hashlib
import logging
import os
import re
import stat
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from itertools import repeat
from pathlib import Path

import numpy as np

from sim.costmodel.latency import StepLatency
from sim.costmodel.profiles import profile_sources

NOTICES = logging.getLogger("llmsim")
ENV = "LLMSIM_STEP_CACHE"
OFF = ("off", "0", "no", "false")
KEEP_FILES = 32  # cache files kept in the folder (least recently used removed first)
KEEP_BYTES = 256 * 2**20  # and at most this many bytes of them
_OURS = re.compile(r"[0-9a-f]{64}\.npz")  # the only files _trim may remove
MAX_ENTRIES = 1 << 18  # memo entries written per configuration (104 B each), at most
_CODE = ("costmodel", "io")  # packages under sim/ whose source is part of the key
# memo key kinds (sim/costmodel/latency.py) and their ints: a key is (kind, *ints)
ARITY = {"dense": 1, "lm": 1, "pa": 2, "da": 3, "mtp": 3, "va": 2, "decode": 3, "verify": 4}
KINDS = tuple(ARITY)
STEPS = ("decode", "verify")  # whole steps: their entries also hold seconds, kernel seconds
_KIND = {k: i for i, k in enumerate(KINDS)}
_INTS = max(ARITY.values())
_VALUES = 3 + 5  # ms, breakdown per tag (len(TAGS)), seconds, kernel seconds


def default_folder() -> Path | None:
    """The cache folder: $LLMSIM_STEP_CACHE, else one per user under the system temp folder;
    None when turned off."""
    env = os.environ.get(ENV)
    if env is not None:
        return None if env.strip().lower() in OFF or not env.strip() else Path(env)
    uid = os.getuid() if hasattr(os, "getuid") else 0
    return Path(tempfile.gettempdir()) / f"llmsim-steptimes-{uid}"


def _ours(folder: Path) -> bool:
    """A folder (made if absent) that only this user can write, not a link."""
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        s = os.lstat(folder)
    except OSError:
        return False
    owner = os.getuid() if hasattr(os, "getuid") else s.st_uid
    return stat.S_ISDIR(s.st_mode) and s.st_uid == owner and not s.st_mode & 0o022


def code_digest() -> bytes:
    """sha256 of the source of the modules that compute step times (see the module doc)."""
    h = hashlib.sha256()
    root = Path(__file__).resolve().parents[1]
    for pkg in _CODE:
        for f in sorted((root / pkg).glob("*.py")):
            h.update(f.name.encode() + b"\0" + f.read_bytes() + b"\0")
    return h.digest()


def config_key(lat: StepLatency, code: bytes | None = None) -> str | None:
    """The cache key of a latency model's configuration; None when it cannot be keyed
    (a profile not read from files, or one of its files changed since it was read)."""
    if type(lat) is not StepLatency:  # a pipeline stage, a test double: not cached
        return None
    sources = profile_sources(lat.p)
    if sources is None:
        return None
    h = hashlib.sha256(code if code is not None else code_digest())
    args = (lat.model, lat.rt, lat.prefill_impl, lat.decode_impl, lat.verify_impl, lat.tensor,
            lat.fp8_weights, lat.expert, lat.data, lat.network, lat.p.name)
    h.update(repr(args).encode())
    for path, was in sorted(sources.items()):
        h.update(str(path).encode() + b"\0")
        if was is None:  # consulted, absent
            if os.path.exists(path):
                return None
            continue
        try:
            data = path.read_bytes()
            now = os.stat(path)
        except OSError:
            return None
        if (now.st_mtime_ns, now.st_size, now.st_ino) != was:  # changed since it was read
            return None
        h.update(len(data).to_bytes(8, "little") + data)
    return h.hexdigest()


def _encode(memo: dict) -> tuple[np.ndarray, np.ndarray]:
    """The memo as (keys: kind index, ints padded with -1; values: ms, breakdown per tag,
    seconds, kernel seconds (NaN for a piece)), one kind at a time; a kind whose entries
    are not all of its shape (ints of its arity; 3 or 5 values) is left out."""
    by_kind: dict[str, list] = {kind: [] for kind in ARITY}
    for item in memo.items():
        group = by_kind.get(item[0][0])
        if group is not None:
            group.append(item)
    keys, values = [], []
    for kind, items in by_kind.items():
        items = items[:MAX_ENTRIES - sum(len(k) for k in keys)]
        if not items:
            continue
        whole = kind in STEPS
        try:
            ints = np.array([k[1:] for k, _ in items])
            vals = np.array([(e[0], *e[1], *(e[3:5] if whole else (np.nan, np.nan)))
                             for _, e in items], dtype=np.float64)
        except (ValueError, TypeError):
            continue
        if (ints.dtype.kind != "i" or ints.shape != (len(items), ARITY[kind])
                or vals.shape != (len(items), _VALUES)):  # a step's entry short of 5 values
            continue
        k = np.full((len(items), 1 + _INTS), -1, dtype=np.int64)
        k[:, 0] = _KIND[kind]
        k[:, 1:1 + ARITY[kind]] = ints
        keys.append(k)
        values.append(vals)
    if not keys:
        return np.empty((0, 1 + _INTS), np.int64), np.empty((0, _VALUES))
    return np.concatenate(keys), np.concatenate(values)


def _decode(keys: np.ndarray, values: np.ndarray) -> dict:
    """The memo entries of `_encode`'s arrays, uses 0, one kind at a time."""
    memo: dict = {}
    for i, kind in enumerate(KINDS):
        rows = np.flatnonzero(keys[:, 0] == i)
        if not len(rows):
            continue
        k, v = keys[rows], values[rows]
        ks = zip(repeat(kind), *(k[:, j].tolist() for j in range(1, 1 + ARITY[kind])))
        cols = [v[:, 0].tolist(), v[:, 1:6].tolist(), repeat(0)]
        if kind in STEPS:
            cols += [v[:, 6].tolist(), v[:, 7].tolist()]
        memo.update(zip(ks, map(list, zip(*cols, strict=False)), strict=True))  # repeat(0)
    return memo


class StepCache:
    """The cache files of a run's latency models; `save()` writes back what grew."""

    def __init__(self, folder: Path | None, entries: list[tuple[StepLatency, str, int]]):
        self.folder, self.entries = folder, entries

    def save(self) -> None:
        """Write each latency model's memo whose entries grew during the run (atomically:
        a temp file renamed into place), then trim the folder to KEEP_FILES files."""
        if self.folder is None:
            return
        wrote = False
        for lat, key, loaded in self.entries:
            if len(lat._memo) <= loaded:
                continue
            with _no_collection():
                keys, values = _encode(lat._memo)
            try:
                fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".npz", dir=self.folder)
                with os.fdopen(fd, "wb") as f:
                    np.savez(f, keys=keys, values=values, key=np.frombuffer(key.encode(), np.uint8))
                os.replace(tmp, self.folder / f"{key}.npz")
                wrote = True
            except OSError as e:
                NOTICES.debug("step-time cache not written: %s", e)
                try:
                    os.unlink(tmp)
                except (OSError, UnboundLocalError):
                    pass
        if wrote:
            _trim(self.folder)


def _trim(folder: Path) -> None:
    """Keep the KEEP_FILES most recently used files, within KEEP_BYTES. Only files named as
    this module names them (a sha256 key and .npz) are counted or removed: a folder given
    in $LLMSIM_STEP_CACHE may hold a user's own .npz files, which are never touched."""
    try:
        stats = sorted(((p.stat(), p) for p in folder.glob("*.npz") if _OURS.fullmatch(p.name)),
                       key=lambda sp: sp[0].st_mtime_ns, reverse=True)
        total = 0
        for i, (st, p) in enumerate(stats):
            total += st.st_size
            if i >= KEEP_FILES or total > KEEP_BYTES:
                p.unlink()
    except OSError:
        pass


def _load(file: Path, key: str) -> dict | None:
    try:
        with np.load(file, allow_pickle=False) as z:
            if bytes(z["key"]).decode() != key:
                return None
            keys, values = z["keys"], z["values"]
        os.utime(file)  # recently used
    except (OSError, ValueError, KeyError, EOFError):
        return None
    if keys.ndim != 2 or keys.shape[1] != 1 + _INTS or values.shape != (len(keys), _VALUES):
        return None
    if len(keys) and not (0 <= keys[:, 0].min() and keys[:, 0].max() < len(KINDS)):
        return None
    with _no_collection():
        return _decode(keys, values)


@contextmanager
def _no_collection() -> Iterator[None]:
    """Cyclic GC held off: tens of thousands of small containers, no cycles among them, made
    beside a run's live objects (each pass would walk those too)."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()


def warm(folder: Path | None, latencies: list) -> StepCache:
    """Fill each distinct latency model's memo from its cache file in `folder` (None: no
    cache); the handle that saves them after the run."""
    if folder is None or not _ours(folder):
        return StepCache(None, [])
    code = code_digest()
    entries = []
    for lat in {id(x): x for x in latencies}.values():
        key = config_key(lat, code)
        if key is None:
            continue
        memo = _load(folder / f"{key}.npz", key)
        if memo:
            memo.update(lat._memo)  # what it already holds stays
            lat._memo = memo
        entries.append((lat, key, len(lat._memo)))
    return StepCache(folder, entries)
