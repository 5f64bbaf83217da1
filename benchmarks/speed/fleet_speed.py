"""Speed and memory of a large fleet: 64 Llama-3-8B replicas on H200s serving 64x the
Azure conversation trace's rate for one hour (~1.24 M requests, the trace's lengths
wrapping around, Poisson arrivals at 64 x 5.38 req/s).

    python benchmarks/speed/fleet_speed.py [--replicas 64] [--router round_robin] [--write DIR]
        [--hours H] [--rate R | --day] [--diurnal PEAK_TO_TROUGH]
        [--workers N|auto [--executor ray]] [--no-split] [--step-log summary]

The day (issue 19): `--day` is a 128-replica fleet at 25 M requests a day (289 req/s,
Poisson, the same lengths); `--hours 0.1` simulates a slice of it and extrapolates to
24 h by requests (`--diurnal 3`: the rate follows a day's cosine, 3x peak to trough,
from its trough at 0 h; for a whole day, not a slice).

Runs the scenario once, as `llmsim run` does, and prints the engine's wall time
(iterations/s, simulated requests/s), the whole run's wall and CPU time and the peak
resident memory: this process's (ru_maxrss) and, with --workers, each worker's CPU and
the largest worker's memory (as the workers measured them; with the process pool also
as the kernel counted them, RUSAGE_CHILDREN), the load average, the spill folder's size
on disk (sim/io/spill.py: the step logs, gaps and request records of a long run), a
day's figures extrapolated by requests, and a host yardstick (`host_yardstick`: a fixed
loop's CPU before and after the run, to compare runs made hours apart on a drifting host).

The extrapolation scales only what grows with the requests. A day pays once what a
slice pays once, so those are timed apart and added unscaled: the imports (from this
script's start, its interpreter's start-up not counted) and, with `--executor ray`,
starting Ray (`ray.init` here, then one task on each of its workers, one fewer than
`--workers` since this process simulates the first group, importing what a task imports,
so `run` finds Ray connected and its workers warm, as a day's run would after its first
seconds) and shutting it down. Everything inside `run` is scaled: the
simulation, the workload's generation, the parent's merge and summary (its passes read
every gap and step: they grow with the day), and the little that does not grow (the
configs resolved again, ~0.02 s a Ray task; forking the process pool's workers, ms), which
the extrapolation therefore overstates slightly. Before, Ray's start-up (4-7 s here) was
multiplied by the 96 slices of a 0.25 h day. The spill folder's size scales the same
way (by requests: it holds every step).
A round-robin or random fleet is simulated replica by replica, each replica alone with
its own requests (sim/engine/split.py: the same results); --no-split simulates it whole,
in one engine, as before. --workers N spreads the replicas over N processes
(sim/engine/parallel.py). With --write, also the time to write requests.csv,
steps.csv and summary.json. `--step-log summary` keeps each replica's step sums instead of
its rows (sim/engine/steptally.py: no steps.csv; a whole day's rows would not fit on disk).
The test suite runs `--replicas 2 --hours 0.005 --write DIR`.
"""

from __future__ import annotations

import time

T_START, C_START = time.perf_counter(), time.process_time()  # before the imports

import argparse  # noqa: E402
import os  # noqa: E402
import resource  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from pathlib import Path  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # this checkout's sim, not an installed one

from sim.config.scenario import scenario_from_dict  # noqa: E402
from sim.engine.runner import run  # noqa: E402
from sim.io.tempdirs import _temp_prefix  # noqa: E402

CONV_RATE = 19366 / 3600  # the Azure conversation trace's mean rate, requests/s
DAY_REPLICAS, DAY_RATE = 128, 25e6 / 86400  # issue 19's fleet-day: ~25 M requests


def scenario(replicas: int, router: str, hours: float, rate: float | None = None,
             diurnal: float | None = None, step_log: str = "rows"):
    rate = CONV_RATE * replicas if rate is None else rate
    arrival = ({"kind": "poisson", "rate": rate} if diurnal is None else
               {"kind": "diurnal", "rate": rate, "peak_to_trough": diurnal, "period_s": 86400.0})
    return scenario_from_dict({
        "name": f"fleet{replicas}",
        "seed": 1,
        "model": "llama-3-8b",
        "gpu": "h200-sxm",
        "runtime": "cuda-graph",
        "step_log": step_log,
        "cluster": {"router": {"policy": router}, "groups": [{"name": "h200", "count": replicas}]},
        "workload": {
            "trace": {"path": str(ROOT / "data/traces/azure_2023_conv.csv"), "format": "azure"},
            "arrival": arrival,
            "duration_s": 3600 * hours,
        },
    }, base_dir=ROOT)


def _warm_import() -> int:
    """A Ray task: import what a run's tasks import (sim/engine/parallel.py simulate_part)."""
    import sim.engine.parallel  # noqa: F401
    import sim.engine.prepare  # noqa: F401

    return os.getpid()


