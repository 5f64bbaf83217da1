"""Host memory per request and per iteration (sim/engine/hostmem.py stands on these).

Runs quickstart at a few sizes and rates, each in a fresh process, and fits peak RSS
(`llmsim run` writing its CSVs) = base + a x requests + b x iterations by least squares.
Measured 2026-12 (CPython 3.11, numpy 2): base 76 MiB, a 1,755 B, b 174 B.

    python benchmarks/speed/host_memory.py [--smoke]       (~1 minute; --smoke: three tiny runs)
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # this checkout's sim, not an installed one
CODE = """
import resource, sys, tempfile
from sim.engine.runner import run
n, rate = int(sys.argv[1]), float(sys.argv[2])
out = run(sys.argv[3], {"workload.num_requests": n, "workload.arrival.rate": rate})
out.write(tempfile.mkdtemp() + "/o", plots=False)
iters = sum(len(next(iter(t.values()))) for t in out.step_tables)
print(n, iters, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
"""
POINTS = [(1000, 2.5), (4000, 2.5), (8000, 2.5), (8000, 50.0), (16000, 50.0), (24000, 50.0)]
SMOKE_POINTS = [(50, 2.5), (100, 2.5), (100, 50.0)]  # the script runs, the fit means little


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--smoke", action="store_true", help="three tiny runs (checks the script works)")
    rows = []
    for n, rate in SMOKE_POINTS if ap.parse_args().smoke else POINTS:
        out = subprocess.run([sys.executable, "-c", CODE, str(n), str(rate), str(ROOT / "scenarios" / "quickstart.yaml")],
                             capture_output=True, text=True, check=True, cwd=ROOT)
        rows.append([float(x) for x in out.stdout.split()])
        print(f"{n:>6} requests at {rate:>4} req/s: {int(rows[-1][1]):>8} iterations, "
              f"peak {rows[-1][2] / 2**20:6.1f} MiB")
    a = np.array([[1.0, r, i] for r, i, _ in rows])
    base, per_request, per_iteration = np.linalg.lstsq(a, np.array([m for *_, m in rows]), rcond=None)[0]
    print(f"fit: base {base / 2**20:.0f} MiB, {per_request:.0f} B per request, {per_iteration:.0f} B per iteration")


if __name__ == "__main__":
    main()
