"""Temp folders llmsim makes beside its outputs, named after their writer, and the
removal of those that killed runs left.

A temp folder is `.llmsim-new-<pid>@<host>-<random>` (results being written),
`.llmsim-old-...` (results being replaced), `.llmsim-probe-...` (a write check) or
`.llmsim-spill-...` (a run's step log on disk, under the system temp folder: sim/io/spill.py);
`<host>` is a short hash of the host name. `clean_stale(parent)` removes those whose
writer is gone (same host, pid not running) or that are older than STALE_AGE_S.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
import socket
import stat
import time
from pathlib import Path

NOTICES = logging.getLogger("llmsim")
TEMP_PREFIX = ".llmsim-new-"
ASIDE_PREFIX = ".llmsim-old-"
PROBE_PREFIX = ".llmsim-probe-"
SPILL_PREFIX = ".llmsim-spill-"
STALE_AGE_S = 24 * 3600  # a temp folder this old is a dead run's, whatever its pid says
_HOST = hashlib.sha256(socket.gethostname().encode()).hexdigest()[:8]
_TEMP_NAME = re.compile(r"\.llmsim-(?:new|old|probe|spill)-(\d+)@([0-9a-f]{8})-")


def _temp_prefix(kind: str) -> str:
    """`.llmsim-new-<pid>@<host>-`: whose temp folder this is, for `clean_stale`."""
    return f"{kind}{os.getpid()}@{_HOST}-"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process: alive
        return True
    return True


def clean_stale(parent: Path) -> list[str]:
    """Remove the temp folders (`.llmsim-new-*`, `.llmsim-old-*`, `.llmsim-probe-*`,
    `.llmsim-spill-*`) that
    dead llmsim runs left in `parent`: written on this host by a pid that is gone, or
    older than STALE_AGE_S. Only real folders of this user, never a link; returns their
    names (a notice says how many)."""
    gone = []
    try:
        entries = list(os.scandir(parent))
    except OSError:
        return gone
    now = time.time()
    for e in entries:
        if not e.name.startswith((TEMP_PREFIX, ASIDE_PREFIX, PROBE_PREFIX, SPILL_PREFIX)):
            continue
        try:
            st = e.stat(follow_symlinks=False)
        except OSError:
            continue
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
            continue
        m = _TEMP_NAME.match(e.name)
        dead = (m is not None and m.group(2) == _HOST and int(m.group(1)) != os.getpid()
                and not _alive(int(m.group(1))))
        if dead or now - st.st_mtime > STALE_AGE_S:
            shutil.rmtree(e.path, ignore_errors=True)  # an interrupt: the rest goes next time
            if not os.path.lexists(e.path):
                gone.append(e.name)
    if gone:
        NOTICES.warning("removed %d temp folder(s) left in %s by llmsim runs that were killed",
                        len(gone), parent)
    return gone
