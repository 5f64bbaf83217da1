"""A plan's probes with and without the early stop (`search.stop_early`,
sim/planning/probestop.py): each candidate's capacity search run both ways in this one
process, alternating, with the CPU seconds of each, the runs the stop ended, the
simulated seconds and iterations it left out, and whether every candidate's sustained
and first failing rate (and every probe's verdict) came out the same.

    python benchmarks/speed/probe_stop.py [--plan plans/chat_8b.yaml] [--only GPU]

Fleet checks and headroom (the rest of `llmsim plan`) are not run: they never stop early.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # this checkout's sim, not an installed one

import sim.engine.runner as runner  # noqa: E402
from sim.config.scenario import load_scenario  # noqa: E402
from sim.planning.capacity import max_rate  # noqa: E402
from sim.planning.estimate import _base, _runner  # noqa: E402
from sim.planning.planspec import candidate_grid, load_plan, plan_scenario  # noqa: E402
from sim.planning.probestop import stopper  # noqa: E402
from sim.planning.traffic import steady_rule  # noqa: E402

RUNS: list[dict] = []  # every engine run of the current search: simulated s, iterations, stop
_run = runner.run


def _counted(*a, **kw):
    out = _run(*a, **kw)
    watch = kw.get("watch")
    RUNS.append({"sim_s": out.result.end_time, "iterations": out.summary["iterations"]["total"],
                 "stopped": bool(watch is not None and watch.stopped)})
    return out


def search(spec, cand: dict, stop: bool) -> tuple[object, float, list[dict]]:
    """One candidate's capacity search: (capacity, CPU seconds, its runs)."""
    scen, base = plan_scenario(spec), {**_base(spec), **cand}
    sc = load_scenario(scen, base)
    s = spec.search
    rule = steady_rule(s.rule(), sc, spec.arrival)
    bounds = spec.slo.bounds()
    run_at = _runner(scen, base, sc, rule, bounds, spec.arrival,
                     stopper(rule, bounds, spec.slo.goodput_min) if stop else None)
    RUNS.clear()
    c0 = time.process_time()
    cap = max_rate(run_at, spec.slo, [sc.seed + i for i in range(s.seeds)], s.need, s.rate_start,
                   s.rate_min, s.rate_max, s.rel_tol, s.max_probes, s.lazy_seeds)
    return cap, time.process_time() - c0, list(RUNS)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--plan", type=Path, default=ROOT / "plans" / "chat_8b.yaml")
    ap.add_argument("--only", default=None, help="candidates whose label contains this")
    a = ap.parse_args()
    spec = load_plan(a.plan)
    runner.run = _counted
    tot = {"cpu_full": 0.0, "cpu_stop": 0.0, "runs": 0, "stopped": 0, "sim_full": 0.0, "sim_stop": 0.0,
           "it_full": 0, "it_stop": 0}
    same = True
    for cand in candidate_grid(spec):
        name = " ".join(str(v) for v in cand.values())
        if a.only and a.only not in name:
            continue
        try:
            full, cpu_f, runs_f = search(spec, cand, False)
            fast, cpu_s, runs_s = search(spec, cand, True)
        except Exception as e:  # a candidate the scenario refuses
            print(f"{name}: skipped ({type(e).__name__})")
            continue
        verdicts = [(p.rate, p.passed, p.seeds_passed, p.seeds_run) for p in full.probes]
        ok = (full.rate, full.fail_rate, verdicts) == (
            fast.rate, fast.fail_rate, [(p.rate, p.passed, p.seeds_passed, p.seeds_run) for p in fast.probes])
        same &= ok
        n_stop = sum(r["stopped"] for r in runs_s)
        sim_f, sim_s = sum(r["sim_s"] for r in runs_f), sum(r["sim_s"] for r in runs_s)
        it_f, it_s = sum(r["iterations"] for r in runs_f), sum(r["iterations"] for r in runs_s)
        print(f"{name}: rate {fast.rate:.4g} (same: {ok}), {len(runs_s)} runs, {n_stop} stopped; "
              f"CPU {cpu_f:.2f} -> {cpu_s:.2f} s; simulated {sim_f:.0f} -> {sim_s:.0f} s; "
              f"iterations {it_f} -> {it_s}")
        for k, v in (("cpu_full", cpu_f), ("cpu_stop", cpu_s), ("runs", len(runs_s)), ("stopped", n_stop),
                     ("sim_full", sim_f), ("sim_stop", sim_s), ("it_full", it_f), ("it_stop", it_s)):
            tot[k] += v
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    print(f"all: CPU {tot['cpu_full']:.1f} -> {tot['cpu_stop']:.1f} s; {tot['stopped']} of {tot['runs']} runs "
          f"stopped; simulated {tot['sim_full']:.0f} -> {tot['sim_stop']:.0f} s; iterations "
          f"{tot['it_full']} -> {tot['it_stop']}; every answer and verdict the same: {same}")


if __name__ == "__main__":
    main()
