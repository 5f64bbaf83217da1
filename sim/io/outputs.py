"""Where llmsim writes, safely.

Every folder llmsim writes carries a small manifest, `.llmsim-output.json` (tool,
version, command, what was run, when, the files written and each one's size and sha256;
read without trusting it: `sim/io/manifest.py`). llmsim only ever replaces a folder that
carries its manifest and holds nothing but the files the manifest lists, each as llmsim
wrote it; an existing empty folder may be used; any other existing folder or file (a
manifest listing a path outside its folder, a listed file changed since) is refused
before anything runs (`OutputError`, one line, exit 2), and nothing in it is touched.

Replacing is atomic: the new results are written into a temp sibling folder, the old
folder is renamed aside, the new one renamed in, and only then is the old one removed.
Ctrl-C and SIGTERM are held back during those renames (and during clean-up), so an
interrupt at any moment leaves either the old or the new results, never a mix, and no
temp folder behind. A temp folder carries its writer's pid (`.llmsim-new-<pid>@<host>-...`):
one left by a killed run (its pid gone, or older than STALE_AGE_S) is removed by the next
llmsim that writes in that parent folder.

    check_out_dir(path)                 -> the folder, checked before a simulation starts
    output_kind(manifest)               -> what wrote a folder: run, compare, sweep, ...
    write_atomically(dest, writer, manifest)   writer(folder) fills a fresh folder
    write_many(dest, [(name, writer), ...], manifest)   one subfolder per run

Replacing an llmsim folder of another kind (a run by a sweep, ...) is allowed by the rule
above, but says so in one line on stderr: `llmsim: replaced the run in X with a sweep`.

Folder names made from scenario names and values: `sim/io/foldernames.py`.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import shlex
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from sim.io.foldernames import unique_names
from sim.io.manifest import MANIFEST, read_manifest, records, unverified
from sim.io.specload import SpecError
from sim.io.tempdirs import (  # noqa: F401  (STALE_AGE_S: part of this module's interface)
    ASIDE_PREFIX,
    PROBE_PREFIX,
    STALE_AGE_S,
    TEMP_PREFIX,
    _temp_prefix,
    clean_stale,
)

NOTICES = logging.getLogger("llmsim")  # what a user should know (the CLI prints it as `llmsim: ...`)
JUNK = {".DS_Store", "Thumbs.db", "desktop.ini"}  # left by file browsers; safe to replace


class OutputError(SpecError):
    """An output location llmsim will not (or cannot) write: `--out: <path>: <what>`."""

    def __init__(self, flag: str, path: str | Path, message: str):
        super().__init__(flag, str(path), message)


def invocation() -> str:
    """The command line as the user typed it (best effort), for the manifest."""
    prog = Path(sys.argv[0]).name if sys.argv and sys.argv[0] else "python"
    if prog in ("llmsim", "__main__.py"):
        return shlex.join(["llmsim", *sys.argv[1:]])
    return shlex.join(["python", *sys.argv])


OUTPUT_KIND_WORDS = {"run": "run", "compare": "comparison", "validate": "validation"}  # else the kind


def output_kind(manifest: dict) -> str:
    """What wrote an llmsim folder: its manifest's `kind`; where none is recorded, a
    compare (one subfolder per run), a validate (a measured profile) or a run folder."""
    kind = manifest.get("kind")
    if isinstance(kind, str) and kind:
        return kind
    if "runs" in manifest:
        return "compare"
    return "validate" if "profile" in manifest else "run"


def provenance() -> dict:
    """Who wrote a folder and when: llmsim's version, the command line, the time."""
    from sim import __version__

    return {"version": __version__, "command": invocation(),
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z")}


# --- inspecting a location -------------------------------------------------------------

def _read_manifest(folder: Path) -> dict | None:
    return read_manifest(folder)


def _ours(name: str) -> bool:
    """A temp folder an interrupted llmsim left (never the user's)."""
    return name.startswith((TEMP_PREFIX, ASIDE_PREFIX))


def _entries(folder: Path) -> tuple[set[str], set[str]]:
    """Relative paths of the files (and links) and of the folders under `folder`,
    llmsim's own temp folders left out."""
    files, dirs = set(), set()
    for root, dnames, fnames in os.walk(folder):
        rel = Path(root).relative_to(folder)
        for d in list(dnames):
            p = rel / d
            if _ours(d):
                dnames.remove(d)
            elif (Path(root) / d).is_symlink():
                files.add(p.as_posix())
                dnames.remove(d)
            else:
                dirs.add(p.as_posix())
        files.update((rel / f).as_posix() for f in fnames)
    return files, dirs


def _is_empty(folder: Path) -> bool:
    """Nothing in it but what file browsers leave and llmsim's own temp folders."""
    with os.scandir(folder) as it:
        return all(e.name in JUNK or (_ours(e.name) and e.is_dir(follow_symlinks=False))
                   for e in it)


def _foreign(folder: Path, manifest: dict) -> list[str]:
    """What in an llmsim folder its manifest does not list (the user's own files)."""
    listed = set(manifest["files"]) | {MANIFEST}
    parents = {p.as_posix() for f in listed for p in Path(f).parents if str(p) != "."}
    files, dirs = _entries(folder)
    return sorted([f for f in files - listed if Path(f).name not in JUNK] + list(dirs - parents))


def _describe_oserror(e: OSError) -> str:
    if e.errno in (errno.EACCES, errno.EPERM):
        return "permission denied"
    if e.errno == errno.EROFS:
        return "read-only file system"
    if e.errno == errno.ENOSPC:
        return "no space left on the device"
    return (e.strerror or str(e)).lower()


def _probe(folder: Path, flag: str, shown: Path) -> None:
    """Create and remove an empty folder in `folder`: whether llmsim can really write there
    (os.access is not enough: root, read-only mounts, /proc)."""
    try:
        with _signals_held():
            os.rmdir(tempfile.mkdtemp(prefix=_temp_prefix(PROBE_PREFIX), dir=folder))
    except OSError as e:
        raise OutputError(flag, shown, f"cannot write in {folder} ({_describe_oserror(e)})") from None


def _within(inner: Path, outer: Path) -> bool:
    return inner == outer or outer in inner.parents


def _resolve(path: str | Path, flag: str) -> tuple[Path, Path]:
    """(`path` as the user wrote it, `path` resolved) for a flag's file or folder. Refused
    (OutputError): an empty path, and one that cannot even be looked at (a name too long,
    a folder on the way that cannot be searched); one that does not exist yet is fine."""
    if str(path) == "":
        raise OutputError(flag, "''", "an empty path")
    shown = Path(path)
    target = Path(os.path.realpath(path))
    try:  # Path.exists raises for a name too long or a folder that cannot be searched
        os.stat(target)
    except OSError as e:
        if e.errno not in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP):
            raise OutputError(flag, shown, _describe_oserror(e)) from None
    return shown, target


