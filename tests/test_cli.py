"""The command line: outputs as named, and bad input as one clear line with exit status 2."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parent.parent
QUICK = (ROOT / "scenarios" / "quickstart.yaml").read_text()


def test_run_writes_the_contracted_files_and_columns(tmp_path, llmsim):
    out = tmp_path / "run"
    r = llmsim("run", str(ROOT / "scenarios" / "quickstart.yaml"), "--out", str(out),
               "--set", "workload.num_requests=200", "--plots")
    assert r.returncode == 0, r.stderr
    req = pd.read_csv(out / "requests.csv")
    for col in ["id", "arrival_s", "prompt_tokens", "output_tokens", "first_token_s", "finish_s",
                "ttft_s", "tpot_s", "e2e_s", "queue_s", "preemptions"]:
        assert col in req.columns
    steps = pd.read_csv(out / "steps.csv")
    for col in ["t_start", "t_end", "kind", "num_seqs", "num_tokens", "kv_blocks_used"]:
        assert col in steps.columns
    s = json.loads((out / "summary.json").read_text())
    assert s["requests"]["total"] == 200 == len(req)
    for metric in ("ttft_s", "tpot_s", "itl_s", "e2e_s"):
        assert set(s[metric]) >= {"p50", "p90", "p99"}
    assert abs(sum(s["lookup_provenance"].values()) - 1) < 1e-9
    assert s["goodput"]["requests_per_s"] <= s["request_throughput"]
    assert (out / "latency_cdf.png").stat().st_size > 10_000
    assert (out / "timeline.png").stat().st_size > 10_000
    assert "TTFT p50" in r.stdout


def test_compare_prints_one_column_per_scenario(llmsim):
    r = llmsim("compare", "scenarios/quickstart.yaml", "scenarios/quickstart.yaml",
               "--set", "workload.num_requests=50")
    assert r.returncode == 0, r.stderr
    header = r.stdout.splitlines()[0]
    assert header.count("quickstart") == 2


def test_sweep_prints_one_row_per_value(tmp_path, llmsim):
    r = llmsim("sweep", "scenarios/quickstart.yaml", "--field", "workload.arrival.rate",
               "--values", "1,4", "--set", "workload.num_requests=50", "--out", str(tmp_path / "s"))
    assert r.returncode == 0, r.stderr
    rates = pd.read_csv(tmp_path / "s" / "results.csv")["workload.arrival.rate"].tolist()
    assert rates == [1, 4] and "workload.arrival.rate" in r.stdout


BAD = {
    "unknown key": (QUICK.replace("seed: 1", "seed: 1\nbogus: 3"), "bogus: unknown key"),
    "wrong type": (QUICK.replace("seed: 1", "seed: one"), "seed: expected an integer"),
    "unknown model": (QUICK.replace("model: llama-3-8b", "model: llama-9b"), "model: unknown 'llama-9b' (known:"),
    "unknown gpu": (QUICK.replace("gpu: h200-sxm", "gpu: h10"), "gpu: unknown 'h10' (known: a100-80gb"),
    "negative rate": (QUICK.replace("rate: 2.5", "rate: -2"), "workload.arrival.rate: -2.0 is out of range"),
    "model too big": (QUICK.replace("model: llama-3-8b", "model: llama-3-70b"), "model: does not fit: weights 131.4 GiB"),
    "missing length file": (QUICK.replace("data/traces/sharegpt_lengths.csv", "nope.csv"),
                            "workload.lengths.path: file not found"),
    "missing trace": ("workload:\n  trace: {path: gone.csv}\n", "workload.trace.path: file not found"),
    "malformed trace": ("workload:\n  trace: {path: bad.csv}\n", "bad.csv: line 3: prompt_tokens"),
    "malformed yaml": ("workload: [1, 2\n", "malformed YAML"),
    "bad policy": (QUICK.replace("scheduler:", "scheduler:\n  policy: greedy", 1),
                   "scheduler.policy: unknown 'greedy' (allowed: continuous, static, chunked)"),
    "chunked (the default) on contiguous kv": (
        QUICK.replace("manager: paged", "manager: contiguous"),
        "scheduler.policy: 'chunked' (the default) needs kv.manager: paged"),
    "paged kernel on contiguous kv": (QUICK.replace("manager: paged", "manager: contiguous")
                                      .replace("scheduler:", "scheduler:\n  policy: continuous", 1),
                                      "attention.decode: 'paged' needs kv.manager: paged"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_gets_one_line_exit_2_and_no_output(tmp_path, case, llmsim):
    text, expected = BAD[case]
    (tmp_path / "bad.csv").write_text("arrival_s,prompt_tokens,output_tokens\n0,10,5\n1,abc,5\n")
    f = tmp_path / "s.yaml"
    f.write_text(text)
    out = tmp_path / "out"
    r = llmsim("run", str(f), "--out", str(out), cwd=tmp_path)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert expected in lines[0]
    assert "Traceback" not in r.stderr
    assert not out.exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out")]


def test_bad_override_names_the_field(llmsim):
    r = llmsim("run", "scenarios/quickstart.yaml", "--set", "kv.block_size=0", "--out", "/nonexistent/x")
    assert r.returncode == 2
    assert "kv.block_size: 0 is out of range (allowed: > 0)" in r.stderr


USAGE_ERRORS = {
    "unknown flag": (["run", "--bogus"], "unrecognized arguments: --bogus"),
    "unknown top-level flag": (["--bogus", "run"], "unrecognized arguments: --bogus"),
    "no command": ([], "the following arguments are required: cmd"),
    "unknown command": (["bogus"], "invalid choice: 'bogus'"),
    "missing value": (["run", "--set"], "run: argument --set: expected one argument"),
    "missing required positional": (["sweep"], "sweep: the following arguments are required: scenario"),
    "missing positional": (["compare"], "compare: the following arguments are required: scenarios"),
    "bad choice in an added parser": (["calibrate", "--out", "x", "--device", "tpu"],
                                      "calibrate: argument --device: invalid choice: 'tpu'"),
}


@pytest.mark.parametrize("case", sorted(USAGE_ERRORS))
def test_usage_error_is_one_line_exit_2(case, capsys):
    from sim.cli.main import main

    argv, expected = USAGE_ERRORS[case]
    with pytest.raises(SystemExit) as e:
        main(argv)
    out, err = capsys.readouterr()
    assert e.value.code == 2 and out == ""
    assert err.endswith("\n") and len(err.splitlines()) == 1, err
    assert err.startswith("llmsim: error: ") and expected in err


def test_parsers_added_later_to_the_subcommands_also_fail_in_one_line(capsys):
    import argparse

    from sim.cli.main import build_parser

    ap = build_parser()
    sub = next(a for a in ap._actions if isinstance(a, argparse._SubParsersAction))
    extra = sub.add_parser("extra")  # as another module's add_parsers(sub) would
    extra.add_argument("--n", type=int, required=True)
    with pytest.raises(SystemExit) as e:
        ap.parse_args(["extra", "--n", "x"])
    err = capsys.readouterr().err
    assert e.value.code == 2
    assert err == "llmsim: error: extra: argument --n: invalid int value: 'x'\n"


def test_help_still_prints_the_usage_and_exits_0(capsys):
    from sim.cli.main import main

    for argv in (["--help"], ["run", "--help"], ["calibrate", "--help"]):
        with pytest.raises(SystemExit) as e:
            main(argv)
        out, err = capsys.readouterr()
        assert e.value.code == 0 and err == ""
        assert out.startswith("usage: llmsim") and "options:" in out
