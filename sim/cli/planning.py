"""Command line of the planning commands: `sweep`, `curve`, `plan`, `report`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from sim.cli.argtypes import positive_seconds, whole_number
from sim.io.specload import SpecError


def _executor_args(p) -> None:
    p.add_argument("--executor", default="process", choices=("process", "ray", "sequential"),
                   help="local worker processes (default), Ray, or one at a time")
    p.add_argument("--workers", type=whole_number, default=None, help="worker processes (default: CPU count)")
    p.add_argument("--address", help="Ray cluster address (default: start a local Ray)")


def cmd_sweep(a) -> int:
    from sim.cli.argtypes import parse_sets
    from sim.planning.sweep import configurations, iter_values, parse_axis, run_sweep, swept_metrics
    from sim.report.text import frame_text

    grid, zipped = iter_values(a.grid, "--grid"), iter_values(a.zip, "--zip")
    if a.field or a.values:  # the older one-field form: --field F --values V1,V2
        if not (a.field and a.values):
            raise SpecError("llmsim sweep", "--field/--values", "both are needed (allowed: "
                            "--field FIELD --values V1,V2,..., or --grid FIELD=V1,V2,...)")
        grid.append(parse_axis(f"{a.field}={a.values}", "--field/--values"))
    if not grid and not zipped:
        raise SpecError("llmsim sweep", "--grid", "give at least one --grid or --zip FIELD=V1,V2,...")
    configs = configurations(grid, zipped)
    out = Path(a.out) if a.out else Path("runs") / f"sweep_{Path(a.scenario).stem}"
    table = run_sweep(a.scenario, configs, out, base=parse_sets(a.set), executor=a.executor,
                      workers=a.workers, address=a.address, progress=sys.stderr.isatty())
    fields = [n for n, _ in grid + zipped]
    show = [c for c in fields + ["request_throughput", "ttft_s.p99", "tpot_s.p99", "e2e_s.p99"] if c in table]
    show += swept_metrics(fields, table)  # what the swept fields move: KV waste, speed-up, hit rate
    print(frame_text(table[show], fields))
    print(f"\nwrote {out}/ (results.csv, results.parquet, rows.jsonl)")
    return 0


def cmd_curve(a) -> int:
    from sim.planning.curve import run_curve
    from sim.planning.sweep import parse_axis
    from sim.report.text import frame_text

    if (a.rates is None) == (a.concurrency is None):
        raise SpecError("llmsim curve", "--rates/--concurrency", "give exactly one of --rates (open loop) or --concurrency (closed loop)")
    users = None
    if a.concurrency is not None:
        _, users = parse_axis(f"concurrency={a.concurrency}", "--concurrency")
        if any(isinstance(u, bool) or not isinstance(u, int) or u < 1 for u in users):
            raise SpecError("--concurrency", a.concurrency, "not a whole number of users >= 1 (allowed: e.g. 1,4,16,64)")
        rates = None
    else:
        _, rates = parse_axis(f"rates={a.rates}", "--rates")
        if any(not isinstance(r, int | float) or r <= 0 for r in rates):
            raise SpecError("--rates", a.rates, "a rate is not positive (allowed: numbers > 0, e.g. 1,2,4,8)")
    out = Path(a.out) if a.out else Path("runs") / f"curve_{Path(a.scenarios[0]).stem}"
    table, knees = run_curve(a.scenarios, rates, out, requests=a.requests, seed=a.seed,
                             ttft_bound=a.ttft_bound, executor=a.executor, workers=a.workers,
                             concurrency=users)
    print(frame_text(curve_display(table), ["scenario", "concurrency" if users else "rate", "seed"]))
    print("(90 % intervals: the step model's 90 % error by what each point stands on; one seed a "
          "point, no seed spread; every bound in curve.csv)\n")
    print(frame_text(knees, ["scenario"]))
    _maybe_report(a, out)
    print(f"\nwrote {out}/ (curve.csv, knees.csv, curve.png)")
    return 0


def cmd_plan(a) -> int:
    from sim.cli.plan_kinds import other_plan
    from sim.planning.deployments import deployment_lines
    from sim.planning.plan import run_plan, write_plan
    from sim.planning.planspec import load_plan
    from sim.planning.traffic import label as arrival_label

    done = other_plan(a)  # a mixed-fleet or closed-loop plan (sim/cli/plan_kinds.py)
    if done is not None:
        return done
    spec = load_plan(a.plan)
    if spec.day is not None:  # a plan over a time-varying day (sim/planning/dayplan.py)
        from sim.planning.dayplan import day_lines, run_day_plan, write_day_plan

        result = run_day_plan(spec, a.prices, workers=a.workers, progress=sys.stderr.isatty())
        out = write_day_plan(result, Path(a.out) if a.out else Path("runs") / f"plan_{spec.name}")
        print("\n".join(day_lines(result)))
        _maybe_report(a, out)
        print(f"wrote {out}/ (plan.json, fleets.csv, bound.csv)")
        return 0
    result = run_plan(spec, a.prices, workers=a.workers, progress=sys.stderr.isatty())
    out = write_plan(result, Path(a.out) if a.out else Path("runs") / f"plan_{spec.name}")
    if result.get("arrival"):
        print(f"arrivals: {arrival_label(result['arrival'])}\n")
    print(candidate_table(result["candidates"]) + "\n")
    print(range_table(result["candidates"], (result.get("seed_pool") or {}).get("unit")) + "\n")
    print("\n".join(plan_verdict(result)))
    print("\n".join(confidence(result)))
    if result.get("deployments"):
        print("\n".join(deployment_lines(result["deployments"])))
    _maybe_report(a, out)
    print(f"wrote {out}/ (plan.json, candidates.csv, fleet_check.csv)")
    return 0


def curve_display(table):
    """The curve table as printed: each p99's 90 % interval as one 'low-high' column in place
    of its low90 / high90 columns (curve.csv keeps them apart)."""
    from sim.planning.uncertainty import fmt_range

    show = table[[c for c in table.columns if not c.endswith(("low90", "high90"))]].copy()
    for c in ("ttft_s.p99", "tpot_s.p99"):
        show.insert(show.columns.get_loc(c) + 1, f"{c} 90%",
                    [fmt_range((lo, hi), "{:.3g}") if lo is not None and lo == lo else "-"
                     for lo, hi in zip(table[f"{c}.low90"], table[f"{c}.high90"], strict=True)])
    return show


def plan_verdict(result: dict) -> list[str]:
    """The fleet checks made and the recommendation, in lines: every figure of the
    recommended fleet from its check, the per-replica estimate labelled as such."""
    from sim.planning.units import unit_noun

    rec, checks = result["recommended"], result.get("fleet_checks") or []
    if rec is None and not checks:
        return ["no candidate meets the SLOs"]
    check = result["fleet_check"]
    lines = [f"fleet checks at {result['target_rate']:g} req/s, {check['router_label']} "
             f"({len(checks)} checked, cheapest estimate first):"]
    for c in checks:
        n = c["replicas"]
        fewer = (f"; with {n - 1} they {'break' if c['one_fewer_breaks'] else 'STILL HOLD'}" if n > 1 else "")
        lines.append(f"  {c['candidate']}: {_n(n, unit_noun(c))} (estimate {c['estimated_replicas']}), "
                     f"${c['usd_per_hour']:.2f}/hour, TTFT99 {c['ttft_p99_s']:.3f} s, TPOT99 "
                     f"{c['tpot_p99_s']:.3f} s: SLOs {'hold' if c['holds'] else 'DO NOT hold'} with {n}{fewer}")
    if rec is None:
        return [*lines, f"recommended: none: no fleet checked meets the SLOs at "
                        f"{result['target_rate']:g} req/s with up to {result['max_replicas']} "
                        "replicas (search.max_replicas)"]
    est = rec["estimate"]
    lines += [f"recommended: {rec['candidate']} x {_n(rec['replicas'], unit_noun(rec))} ({_n(rec['gpus'], 'GPU')}), "
              f"${rec['usd_per_hour']:.2f}/hour, ${rec['usd_per_m_output_tokens']:.3f}/M output tokens, "
              f"TTFT99 {rec['ttft_p99_s']:.3f} s, TPOT99 {rec['tpot_p99_s']:.3f} s (its fleet check)",
              f"  estimate before the check: {_n(est['replicas'], unit_noun(rec))}, ${est['usd_per_hour']:.2f}/hour, "
              f"TTFT99 {est['ttft_p99_at_target_s']:.3f} s (one {unit_noun(rec)} alone sustains "
              f"{est['sustained_rate']:.2f} req/s within the SLOs)"]
    if result.get("unchecked_within"):
        lines.append(f"  {result['unchecked_within']} more candidate(s) estimated at <= "
                     f"${rec['usd_per_hour']:.2f}/hour were not fleet-checked (search.fleet_checks)")
    return lines


def confidence(result: dict) -> list[str]:
    """How sure the recommendation is: 90 % intervals, how robust it is across them, what
    they stand on, headroom, redundancy, ties."""
    from sim.planning.uncertainty import fmt_range

    rec = result.get("recommended")
    if not rec or "replicas_interval90" not in rec:
        return []
    lines = [f"90 % intervals: replicas needed {fmt_range(rec['replicas_interval90'], '{:d}')}, "
             f"${fmt_range(rec['usd_per_hour_interval90'], '{:.2f}')}/hour, "
             f"${fmt_range(rec['usd_per_m_output_tokens_interval90'], '{:.3f}')}/M output tokens, "
             f"TTFT99 {fmt_range(rec['ttft_p99_interval90_s'], '{:.3f}')} s, "
             f"TPOT99 {fmt_range(rec['tpot_p99_interval90_s'], '{:.3f}')} s "
             f"(seed spread over {rec['seeds']} seed(s) + the step model's 90 % error "
             f"±{rec['interval90_model']:.0%})",
             *([f"  the seed term stands on {rec['seed_term']}"] if rec.get("seed_term") else []),
             f"  robust? {rec['candidate']} x {rec['replicas']}: {rec['robust']['words']}",
             f"  the step time behind it: {rec['stands_on_lookups']} "
             f"({rec['measured_share']:.0%} rests on measurement; data/step_error_bands.yaml, "
             "coverage: docs/fidelity.md)"]
    head = rec.get("headroom")
    if head:
        more = f"; fails at +{head['fail_factor'] - 1:.0%}" if head.get("fail_factor") else \
            " (no failure found in the rates tried)"
        lines.append(f"  headroom: the SLOs still hold at {head['rate']:.3g} req/s, "
                     f"+{head['over_target']:.0%} over the target{more}")
    if rec.get("redundancy") == "n+1":
        lines.append(f"  redundancy n+1: the SLOs {'hold' if rec.get('holds_one_down') else 'DO NOT hold'} "
                     f"with one replica down ({rec['replicas'] - 1} serving)")
    elif rec["replicas"] == 1:
        lines.append("  no redundancy: one replica; set search.redundancy: n+1 to survive losing it")
    if rec.get("ties"):
        lines.append(f"  tied on cost with: {', '.join(rec['ties'])} (shown; the tie goes to more replicas)")
    return lines


def range_table(rows: list[dict], pool: dict | None = None) -> str:
    """Per candidate, the 90 % interval of each figure (seed spread + the step model's 90 %
    error) and the share of its step time that rests on measurement; `pool`: the plan's
    `seed_pool`, what the p99s' seed term stands on."""
    from sim.planning.uncertainty import fmt_range, pool_words

    head = (f"{'candidate':30} {'req/s 90%':>13} {'replicas':>8} {'$/h 90%':>13} {'$/M tok 90%':>13} "
            f"{'TTFT99 90%':>13} {'TPOT99 90%':>13} {'model':>5} {'measured':>8}")
    lines = ["90 % intervals (seed spread + the step model's 90 % error by what each figure stands on):",
             *([f"  the p99s' seed term stands on {pool_words(pool)}"] if pool else []),
             head, "-" * len(head)]
    ok = [r for r in rows if r.get("status") == "ok" and r.get("sustained_rate_interval90")]
    for r in sorted(ok, key=lambda r: (r["usd_per_hour"], r["ttft_p99_at_target_s"] or 0)):
        lines.append(f"{r['candidate'][:30]:30} {fmt_range(r['sustained_rate_interval90'], '{:.3g}'):>13} "
                     f"{fmt_range(r['replicas_interval90'], '{:d}'):>8} "
                     f"{fmt_range(r['usd_per_hour_interval90'], '{:.1f}'):>13} "
                     f"{fmt_range(r['usd_per_m_output_tokens_interval90'], '{:.3f}'):>13} "
                     f"{fmt_range(r.get('ttft_p99_interval90_s'), '{:.3f}'):>13} "
                     f"{fmt_range(r.get('tpot_p99_interval90_s'), '{:.3f}'):>13} "
                     f"{r['interval90_model']:5.0%} {r['measured_share']:8.0%}")
    return "\n".join(lines)


