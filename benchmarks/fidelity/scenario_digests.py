"""Digests of requests.csv, steps.csv and summary.json for every shipped scenario.

    python benchmarks/fidelity/scenario_digests.py [--out FILE] [--check FILE] [--only NAME,...]

Runs each scenario in scenarios/ as shipped (seed as shipped), writes its tables
into a temporary folder (no plots) and prints one line per file: scenario, file,
sha256 (summary.json without its wall-clock fields). `--check FILE` compares against digests written earlier and exits 1 on any
difference: a refactor that must not change results runs this before and after.
`--only` digests only the named scenarios (file stems) and checks only their lines.
"""

from __future__ import annotations

import argparse
import hashlib
import re
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # this checkout's sim, not an installed one

from sim import run  # noqa: E402

FILES = ("requests.csv", "steps.csv", "summary.json")
WALL = re.compile(rb'^\s*"(simulate_)?wall_s": .*$\n?', re.M)  # how long the run took, not a result


def digest(path: Path) -> str:
    data = path.read_bytes()
    if path.suffix == ".json":
        data = WALL.sub(b"", data)
    return hashlib.sha256(data).hexdigest()


def digests(only: set[str] | None = None) -> list[str]:
    lines = []
    for path in sorted((ROOT / "scenarios").glob("*.yaml")):
        if only is not None and path.stem not in only:
            continue
        out = run(path)
        with tempfile.TemporaryDirectory() as tmp:
            folder = out.write(Path(tmp) / "run", plots=False)
            for name in FILES:
                h = digest(folder / name)
                lines.append(f"{path.stem} {name} {h}")
        print(lines[-1], file=sys.stderr, flush=True)
    return lines


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--check")
    ap.add_argument("--only", help="comma-separated scenario names (default: all)")
    a = ap.parse_args()
    only = set(a.only.split(",")) if a.only else None
    lines = digests(only)
    if a.out:
        Path(a.out).write_text("\n".join(lines) + "\n")
    if a.check:
        want = Path(a.check).read_text().splitlines()
        if only is not None:
            want = [w for w in want if w.split(" ", 1)[0] in only]
        diff = sorted(set(want) ^ set(lines))
        for d in diff:
            print("differs:", d)
        print("identical" if not diff else f"{len(diff)} lines differ")
        return 1 if diff else 0
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
