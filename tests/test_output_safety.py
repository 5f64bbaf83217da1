"""Output folders do not trust what they read: a manifest lists only files inside its
folder, a listed file is replaced only while it is exactly what llmsim wrote, and temp
folders of killed runs are cleaned by the next run in that parent (issue 18, item 1)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sim.cli.main import main
from sim.io.manifest import MANIFEST
from sim.io.outputs import write_atomically
from sim.io.tempdirs import STALE_AGE_S, TEMP_PREFIX, _temp_prefix

pytestmark = pytest.mark.xdist_group("test_output_safety")

ROOT = Path(__file__).resolve().parent.parent
QUICK = str(ROOT / "scenarios" / "quickstart.yaml")
RUN = ["--set", "workload.num_requests=10", "--no-progress"]


@pytest.fixture(scope="module")
def made_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("made") / "run"
    assert main(["run", QUICK, *RUN, "--out", str(out)]) == 0
    return out


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    """A user's folder: a file beside the llmsim folder, one above it, one in a subfolder."""
    (tmp_path / "secret.txt").write_text("the user's own\n")
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "notes.txt").write_text("notes\n")
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "thesis.tex").write_text("chapter 1\n")
    monkeypatch.chdir(tmp_path / "work")
    return tmp_path


def _user_files(home: Path) -> dict[str, bytes]:
    return {p.relative_to(home).as_posix(): p.read_bytes() for p in sorted(home.rglob("*"))
            if p.is_file() and not p.is_symlink() and "res" not in p.relative_to(home).parts}


def _plant(folder: Path, edit) -> None:
    m = json.loads((folder / MANIFEST).read_text())
    edit(m)
    (folder / MANIFEST).write_text(json.dumps(m))


def _one_line(capsys) -> str:
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    return err


ESCAPES = ["../secret.txt", "../../secret.txt", "/etc/hostname", "sub/../../secret.txt", "./summary.json",
           "", "a\\..\\..\\secret.txt", "summary.json/", MANIFEST, "bad\nname"]


@pytest.mark.parametrize("entry", ESCAPES)
@pytest.mark.parametrize("command", ["report", "run"])
def test_a_manifest_entry_outside_its_folder_is_refused_and_nothing_is_written(
        home, made_run, capsys, entry, command):
    res = home / "work" / "res"
    shutil.copytree(made_run, res)
    _plant(res, lambda m: m["files"].append(entry))
    before, inside = _user_files(home), sorted(p.name for p in res.iterdir())
    argv = ["report", "res"] if command == "report" else ["run", QUICK, *RUN, "--out", "res"]
    assert main(argv) == 2
    err = _one_line(capsys)
    assert f"{MANIFEST}: files[" in err and "not" in err, err
    assert _user_files(home) == before
    assert sorted(p.name for p in res.iterdir()) == inside


def test_report_in_place_never_writes_one_level_above_the_folder(home, made_run, capsys):
    res = home / "work" / "res"
    shutil.copytree(made_run, res)
    (home / "work" / "summary.json").write_text("the user's summary\n")  # ../summary.json
    _plant(res, lambda m: m["files"].append("../summary.json"))
    assert main(["report", "res"]) == 2
    assert (home / "work" / "summary.json").read_text() == "the user's summary\n"
    assert not (res / "report.html").exists()


def test_a_planted_manifest_listing_a_users_files_never_deletes_them(home, capsys):
    docs = home / "docs"
    (docs / MANIFEST).write_text(json.dumps({"tool": "llmsim", "kind": "run", "files": ["thesis.tex"]}))
    assert main(["run", QUICK, *RUN, "--out", str(docs)]) == 2
    err = _one_line(capsys)
    assert "thesis.tex" in err and "kept" in err
    assert (docs / "thesis.tex").read_text() == "chapter 1\n"


def test_a_planted_manifest_with_a_made_up_checksum_never_deletes_the_file(home, capsys):
    docs = home / "docs"
    (docs / MANIFEST).write_text(json.dumps({"tool": "llmsim", "kind": "run", "files": ["thesis.tex"],
                                             "written": {"thesis.tex": {"size": 10, "sha256": "0" * 64}}}))
    assert main(["run", QUICK, *RUN, "--out", str(docs)]) == 2
    assert "thesis.tex" in _one_line(capsys)
    assert (docs / "thesis.tex").read_text() == "chapter 1\n"


def test_a_listed_file_changed_since_llmsim_wrote_it_is_kept_and_reported(home, made_run, capsys):
    res = home / "work" / "res"
    shutil.copytree(made_run, res)
    mine = json.dumps({**json.loads((res / "summary.json").read_text()), "my": "annotations"})
    (res / "summary.json").write_text(mine)
    for argv in (["run", QUICK, *RUN, "--out", "res"], ["report", "res"]):
        assert main(argv) == 2
        err = _one_line(capsys)
        assert "summary.json" in err and "kept" in err, err
        assert (res / "summary.json").read_text() == mine


