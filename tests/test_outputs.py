"""Where llmsim writes: it never deletes what it did not write, checks --out before it
simulates, and replaces an earlier run atomically (also under Ctrl-C and SIGTERM)."""

from __future__ import annotations

import errno
import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sim.cli import main as cli
from sim.io.foldernames import safe_folder_name, unique_names
from sim.io.outputs import MANIFEST, TEMP_PREFIX, OutputError, check_out_dir, write_atomically
from tests.conftest import QUICK_YAML as B_YAML
from tests.conftest import tree

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def work(quick_scenario) -> Path:
    """A user's folder: the small scenario b.yaml and a file of theirs."""
    (quick_scenario.parent / "notes.txt").write_text("my work\n")
    return quick_scenario.parent


def temp_folders(root: Path) -> list[Path]:
    return [p for p in root.rglob(".llmsim-*") if p.name != MANIFEST]


def one_error_line(r: subprocess.CompletedProcess, start: str) -> str:
    assert r.returncode == 2, (r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(start), r.stderr
    return lines[0]


# --- never deleting the user's files ------------------------------------------------------

def test_out_dot_with_user_files_is_refused_and_deletes_nothing(work, llmsim):
    before = tree(work)
    r = llmsim("run", "b.yaml", "--out", ".", "--no-plots", cwd=work)
    one_error_line(r, "llmsim: error: --out: .: folder exists, is not empty and was not written")
    assert tree(work) == before


def test_out_parent_folder_is_refused_and_deletes_nothing(work, llmsim):
    inner = work / "project"
    inner.mkdir()
    (inner / "b.yaml").write_text(B_YAML)
    before = tree(work)
    r = llmsim("run", "b.yaml", "--out", "..", "--no-plots", cwd=inner)
    one_error_line(r, "llmsim: error: --out: ..: ")
    assert tree(work) == before


def test_out_folder_holding_user_files_is_refused(work, llmsim):
    (work / "mydir").mkdir()
    (work / "mydir" / "thesis.tex").write_text("chapter 1\n")
    before = tree(work)
    r = llmsim("run", "b.yaml", "--out", "mydir", "--no-plots", cwd=work)
    one_error_line(r, "llmsim: error: --out: mydir: ")
    assert tree(work) == before


def test_user_file_added_to_an_llmsim_folder_blocks_replacing_it(work, llmsim):
    assert llmsim("run", "b.yaml", "--out", "res", "--no-plots", cwd=work).returncode == 0
    (work / "res" / "analysis.ipynb").write_text("{}")
    r = llmsim("run", "b.yaml", "--out", "res", "--no-plots", cwd=work)
    assert "analysis.ipynb" in one_error_line(r, "llmsim: error: --out: res: ")
    assert (work / "res" / "analysis.ipynb").read_text() == "{}"


def test_a_folder_with_a_foreign_or_broken_manifest_is_not_llmsims(tmp_path):
    for text in ("not json", json.dumps({"tool": "other", "files": []}),
                 json.dumps({"tool": "llmsim", "files": "all"})):
        (tmp_path / MANIFEST).write_text(text)
        with pytest.raises(OutputError, match="not written by llmsim"):
            check_out_dir(tmp_path)


def test_rerun_into_an_llmsim_folder_replaces_it(work, llmsim):
    assert llmsim("run", "b.yaml", "--out", "res", "--plots", cwd=work).returncode == 0
    assert (work / "res" / "timeline.png").exists()
    first = json.loads((work / "res" / "summary.json").read_text())
    r = llmsim("run", "b.yaml", "--out", "res", "--no-plots", "--set", "seed=2", cwd=work)
    assert r.returncode == 0, r.stderr
    second = json.loads((work / "res" / "summary.json").read_text())
    assert (first["seed"], second["seed"]) == (1, 2)
    assert not (work / "res" / "timeline.png").exists()  # replaced, not merged
    assert temp_folders(work) == []


def test_existing_empty_folder_is_used_and_marked(work, llmsim):
    (work / "empty").mkdir()
    assert llmsim("run", "b.yaml", "--out", "empty", "--no-plots", cwd=work).returncode == 0
    manifest = json.loads((work / "empty" / MANIFEST).read_text())
    assert manifest["files"] == ["requests.csv", "steps.csv", "summary.json"]
    assert temp_folders(work) == []


def test_out_dot_in_an_empty_folder_writes_there(tmp_path, llmsim):
    (tmp_path / "scen").mkdir()
    (tmp_path / "scen" / "b.yaml").write_text(B_YAML)
    here = tmp_path / "here"
    here.mkdir()
    for _ in range(2):  # the second time it is an llmsim folder: replaced in place
        r = llmsim("run", "../scen/b.yaml", "--out", ".", "--no-plots", cwd=here)
        assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in here.iterdir()) == [MANIFEST, "requests.csv", "steps.csv",
                                                      "summary.json"]


