"""Every simulated result quoted in README.md, regenerated from the shipped scenarios.

    python benchmarks/readme/readme_results.py [--only NAME,...]   # print each block
    python benchmarks/readme/readme_results.py --check             # list blocks that differ; exit 1
    python benchmarks/readme/readme_results.py --write             # replace them in README.md
    python benchmarks/readme/readme_results.py --list              # block names and README sections

README.md marks each generated block with HTML comments,

    <!-- results:NAME -->
    ...the Markdown this script prints for NAME...
    <!-- /results:NAME -->

and everything between a pair of markers belongs to this script: edit the template here,
never the numbers there. Each block is built from the shipped scenario files (seed as
shipped, with the overrides the README names) through the public API (`sim.run`,
`sim.planning.curve.run_curve`, `sim.engine.build.replica_configs`, `sim.fit.runtime_fit`), so a change to a
kernel table, a runtime or the engine moves exactly the numbers it should.

This file holds the list of blocks and the command line; the rest sits beside it:
readme_markers.py (finding and replacing marked blocks), readme_format.py (numbers,
sentences, tables), readme_runs.py (the memoised scenario runs), and the producers of the
blocks' text: readme_serving.py (scenarios, tensor parallelism, clusters),
readme_features.py (speculative decoding, chunked prefill, prefix caching, capacity
curves) and readme_accuracy.py (the refitted eager reference runtime).

Not here: wall-time figures (benchmarks/speed/*_speed.py: they depend on the machine), the
published check (benchmarks/fidelity/published_check.py writes docs/fidelity.md and its
summary), and the live-log fit and replay tables of "Live serving"
(benchmarks/fidelity/live_check.py).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # this checkout's sim and benchmarks, not an installed one

from benchmarks.readme.readme_accuracy import warm_grid_accuracy, warm_grid_fit  # noqa: E402
from benchmarks.readme.readme_energy import energy_quickstart  # noqa: E402
from benchmarks.readme.readme_features import (  # noqa: E402
    chunked,
    curve_knees,
    prefix_caching,
    prefix_caching_gpu_only,
    speculative,
    speculative_batch1,
)
from benchmarks.readme.readme_markers import current, readme_blocks, replace_blocks  # noqa: E402
from benchmarks.readme.readme_moe import moe_scenarios  # noqa: E402
from benchmarks.readme.readme_pipeline import pipeline_405b, pipeline_published  # noqa: E402
from benchmarks.readme.readme_runs import Runs  # noqa: E402
from benchmarks.readme.readme_serving import (  # noqa: E402
    clusters,
    memory_refusal,
    scenario_comparisons,
    tp_runs,
    tp_scaling,
)

README = ROOT / "README.md"


@dataclass(frozen=True)
class Block:
    section: str                    # the README section the block sits in
    make: Callable[[Runs], str]


BLOCKS: dict[str, Block] = {
    "scenario-comparisons": Block("Scenarios", scenario_comparisons),
    "memory-refusal": Block("Tensor parallelism, memory feasibility, FP8", memory_refusal),
    "tp-scaling": Block("Tensor parallelism, memory feasibility, FP8", tp_scaling),
    "tp-runs": Block("Tensor parallelism, memory feasibility, FP8", tp_runs),
    "moe-scenarios": Block("Mixture-of-Experts at scale", moe_scenarios),
    "pipeline-405b": Block("Pipeline parallelism", pipeline_405b),
    "pipeline-published": Block("Pipeline parallelism", pipeline_published),
    "clusters": Block("Clusters: replicas, routers, disaggregated prefill/decode", clusters),
    "speculative": Block("Speculative decoding", speculative),
    "speculative-batch1": Block("Speculative decoding", speculative_batch1),
    "chunked-prefill": Block("Chunked prefill", chunked),
    "prefix-caching": Block("Prefix caching", prefix_caching),
    "prefix-caching-gpu-only": Block("Prefix caching", prefix_caching_gpu_only),
    "curve-knees": Block("Capacity planning", curve_knees),
    "energy-quickstart": Block("Energy and cost", energy_quickstart),
    "warm-grid-accuracy": Block("Accuracy", warm_grid_accuracy),
    "warm-grid-fit": Block("Accuracy", warm_grid_fit),
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", help="comma-separated block names (default: all)")
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true", help="list blocks that differ from README.md")
    mode.add_argument("--write", action="store_true", help="replace differing blocks in README.md")
    mode.add_argument("--list", action="store_true", help="block names and sections")
    a = ap.parse_args(argv)
    if a.list:
        for name, b in BLOCKS.items():
            print(f"{name:26} {b.section}")
        return 0
    names = a.only.split(",") if a.only else list(BLOCKS)
    unknown = [n for n in names if n not in BLOCKS]
    if unknown:
        ap.error(f"unknown block(s) {', '.join(unknown)} (known: {', '.join(BLOCKS)})")
    text = README.read_text(encoding="utf-8")
    spans = readme_blocks(text)
    missing = [n for n in names if n not in spans]
    if missing and (a.check or a.write):
        print(f"README.md has no markers for: {', '.join(missing)}", file=sys.stderr)
        return 2
    runs, made, t0 = Runs(), {}, time.perf_counter()
    for name in names:
        t = time.perf_counter()
        made[name] = BLOCKS[name].make(runs)
        print(f"[{name}: {time.perf_counter() - t:.1f} s]", file=sys.stderr)
        if not (a.check or a.write):
            print(f"### {BLOCKS[name].section} (results:{name})\n\n{made[name]}\n")
    print(f"[all: {time.perf_counter() - t0:.1f} s]", file=sys.stderr)
    differ = [n for n in names if n in spans and made[n] != current(text, spans[n])]
    if a.check:
        for n in differ:
            print(f"differs: results:{n} ({BLOCKS[n].section})")
        return 1 if differ else 0
    if a.write and differ:
        README.write_text(replace_blocks(text, {n: made[n] for n in differ}), encoding="utf-8")
        print(f"README.md: rewrote {', '.join(differ)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