def test_a_listed_link_or_folder_is_never_followed_or_removed(home, made_run, capsys):
    res = home / "work" / "res"
    shutil.copytree(made_run, res)
    secret = (home / "secret.txt").read_bytes()
    os.remove(res / "summary.json")
    os.symlink(home / "secret.txt", res / "summary.json")  # a link where a listed file was
    _plant(res, lambda m: m["written"].update(
        {"summary.json": {"size": len(secret), "sha256": hashlib.sha256(secret).hexdigest()}}))
    assert main(["run", QUICK, *RUN, "--out", "res"]) == 2
    assert "summary.json" in _one_line(capsys)
    assert (home / "secret.txt").read_bytes() == secret and (res / "summary.json").is_symlink()

    shutil.rmtree(res)
    shutil.copytree(made_run, res)
    os.symlink(home / "docs", res / "linked")  # a listed path through a link to the user's folder
    _plant(res, lambda m: m["files"].append("linked/thesis.tex"))
    assert main(["run", QUICK, *RUN, "--out", "res"]) == 2
    assert "files[" in _one_line(capsys)
    assert (home / "docs" / "thesis.tex").read_text() == "chapter 1\n"

    shutil.rmtree(res)
    shutil.copytree(made_run, res)
    (res / "sub").mkdir()
    (res / "sub" / "mine.txt").write_text("mine\n")
    _plant(res, lambda m: m["files"].append("sub"))  # a manifest listing a folder
    assert main(["run", QUICK, *RUN, "--out", "res"]) == 2
    _one_line(capsys)
    assert (res / "sub" / "mine.txt").read_text() == "mine\n"


@pytest.mark.parametrize("text", ["not json {", "[]", '{"tool": "llmsim", "files": [1]}'])
def test_a_manifest_that_is_not_llmsims_leaves_the_folder_alone(home, capsys, text):
    docs = home / "docs"
    (docs / MANIFEST).write_text(text)
    assert main(["run", QUICK, *RUN, "--out", str(docs)]) == 2
    assert "not written by llmsim" in _one_line(capsys)
    assert main(["report", str(docs)]) == 2
    _one_line(capsys)
    assert (docs / "thesis.tex").read_text() == "chapter 1\n"


def test_the_manifest_records_the_size_and_sha256_of_every_file_written(made_run):
    m = json.loads((made_run / MANIFEST).read_text())
    assert set(m["written"]) == set(m["files"]) and m["files"]
    for name, rec in m["written"].items():
        data = (made_run / name).read_bytes()
        assert rec == {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def test_rerun_and_report_still_replace_a_folder_llmsim_wrote(home, made_run, capsys):
    res = home / "work" / "res"
    shutil.copytree(made_run, res)
    assert main(["report", "res"]) == 0
    assert main(["report", "res"]) == 0
    assert main(["run", QUICK, *RUN, "--out", "res", "--set", "seed=3"]) == 0
    assert json.loads((res / "summary.json").read_text())["seed"] == 3
    assert not (res / "report.html").exists()


# --- temp folders of killed runs --------------------------------------------------------

def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def _temp(parent: Path, prefix: str) -> Path:
    t = parent / f"{prefix}xyz"
    (t / "deep").mkdir(parents=True)
    (t / "deep" / "requests.csv").write_text("half of it")
    return t


def test_temp_folders_of_dead_runs_are_removed_by_the_next_run_in_that_parent(home, capsys):
    work = home / "work"
    dead = _temp(work, _temp_prefix(TEMP_PREFIX).replace(str(os.getpid()), str(_dead_pid())))
    alive = _temp(work, _temp_prefix(TEMP_PREFIX).replace(str(os.getpid()), str(os.getppid())))
    old = _temp(work, TEMP_PREFIX + "legacy")  # no pid in its name: by its age
    os.utime(old, (time.time() - STALE_AGE_S - 60,) * 2)
    young = _temp(work, TEMP_PREFIX + "recent")
    os.symlink(home / "docs", work / f"{TEMP_PREFIX}1@00000000-link")  # never followed
    assert main(["run", QUICK, *RUN, "--out", "res"]) == 0
    assert "removed 2 temp folder(s)" in capsys.readouterr().err
    assert not dead.exists() and not old.exists()
    assert alive.exists() and young.exists()  # a live run's, and one too young to judge
    assert (home / "docs" / "thesis.tex").read_text() == "chapter 1\n"


def test_a_run_killed_while_writing_leaves_a_temp_folder_the_next_run_removes(home, capsys):
    code = ("import time, sys; from sim.io.outputs import write_atomically;"
            "write_atomically(sys.argv[1], lambda f: ((f / 'a.csv').write_text('x'), time.sleep(60)), {})")
    p = subprocess.Popen([sys.executable, "-c", code, str(home / "work" / "killed")],
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    deadline = time.monotonic() + 60
    while not list((home / "work").glob(f"{TEMP_PREFIX}*/a.csv")):
        assert time.monotonic() < deadline and p.poll() is None
        time.sleep(0.05)
    p.send_signal(signal.SIGKILL)
    p.wait()
    assert list((home / "work").glob(f"{TEMP_PREFIX}*"))  # what the killed run left
    write_atomically(home / "work" / "next", lambda f: (f / "b.csv").write_text("y"), {})
    assert not list((home / "work").glob(".llmsim-*"))
    assert not (home / "work" / "killed").exists()


def test_a_report_never_pulls_a_linked_file_into_its_page(home, made_run, capsys):
    import base64

    res = home / "work" / "res"
    shutil.copytree(made_run, res)
    (home / "key.png").write_bytes(b"PRIVATE KEY MATERIAL")
    os.symlink(home / "key.png", res / "leak.png")
    assert main(["report", "res", "--out", "page"]) == 0
    page = (home / "work" / "page" / "report.html").read_text()
    assert base64.b64encode(b"PRIVATE KEY MATERIAL").decode() not in page
    capsys.readouterr()
    os.remove(res / "summary.json")
    os.symlink(home / "secret.txt", res / "summary.json")
    assert main(["report", "res", "--out", "page2"]) == 2
    assert "summary.json: is a link" in _one_line(capsys)
