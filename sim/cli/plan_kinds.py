"""`llmsim plan` for the plan kinds beside the rate plan: a mixed-fleet plan (a `mixed:`
section, sim/planning/mixed.py) and a closed-loop plan (`target_users:`,
sim/planning/concurrency.py). `other_plan` runs one and returns the exit status, or
returns None for a rate plan (sim/cli/planning.py runs that)."""

from __future__ import annotations

from pathlib import Path


def other_plan(a) -> int | None:
    from sim.planning.concurrency import is_concurrency_plan
    from sim.planning.mixed import is_mixed_plan

    run = _mixed if is_mixed_plan(a.plan) else _concurrency if is_concurrency_plan(a.plan) else None
    if run is None:
        return None
    return run(a)


def _maybe_report(a, out: Path) -> None:
    if getattr(a, "report", False):
        from sim.report.pages import build_report, write_report

        print(f"report: {write_report(build_report(out), out)}")


def _mixed(a) -> int:
    from sim.planning.mixed import load_mixed_plan, mixed_lines, run_mixed_plan, write_mixed_plan

    spec = load_mixed_plan(a.plan)
    result = run_mixed_plan(spec, a.prices, workers=a.workers)
    out = write_mixed_plan(result, Path(a.out) if a.out else Path("runs") / f"plan_{spec.name}")
    print("\n".join(mixed_lines(result)))
    _maybe_report(a, out)
    print(f"wrote {out}/ (plan.json, options.csv)")
    return 0


def _concurrency(a) -> int:
    from sim.planning.concurrency import (
        concurrency_lines,
        load_concurrency_plan,
        run_concurrency_plan,
    )
    from sim.planning.plan import write_plan

    spec = load_concurrency_plan(a.plan)
    result = run_concurrency_plan(spec, a.prices, workers=a.workers)
    out = write_plan(result, Path(a.out) if a.out else Path("runs") / f"plan_{spec.name}")
    print("\n".join(concurrency_lines(result)))
    _maybe_report(a, out)
    print(f"wrote {out}/ (plan.json, candidates.csv, fleet_check.csv)")
    return 0
