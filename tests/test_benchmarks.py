"""Every script in benchmarks/ runs at its smallest setting, so none can rot: each as a
user runs it (`python benchmarks/FOLDER/SCRIPT.py ...` in a child process, from a folder
that is not the checkout), and each prints what it is for. The device check has its own
CPU dry run end to end (tests/test_device_check.py). The whole file takes ~30 s alone."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS = ROOT / "benchmarks"

# script -> its smallest setting (arguments; "{tmp}" is the test's temporary folder)
SMOKE = {
    "speed/engine_speed.py": ["--repeat", "1", "--duration-s", "20"],
    "speed/run_speed.py": ["--repeat", "1", "--scenario", str(ROOT / "scenarios" / "quickstart.yaml")],
    "speed/fleet_speed.py": ["--replicas", "2", "--hours", "0.005", "--write", "{tmp}/fleet"],
    "speed/autoscale_day_speed.py": ["--hours", "0.01", "--period-hours", "0.01", "--rate", "2"],
    "speed/day_plan_speed.py": ["--hours", "0.02", "--rate", "2", "--gpus", "l40s", "--policies", "schedule",
                                "--workers", "1"],
    "speed/overload.py": ["--requests", "2000"],
    "speed/plan_speed.py": ["--plan", "{tmp}/plan.yaml", "--workers", "1"],
    "speed/plan_reuse.py": ["--plan", "{tmp}/plan.yaml", "--workers", "1"],
    "speed/sweep_speed.py": ["--configs", "4", "--requests", "20", "--no-ray"],
    "speed/host_memory.py": ["--smoke"],
    "speed/moe_speed.py": ["--requests", "40", "--repeat", "1"],
    "speed/probe_stop.py": ["--plan", "{tmp}/plan.yaml"],
    "speed/cold_pricing.py": ["--repeat", "1", "--scenario", str(ROOT / "scenarios" / "quickstart.yaml")],
    "readme/readme_results.py": ["--only", "memory-refusal,warm-grid-fit"],
    "fidelity/published_check.py": [],
    "fidelity/accuracy.py": ["--folds", "2"],
    "fidelity/interval_coverage.py": ["--check"],
    "fidelity/live_check.py": ["--seeds", "1"],
    "fidelity/scenario_digests.py": ["--only", "quickstart", "--out", "{tmp}/digests.txt"],
}
ELSEWHERE = {"fidelity/device_check.py": "tests/test_device_check.py: a CPU dry run end to end"}

# A plan of one candidate (one GPU, one TP degree, one policy) and one seed
TINY_PLAN = f"""name: tiny
scenario: {ROOT / "scenarios" / "quickstart.yaml"}
target_rate: 2
slo: {{ttft_p99_s: 1.0, tpot_p99_s: 0.06}}
search: {{seeds: 1, requests: 20}}
candidates: {{gpu: [h200-sxm], tensor: [1], policy: [continuous]}}
"""


def scripts() -> set[str]:
    """Every benchmark that runs as a script (a module of helpers has no __main__)."""
    return {p.relative_to(BENCHMARKS).as_posix() for p in BENCHMARKS.rglob("*.py")
            if 'if __name__ == "__main__":' in p.read_text(encoding="utf-8")}


def bench(script: str, tmp_path: Path, *extra: str) -> subprocess.CompletedProcess:
    args = [a.replace("{tmp}", str(tmp_path)) for a in [*SMOKE[script], *extra]]
    return subprocess.run([sys.executable, str(BENCHMARKS / script), *args], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)


def ok(script: str, tmp_path: Path, *extra: str) -> str:
    r = bench(script, tmp_path, *extra)
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout


def test_every_benchmark_script_has_a_smallest_setting_run_here_or_elsewhere():
    assert scripts() == set(SMOKE) | set(ELSEWHERE)
    assert not set(SMOKE) & set(ELSEWHERE)


def test_the_benchmarks_live_in_their_three_folders():
    folders = {p.parent.relative_to(BENCHMARKS).as_posix() for p in BENCHMARKS.rglob("*.py")}
    assert folders == {"speed", "readme", "fidelity"}


def test_engine_speed_times_each_runtime_on_the_same_requests(tmp_path):
    out = ok("speed/engine_speed.py", tmp_path)
    rows = [ln.split() for ln in out.splitlines()[1:]]
    assert [r[0] for r in rows] == ["h200-eager-reference", "h200-eager-live", "cuda-graph"]
    assert len({r[1] for r in rows}) == 1 and int(rows[0][1]) > 0  # the same requests
    assert all(int(r[2]) > 0 for r in rows)  # iterations
    assert all(float(r[-3]) > 0 and float(r[-2]) > 0 for r in rows)  # iter/cpu-s, peak MiB
    assert all(0 < int(r[-1]) < int(r[2]) for r in rows)  # leaping: fewer events than steps


def test_run_speed_times_the_run_and_its_phases(tmp_path):
    out = ok("speed/run_speed.py", tmp_path)
    n = yaml.safe_load((ROOT / "scenarios" / "quickstart.yaml").read_text())["workload"]["num_requests"]
    for cache in ("cold", "warm"):
        assert re.search(rf"^llmsim run quickstart\.yaml .*\(step-time cache {cache}\): .*s wall, "
                         r".*s CPU \(median of 1", out, re.M), out
    assert "phases (CPU s): python start" in out and f"({n:,} requests" in out, out
    assert re.search(r"iterations, [\d,]+ iterations/s\)", out), out


def test_cold_pricing_counts_the_shapes_a_first_run_prices(tmp_path):
    out = ok("speed/cold_pricing.py", tmp_path)
    m = re.search(r"^quickstart\.yaml: ([\d,]+) shapes priced by a first run \(([\d,]+) decode.*"
                  r"CPU \d+ ms cold, \d+ ms warm \(median of 1\): -?[\d.]+ µs per shape$", out, re.M)
    assert m, out
    assert int(m[1].replace(",", "")) > int(m[2].replace(",", "")) > 0


def test_fleet_speed_runs_the_fleet_and_writes_its_tables(tmp_path):
    out = ok("speed/fleet_speed.py", tmp_path)
    m = re.search(r"^2 replicas, router round_robin: ([\d,]+) requests", out, re.M)
    assert m, out
    rows = (tmp_path / "fleet" / "requests.csv").read_text().strip().splitlines()
    assert len(rows) - 1 == int(m.group(1).replace(",", ""))  # header + one row a request
    assert (tmp_path / "fleet" / "summary.json").is_file() and "writing tables:" in out


def test_fleet_speed_runs_a_slice_of_the_day_on_workers_and_extrapolates(tmp_path):
    out = ok("speed/fleet_speed.py", tmp_path, "--day", "--replicas", "4", "--hours", "0.002",
             "--workers", "2")
    assert re.search(r"^4 replicas, router round_robin: [\d,]+ requests", out, re.M), out
    assert "on 2 processes (process)" in out and re.search(r"workers: +1 x \([\d.]+\) s cpu", out)
    assert re.search(r"a day \(25\.0 M requests, x\d+\): +[\d.]+ min wall", out), out
    # what a day pays once (the imports) is added once, not scaled with the requests
    assert re.search(r"fixed costs: +imports [\d.]+ s: [\d.]+ s wall.*not scaled", out), out
    assert re.search(r"fixed costs once \+ \d+ x the run\), [\d,]+ M iterations, [\d,]+ GB "
                     r"spilled", out), out
    assert re.search(r"spill folder: +[\d,]+ MiB on disk", out), out


def test_autoscale_day_speed_runs_a_short_autoscaled_day(tmp_path):
    out = ok("speed/autoscale_day_speed.py", tmp_path)
    assert re.search(r"^0.01 h at mean 2 req/s, up to 8 replicas: [\d,]+ requests", out, re.M), out
    assert "GPU-hours" in out and "SLO attainment" in out


def test_day_plan_speed_plans_a_short_day(tmp_path):
    out = ok("speed/day_plan_speed.py", tmp_path)
    assert re.search(r"^day plan \(screened\): 0.02 h day at mean 2 req/s, GPUs l40s: [12] fleets simulated "
                     r"whole \([\d,]+ requests\), [01] screened", out, re.M), out
    assert "lower bound" in out and "recommended:" in out


def test_overload_rejects_the_prompts_over_the_context_window(tmp_path):
    out = ok("speed/overload.py", tmp_path)
    n, rejected, iterations = (int(x) for x in out.splitlines()[1].split()[:3])
    # prompts uniform in 100..10,000; the window 8,192 holds prompt + 50 output tokens:
    # 18.3-18.8 % over it (which depends on the bound), sd 0.9 % at 2,000 requests
    assert n == 2000 and iterations > 0
    assert 0.15 < rejected / n < 0.22, out


def test_plan_speed_times_a_one_candidate_plan(tmp_path):
    (tmp_path / "plan.yaml").write_text(TINY_PLAN)
    out = ok("speed/plan_speed.py", tmp_path)
    assert "1 candidates (0 skipped)" in out, out
    assert "recommended h200-sxm tp1 continuous" in out, out


def test_plan_reuse_gives_the_exhaustive_answer_with_no_more_runs(tmp_path):
    (tmp_path / "plan.yaml").write_text(TINY_PLAN.replace("seeds: 1", "seeds: 2"))
    out = ok("speed/plan_reuse.py", tmp_path)
    runs = [int(x) for x in re.findall(r"; (\d+) probe runs", out)]
    assert len(runs) == 2 and runs[1] <= runs[0], out  # before (every seed), after (lazy)
    assert "same recommendation: True" in out and "sustained rates moved: none" in out, out


def test_probe_stop_finds_the_same_rates_and_verdicts_both_ways(tmp_path):
    (tmp_path / "plan.yaml").write_text(TINY_PLAN)
    out = ok("speed/probe_stop.py", tmp_path)
    assert re.search(r"^h200-sxm 1 continuous: rate \S+ \(same: True\), \d+ runs", out, re.M), out
    assert out.rstrip().endswith("every answer and verdict the same: True"), out


def test_sweep_speed_gets_the_same_rows_from_each_executor(tmp_path):
    out = ok("speed/sweep_speed.py", tmp_path)
    assert out.startswith("4 configurations") and "rows identical across executors: True" in out
    assert re.search(r"^  sequential .* speed-up 1\.00x$", out, re.M) and "  process " in out, out


def test_readme_results_prints_the_blocks_asked_for(tmp_path):
    out = ok("readme/readme_results.py", tmp_path)
    assert "### Accuracy (results:warm-grid-fit)" in out
    assert "### Tensor parallelism, memory feasibility, FP8 (results:memory-refusal)" in out
    assert "llmsim: error: s.yaml" in out  # the refusal, quoted as README shows it


def test_published_check_costs_every_published_row(tmp_path):
    out = ok("fidelity/published_check.py", tmp_path)
    with (ROOT / "data" / "published" / "published_measurements.csv").open() as f:
        rows = sum(1 for ln in f if ln.strip() and not ln.startswith("#")) - 1
    summary = [ln.split() for ln in out.splitlines() if re.match(r"^(bf16|fp8)\s+\d+\s", ln)]
    assert sum(int(r[1]) for r in summary) == rows, out


def test_accuracy_prints_every_dataset_and_the_intervals_coverage(tmp_path):
    out = ok("fidelity/accuracy.py", tmp_path)
    for dataset in ("published", "live-heldout", "live-load", "grid-heldout", "published-ratios",
                    "all datasets"):
        assert dataset in out
    assert "published-ratios, row by row" in out and "trtllm-405b-min-latency" in out
    assert "90 % interval ±" in out and "coverage" in out


def test_interval_coverage_checks_every_calibration_dataset_on_rows_it_did_not_size_on(tmp_path):
    out = ok("fidelity/interval_coverage.py", tmp_path)  # --check: exit 0 only if every claim holds
    for cls in ("measured", "derived", "extrapolated", "analytic"):
        assert cls in out
    for dataset in ("published", "live-heldout", "grid-heldout"):
        assert re.search(rf"^{dataset} +held out \(other parts\) +\d+ +[\d.]+% +(9\d|100)\.\d%", out, re.M), out
    assert re.search(r"^live-load +check only", out, re.M)


def test_live_check_prints_its_four_tables(tmp_path):
    out = ok("fidelity/live_check.py", tmp_path)
    for heading in ("## Step time on the live log (in-sample)", "## Replay of the live log",
                    "## Cross-validation (ranges over seeds 0-0)", "## Sensitivity"):
        assert heading in out


def test_scenario_digests_checks_only_the_scenarios_it_ran(tmp_path):
    ok("fidelity/scenario_digests.py", tmp_path)
    lines = (tmp_path / "digests.txt").read_text().splitlines()
    assert [ln.split()[:2] for ln in lines] == [["quickstart", f] for f in
                                                ("requests.csv", "steps.csv", "summary.json")]
    assert all(re.fullmatch(r"[0-9a-f]{64}", ln.split()[2]) for ln in lines)
    # another scenario's line is not checked; a changed digest is
    changed = [*lines[:2], lines[2][:-1] + ("0" if lines[2][-1] != "0" else "1"), "batching x y"]
    (tmp_path / "want.txt").write_text("\n".join(changed) + "\n")
    r = bench("fidelity/scenario_digests.py", tmp_path, "--check", str(tmp_path / "want.txt"))
    assert r.returncode == 1 and r.stdout.strip().endswith("2 lines differ"), r.stdout