def start_ray(workers: int) -> tuple[float, float, int]:
    """Start a local Ray of `workers` CPUs and warm its workers (each imports what a
    task imports): (wall s, this process's CPU s, workers warmed)."""
    import ray

    t, c = time.perf_counter(), time.process_time()
    ray.init(num_cpus=workers, include_dashboard=False, log_to_driver=False)
    warm = ray.remote(_warm_import)
    pids = set(ray.get([warm.remote() for _ in range(workers)]))
    return time.perf_counter() - t, time.process_time() - c, len(pids)


def host_yardstick(n: int = 1_000_000) -> float:
    """CPU seconds of a fixed pure-Python loop (float sums, integer arithmetic, dict hits,
    list appends: the kinds of work of the engine's hot loop), the median of three: the
    same work on any day and any checkout, so it measures the host, not the code. Timed
    before and after a run, it tells runs made hours apart on a host whose speed drifts
    (±25 % within an hour here) which of them ran on a slower machine."""
    times = []
    for _ in range(3):
        c = time.process_time()
        table = {i: float(i) for i in range(64)}
        acc, t, kept = 0.0, 0.0, []
        for i in range(n):
            x = table[i & 63]
            t += x * 1e-6
            acc += (t - x) * 0.5
            if i % 7 == 0:
                kept.append(t)
        times.append(time.process_time() - c)
    return sorted(times)[1]


def spill_bytes() -> tuple[int, int]:
    """Bytes in this process's spill folders (sim/io/spill.py), all and the gaps' alone."""
    total = gaps = 0
    for d in Path(tempfile.gettempdir()).glob(f"{_temp_prefix('.llmsim-spill-')}*"):
        for f in d.iterdir():
            size = f.stat().st_size
            total += size
            gaps += size if f.name.split("~")[0].endswith((".gaps", ".weights")) else 0
    return total, gaps


@dataclass
class Timed:
    """One run's measured costs: `run()`'s (scaled to a day) and the fixed ones (not)."""
    out: object  # the RunOutput
    wall: float  # run(), s
    cpu: float   # run(), this process's CPU s
    fixed: list[str] = field(default_factory=list)  # the fixed costs, in words
    fixed_wall: float = 0.0
    fixed_cpu: float = 0.0
    spilled: int = 0  # bytes in the spill folder after the run (its peak: it only grows)
    spilled_gaps: int = 0
    yardstick: tuple[float, float] = (0.0, 0.0)  # host_yardstick() before and after run(), s


def _args() -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    ap.add_argument("--replicas", type=int, default=None, help="default 64 (--day: 128)")
    ap.add_argument("--rate", type=float, default=None,
                    help="the fleet's requests/s (default replicas x 5.38, the trace's; --day: 289)")
    ap.add_argument("--day", action="store_true", help="issue 19's fleet-day: 128 replicas, 25 M "
                    "requests a day (use --hours for a slice)")
    ap.add_argument("--diurnal", type=float, default=None, metavar="PEAK_TO_TROUGH",
                    help="arrivals follow a 24 h cosine of this peak-to-trough ratio")
    ap.add_argument("--router", default="round_robin")
    ap.add_argument("--hours", type=float, default=1.0)
    ap.add_argument("--write", help="also write the run's tables into this (new) folder")
    ap.add_argument("--workers", default="1", help="N, or auto (as `llmsim run`'s default)")
    ap.add_argument("--executor", default="process", choices=("process", "ray"))
    ap.add_argument("--step-log", choices=("rows", "summary"), default="rows",
                    help="what each replica keeps of its steps (summary: their sums only)")
    ap.add_argument("--no-split", action="store_true",
                    help="the whole fleet in one engine (not replica by replica)")
    a = ap.parse_args()
    if a.day:
        a.replicas = a.replicas or DAY_REPLICAS
        a.rate = a.rate or DAY_RATE
    a.replicas = a.replicas or 64
    return a


