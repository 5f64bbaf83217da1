"""Loaders: what they remember lasts only while the files they read are unchanged, and an
unusable name (too long for the file system, a NUL byte) is a one-line SpecError."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from sim.costmodel.models import load_model
from sim.costmodel.profiles import PROFILES_DIR, load_profile
from sim.costmodel.runtime import load_runtime
from sim.io.filecache import FileCache
from sim.io.specload import ROOT, SpecError
from sim.workload import traces

LONG = "a" * 300  # over NAME_MAX (255) of common file systems
ODD = [LONG, LONG + ".yaml", "a\0b", "a\0b.yaml", f"{LONG}/{LONG}.yaml"]


def copy_profile(tmp_path: Path, name: str = "h100-sxm") -> Path:
    return Path(shutil.copytree(PROFILES_DIR / name, tmp_path / name))


# ---- caches follow the files ------------------------------------------------------------


def test_an_unchanged_profile_folder_is_loaded_once(tmp_path):
    folder = copy_profile(tmp_path)
    assert load_profile(str(folder)) is load_profile(str(folder))


def test_editing_profile_yaml_in_one_process_reloads_it(tmp_path):
    folder = copy_profile(tmp_path)
    assert load_profile(str(folder)).facts.memory_gib == 79.2
    yaml_file = folder / "profile.yaml"
    yaml_file.write_text(yaml_file.read_text().replace("memory_gib: 79.2", "memory_gib: 9.25"))
    assert load_profile(str(folder)).facts.memory_gib == 9.25


def test_a_table_removed_or_added_after_loading_is_seen_at_the_next_load(tmp_path):
    folder = copy_profile(tmp_path, "a100-80gb")  # its GEMMs are its own (the H100's derived)
    gemm = folder / "gemm.csv"
    measured = load_profile(str(folder)).rows["gemm"]
    assert measured > 0
    saved = gemm.read_text()
    gemm.unlink()
    assert load_profile(str(folder)).rows["gemm"] == 0
    gemm.write_text(saved)
    assert load_profile(str(folder)).rows["gemm"] == measured
    gemm.write_text(saved.rsplit("\n", 2)[0] + "\n")  # last row dropped, in place
    assert load_profile(str(folder)).rows["gemm"] == measured - 1


def test_editing_the_all_reduce_table_reloads_the_profile(tmp_path):
    folder = copy_profile(tmp_path, "a100-80gb")
    table = folder / "all_reduce_a100_dgx.csv"
    assert load_profile(str(folder)).comm is not None
    table.unlink()
    with pytest.raises(SpecError, match="all_reduce_table: file not found"):
        load_profile(str(folder))


def test_editing_a_model_file_in_one_process_reloads_it(tmp_path):
    p = tmp_path / "tiny.yaml"
    shutil.copy(ROOT / "models" / "tiny-llama.yaml", p)
    text = p.read_text().replace("name: tiny-llama", "name: tiny")
    p.write_text(text)
    first = load_model(str(p))
    assert load_model(str(p)) is first
    p.write_text(text.replace(f"layers: {first.layers}", f"layers: {first.layers + 10}"))
    assert load_model(str(p)).layers == first.layers + 10


def test_editing_a_runtime_file_in_one_process_reloads_it(tmp_path):
    p = tmp_path / "rt.yaml"
    p.write_text("name: rt\nhost_ms_per_step: 1.0\n")
    first = load_runtime(str(p))
    assert load_runtime(str(p)) is first
    p.write_text("name: rt\nhost_ms_per_step: 2.5\n")
    assert load_runtime(str(p)).host_ms_per_step == 2.5


def test_a_scenario_file_is_parsed_once_and_overrides_never_reach_the_cache(tmp_path):
    from sim.config.scenario import load_scenario

    p = tmp_path / "s.yaml"
    shutil.copy(ROOT / "scenarios" / "quickstart.yaml", p)
    assert load_scenario(p, {"scheduler.max_num_seqs": 7}).scheduler.max_num_seqs == 7
    assert load_scenario(p).scheduler.max_num_seqs == 256  # the file's, not the last override's
    p.write_text(p.read_text().replace("max_num_seqs: 256", "max_num_seqs: 64"))
    assert load_scenario(p).scheduler.max_num_seqs == 64


def test_a_rewritten_length_file_replaces_its_cached_columns(tmp_path):
    src = tmp_path / "lengths.csv"
    seen = []
    for n in (3, 30, 300):
        src.write_text("prompt,output\n" + f"{n},{n + 1}\n" * n)
        col = traces.length_column(src.resolve(), "prompt", "s.yaml", "workload.lengths")
        assert list(col) == [n] * n
        seen.append(len(traces._CACHE))
    assert seen[0] == seen[1] == seen[2]  # one entry per (what, path), not one per version


def test_file_cache_reloads_a_deleted_file_and_drops_a_stale_entry_that_fails(tmp_path):
    cache: FileCache[str] = FileCache()
    p = tmp_path / "x.txt"
    p.write_text("one")

    def read(watch):
        return watch(p).read_text()
    assert cache.get("x", read) == "one" and len(cache) == 1
    p.unlink()
    with pytest.raises(FileNotFoundError):
        cache.get("x", read)
    assert len(cache) == 0
    p.write_text("two")
    assert cache.get("x", read) == "two"


def test_file_cache_notices_a_file_that_appears(tmp_path):
    cache: FileCache[bool] = FileCache()
    ghost = tmp_path / "x"
    calls = []

    def make(watch):
        calls.append(1)
        return watch(ghost).exists()
    assert cache.get("k", make) is False
    assert cache.get("k", make) is False
    assert len(calls) == 1  # an absent file, still absent: remembered
    ghost.write_text("here")
    assert cache.get("k", make) is True  # it appeared: made again
    assert len(calls) == 2


# ---- odd names are one-line errors ------------------------------------------------------


@pytest.mark.parametrize("name", ODD, ids=["long", "long.yaml", "nul", "nul.yaml", "long-dirs"])
def test_odd_runtime_names_are_spec_errors(name, tmp_path):
    with pytest.raises(SpecError, match=r"s\.yaml: runtime: (unknown|file not found)"):
        load_runtime(name, file="s.yaml", base_dir=tmp_path)


@pytest.mark.parametrize("name", ODD, ids=["long", "long.yaml", "nul", "nul.yaml", "long-dirs"])
def test_odd_gpu_names_are_spec_errors(name, tmp_path):
    with pytest.raises(SpecError, match=r"s\.yaml: gpu: unknown"):
        load_profile(name, file=tmp_path / "s.yaml")


@pytest.mark.parametrize("name", ODD, ids=["long", "long.yaml", "nul", "nul.yaml", "long-dirs"])
def test_odd_model_names_are_spec_errors(name, tmp_path):
    with pytest.raises(SpecError, match=r"s\.yaml: model: (unknown|model file not found)"):
        load_model(name, file=tmp_path / "s.yaml")


def test_runtime_name_is_a_name_not_a_path():
    with pytest.raises(SpecError, match="unknown '../h200-sxm/profile'"):
        load_runtime("../h200-sxm/profile")


@pytest.mark.parametrize("args", [
    ["run", "scenarios/quickstart.yaml", "--set", f"gpu={LONG}"],
    ["run", "scenarios/quickstart.yaml", "--set", f"runtime={LONG}"],
    ["run", "scenarios/quickstart.yaml", "--set", f"runtime={LONG}.yaml"],
    ["run", "scenarios/quickstart.yaml", "--out", f"/tmp/{LONG}"],
    ["fit-log", f"{LONG}.csv", "--model", "llama-3-8b", "--gpu", "h200-sxm",
     "--base-runtime", "vllm", "--out", "unused.yaml"],
], ids=["gpu", "runtime", "runtime.yaml", "out", "fit-log"])
def test_a_name_too_long_on_the_command_line_is_one_line_exit_2(args, tmp_path, llmsim):
    r = llmsim(*args)
    assert r.returncode == 2, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert r.stderr.startswith("llmsim: error: ") and "Traceback" not in r.stderr
