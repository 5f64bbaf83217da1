"""Output and input contract of fit-log, validate --replay and calibrate (found by the QA
harness): a user's file or folder is never written into, bad flags and logs are one line."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
STEPS = ROOT / "data" / "live" / "cb_r16_steps.csv"
REQS = ROOT / "data" / "live" / "cb_r16_requests.csv"
FIT = ["fit-log", str(STEPS), "--requests", str(REQS), "--model", "llama-3.2-1b", "--gpu", "h200-sxm",
       "--base-runtime", "vllm", "--out"]
REPLAY = ["validate", "b.yaml", "--replay", str(STEPS), str(REQS), "--out"]


@pytest.mark.parametrize("out", ["user.txt", ".", "userdir", "user.txt/rt.yaml", "/proc/rt.yaml"])
def test_fit_log_out_that_is_a_users_file_or_not_writable_is_refused_before_fitting(user_cwd, refused, out):
    refused(FIT + [out], user_cwd)


@pytest.mark.parametrize("out", [".", "userdir", "user.txt", "user.txt/v", "/proc/v"])
def test_validate_replay_out_that_is_a_users_folder_or_file_is_refused(user_cwd, refused, out):
    refused(REPLAY + [out], user_cwd)


def test_fit_log_of_a_log_without_rows_is_a_one_line_error(user_cwd, refused):
    (user_cwd / "s.csv").write_text("t_start,t_end,kind,num_seqs,num_tokens,sum_ctx,free_blocks\n")
    argv = ["fit-log", "s.csv", "--model", "llama-3.2-1b", "--gpu", "h200-sxm", "--base-runtime", "vllm"]
    refused(argv + ["--out", "rt.yaml"], user_cwd)


@pytest.mark.parametrize("flag", [["--budget-s", "nan"], ["--budget-s", "-1"], ["--threads", "0"]])
def test_calibrate_numeric_flags_out_of_range_are_one_line(user_cwd, refused, flag):
    refused(["calibrate", "--out", "p", *flag], user_cwd)


def test_calibrate_refuses_a_users_folder_before_measuring(user_cwd, refused):
    pytest.importorskip("torch")
    refused(["calibrate", "--out", "userdir", "--device", "cpu", "--quick"], user_cwd)


def test_fit_log_with_a_non_finite_cell_is_a_one_line_error(user_cwd, refused):
    text = STEPS.read_text().splitlines()
    cells = text[2].split(",")
    cells[1] = "inf"
    (user_cwd / "s.csv").write_text("\n".join([text[0], text[1], ",".join(cells)] + text[3:]) + "\n")
    argv = ["fit-log", "s.csv", "--model", "llama-3.2-1b", "--gpu", "h200-sxm", "--base-runtime", "vllm"]
    refused(argv + ["--out", "rt.yaml"], user_cwd)


def test_calibrate_refuses_a_shipped_profile_it_did_not_measure(tmp_path, refused, monkeypatch):
    import shutil

    pytest.importorskip("torch")
    shipped = tmp_path / "h200-sxm"
    shutil.copytree(ROOT / "gpu_profiles" / "h200-sxm", shipped)
    monkeypatch.chdir(tmp_path)
    refused(["calibrate", "--out", str(shipped), "--device", "cpu", "--quick"], tmp_path)


@pytest.mark.parametrize("log, column, value, message", [
    ("steps", "num_seqs", "2.5", "num_seqs is not a whole number"),
    ("steps", "sum_ctx", "-100", "sum_ctx is not a whole number"),
    ("requests", "prompt_tokens", "-3", "prompt_tokens < 1"),
    ("requests", "finish_s", "0.0", "finish_s before first_token_s"),
])
def test_fit_log_with_an_impossible_count_or_time_is_a_one_line_error(user_cwd, refused, log, column,
                                                                       value, message):
    source = STEPS if log == "steps" else REQS
    lines = source.read_text().splitlines()
    header = lines[0].split(",")
    row = lines[2].split(",")
    row[header.index(column)] = value
    bad = user_cwd / f"bad_{log}.csv"
    bad.write_text("\n".join([lines[0], lines[1], ",".join(row), *lines[3:]]) + "\n")
    steps, reqs = (bad, REQS) if log == "steps" else (STEPS, bad)
    argv = ["fit-log", str(steps), "--requests", str(reqs), "--model", "llama-3.2-1b", "--gpu",
            "h200-sxm", "--base-runtime", "vllm", "--out", "rt.yaml"]
    assert message in refused(argv, user_cwd)


@pytest.mark.parametrize(("flag", "value"), [("--model", "llama-3-8x"), ("--gpu", "h10"),
                                             ("--base-runtime", "vlm")])
def test_fit_log_unknown_name_names_the_flag_not_a_file(user_cwd, refused, flag, value):
    argv = [value if prev == flag else a for prev, a in zip([None, *FIT[:-1]], FIT, strict=True)]
    err = refused(argv + ["rt.yaml"], user_cwd)
    assert err.startswith(f"llmsim: error: {flag}: unknown '{value}' (known: "), err
