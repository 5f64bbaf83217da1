"""The manifest of an llmsim folder, `.llmsim-output.json`, read without trusting it.

A manifest says what llmsim wrote in its folder: `files` (paths inside the folder) and
`written`, each file's size and sha256 as llmsim wrote it. Anyone can plant or edit a
manifest, so what it says is checked before llmsim deletes, copies or overwrites
anything it lists:

* every entry is a relative path of plain names inside the folder (`summary.json`, or
  `base/summary.json` in a compare folder); an absolute path, `..`, `.`, an empty name,
  a backslash or a control character, and a link or a non-folder on the way, are
  refused (`SpecError` naming the manifest and the entry's index, one line);
* a listed file is llmsim's only while it is a regular file (not a link, a folder, a
  device) whose size and sha256 are those recorded; a log llmsim appends to (`appends`:
  a sweep's `rows.jsonl`) while its recorded bytes are still its start. Anything else
  (changed since, or listed with no record, as an older llmsim wrote manifests) is kept
  and reported, never deleted.

    read_manifest(folder)        -> the manifest (entries checked), or None: not llmsim's
    unverified(folder, manifest) -> listed files that are not as llmsim wrote them
    records(folder, names, appends) -> the `written` records of files just written
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
from pathlib import Path

from sim.io.specload import SpecError

MANIFEST = ".llmsim-output.json"
_BAD_NAME = re.compile(r"[\\\x00-\x1f\x7f]")  # a backslash (a separator elsewhere), control chars
_digests: dict[tuple, str] = {}  # (path, inode, size, mtime) -> sha256: a file is hashed once


def read_manifest(folder: str | Path) -> dict | None:
    """The manifest of `folder`, or None when it has none or one llmsim did not write
    (not JSON, another tool's, `files` not a list of names). SpecError (one line) when it
    is llmsim's but lists an entry that is not a path inside the folder."""
    path = Path(folder) / MANIFEST
    try:
        if not stat.S_ISREG(os.lstat(path).st_mode):
            return None  # a link or a folder named like a manifest: not one llmsim wrote
        data = json.loads(path.read_text())
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    if not isinstance(data, dict) or data.get("tool") != "llmsim":
        return None
    files = data.get("files")
    if not isinstance(files, list) or not all(isinstance(f, str) for f in files):
        return None
    for i, name in enumerate(files):
        why = _unsafe(Path(folder), name)
        if why:
            raise SpecError(path, f"files[{i}]", f"{why} (allowed: names of files inside the "
                            "folder, as llmsim writes them): nothing written")
    return data


def _unsafe(folder: Path, name: str) -> str | None:
    """Why `name` is not a path of plain names inside `folder` (None: it is)."""
    parts = name.split("/")
    if not name or name.startswith("/") or _BAD_NAME.search(name) or Path(name).is_absolute():
        return "not a relative file name"
    if any(p in ("", ".", "..") for p in parts) or name == MANIFEST:
        return "not a plain file name inside the folder"
    here = folder
    for p in parts[:-1]:  # each folder on the way: a real folder, never a link out
        here = here / p
        try:
            mode = os.lstat(here).st_mode
        except FileNotFoundError:
            return None  # nothing there: nothing to touch
        except OSError:
            return "a path llmsim cannot look at"
        if not stat.S_ISDIR(mode):
            return "a path through a link or a file"
    return None


def sha256(path: Path, st: os.stat_result) -> str:
    key = (str(path), st.st_ino, st.st_size, st.st_mtime_ns)
    if key not in _digests:
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
        _digests[key] = h.hexdigest()
    return _digests[key]


def records(folder: Path, names: list[str]) -> dict[str, dict]:
    """`written` for the files `names` just written into `folder`: size and sha256."""
    out = {}
    for name in names:
        st = os.lstat(folder / name)
        if stat.S_ISREG(st.st_mode):
            out[name] = {"size": st.st_size, "sha256": sha256(folder / name, st)}
    return out


def _prefix_sha256(path: Path, size: int) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        left = size
        while left > 0:
            block = f.read(min(left, 1 << 20))
            if not block:
                break
            h.update(block)
            left -= len(block)
    return h.hexdigest()


def unverified(folder: Path, manifest: dict) -> list[str]:
    """The files `manifest` lists that are present but not as llmsim wrote them: not a
    regular file, no record, or a size or sha256 other than recorded (a log in `appends`:
    its recorded bytes no longer its start). Missing files are not listed here."""
    written = manifest.get("written") if isinstance(manifest.get("written"), dict) else {}
    appends = manifest.get("appends") if isinstance(manifest.get("appends"), list) else []
    out = []
    for name in manifest["files"]:
        path = folder / name
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            continue
        except OSError:
            out.append(name)
            continue
        rec = written.get(name)
        if not (stat.S_ISREG(st.st_mode) and isinstance(rec, dict)
                and isinstance(rec.get("size"), int) and isinstance(rec.get("sha256"), str)):
            out.append(name)
        elif name in appends:
            if st.st_size < rec["size"] or _prefix_sha256(path, rec["size"]) != rec["sha256"]:
                out.append(name)
        elif st.st_size != rec["size"] or sha256(path, st) != rec["sha256"]:
            out.append(name)
    return out
