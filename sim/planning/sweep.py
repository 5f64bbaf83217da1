"""Sweeps: one scenario run for many configurations, in parallel, resumable.

A configuration is a mapping of dotted scenario fields to values (`--set` style).
`configurations(grid, zipped)` crosses the grid axes and zips the zipped lists
(all of one length) into one axis crossed with the grid. Each configuration is keyed
by a hash of the scenario file's bytes, the base overrides and its own values, so a
resumed sweep recognises the rows it already has.

Rows go to `rows.jsonl` as they finish (one line each, flushed): an interrupted sweep
keeps them and `run_sweep` skips their keys next time. At the end the rows are written,
in configuration order, to `results.csv` and `results.parquet` (when pyarrow is
installed): one row per configuration, every swept field, every summary metric
(flattened, `ttft_s.p99`). The row never holds wall-clock times, so it is the same
bytes whatever executor ran it: `sequential`, `process` (a local pool), or `ray`.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import numpy as np
import pandas as pd

from sim.io.outdir import open_progress, write_output
from sim.io.outputs import OutputError, _describe_oserror
from sim.io.specload import SpecError, parse_cli_value
from sim.planning.lifetime import reaper, worker_pool

EXECUTORS = ("process", "ray", "sequential")
UNSTABLE = ("wall_s", "simulate_wall_s")  # summary fields that differ from run to run: never in a row


# what a swept field moves beyond the latencies, shown beside them: a swept field's dotted
# prefix (the longest that matches) -> results columns (KV waste, speed-up, hit rate)
SWEPT_METRICS = {
    "kv": ("kv.reserved_unused_share", "kv.util_peak", "kv.capacity_tokens", "preemptions"),
    "kv.prefix_caching": ("prefix_cache.hit_rate", "kv.util_peak"),
    "kv.prefix_cache_host_gib": ("prefix_cache.hit_rate",),
    "speculative": ("speculative.tokens_per_round", "speculative.speedup_vs_decode"),
    "scheduler": ("mean_batch_size", "preemptions"),
    "parallel": ("kv.capacity_tokens", "mean_batch_size"),
    "dtype": ("kv.capacity_tokens", "mean_batch_size"),
    "gpu": ("kv.capacity_tokens", "mean_batch_size"),
}


def swept_metrics(fields: list[str], table: pd.DataFrame) -> list[str]:
    """The SWEPT_METRICS columns of the swept fields that the table holds with a value."""
    out: list[str] = []
    for f in fields:
        keys = [k for k in SWEPT_METRICS if f == k or f.startswith(k + ".")]
        for c in SWEPT_METRICS[max(keys, key=len)] if keys else ():
            if c in table and table[c].notna().any() and c not in out:
                out.append(c)
    return out


def parse_axis(text: str, where: str) -> tuple[str, list]:
    """`field.path=v1,v2,...` -> (field, [values]); values are YAML scalars."""
    if "=" not in text:
        raise SpecError(where, text, "expected FIELD.PATH=V1,V2,...")
    name, values = text.split("=", 1)
    if not name.strip() or not values.strip():
        raise SpecError(where, text, "expected FIELD.PATH=V1,V2,... with at least one value")
    return name.strip(), [parse_cli_value(v, f"{where} {name.strip()}") for v in values.split(",")]


def configurations(grid: list[tuple[str, list]], zipped: list[tuple[str, list]]) -> list[dict]:
    """The grid's cross product, crossed with the zipped lists taken together."""
    lengths = {len(v) for _, v in zipped}
    if len(lengths) > 1:
        raise SpecError("--zip", ", ".join(n for n, _ in zipped),
                        f"lists of different lengths {sorted(lengths)} (allowed: equal lengths)")
    names = [n for n, _ in grid] + [n for n, _ in zipped]
    if len(set(names)) != len(names):
        raise SpecError("--grid/--zip", ", ".join(names), "a field is swept twice")
    zrows = [dict(zip([n for n, _ in zipped], vals, strict=True))
             for vals in zip(*[v for _, v in zipped], strict=True)] if zipped else [{}]
    out = []
    for combo in itertools.product(*[v for _, v in grid]):
        g = dict(zip([n for n, _ in grid], combo, strict=True))
        out.extend({**g, **z} for z in zrows)
    return out


def config_key(scenario_file: str | Path, base: dict, config: dict) -> str:
    """A stable id of one configuration: scenario bytes + base overrides + its values."""
    h = hashlib.sha256(Path(scenario_file).read_bytes())
    h.update(json.dumps([base, config], sort_keys=True, default=str).encode())
    return h.hexdigest()[:16]