def _inspect(path: str | Path, flag: str) -> tuple[Path, str]:
    """(resolved folder, how it will be written): 'new' (created), 'empty' (an existing
    empty folder, filled in place), 'replace' (an llmsim folder, swapped atomically) or
    'in_place' (an llmsim folder that is the current folder: swapped inside itself)."""
    shown, target = _resolve(path, flag)
    if target.exists():
        if not target.is_dir():
            raise OutputError(flag, shown, "exists and is not a folder (llmsim writes a folder)")
        try:
            empty = _is_empty(target)
        except OSError as e:
            raise OutputError(flag, shown, f"cannot read the folder ({_describe_oserror(e)})") \
                from None
        if empty:
            _probe(target, flag, shown)
            return target, "empty"
        manifest = _read_manifest(target)
        if manifest is None:
            raise OutputError(flag, shown, "folder exists, is not empty and was not written by "
                              f"llmsim (no {MANIFEST}): choose a new or empty folder")
        extra = _foreign(target, manifest)
        if extra:
            more = f" and {len(extra) - 3} more" if len(extra) > 3 else ""
            raise OutputError(flag, shown, "llmsim folder also holds files llmsim did not write "
                              f"({', '.join(extra[:3])}{more}): move them or choose another folder")
        changed = unverified(target, manifest)
        if changed:
            more = f" and {len(changed) - 3} more" if len(changed) > 3 else ""
            raise OutputError(flag, shown, "llmsim folder holds files that are not as llmsim wrote "
                              f"them ({', '.join(changed[:3])}{more}: changed since, or no record of "
                              "their checksums); kept: move them or choose another folder")
        cwd = Path(os.path.realpath(os.getcwd()))
        if target == cwd:
            _probe(target, flag, shown)
            return target, "in_place"
        if _within(cwd, target):
            raise OutputError(flag, shown, "holds the current folder, which replacing it would "
                              "delete: run llmsim from elsewhere or choose another folder")
        _probe(target.parent, flag, shown)
        if not os.access(target, os.W_OK | os.X_OK):
            raise OutputError(flag, shown, "cannot replace the folder (permission denied)")
        return target, "replace"
    _probe_new(target, flag, shown)
    return target, "new"


