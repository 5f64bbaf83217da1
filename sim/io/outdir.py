"""Output folders of the planning commands (sweep, curve, plan, report), on top of
`sim/io/outputs.py` (manifest-marked folders, replaced atomically).

* `write_output(dest, kind, writer, meta)`: a finished folder (curve, plan) written at
  once: `writer(folder)` fills a fresh folder, the manifest records `kind`.
* `open_progress(dest, kind, meta, log)`: a sweep's folder while it runs. A new folder is
  written at once holding only an empty progress log (listed in its manifest), and rows
  are then appended to that log in place; an existing folder is reused only when its
  manifest says the same kind. The finished folder replaces it through `write_output`.
* `add_to_output(folder, writer)`: rewrite an llmsim folder with extra files (a report),
  keeping its files and manifest fields (the command, version and time that made its
  results too), so the folder still lists all it holds; each addition is recorded in the
  manifest's `reports` list (command, version, created).
"""

from __future__ import annotations

import os
import shutil
import stat
from collections.abc import Callable
from pathlib import Path

from sim.io.manifest import read_manifest
from sim.io.outputs import (
    OutputError,
    check_out_dir,
    output_kind,
    provenance,
    write_atomically,
)

_MANIFEST_OWN = ("tool", "files", "written")  # rewritten by every write; the rest is kept


def manifest(folder: str | Path) -> dict | None:
    """The folder's manifest (its entries checked: `sim/io/manifest.py`), None: not llmsim's."""
    return read_manifest(folder)


def folder_kind(folder: str | Path) -> str | None:
    """What wrote an llmsim folder (run, compare, sweep, curve, plan, ...; None: not llmsim's)."""
    m = manifest(folder)
    return output_kind(m) if m else None


def write_output(dest: str | Path, kind: str, writer: Callable[[Path], None], meta: dict | None = None) -> Path:
    return write_atomically(dest, writer, {"kind": kind, **(meta or {})})


def open_progress(dest: str | Path, kind: str, meta: dict, log: str) -> Path:
    """The folder a long job appends its progress `log` to (created or reopened)."""
    out = Path(dest)
    check_out_dir(out)
    m = manifest(out)
    if m is not None and log in m["files"]:
        if m.get("kind") != kind:
            raise OutputError("--out", out, f"holds llmsim '{m.get('kind') or 'run'}' output "
                                            f"(allowed: a new folder or a '{kind}' folder)")
        return out
    write_output(out, kind, lambda folder: (folder / log).touch(),
                 {**meta, "appends": [log], "complete": False})
    return out


def _regular(path: Path) -> bool:
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def add_to_output(folder: str | Path, writer: Callable[[Path], None],
                  replaces: Callable[[str], bool] = lambda name: False) -> Path:
    """Rewrite an llmsim output folder with `writer`'s files added to what it holds;
    the files `replaces` names (an earlier report's) are left out, `writer` rewrites them."""
    src = Path(folder)
    m = manifest(src)
    if m is None:
        raise OutputError("report", src, "not an llmsim output folder (allowed: a run, sweep, curve or plan folder)")

    def copy_then_add(tmp: Path) -> None:
        for f in m["files"]:  # each a plain name inside src, each as llmsim wrote it (checked)
            if _regular(src / f) and not replaces(f):
                (tmp / f).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src / f, tmp / f)
        writer(tmp)

    kept = {k: v for k, v in m.items() if k not in _MANIFEST_OWN}
    reports = kept.get("reports") if isinstance(kept.get("reports"), list) else []
    return write_atomically(src, copy_then_add, {**kept, "reports": [*reports, provenance()]},
                            flag="report")