def flatten(d: dict, prefix: str = "") -> dict:
    """Nested summary -> one level with dotted keys; lists become JSON text."""
    out: dict = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, key + "."))
        elif isinstance(v, list | tuple):
            out[key] = json.dumps(v)
        else:
            out[key] = v
    return out


def run_config(scenario_file: str, overrides: dict) -> dict:
    """One configuration's row: the summary flattened (run in a worker)."""
    from sim.engine.runner import run
    from sim.planning.capacity import steady_throughput

    out = run(scenario_file, overrides)
    summary = {**out.summary, "steady": steady_throughput(out.requests)}
    return {k: v for k, v in flatten(summary).items() if k not in UNSTABLE}


Task = tuple[str, str, dict]  # (key, scenario file, overrides)


def execute(tasks: list[Task], executor: str = "process", workers: int | None = None,
            address: str | None = None, fn=None) -> Iterator[tuple[str, dict]]:
    """Run tasks, yielding (key, row) as each finishes (order depends on the executor);
    `fn(scenario file, overrides) -> row` (picklable) runs one, default `run_config`."""
    fn = fn or run_config
    if executor == "sequential" or (executor == "process" and (workers or 2) <= 1) or len(tasks) <= 1:
        for key, f, o in tasks:
            yield key, fn(f, o)
    elif executor == "process":
        import concurrent.futures as cf

        with worker_pool(workers) as pool:
            futs = {pool.submit(fn, f, o): key for key, f, o in tasks}
            try:
                for fut in cf.as_completed(futs):
                    yield futs[fut], fut.result()
            except BaseException:
                for fut in futs:
                    fut.cancel()
                raise
    elif executor == "ray":
        yield from _execute_ray(tasks, workers, address, fn)
    else:
        raise SpecError("--executor", executor, f"unknown (known: {', '.join(EXECUTORS)})")


def _execute_ray(tasks: list[Task], workers: int | None, address: str | None, fn=None):
    try:
        import ray
    except ImportError:
        raise SpecError("--executor", "ray", "ray is not installed (pip install 'llmsim[ray]')") from None
    started = not ray.is_initialized()
    watch = None
    if started:
        kw = {"address": address} if address else {"num_cpus": workers, "include_dashboard": False}
        watch = None if address else reaper()  # a local Ray's processes end with this one
        ray.init(log_to_driver=False, **kw)
    try:
        remote = ray.remote(fn or run_config)
        refs = {remote.remote(f, o): key for key, f, o in tasks}
        pending = list(refs)
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            try:
                row = ray.get(done[0])
            except ray.exceptions.RayTaskError as e:  # a task's SpecError: its one line
                if isinstance(e.cause, SpecError):
                    raise e.cause from None
                raise
            yield refs[done[0]], row
    finally:
        if started:
            ray.shutdown()
        if watch is not None:
            watch.kill()
            watch.wait()


def _ends_a_line(path: Path) -> bool:
    """`path` is empty or ends with a newline."""
    with path.open("rb") as f:
        if f.seek(0, 2) == 0:
            return True
        f.seek(-1, 2)
        return f.read(1) == b"\n"


def read_rows(path: Path) -> dict[str, dict]:
    """Finished rows of an earlier (maybe interrupted) sweep; a torn last line is dropped."""
    rows = {}
    if path.is_file():
        for line in path.read_text().splitlines():
            try:
                rec = json.loads(line)
            except (json.JSONDecodeError, RecursionError):
                continue
            if isinstance(rec, dict) and isinstance(rec.get("key"), str) and isinstance(rec.get("row"), dict):
                rows[rec["key"]] = rec["row"]
    return rows