def check_out_dir(path: str | Path, *, flag: str = "--out", adds_to: bool = False) -> Path:
    """Check, before any work, that llmsim may write the folder `path`; returns it resolved.

    Refused (OutputError): an existing file, a path under a file, a folder that is not
    empty and has no llmsim manifest, an llmsim folder holding files it does not list, a
    folder holding the current one, and anywhere llmsim cannot create a folder
    (permissions, a read-only file system, /proc). Writes nothing (a probe folder is made
    and removed at once). `adds_to`: for commands that add their own named files to a
    folder rather than replace it (`llmsim calibrate`): only where, not what it holds."""
    if adds_to:
        target = Path(os.path.realpath(path)) if str(path) else Path()
        if str(path) and target.is_dir():
            _probe(target, flag, Path(path))
            return target
    return _inspect(path, flag)[0]


def _probe_new(target: Path, flag: str, shown: Path) -> None:
    """`target` does not exist yet: its nearest existing ancestor must be a folder llmsim
    can create things in."""
    ancestor = target.parent
    while not ancestor.exists():
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise OutputError(flag, shown, f"{ancestor} is a file, not a folder")
    _probe(ancestor, flag, shown)


# --- writing -------------------------------------------------------------------------------

@contextmanager
def _signals_held() -> Iterator[None]:
    """Hold SIGINT and SIGTERM back for the duration; re-deliver them afterwards (through
    the handlers in place before). Only the main thread can change handlers: elsewhere
    this does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    sigs = (signal.SIGINT, signal.SIGTERM)
    before = {s: signal.signal(s, lambda signum, _frame: caught.append(signum)) for s in sigs}
    try:
        yield
    finally:
        for s, handler in before.items():
            if handler is not None:  # None: a handler installed outside Python
                signal.signal(s, handler)
    for s in dict.fromkeys(caught):
        signal.raise_signal(s)


def _folder_mode() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return 0o777 & ~mask


def _write_manifest(folder: Path, manifest: dict) -> None:
    """`manifest` may carry its own version, command and created (a folder rewritten with
    a report keeps those of the command that made its results)."""
    files, _ = _entries(folder)
    data = {"tool": "llmsim", **provenance(), **manifest, "files": sorted(files),
            "written": records(folder, sorted(files))}
    (folder / MANIFEST).write_text(json.dumps(data, indent=2) + "\n")


def _swap(tmp: Path, target: Path) -> None:
    """Put the finished `tmp` in place of `target`, which is absent, empty or an llmsim
    folder (checked by the caller, who also holds signals back). Only what the old
    manifest lists is ever removed: what file browsers leave (JUNK) and other runs' temp
    folders stay where they are."""
    if tmp.parent == target:  # an empty folder or the current one: swap its entries
        aside = Path(tempfile.mkdtemp(prefix=_temp_prefix(ASIDE_PREFIX), dir=target))
        for entry in _listed_top(target):
            os.rename(target / entry, aside / entry)
        for entry in os.listdir(tmp):
            os.rename(tmp / entry, target / entry)
        os.rmdir(tmp)
        shutil.rmtree(aside, ignore_errors=True)
    elif not target.exists():
        os.rename(tmp, target)
    else:  # rename the old folder aside, the new one in, then remove the old one
        _carry_junk(target, tmp)
        aside = Path(tempfile.mkdtemp(prefix=_temp_prefix(ASIDE_PREFIX), dir=target.parent))
        os.rename(target, aside / "old")
        try:
            os.rename(tmp, target)
        except BaseException:
            os.rename(aside / "old", target)
            os.rmdir(aside)
            raise
        shutil.rmtree(aside, ignore_errors=True)


def _listed_top(folder: Path) -> list[str]:
    """The top-level entries of an llmsim folder that its manifest accounts for (none in
    an empty folder)."""
    manifest = _read_manifest(folder)
    if manifest is None:
        return []
    listed = {Path(f).parts[0] for f in manifest["files"]} | {MANIFEST}
    return [e for e in os.listdir(folder) if e in listed]


def _carry_junk(old: Path, new: Path) -> None:
    """Move what file browsers left in the old folder (JUNK) into the new one, so
    replacing an llmsim folder removes only llmsim's files."""
    for root, _, names in os.walk(old):
        for name in names:
            if name in JUNK:
                dest = new / Path(root).relative_to(old) / name
                if not dest.exists():
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    os.rename(Path(root) / name, dest)


