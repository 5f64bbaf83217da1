"""The scenario runs behind README's generated blocks: the shipped scenario files, each
run once per invocation of benchmarks/readme/readme_results.py however many blocks quote it."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCENARIOS = ROOT / "scenarios"


class Runs:
    """Summaries of scenario runs, memoised for one invocation of readme_results.py."""

    def __init__(self) -> None:
        self._done: dict[tuple, dict] = {}

    def summary(self, scenario: str, **overrides) -> dict:
        key = (scenario, tuple(sorted(overrides.items())))
        if key not in self._done:
            from sim import run

            out = run(SCENARIOS / f"{scenario}.yaml", overrides)
            self._done[key] = {**out.summary, "itl_max_s": out.summary["itl_s"]["max"] or 0.0}
        return self._done[key]
