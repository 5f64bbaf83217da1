"""What many test files share: the command line run in a child process (`llmsim`) or
in-process and refused (`refused`), the quick scenario (`QUICK_YAML`, `quick_scenario`)
and a folder's contents (`tree`, to show that nothing was written).

Tests over ~10 s alone are marked `@pytest.mark.slow`
(registered in pyproject.toml): `python -m pytest` runs them as CI does,
`python -m pytest -m "not slow"` leaves them out for a quick local pass.

Constants and plain functions are imported where a module needs them at import time
(`from tests.conftest import QUICK_YAML`); everything else is a fixture.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
_STEP_CACHE = "LLMSIM_STEP_CACHE"  # sim/costmodel/stepcache.py: ENV


def pytest_configure(config) -> None:
    """One step-time cache folder for the session (`llmsim` runs in-process and in child
    processes, and pytest-xdist's workers, inherit it), removed at its end: the tests
    neither read the user's cache nor fill or trim it. A folder the user names in
    $LLMSIM_STEP_CACHE (or `off`) is left as it is."""
    if _STEP_CACHE not in os.environ:
        folder = tempfile.mkdtemp(prefix="llmsim-steptimes-tests-")
        os.environ[_STEP_CACHE] = folder
        config._llmsim_step_cache = folder


def pytest_unconfigure(config) -> None:
    folder = getattr(config, "_llmsim_step_cache", None)
    if folder is not None:
        shutil.rmtree(folder, ignore_errors=True)
        if os.environ.get(_STEP_CACHE) == folder:
            del os.environ[_STEP_CACHE]

# The quick scenario: 20 requests of 100 prompt and 20 output tokens at 5 req/s on the
# defaults (Llama-3-8B, H200, continuous batching); a run takes well under a second.
QUICK_YAML = ("name: base\nseed: 1\nworkload:\n  num_requests: 20\n  arrival: {kind: poisson, rate: 5}\n"
              "  prompt: {kind: fixed, value: 100}\n  output: {kind: fixed, value: 20}\n")


def tree(root: Path) -> dict[str, bytes | None]:
    """Every path below `root` with its bytes (None for a folder)."""
    return {p.relative_to(root).as_posix(): (p.read_bytes() if p.is_file() else None)
            for p in sorted(root.rglob("*"))}


def run_llmsim(*args: str, cwd: Path | str = ROOT, env: dict | None = None,
               timeout: float = 300) -> subprocess.CompletedProcess:
    """`python -m sim ARGS` in a child process, this checkout's sim first from any cwd."""
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return subprocess.run([sys.executable, "-m", "sim", *args], capture_output=True, text=True,
                          cwd=cwd, env={**os.environ, "PYTHONPATH": path, **(env or {})},
                          timeout=timeout)


@pytest.fixture
def llmsim() -> Callable[..., subprocess.CompletedProcess]:
    """The command line in a child process: `llmsim("run", FILE, "--out", DIR, cwd=..., env=...)`
    returns the CompletedProcess (text stdout and stderr)."""
    return run_llmsim


@pytest.fixture
def refused(capsys) -> Callable[..., str]:
    """The command line in-process, refused: `refused(argv, root, *needles)` asserts exit 2,
    one line `llmsim: error: ...` on stderr holding every needle, and nothing written or
    replaced below `root`; returns that line."""
    from sim.cli.main import main

    def check(argv: list[str], root: Path, *needles: str) -> str:
        before = tree(root)
        try:
            rc = main(argv)
        except SystemExit as e:
            rc = e.code
        except Exception:  # noqa: BLE001 - a traceback is the failure being recorded
            rc = "traceback"
        err = capsys.readouterr().err
        assert rc == 2 and len(err.strip().splitlines()) == 1, (rc, err)
        assert err.startswith("llmsim: error: "), err
        for n in needles:
            assert n in err, err
        assert tree(root) == before  # nothing written, nothing replaced
        return err

    return check


@pytest.fixture
def quick_scenario(tmp_path) -> Path:
    """The quick scenario written as `b.yaml` in the test's temporary folder."""
    path = tmp_path / "b.yaml"
    path.write_text(QUICK_YAML)
    return path


@pytest.fixture
def user_cwd(quick_scenario, monkeypatch) -> Path:
    """A user's folder, made the current one: the quick scenario b.yaml, a file (user.txt)
    and a folder (userdir/f.txt) of theirs."""
    root = quick_scenario.parent
    (root / "user.txt").write_text("mine")
    (root / "userdir").mkdir()
    (root / "userdir" / "f.txt").write_text("mine")
    monkeypatch.chdir(root)
    return root