def run_sweep(scenario_file: str | Path, configs: list[dict], out_dir: str | Path, *,
              base: dict | None = None, executor: str = "process", workers: int | None = None,
              address: str | None = None, progress: bool = False,
              on_row: Callable[[str, dict], None] | None = None) -> pd.DataFrame:
    """Run every configuration not yet in `out_dir`, then write the results table."""
    base = dict(base or {})
    scenario_file = str(scenario_file)
    check_configs(scenario_file, base, configs)  # before any run, before the folder is made
    keys = [config_key(scenario_file, base, c) for c in configs]
    meta = {"scenario": scenario_file, "base": base, "fields": sorted({k for c in configs for k in c}),
            "appends": ["rows.jsonl"]}  # a resumed sweep appends to the finished folder's log
    out = open_progress(out_dir, "sweep", meta, "rows.jsonl")
    log = out / "rows.jsonl"
    kept = 0
    try:
        done = read_rows(log)
        kept = len(done)
        tasks = [(k, scenario_file, {**base, **c}) for k, c in zip(keys, configs, strict=True) if k not in done]
        bar = _bar(len(configs), len(configs) - len(tasks)) if progress else None
        with log.open("a") as f:
            if not _ends_a_line(log):
                f.write("\n")  # a torn last line (a full disk, a kill) stays a line of its own
            for key, row in execute(tasks, executor, workers, address):
                f.write(json.dumps({"key": key, "row": row}) + "\n")
                f.flush()
                done[key] = row
                kept += 1
                if bar:
                    bar.update(1)
                if on_row:
                    on_row(key, row)
        if bar:
            bar.close()
        lines = log.read_text()
    except OSError as e:  # a full disk, an I/O error: the rows written so far stay for a rerun
        raise OutputError("--out", out, f"could not write rows.jsonl ({_describe_oserror(e)}); "
                          f"{kept} finished row(s) kept there: rerun to resume") from None
    table = results_table(configs, keys, done)

    def finish(folder: Path) -> None:
        (folder / "rows.jsonl").write_text(lines)
        write_table(table, folder / "results")

    write_output(out, "sweep", finish, {**meta, "complete": True})
    return table


def check_configs(scenario_file: str, base: dict, configs: list[dict], *,
                  names: list[str] | None = None, origin: str = "--grid/--zip") -> None:
    """Refuse the sweep (SpecError naming the configuration: `names`, else
    `sweep configuration FIELD=VALUE, ...`) when any configuration is one the scenario
    spec refuses: loaded, resolved into replicas (parallelism, memory fit) and a fleet,
    its workload generated (once per distinct workload), but not simulated. `origin`:
    the flag the configurations came from."""
    from sim.config.scenario import load_scenario
    from sim.engine.build import build_fleet, replica_configs
    from sim.engine.hostmem import check_host_memory
    from sim.workload.requests import generate

    workloads: dict[str, tuple] = {}
    for i, c in enumerate(configs):
        try:
            sc = load_scenario(scenario_file, {**base, **c}, origins={
                **dict.fromkeys(base, "--set"), **dict.fromkeys(c, origin)})
            replicas = replica_configs(sc)
            wkey = repr((sc.workload, sc.seed, sc.file, sc.base_dir))
            check_host_memory(sc)  # before its workload is drawn
            if wkey not in workloads:
                wl = generate(sc.workload, np.random.default_rng(sc.seed), file=sc.file or None,
                              path="workload", base_dir=Path(sc.base_dir) if sc.base_dir else None)
                workloads[wkey] = (wl.acceptance, wl.block_tokens if wl.prefix_hashes is not None else None)
            acceptance, prefix_tokens = workloads[wkey]
            build_fleet(sc, replicas, np.random.default_rng(sc.seed), acceptance=acceptance,
                        prefix_tokens=prefix_tokens)
        except SpecError as e:
            if e.file.startswith(origin + " "):  # the error names its override already
                raise
            name = names[i] if names else f"sweep configuration {describe(c)}"
            raise SpecError(name, "", str(e)) from None


def describe(config: dict) -> str:
    """`field=value, ...` as on the command line (values as YAML writes them)."""
    return ", ".join(f"{k}={v if isinstance(v, str) else json.dumps(v)}" for k, v in config.items())


def results_table(configs: list[dict], keys: list[str], rows: dict[str, dict]) -> pd.DataFrame:
    """One row per configuration, in configuration order: key, swept fields, metrics."""
    recs = [{"config_key": k, **c, **rows[k]} for k, c in zip(keys, configs, strict=True)]
    return pd.DataFrame.from_records(recs)


def write_table(table: pd.DataFrame, stem: Path) -> None:
    """`stem`.csv always, `stem`.parquet when pyarrow is installed (into a fresh folder)."""
    table.to_csv(stem.with_suffix(".csv"), index=False)
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        return
    table.astype({c: str for c in table.columns if table[c].dtype == object}).to_parquet(
        stem.with_suffix(".parquet"), index=False)


def _bar(total: int, initial: int):
    from tqdm import tqdm

    return tqdm(total=total, initial=initial, unit="run", desc="sweep", leave=False)  # on stderr


def iter_values(items: Iterable[str], where: str) -> list[tuple[str, list]]:
    return [parse_axis(t, where) for t in items or []]
