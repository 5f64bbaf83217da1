"""Values derived from files, remembered only while those files stay as they were read.

A `FileCache` maps a key (a folder, a path, what was parsed from it) to one value and
the stamp — (mtime_ns, size, inode), or None for a file that was absent — of every
file the value was made from. A lookup re-stats those files (a few microseconds
each) and makes the value again when any stamp differs: a file edited, replaced,
created or deleted since. A key holds one entry, so a changed file replaces its old
value instead of piling up beside it.

The loader passes each file it is about to consult through `watch`, which stamps it
before it is read: a file changed during the read differs at the next lookup. Limit: a
rewrite in place to the same size within one tick of the file system's clock (a few
ms on some) keeps the stamp; llmsim's own writers (calibrate) are minutes apart.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Hashable
from pathlib import Path
from typing import Generic, TypeVar

V = TypeVar("V")
Stamp = tuple[int, int, int] | None


def stamp(p: Path) -> Stamp:
    """(mtime_ns, size, inode) of a file, or None when it cannot be stat'ed."""
    try:
        s = os.stat(p)
    except (OSError, ValueError):
        return None
    return s.st_mtime_ns, s.st_size, s.st_ino


class FileCache(Generic[V]):
    """One value per key, valid while the files it was made from are unchanged."""

    def __init__(self) -> None:
        self._entries: dict[Hashable, tuple[dict[Path, Stamp], V]] = {}

    def get(self, key: Hashable, make: Callable[[Callable[[Path], Path]], V]) -> V:
        """The value for `key`; `make(watch)` builds it, calling `watch(path)` (which
        returns the path) on each file it consults, present or not."""
        hit = self._entries.get(key)
        if hit is not None and all(stamp(p) == s for p, s in hit[0].items()):
            return hit[1]
        self._entries.pop(key, None)  # stale: let it go even if making the new one fails
        stamps: dict[Path, Stamp] = {}

        def watch(p: Path) -> Path:
            stamps.setdefault(Path(p), stamp(p))
            return p

        value = make(watch)
        self._entries[key] = (stamps, value)
        return value

    def sources(self, value: V) -> dict[Path, Stamp] | None:
        """The files `value` (this very object) was made from, with their stamps when read;
        None when no entry holds it (never made here, or replaced since)."""
        for stamps, v in self._entries.values():
            if v is value:
                return dict(stamps)
        return None

    def clear(self) -> None:
        self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)
