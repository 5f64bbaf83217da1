"""Output folders of the planning commands (sweep, curve, plan, report).

Every folder these commands write goes through `output_folder`, so the checks live in
one place: the folder is created if missing, carries a marker file `llmsim.json`
naming what wrote it, and an existing folder is reused only if its marker says the
same kind (a sweep resuming) — a folder of other files is never written into.
Single files inside are replaced atomically (`write_atomic`: a temp file renamed).
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from .specload import SpecError

MARKER = "llmsim.json"


def output_folder(path: str | Path, kind: str, meta: dict | None = None) -> Path:
    """Create or reopen an output folder of `kind`; refuse a folder someone else owns."""
    out = Path(path)
    marker = out / MARKER
    if out.exists():
        if not out.is_dir():
            raise SpecError(out, "", "exists and is not a folder (allowed: a new or llmsim output folder)")
        if marker.is_file():
            old = json.loads(marker.read_text()).get("kind")
            if old != kind:
                raise SpecError(out, "", f"holds llmsim '{old}' output (allowed: a new folder or a '{kind}' folder)")
        elif any(out.iterdir()):
            raise SpecError(out, "", "is a non-empty folder llmsim did not write (allowed: a new or llmsim output folder)")
    out.mkdir(parents=True, exist_ok=True)
    write_atomic(marker, json.dumps({"kind": kind, **(meta or {})}, indent=2, default=str) + "\n")
    return out


def folder_kind(path: str | Path) -> str | None:
    """The kind an output folder's marker names (None without a marker)."""
    marker = Path(path) / MARKER
    if not marker.is_file():
        return None
    return json.loads(marker.read_text()).get("kind")


def write_atomic(path: str | Path, data: str | bytes) -> Path:
    """Write a file by renaming a finished temp file over it (readers never see half)."""
    p = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", dir=p.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
        os.replace(tmp, p)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return p