def test_llmsim_folder_holding_the_current_folder_is_refused(work, llmsim):
    assert llmsim("compare", "b.yaml", "--out", "cmp", "--no-plots", cwd=work).returncode == 0
    r = llmsim("compare", "../../b.yaml", "--out", "..", "--no-plots", cwd=work / "cmp" / "base")
    assert "holds the current folder" in one_error_line(r, "llmsim: error: --out: ..: ")
    assert (work / "cmp" / "base" / "summary.json").exists()


def test_manifest_names_the_tool_command_scenario_and_every_file(work, llmsim):
    assert llmsim("run", "b.yaml", "--out", "res", "--plots", cwd=work).returncode == 0
    m = json.loads((work / "res" / MANIFEST).read_text())
    assert m["tool"] == "llmsim" and m["version"] and m["created"]
    assert m["command"] == "llmsim run b.yaml --out res --plots" and m["scenario"] == "base"
    on_disk = sorted(p.name for p in (work / "res").iterdir() if p.name != MANIFEST)
    assert m["files"] == on_disk == ["latency_cdf.png", "requests.csv", "steps.csv",
                                     "summary.json", "timeline.png"]


# --- scenario names and values become folder names, never paths -----------------------------

@pytest.mark.parametrize("name", ["VICTIM", "../../x", "''", "..", ".", "a/../../b"])
def test_scenario_name_stays_a_folder_under_runs(work, name, llmsim):
    victim = work / "abs" / "victim"
    name = name.replace("VICTIM", str(victim))  # name: /the/absolute/path/of/a/user/folder
    victim.mkdir(parents=True)
    (victim / "keep.txt").write_text("mine")
    (work / "runs" / "other").mkdir(parents=True)
    (work / "runs" / "other" / "keep.txt").write_text("mine too")
    sub = work / "deep" / "er"
    sub.mkdir(parents=True)
    (sub / "b.yaml").write_text(B_YAML)
    before = tree(work)
    r = llmsim("run", "b.yaml", "--no-plots", "--set", f"name={name}", cwd=sub)
    assert r.returncode == 0, r.stderr
    new = sorted(set(tree(work)) - set(before))
    assert new[0] == "deep/er/runs", new
    runs = {p.split("/")[3] for p in new[1:]}
    assert len(runs) == 1 and all(p.startswith(f"deep/er/runs/{min(runs)}/") for p in new[2:]), new
    assert all(tree(work)[p] == before[p] for p in before)


def test_known_safe_folder_names():
    assert safe_folder_name("/abs/path") == "abs_path"
    assert safe_folder_name("../../x") == "x"
    assert safe_folder_name("") == safe_folder_name("..") == "scenario"
    assert safe_folder_name(".hidden") == "hidden"
    assert safe_folder_name("rate=1.5") == "rate_1.5"
    assert unique_names(["base", "base", "Base", "other"]) == ["base", "base-2", "Base-3", "other"]


