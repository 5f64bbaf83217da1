"""The step-time cache on disk (sim/costmodel/stepcache.py): a warm run gives the bytes a
cold one gives, and an edited profile, model, runtime or cost-model code is never served
from an older file."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest

from sim.config.scenario import load_scenario
from sim.costmodel import stepcache
from sim.costmodel.latency import StepLatency
from sim.costmodel.models import load_model
from sim.costmodel.profiles import PROFILES_DIR, load_profile
from sim.costmodel.runtime import load_runtime
from sim.engine.runner import prepare, run
from sim.io.specload import ROOT

# 60 requests of mixed lengths on a copied A100 profile (its GEMM table its own): prefill, decode and mixed shapes
SCENARIO = """name: cache
seed: 3
gpu: {gpu}
workload:
  num_requests: 60
  arrival: {{kind: poisson, rate: 20}}
  prompt: {{kind: uniform, low: 50, high: 900}}
  output: {{kind: uniform, low: 5, high: 120}}
"""


def scenario(tmp_path: Path) -> tuple[Path, Path]:
    """(scenario file, its copied GPU profile folder)."""
    folder = Path(shutil.copytree(PROFILES_DIR / "a100-80gb", tmp_path / "a100-80gb"))
    path = tmp_path / "s.yaml"
    path.write_text(SCENARIO.format(gpu=folder))
    return path, folder


def outputs(out) -> tuple:
    """What a run writes: requests.csv and steps.csv, and its summary less its wall-clock
    fields."""
    folder = Path(tempfile.mkdtemp())
    try:
        out.write_files(folder, plots=False)
        tables = tuple((folder / f).read_bytes() for f in ("requests.csv", "steps.csv"))
    finally:
        shutil.rmtree(folder)
    s = {k: v for k, v in out.summary.items() if not k.endswith("wall_s")}
    return (*tables, json.dumps(s, sort_keys=True))


def memo_file(cache: Path) -> Path:
    files = list(cache.glob("*.npz"))
    assert len(files) == 1, files
    return files[0]


def test_a_warm_run_gives_the_same_results_as_a_cold_one(tmp_path):
    path, _ = scenario(tmp_path)
    cache = tmp_path / "cache"
    cold = run(load_scenario(path))  # no cache at all
    first = run(load_scenario(path), step_cache=cache)
    f = memo_file(cache)
    stored = f.stat().st_mtime_ns
    second = run(load_scenario(path), step_cache=cache)
    assert outputs(first) == outputs(cold) == outputs(second)
    assert f.stat().st_mtime_ns >= stored  # read (and marked used), nothing new to write


def test_a_warm_memo_holds_the_cold_lookups_bit_for_bit(tmp_path):
    path, _ = scenario(tmp_path)
    cache = tmp_path / "cache"
    run(load_scenario(path), step_cache=cache)
    cfg_lat = _latency(path)
    warmed = stepcache.warm(cache, [cfg_lat])
    assert warmed.entries and len(cfg_lat._memo) > 100
    fresh = _latency(path)
    fresh._memo.clear()
    for key in cfg_lat._memo:  # every stored step recomputed cold
        kind, *args = key
        if kind == "decode":
            n, ctx_q, max_q = args
            fresh.decode(n, ctx_q * n, max_q)  # sums that quantise back to the key
        elif kind == "dense":
            fresh.dense_ms(*args)
        elif kind == "lm":
            fresh.lm_head_ms(*args)
        elif kind == "pa":
            fresh.prefill_attn_ms(*args)
    checked = 0
    for key, e in fresh._memo.items():
        stored = cfg_lat._memo[key]
        assert stored[0] == e[0] and stored[1] == e[1] and stored[3:] == e[3:], key
        checked += 1
    assert checked > 100


def _latency(path: Path) -> StepLatency:
    """A fresh latency model of the scenario's replica, as a run builds it."""
    return prepare(load_scenario(path))[0][0].latency


def test_an_edited_profile_table_is_never_served_from_the_old_cache(tmp_path):
    path, folder = scenario(tmp_path)
    cache = tmp_path / "cache"
    before = run(load_scenario(path), step_cache=cache)
    old = memo_file(cache).name
    gemm = folder / "gemm.csv"  # every GEMM measured 10 % slower
    lines = gemm.read_text().splitlines()
    head = lines[0].split(",")
    ms = head.index("ms")
    rows = [line.split(",") for line in lines[1:]]
    for r in rows:
        r[ms] = repr(float(r[ms]) * 1.1)
    gemm.write_text("\n".join([lines[0], *(",".join(r) for r in rows)]) + "\n")
    warm = run(load_scenario(path), step_cache=cache)
    cold = run(load_scenario(path))
    assert outputs(warm) == outputs(cold)
    assert outputs(warm) != outputs(before)  # the edit mattered
    assert {f.name for f in cache.glob("*.npz")} - {old}  # a new key beside the old file


def test_a_stale_file_under_the_new_key_would_be_caught_by_the_content_comparison(tmp_path):
    """The key covers the files' bytes: the same stamps' worth of change (same size) still
    changes it; and a profile whose file changed since it was read has no key at all."""
    path, folder = scenario(tmp_path)
    lat = _latency(path)
    key = stepcache.config_key(lat)
    assert key is not None and key == stepcache.config_key(_latency(path))
    yaml_file = folder / "profile.yaml"
    text = yaml_file.read_text()
    yaml_file.write_text(text.replace("memory_gib: 79.2", "memory_gib: 79.3"))  # same size
    assert stepcache.config_key(lat) is None  # read before the edit: not cached
    assert stepcache.config_key(_latency(path)) not in (None, key)


