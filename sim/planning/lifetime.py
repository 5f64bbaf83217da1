"""Worker processes that end with the command that started them: a SIGKILLed sweep,
curve or plan leaves no pool worker or local Ray process behind (holding its stdout and
stderr open, so that a CI step reading them hangs).

    die_with_parent(pid)   a process pool's initializer: the worker ends with `pid`
    worker_pool(n)         a process pool of n workers that end with this process
    pmap(fn, args, n)      [fn(*a) for a in args] on such a pool (here, for one worker or task)
    reaper()               a watchdog that kills the local Ray this process starts, once
                           this process is gone (Ray's agents outlive a killed driver)
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

# fork: workers need not re-import the caller (a notebook, stdin); spawn where no fork
START_METHOD = "fork" if sys.platform != "win32" else "spawn"
PARENT_POLL_S = 1.0  # how often a worker looks for its parent (besides PR_SET_PDEATHSIG)
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def die_with_parent(parent: int) -> None:
    """In a pool worker: end when the process that started the pool (`parent`) ends, even
    by SIGKILL. Linux: the kernel sends SIGKILL at the parent's death (prctl
    PR_SET_PDEATHSIG); everywhere, as well, a daemon thread checks the parent's pid every
    PARENT_POLL_S seconds."""
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent:  # the parent died before the line above: nothing would tell us
        os._exit(1)

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_POLL_S)
        os._exit(1)

    threading.Thread(target=watch, name="llmsim-parent-watch", daemon=True).start()


def worker_pool(workers: int | None):
    """A process pool (START_METHOD) whose workers end with this process: every pool of a
    sweep, curve or plan is made here, so none can outlive a killed command. Its imports
    wait for the first pool: a plain run never starts one."""
    import concurrent.futures as cf
    import multiprocessing as mp

    return cf.ProcessPoolExecutor(workers, mp_context=mp.get_context(START_METHOD),
                                  initializer=die_with_parent, initargs=(os.getpid(),))


def pmap(fn, args: list[tuple], workers: int, progress: bool = False, what: str = "",
         unit: str = "it") -> list:
    """[fn(*a) for a in args], in order: in this process for one worker or one task, else on
    a worker_pool of at most `workers` (`fn` and its arguments picklable); `progress` draws
    a tqdm bar named `what` as the tasks finish."""
    if workers <= 1 or len(args) <= 1:
        return [fn(*a) for a in args]
    import concurrent.futures as cf

    with worker_pool(min(workers, len(args))) as pool:
        futs = [pool.submit(fn, *a) for a in args]
        if progress:
            from tqdm import tqdm

            for _ in tqdm(cf.as_completed(futs), total=len(futs), desc=what, unit=unit, leave=False):
                pass
        return [f.result() for f in futs]


# The watchdog, run as `python -c REAPER <pid>`: every half second it notes the process
# tree under <pid> (pid and start time, from /proc); once <pid> is gone it SIGKILLs every
# process it noted that still runs (same start time: never a reused pid), then exits.
REAPER = r"""
import os, signal, sys, time
def started(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None
def tree(root):
    parent = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    parent[int(d)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                pass
    out, todo = set(), [root]
    while todo:
        here = todo.pop()
        kids = {c for c, p in parent.items() if p == here} - out
        out |= kids
        todo += kids
    return out
root = int(sys.argv[1])
root_start, me, seen = started(root), os.getpid(), {}
while root_start is not None and started(root) == root_start:
    for p in tree(root) - {me}:
        seen.setdefault(p, started(p))
    time.sleep(0.5)
for p, st in seen.items():
    if st is not None and started(p) == st:
        try:
            os.kill(p, signal.SIGKILL)
        except OSError:
            pass
"""


def reaper() -> subprocess.Popen | None:
    """Start the watchdog for this process (Linux: it reads /proc; elsewhere None). Kill it
    when the processes it guards have ended normally."""
    if not os.path.isdir("/proc/self"):
        return None
    return subprocess.Popen([sys.executable, "-c", REAPER, str(os.getpid())], stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