@given(st.text(max_size=300))
def test_a_safe_folder_name_is_one_plain_path_component(text):
    name = safe_folder_name(text)
    assert name and len(name) <= 100
    assert "/" not in name and "\\" not in name and "\x00" not in name
    assert ".." not in name and not name.startswith((".", "-"))
    assert Path(name).name == name and len(Path(name).parts) == 1


def test_compare_of_the_same_scenario_twice_writes_two_folders(work, llmsim):
    r = llmsim("compare", "b.yaml", "b.yaml", "--out", "cmp", "--no-plots",
               "--set", "workload.num_requests=5", cwd=work)
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in (work / "cmp").iterdir()) == [MANIFEST, "base", "base-2"]
    outer = json.loads((work / "cmp" / MANIFEST).read_text())
    assert outer["runs"] == {"base": "base", "base-2": "base"}
    for sub in ("base", "base-2"):
        assert json.loads((work / "cmp" / sub / "summary.json").read_text())["requests"]["total"] == 5


def test_sweep_values_cannot_write_outside_out(work, llmsim):
    before = tree(work)
    r = llmsim("sweep", "b.yaml", "--field", "name", "--values", "../../x,/abs,..", "--out", "sw",
               "--no-plots", "--set", "workload.num_requests=5", cwd=work)
    assert r.returncode == 0, r.stderr
    assert sorted(set(tree(work)) - set(before))[0] == "sw"
    assert all(p.startswith("sw") for p in set(tree(work)) - set(before))
    names = sorted(p.name for p in (work / "sw").iterdir())  # one table, no folder per value
    assert names == sorted([MANIFEST, "results.csv", "rows.jsonl"] + ["results.parquet"] * ("results.parquet" in names))


# --- output locations are checked before the simulation ------------------------------------

def _no_simulation(*args, **kwargs):
    raise AssertionError("the simulation started before --out was checked")


def _bad_locations(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "a_file").write_text("x")
    return {"an existing file": str(tmp_path / "a_file"),
            "a path under a file": str(tmp_path / "a_file" / "sub"),
            "/proc": "/proc/llmsim-out",
            "a folder of the user's": str(tmp_path)}


@pytest.mark.parametrize("command", ["run", "compare", "sweep"])
@pytest.mark.parametrize("where", ["an existing file", "a path under a file", "/proc",
                                   "a folder of the user's"])
def test_bad_out_is_refused_before_the_simulation(tmp_path, monkeypatch, capsys, command, where):
    monkeypatch.setattr("sim.engine.runner.run", _no_simulation)
    (tmp_path / "b.yaml").write_text(B_YAML)
    out = _bad_locations(tmp_path)[where]
    before = tree(tmp_path)
    argv = {"run": ["run", str(tmp_path / "b.yaml")],
            "compare": ["compare", str(tmp_path / "b.yaml")],
            "sweep": ["sweep", str(tmp_path / "b.yaml"), "--field", "seed", "--values", "1,2"]}
    assert cli.main([*argv[command], "--out", out, "--no-plots"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"llmsim: error: --out: {out}: "), err
    assert tree(tmp_path) == before


def test_unwritable_folder_is_refused(tmp_path):
    if os.geteuid() == 0:
        pytest.skip("root writes through permission bits (the read-only mount test covers it)")
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    with pytest.raises(OutputError, match="permission denied"):
        check_out_dir(locked / "run")


@pytest.fixture
def mount_tmpfs(tmp_path):
    """Mount a small tmpfs (needs root and mount rights: skipped honestly otherwise)."""
    mounted: list[Path] = []

    def mount(options: str) -> Path:
        point = tmp_path / f"mnt{len(mounted)}"
        point.mkdir()
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(point)],
                           capture_output=True, text=True)
        if r.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
        mounted.append(point)
        return point

    yield mount
    for point in mounted:
        subprocess.run(["umount", str(point)], check=True)