def write_atomically(dest: str | Path, writer: Callable[[Path], None], manifest: dict, *,
                     flag: str = "--out") -> Path:
    """Fill a fresh folder with `writer(folder)`, mark it with the manifest (`manifest`
    plus tool, version, command, created time and the files written) and put it at
    `dest`, replacing an earlier llmsim folder there atomically. Returns the folder.

    `dest` is checked again here (OutputError, nothing written, if refused). An OSError
    while writing (a full disk, ...) becomes an OutputError; the temp folder is removed
    and the earlier results stay as they were, also on Ctrl-C or SIGTERM."""
    target, kind = _inspect(dest, flag)
    old = _read_manifest(target) if kind in ("replace", "in_place") else None
    home = target if kind in ("empty", "in_place") else target.parent
    tmp: Path | None = None
    try:
        clean_stale(home if kind != "new" or home.exists() else target)
        with _signals_held():
            if kind == "new":
                home.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(prefix=_temp_prefix(TEMP_PREFIX), dir=home))
        writer(tmp)
        _write_manifest(tmp, manifest)
        os.chmod(tmp, _folder_mode())
        with _signals_held():
            target = _inspect(dest, flag)[0]  # refused if something else appeared there
            _swap(tmp, target)
            tmp = None
    except BaseException as e:
        with _signals_held():
            if tmp is not None:
                shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(e, OutputError):
            raise OutputError(flag, dest, e.message) from None
        if isinstance(e, OSError):
            raise OutputError(flag, dest, f"could not write: {_describe_oserror(e)}") from None
        raise
    if old is not None and output_kind(old) != output_kind(manifest):
        was, now = (OUTPUT_KIND_WORDS.get(k, k) for k in (output_kind(old), output_kind(manifest)))
        NOTICES.warning("replaced the %s in %s with a %s", was, dest, now)
    return Path(dest)


def write_many(dest: str | Path, items: Sequence[tuple[str, Callable[[Path], None]]],
               manifest: dict, *, flag: str = "--out") -> list[str]:
    """One subfolder per (name, writer) under `dest`, written atomically as a whole;
    folder names are `unique_names` of the names. Returns the folder names."""
    folders = unique_names(name for name, _ in items)

    def write_all(folder: Path) -> None:
        for sub, (_, writer) in zip(folders, items, strict=True):
            writer(folder / sub)

    write_atomically(dest, write_all, {**manifest, "runs": dict(zip(folders, (n for n, _ in items),
                                                                     strict=True))}, flag=flag)
    return folders
