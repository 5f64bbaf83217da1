"""llmsim: a discrete-event simulator of LLM inference serving.

    >>> from sim import run
    >>> out = run("scenarios/quickstart.yaml")   # .requests, .steps (DataFrames), .summary
"""

from __future__ import annotations

__version__ = "0.1.0"
__all__ = ["run", "load_scenario", "RunOutput"]


def __getattr__(name: str):
    # imported on first use so `llmsim --help` and the spec loaders stay light
    if name in ("run", "RunOutput"):
        from sim.engine import runner

        return getattr(runner, name)
    if name == "load_scenario":
        from sim.config.scenario import load_scenario

        return load_scenario
    raise AttributeError(f"module 'sim' has no attribute {name!r}")
