"""One file llmsim writes on its own (a Perfetto trace, a fitted runtime YAML), on top of
`sim/io/outputs.py`: checked before any work, then written through a temp file beside it and
renamed in, so an interrupt leaves the old file or the new one, never half of one.

    check_out_file(path, flag=..., ours=...)   -> the file, checked before any work
    write_file_atomically(path, text)          writes it
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

from sim.io.outputs import OutputError, _folder_mode, _probe, _probe_new, _resolve


def check_out_file(path: str | Path, *, flag: str, ours: Callable[[Path], bool]) -> Path:
    """Check, before any work, that llmsim may write the one file `path` (a trace, a
    runtime YAML); returns it resolved. An existing file is replaced only when `ours`
    says llmsim wrote it; a folder, a device, a path under a file and anywhere llmsim
    cannot write are refused (OutputError). Writes nothing."""
    shown, target = _resolve(path, flag)
    if target.is_dir():
        raise OutputError(flag, shown, "is a folder (allowed: a file name)")
    if target.exists():
        if not target.is_file() or not ours(target):
            raise OutputError(flag, shown, "exists and was not written by llmsim (allowed: a new "
                              "file name, or a file llmsim wrote)")
        _probe(target.parent, flag, shown)
        return target
    _probe_new(target, flag, shown)
    return target


def write_file_atomically(path: str | Path, text: str) -> Path:
    """Write one file (a runtime YAML, a trace) through a temp file beside it, renamed in:
    an interrupt leaves the old file or the new one, never half of one. The caller has
    checked `path` (`check_out_file`)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(tmp, 0o666 & _folder_mode())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return path
