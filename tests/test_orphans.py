"""A killed sweep leaves no process behind: its pool workers die with it (SIGKILL
included), so nothing holds its stdout and stderr open (issue 18, item 4)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
QUICK = str(ROOT / "scenarios" / "quickstart.yaml")

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc (Linux)")


def _stat(pid: int) -> tuple[int, str] | None:
    """(parent pid, state) of a live process, None when gone (a zombie is gone)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    state, ppid = text.rsplit(")", 1)[1].split()[:2]
    return None if state in ("Z", "X") else (int(ppid), state)


def _descendants(pid: int) -> set[int]:
    parents = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            st = _stat(int(d))
            if st:
                parents[int(d)] = st[0]
    out, todo = set(), [pid]
    while todo:
        p = todo.pop()
        kids = {c for c, pp in parents.items() if pp == p}
        todo += list(kids - out)
        out |= kids
    return out


def _killed_midway(args: list[str], tmp_path: Path, workers: int) -> tuple[set[int], subprocess.Popen]:
    """Start `llmsim ARGS`, wait until it has `workers` worker processes, SIGKILL it."""
    p = subprocess.Popen([sys.executable, "-m", "sim", *args], cwd=tmp_path, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, start_new_session=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    deadline = time.monotonic() + 120
    kids: set[int] = set()
    while len(kids) < workers:
        assert p.poll() is None, p.communicate()
        assert time.monotonic() < deadline, "the pool never started"
        time.sleep(0.1)
        kids = _descendants(p.pid)
    time.sleep(0.5)  # the workers are running configurations now
    p.send_signal(signal.SIGKILL)
    return _descendants(p.pid) | kids, p


def test_sigkill_of_a_sweep_leaves_no_worker_and_closes_its_output(tmp_path):
    kids, p = _killed_midway(["sweep", QUICK, "--grid", "workload.num_requests=3000,3001,3002,3003",
                              "--workers", "2", "--out", "sw"], tmp_path, workers=2)
    try:
        # every writer of the sweep's stdout/stderr gone: reading them ends (a CI step would hang)
        p.communicate(timeout=15)
        deadline = time.monotonic() + 10
        while any(_stat(k) for k in kids) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not [k for k in kids if _stat(k)], "pool workers outlived the killed sweep"
    finally:
        for k in kids:
            if _stat(k):
                os.kill(k, signal.SIGKILL)


def test_a_worker_whose_parent_is_gone_ends_by_itself_without_pdeathsig(tmp_path):
    """The portable fallback alone (no prctl): a worker polls its parent's pid."""
    code = ("import os, sys, time\n"
            "from sim.planning import lifetime as sweep\n"
            "sweep.PARENT_POLL_S = 0.1\n"
            "sys.platform = 'other'\n"  # the non-Linux path: the watching thread only
            "if os.fork() == 0:\n"
            "    sweep.die_with_parent(os.getppid())\n"
            "    print(os.getpid(), flush=True)\n"
            "    time.sleep(600)\n"
            "else:\n"
            "    time.sleep(600)\n")
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, start_new_session=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    child = int(p.stdout.readline())
    try:
        os.kill(p.pid, signal.SIGKILL)
        p.wait()
        deadline = time.monotonic() + 10
        while _stat(child) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _stat(child) is None
    finally:
        if _stat(child):
            os.kill(child, signal.SIGKILL)


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def test_sigkill_of_a_ray_sweep_leaves_no_ray_process(tmp_path):
    pytest.importorskip("ray")
    p = subprocess.Popen([sys.executable, "-m", "sim", "sweep", QUICK, "--grid",
                          "workload.num_requests=3000,3001,3002,3003", "--executor", "ray", "--workers", "2",
                          "--out", "sw"], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         start_new_session=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    seen: set[int] = set()
    try:
        deadline = time.monotonic() + 240
        while not any("ray::run_config" in _cmdline(k) for k in seen):  # a task running
            assert p.poll() is None, p.communicate()
            assert time.monotonic() < deadline, "Ray never ran a task"
            seen |= _descendants(p.pid)
            time.sleep(0.2)
        seen |= _descendants(p.pid)
        p.send_signal(signal.SIGKILL)
        p.communicate(timeout=30)
        deadline = time.monotonic() + 20
        while [k for k in seen if _stat(k)] and time.monotonic() < deadline:
            time.sleep(0.2)
        left = {k: _cmdline(k)[:80] for k in seen if _stat(k)}
        assert not left, f"outlived the killed sweep: {left}"
    finally:
        for k in seen:
            if _stat(k):
                os.kill(k, signal.SIGKILL)