def test_read_only_file_system_is_refused_before_the_simulation(mount_tmpfs, monkeypatch, capsys,
                                                                 tmp_path):
    monkeypatch.setattr("sim.engine.runner.run", _no_simulation)
    ro = mount_tmpfs("size=1m,ro")
    (tmp_path / "b.yaml").write_text(B_YAML)
    assert cli.main(["run", str(tmp_path / "b.yaml"), "--out", str(ro / "res")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"llmsim: error: --out: {ro / 'res'}: cannot write in {ro} (read-only file system)"


def test_full_disk_is_one_line_and_keeps_the_earlier_results(mount_tmpfs, work, llmsim):
    disk = mount_tmpfs("size=64k")
    (disk / "res").mkdir()
    assert llmsim("run", "b.yaml", "--out", str(disk / "res"), "--no-plots",
                  "--set", "workload.num_requests=5", cwd=work).returncode == 0
    before = tree(disk)
    r = llmsim("run", "b.yaml", "--out", str(disk / "res"), "--no-plots",
               "--set", "workload.num_requests=3000", cwd=work)  # steps.csv alone is > 64 KiB
    line = one_error_line(r, f"llmsim: error: --out: {disk / 'res'}: could not write")
    assert "no space left" in line
    assert tree(disk) == before and temp_folders(disk) == []


# --- atomic replacing, interrupts, permissions ----------------------------------------------

def _write_files(text: str):
    def writer(folder: Path) -> None:
        (folder / "result.txt").write_text(text)
    return writer


def test_interrupt_while_writing_keeps_old_results_and_no_temp_folder(tmp_path):
    dest = tmp_path / "res"
    write_atomically(dest, _write_files("old"), {})
    for failure in (KeyboardInterrupt(), OSError(errno.ENOSPC, "No space left on device")):
        def writer(folder: Path, failure=failure) -> None:
            (folder / "result.txt").write_text("half")
            raise failure

        with pytest.raises((KeyboardInterrupt, OutputError)) as caught:
            write_atomically(dest, writer, {})
        if isinstance(failure, OSError):
            assert str(caught.value) == f"--out: {dest}: could not write: no space left on the device"
        assert (dest / "result.txt").read_text() == "old"
        assert temp_folders(tmp_path) == []


def test_signal_during_the_swap_is_held_until_the_new_results_are_in(tmp_path, monkeypatch):
    dest = tmp_path / "res"
    write_atomically(dest, _write_files("old"), {})
    real_rename = os.rename
    sent = []

    def rename_then_interrupt(a, b):
        real_rename(a, b)
        if not sent:  # Ctrl-C right after the old folder was moved aside
            sent.append(True)
            os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(os, "rename", rename_then_interrupt)
    with pytest.raises(KeyboardInterrupt):
        write_atomically(dest, _write_files("new"), {})
    assert sent and (dest / "result.txt").read_text() == "new"
    assert temp_folders(tmp_path) == []


def test_output_folders_get_normal_permissions(work, llmsim):
    old = os.umask(0o022)
    try:
        assert llmsim("run", "b.yaml", "--out", "res", "--no-plots", cwd=work).returncode == 0
        assert llmsim("compare", "b.yaml", "--out", "cmp", "--no-plots", cwd=work).returncode == 0
    finally:
        os.umask(old)
    for folder in (work / "res", work / "cmp", work / "cmp" / "base"):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o755, folder
    assert stat.S_IMODE((work / "res" / "summary.json").stat().st_mode) == 0o644


def test_sigterm_stops_a_run_with_one_line_and_no_temp_folder(work):
    (work / "res").mkdir()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "sim", "run", "b.yaml", "--out", "res", "--no-plots",
         "--set", "workload.num_requests=3000000", "--set", "workload.arrival.rate=1000"],
        cwd=work, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(6)  # imported, checked --out, simulating
    assert proc.poll() is None, proc.communicate()
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode != 0
    assert err.strip().splitlines() == ["llmsim: interrupted"], err
    assert list((work / "res").iterdir()) == [] and temp_folders(work) == []


def test_calibrate_refuses_a_file_as_its_out_before_measuring(tmp_path, llmsim):
    pytest.importorskip("torch")
    (tmp_path / "profile").write_text("x")
    r = llmsim("calibrate", "--quick", "--device", "cpu", "--out", "profile", cwd=tmp_path)
    one_error_line(r, "llmsim: error: --out: profile: exists and is not a folder")


def _small(folder: Path, name: str) -> None:
    (folder / name).write_text(name)


def test_replacing_a_run_keeps_what_a_file_browser_left_in_it(tmp_path):
    dest = tmp_path / "run"
    write_atomically(dest, lambda f: _small(f, "a.txt"), {"scenario": "x"})
    (dest / ".DS_Store").write_bytes(b"finder")
    write_atomically(dest, lambda f: _small(f, "b.txt"), {"scenario": "x"})
    assert (dest / ".DS_Store").read_bytes() == b"finder"
    assert (dest / "b.txt").exists() and not (dest / "a.txt").exists()


def test_writing_into_the_current_llmsim_folder_removes_only_its_listed_files(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write_atomically(".", lambda f: _small(f, "a.txt"), {"scenario": "x"})
    (tmp_path / "Thumbs.db").write_bytes(b"explorer")
    other_run = tmp_path / f"{TEMP_PREFIX}other"  # another llmsim's temp folder, still in use
    other_run.mkdir()
    (other_run / "partial.csv").write_text("x")
    write_atomically(".", lambda f: _small(f, "b.txt"), {"scenario": "x"})
    assert (tmp_path / "Thumbs.db").read_bytes() == b"explorer"
    assert (tmp_path / "b.txt").exists() and not (tmp_path / "a.txt").exists()
    assert (other_run / "partial.csv").read_text() == "x"


# --- what llmsim says when it writes --------------------------------------------------------

def test_replacing_an_llmsim_folder_of_another_kind_says_so_in_one_line(work, llmsim):
    first = llmsim("run", "b.yaml", "--out", "res", cwd=work)
    assert first.returncode == 0 and first.stderr == "", first.stderr
    again = llmsim("run", "b.yaml", "--out", "res", "--set", "seed=2", cwd=work)
    assert again.returncode == 0 and again.stderr == ""  # same kind: replaced without a word
    sweep = llmsim("sweep", "b.yaml", "--grid", "seed=1,2", "--executor", "sequential", "--out", "res",
                   cwd=work)
    assert sweep.returncode == 0, sweep.stderr
    assert sweep.stderr == "llmsim: replaced the run in res with a sweep\n"
    assert (work / "res" / "results.csv").is_file() and not (work / "res" / "summary.json").exists()
    cmp = llmsim("compare", "b.yaml", "--out", "res", cwd=work)
    assert cmp.returncode == 0 and cmp.stderr == "llmsim: replaced the sweep in res with a comparison\n"
    assert (work / "notes.txt").read_text() == "my work\n"


def test_run_and_compare_name_everything_they_wrote(work, llmsim):
    run = llmsim("run", "b.yaml", "--out", "res", "--trace-out", "t.json", cwd=work)
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines()[-1] == ("wrote res/ (requests.csv, steps.csv, summary.json; "
                                           "--plots adds the plots) and t.json")
    cmp = llmsim("compare", "b.yaml", "b.yaml", "--out", "cmp", cwd=work)
    assert cmp.returncode == 0, cmp.stderr
    assert cmp.stdout.splitlines()[-1] == "wrote cmp/ (base/, base-2/)"
    assert sorted(p.name for p in (work / "cmp").iterdir() if p.name != MANIFEST) == ["base", "base-2"]