def timed_run(a: argparse.Namespace) -> Timed:
    """Run the scenario as `llmsim run` does, Ray started before and shut down after it
    (when asked for), each timed apart."""
    sc = scenario(a.replicas, a.router, a.hours, a.rate, a.diurnal, a.step_log)
    fixed_wall, fixed_cpu = time.perf_counter() - T_START, time.process_time() - C_START
    fixed = [f"imports {fixed_wall:.2f} s"]
    workers = a.workers if a.workers == "auto" else int(a.workers)
    ray_up = a.executor == "ray" and workers != 1
    if ray_up:
        # the run's first group is simulated by this process (sim/engine/parallel.py)
        n = os.cpu_count() if workers == "auto" else workers
        s_wall, s_cpu, warmed = start_ray(max(1, n - 1))
        fixed_wall, fixed_cpu = fixed_wall + s_wall, fixed_cpu + s_cpu
        fixed.append(f"Ray start-up {s_wall:.2f} s ({warmed} workers warmed)")
    before = host_yardstick()
    t0, c0 = time.perf_counter(), time.process_time()
    out = run(sc, workers=workers, executor=a.executor,  # what `llmsim run` does
              split=not a.no_split)
    t = Timed(out, time.perf_counter() - t0, time.process_time() - c0, fixed)
    t.spilled, t.spilled_gaps = spill_bytes()
    t.yardstick = (before, host_yardstick())
    if ray_up:
        import ray

        t1, c1 = time.perf_counter(), time.process_time()
        ray.shutdown()
        fixed_wall += time.perf_counter() - t1
        fixed_cpu += time.process_time() - c1
        fixed.append(f"Ray shut-down {time.perf_counter() - t1:.2f} s")
    t.fixed_wall, t.fixed_cpu = fixed_wall, fixed_cpu
    return t


def main() -> None:
    a = _args()
    t = timed_run(a)
    out, wall, cpu = t.out, t.wall, t.cpu
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    iters = sum(r.steps.rows() for r in out.result.replicas)
    n = len(out.result.seqs)
    sim_s = out.summary["simulate_wall_s"]
    print(f"{a.replicas} replicas, router {a.router}: {n:,} requests, {iters:,} iterations")
    print(f"  simulate():           {sim_s:6.1f} s wall ({iters / sim_s:,.0f} iterations/s, "
          f"{n / sim_s:,.0f} simulated requests/s)")
    print(f"  sim.run() end to end: {wall:6.2f} s wall {cpu:6.2f} s cpu "
          f"({wall - sim_s:.2f} s wall outside the engine: workload, merge, summary)")
    print(f"  engine:               {out.engine}")
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    use = out.worker_usage
    if use:
        print(f"  workers:              {len(use)} x ({', '.join(f'{u.cpu_s:.2f}' for u in use)}) s"
              f" cpu, largest {max(u.peak_rss_gib for u in use):.2f} GiB; all processes "
              f"{cpu + sum(u.cpu_s for u in use):6.1f} s cpu")
    if kids.ru_maxrss:  # process pool: its workers, as the kernel counted them
        print(f"  child processes:      {kids.ru_utime + kids.ru_stime:6.2f} s cpu, largest "
              f"{kids.ru_maxrss / 2**20:.2f} GiB; with this process "
              f"{cpu + kids.ru_utime + kids.ru_stime:6.2f} s cpu")
    print(f"  peak RSS after run:   {rss:.2f} GiB (this process)")
    load = os.getloadavg()
    print(f"  load average:         {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} "
          f"({os.cpu_count()} cores)")
    print(f"  spill folder:         {t.spilled / 2**20:,.0f} MiB on disk "
          f"({t.spilled / max(iters, 1):.1f} B an iteration; the gaps "
          f"{t.spilled_gaps / max(iters, 1):.1f})")
    print(f"  host yardstick:       {t.yardstick[0] * 1e3:.0f} ms before, {t.yardstick[1] * 1e3:.0f} ms "
          "after the run (a fixed loop's CPU: lower is a faster host; not timed in the run)")
    print(f"  fixed costs:          {', '.join(t.fixed)}: {t.fixed_wall:.2f} s wall, "
          f"{t.fixed_cpu:.2f} s cpu (this process), not scaled below")
    if a.hours < 24 and a.diurnal is None:
        day = (a.rate or CONV_RATE * a.replicas) * 86400
        k = day / max(n, 1)
        all_cpu = cpu + (sum(u.cpu_s for u in use) if use else kids.ru_utime + kids.ru_stime)
        print(f"  all processes:        {iters / all_cpu:,.0f} iterations and "
              f"{n / all_cpu:,.0f} requests per CPU second ({all_cpu / max(n, 1) * 1e3:.3f} ms "
              f"cpu, {wall / max(n, 1) * 1e3:.3f} ms wall a request)")
        print(f"  a day ({day / 1e6:.1f} M requests, x{k:.0f}): "
              f"{(t.fixed_wall + wall * k) / 60:6.1f} min wall, "
              f"{(t.fixed_cpu + all_cpu * k) / 60:6.1f} min cpu (all processes; fixed costs once "
              f"+ {k:.0f} x the run), {iters * k / 1e6:,.0f} M iterations, "
              f"{t.spilled * k / 1e9:,.0f} GB spilled (the gaps {t.spilled_gaps * k / 1e9:,.0f})")
    if a.write:
        t5 = time.perf_counter()
        out.write(a.write, plots=False)
        print(f"  writing tables: {time.perf_counter() - t5:6.1f} s wall")
        print(f"  peak RSS:       {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.2f} GiB")


if __name__ == "__main__":
    main()