def _n(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


def candidate_table(rows: list[dict]) -> str:
    """One line per candidate, cheapest estimate first: what one replica sustains, the
    fleet it takes, its cost, its latency at its share of the target and what binds it;
    `fleet` is the fleet check's replicas and $/hour where the candidate was checked.
    Then the candidates that did not run or meet the SLOs, with why."""
    head = (f"{'candidate':30} {'req/s':>7} {'repl':>4} {'GPUs':>4} {'$/h':>7} {'$/M tok':>8} "
            f"{'TTFT99':>7} {'TPOT99':>7}  {'binding':17} {'fleet':>11} pareto")
    lines = [head, "-" * len(head)]
    ok = [r for r in rows if r.get("status") == "ok" and r.get("replicas")]
    for r in sorted(ok, key=lambda r: (r["usd_per_hour"], r["ttft_p99_at_target_s"] or 0)):
        ttft, tpot = r.get("ttft_p99_at_target_s"), r.get("tpot_p99_at_target_s")
        fleet = (f"{r['fleet_replicas']} ${r['fleet_usd_per_hour']:.2f}"
                 if r.get("fleet_replicas") is not None else "-")
        lines.append(
            f"{r['candidate'][:30]:30} {r['sustained_rate']:7.2f} {r['replicas']:4d} {r['gpus']:4d} "
            f"{r['usd_per_hour']:7.2f} {r['usd_per_m_output_tokens']:8.3f} "
            f"{'-' if ttft is None else f'{ttft:.3f}':>7} {'-' if tpot is None else f'{tpot:.3f}':>7}  "
            f"{str(r.get('binding') or '-')[:17]:17} {fleet:>11} {'*' if r.get('pareto') else ''}")
    for r in rows:
        if not (r.get("status") == "ok" and r.get("replicas")):
            lines.append(f"{r['candidate'][:30]:30} {r.get('status')}: {r.get('note') or '-'}")
    return "\n".join(lines)


def _maybe_report(a, folder: Path) -> None:
    if getattr(a, "report", False):
        from sim.report.pages import build_report, write_report

        print(f"report: {write_report(build_report(folder), folder)}")


def cmd_report(a) -> int:
    from sim.report.pages import build_report, write_report

    print(write_report(build_report(a.folder), a.folder, a.out))
    return 0


def add_parsers(sub) -> None:
    s = sub.add_parser("sweep", help="run one scenario over a grid of field values, in parallel")
    s.add_argument("scenario")
    s.add_argument("--grid", action="append", metavar="FIELD=V1,V2,...", help="an axis of the grid (repeatable)")
    s.add_argument("--zip", action="append", metavar="FIELD=V1,V2,...",
                   help="lists taken together, one value of each per configuration (repeatable)")
    s.add_argument("--field", help="one-field form: a dotted field (with --values)")
    s.add_argument("--values", help="one-field form: comma-separated values")
    s.add_argument("--set", action="append", metavar="FIELD=VALUE", help="override a scenario field")
    s.add_argument("--out", help="output folder (default runs/sweep_<scenario>); rerun to resume")
    s.add_argument("--no-plots", action="store_true", help=argparse.SUPPRESS)  # a sweep writes tables only
    _executor_args(s)
    s.set_defaults(fn=cmd_sweep)

    c = sub.add_parser("curve", help="throughput-latency curves of scenarios against offered load")
    c.add_argument("scenarios", nargs="+")
    c.add_argument("--rates", help="offered request rates, e.g. 1,2,4,8,16")
    c.add_argument("--concurrency", help="closed-loop users instead of rates, e.g. 1,4,16,64")
    c.add_argument("--requests", type=whole_number,
                   help="requests in a point's first run, at least 60 s of traffic; the steady rule "
                        "doubles it until steady (default: the scenario's; with --concurrency, "
                        "requests per point)")
    c.add_argument("--seed", type=int, help="seed for every point (default: the scenario's)")
    c.add_argument("--ttft-bound", type=positive_seconds, help="p99 TTFT bound of the knee when the scenario has no slo.ttft_s")
    c.add_argument("--out", help="output folder (default runs/curve_<first scenario>)")
    c.add_argument("--report", action="store_true", help="also write report.html/.md")
    _executor_args(c)
    c.set_defaults(fn=cmd_curve)

    p = sub.add_parser("plan", help="cheapest fleet meeting SLOs at a target rate, validated by simulation "
                       "(or over a day of time-varying traffic: a plan with a day: section)")
    p.add_argument("plan", help="plan YAML (see sim/planning/plan.py)")
    p.add_argument("--prices", help="GPU prices YAML (default gpu_profiles/prices.yaml)")
    p.add_argument("--workers", type=whole_number, default=None, help="worker processes (default: CPU count)")
    p.add_argument("--out", help="output folder (default runs/plan_<name>)")
    p.add_argument("--report", action="store_true", help="also write report.html/.md")
    p.set_defaults(fn=cmd_plan)

    r = sub.add_parser("report", help="HTML + Markdown + CSV report of a run, sweep, curve or plan folder")
    r.add_argument("folder")
    r.add_argument("--out", help="where to write (default: into the folder)")
    r.set_defaults(fn=cmd_report)