def test_the_key_covers_the_model_the_runtime_the_layout_and_the_code(tmp_path):
    path, _ = scenario(tmp_path)
    sc = load_scenario(path)
    model, profile, rt = load_model(sc.model), load_profile(sc.gpu), load_runtime(sc.runtime)
    base = StepLatency(model, profile, rt)
    keys = {
        stepcache.config_key(base),
        stepcache.config_key(StepLatency(load_model("llama-3.1-8b"), profile, rt)),
        stepcache.config_key(StepLatency(model, profile, load_runtime("vllm"))),
        stepcache.config_key(StepLatency(model, profile, rt, decode_impl="contiguous")),
        stepcache.config_key(StepLatency(model, profile, rt, tensor=2)),
        stepcache.config_key(base, code=b"other code"),
    }
    assert None not in keys and len(keys) == 6
    assert rt.name != "vllm"
    runtime = ROOT / "gpu_profiles" / "runtimes" / "vllm.yaml"  # one host cost edited
    copy = tmp_path / "vllm.yaml"
    copy.write_text(runtime.read_text().replace("host_ms_per_step: 1.2", "host_ms_per_step: 1.3"))
    edited = load_runtime(str(copy))
    assert edited.host_ms_per_step == 1.3
    assert stepcache.config_key(StepLatency(model, profile, edited)) not in keys


def test_a_deleted_or_damaged_cache_file_only_makes_the_run_cold(tmp_path):
    path, _ = scenario(tmp_path)
    cache = tmp_path / "cache"
    cold = outputs(run(load_scenario(path)))
    run(load_scenario(path), step_cache=cache)
    f = memo_file(cache)
    f.unlink()
    assert outputs(run(load_scenario(path), step_cache=cache)) == cold
    f.write_bytes(b"not an npz")
    assert outputs(run(load_scenario(path), step_cache=cache)) == cold
    with np.load(memo_file(cache)) as z:  # rewritten whole
        assert len(z["keys"]) > 100
    data = dict(np.load(f))
    data["key"] = np.frombuffer(b"0" * 64, np.uint8)  # another configuration's file
    with open(f, "wb") as fh:
        np.savez(fh, **data)
    assert outputs(run(load_scenario(path), step_cache=cache)) == cold


@pytest.mark.skipif(not hasattr(os, "getuid"), reason="POSIX ownership")
def test_a_folder_others_can_write_is_not_used(tmp_path):
    path, _ = scenario(tmp_path)
    cache = tmp_path / "shared"
    cache.mkdir()
    os.chmod(cache, 0o777)
    run(load_scenario(path), step_cache=cache)
    assert list(cache.iterdir()) == []
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    (tmp_path / "elsewhere").mkdir(mode=0o700)
    run(load_scenario(path), step_cache=link)
    assert list((tmp_path / "elsewhere").iterdir()) == []


def test_the_environment_names_or_turns_off_the_folder(monkeypatch, tmp_path):
    monkeypatch.setenv(stepcache.ENV, str(tmp_path / "c"))
    assert stepcache.default_folder() == tmp_path / "c"
    for off in ("off", "0", ""):
        monkeypatch.setenv(stepcache.ENV, off)
        assert stepcache.default_folder() is None
    monkeypatch.delenv(stepcache.ENV)
    assert stepcache.default_folder().name.startswith("llmsim-steptimes-")


def test_llmsim_run_writes_the_cache_outside_its_output_folder(tmp_path, llmsim):
    path, _ = scenario(tmp_path)
    cache = tmp_path / "cache"
    for out in ("a", "b"):
        r = llmsim("run", str(path), "--out", str(tmp_path / out), "--no-progress",
                   env={stepcache.ENV: str(cache)})
        assert r.returncode == 0, r.stderr
    assert len(list(cache.glob("*.npz"))) == 1
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == [
        ".llmsim-output.json", "requests.csv", "steps.csv", "summary.json"]
    for name in ("requests.csv", "steps.csv"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()


def test_the_oldest_files_are_removed_past_the_limit(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    for i in range(5):
        f = cache / f"{i:064x}.npz"
        f.write_bytes(b"")
        os.utime(f, ns=(i * 10**9, i * 10**9))
    monkeypatch.setattr(stepcache, "KEEP_FILES", 3)
    stepcache._trim(cache)
    assert sorted(p.name[-5:] for p in cache.iterdir()) == ["2.npz", "3.npz", "4.npz"]
    for i in (2, 3, 4):
        (cache / f"{i:064x}.npz").write_bytes(b"x" * 100)
        os.utime(cache / f"{i:064x}.npz", ns=(i * 10**9, i * 10**9))
    monkeypatch.setattr(stepcache, "KEEP_BYTES", 250)  # the two newest fit
    stepcache._trim(cache)
    assert sorted(p.name[-5:] for p in cache.iterdir()) == ["3.npz", "4.npz"]


def test_trimming_never_removes_files_it_did_not_name(tmp_path, monkeypatch):
    cache = tmp_path / "cache"  # e.g. LLMSIM_STEP_CACHE pointed at a user's own folder
    cache.mkdir(mode=0o700)
    mine = [cache / "weights.npz", cache / f"{0:063x}.npz", cache / f"{0:064x}.npz.bak"]
    for i, f in enumerate(mine):
        f.write_bytes(b"user")
        os.utime(f, ns=(i, i))
    for i in range(3):
        f = cache / f"{i + 1:064x}.npz"
        f.write_bytes(b"")
        os.utime(f, ns=((i + 10) * 10**9,) * 2)
    monkeypatch.setattr(stepcache, "KEEP_FILES", 1)
    stepcache._trim(cache)
    assert all(f.read_bytes() == b"user" for f in mine)
    assert sorted(p.name for p in cache.glob("0*.npz") if len(p.name) == 68) == [f"{3:064x}.npz"]
