"""The calibration harness on the CPU: calibrate -> profile -> simulate -> validate.

The tiny model (models/tiny-llama.yaml) keeps the whole path to well under a minute.
Tests that need PyTorch skip where it is not installed; the missing-PyTorch message
is tested without it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from sim.io.specload import ROOT

pytestmark = pytest.mark.xdist_group("test_calibrate")

FIXTURES = Path(__file__).parent / "fixtures" / "calibrate"
TINY = FIXTURES / "tiny.yaml"
# Simulator vs the CPU reference engine on tiny.yaml (docs/calibration.md has the figures):
# on a shared 2-core VM the real engine's own run-to-run spread at p50 is 5-50 %, so
# request-level p50s are held to 50 % and throughput (arrival-bound here) to 10 %;
# typical errors are 5-30 %.
TOL_P50 = 0.50
TOL_THROUGHPUT = 0.10


@pytest.fixture(scope="module")
def profile(tmp_path_factory) -> Path:
    pytest.importorskip("torch")
    from sim.calibrate.calibrate import calibrate

    out = tmp_path_factory.mktemp("profiles") / "tiny-cpu"
    res = calibrate(["tiny-llama"], out, device="cpu", quick=True, progress=False)
    assert res.stopped == "" and res.measured == res.total
    return out


@pytest.fixture(scope="module")
def report(profile, tmp_path_factory) -> tuple[dict, Path]:
    from sim.calibrate.validate import validate

    out = tmp_path_factory.mktemp("validate") / "tiny"
    return validate(TINY, profile, out, device="cpu"), out


# ---- the profile --------------------------------------------------------------------------

@pytest.mark.slow
def test_calibrated_profile_loads_with_every_table_populated(profile):
    from sim.costmodel.profiles import TABLES, load_profile
    from sim.costmodel.runtime import RuntimeSpec
    from sim.io.specload import build, load_yaml

    p = load_profile(str(profile))
    assert p.name == "tiny-cpu" and p.facts.analytic is False
    assert all(p.rows[t] > 0 for t in TABLES), p.rows
    assert set(pd.read_csv(profile / "attn_decode.csv").impl) == {"contiguous", "paged_reference",
                                                                  "paged_gather"}
    assert set(pd.read_csv(profile / "elementwise.csv").op) == {
        "rmsnorm", "residual_add", "silu_mul", "rotary", "kv_write", "embedding"}
    assert len(pd.read_csv(profile / "sampling.csv")) > 0
    assert len(pd.read_csv(profile / "iter_grid_eager.csv")) > 0
    rt = build(RuntimeSpec, load_yaml(profile / "runtime-eager.yaml"))
    assert rt.gpu_scale > 0
    assert rt.elementwise == p.facts.elementwise_kernels == "unfused"  # the reference model's eager ops
    meta = json.loads((profile / "calibration.json").read_text())
    for key in ("device_name", "driver", "torch", "date", "command", "threads"):
        assert meta[key] not in (None, "")
    assert meta["stopped"] == "complete"
    assert set(meta["timing"]) == {"cpu clock"}  # on CUDA: "graph" (or "events" where a
    # point could not be captured)


@pytest.mark.slow
def test_kernel_times_grow_with_problem_size(profile):
    # the ends of each grid, where the work differs 8-1024x: small kernels on a CPU are
    # dominated by call overhead and timing noise (the profile's loader makes every table
    # monotone anyway), large ones by the work
    gemm = pd.read_csv(profile / "gemm.csv")
    for _, g in gemm.groupby(["K", "N"]):
        g = g.sort_values("M")
        assert g.ms.iloc[-1] > g.ms.iloc[0]
    dec = pd.read_csv(profile / "attn_decode.csv")
    uniform = dec[(dec.ctx == dec.max_ctx) & (dec.batch == dec.batch.max())]
    for _, g in uniform.groupby("impl"):
        g = g.sort_values("ctx")
        assert g.ms.iloc[-1] > g.ms.iloc[0]
    pre = pd.read_csv(profile / "attn_prefill.csv")
    for _, g in pre.groupby("impl"):
        g = g.sort_values("seq")
        assert g.ms.iloc[-1] > g.ms.iloc[0]


@pytest.mark.slow
def test_flash_memory_grows_linearly_and_naive_quadratically_in_sequence_length(profile):
    # per doubling of seq: flash's extra memory (output + log-sum-exp) doubles; naive's
    # (scores + probabilities, plus a linear part) tends to 4x as the s^2 term takes over
    pre = pd.read_csv(profile / "attn_prefill.csv")
    ratios = {}
    for impl in ("flash", "naive"):
        g = pre[pre.impl == impl].sort_values("seq")
        assert list(g.seq) == [64, 128, 256, 512]
        ratios[impl] = g.peak_mib.to_numpy()[1:] / g.peak_mib.to_numpy()[:-1]
    assert ratios["flash"] == pytest.approx([2, 2, 2], rel=0.1)
    assert np.all(np.diff(ratios["naive"]) > 0) and 3.5 < ratios["naive"][-1] <= 4.0


# ---- validation ----------------------------------------------------------------------------

def _outside_tolerance(r: dict) -> list[str]:
    m = {row["metric"]: row for row in r["metrics"]}
    bad = [f"{name}: {m[name]['error']:+.0%}" for name in ("TPOT p50 (ms)", "E2E p50 (ms)", "TTFT p50 (ms)")
           if abs(m[name]["error"]) >= TOL_P50]
    bad += [f"{name}: {m[name]['error']:+.0%}" for name in ("requests/s", "output tokens/s")
            if abs(m[name]["error"]) >= TOL_THROUGHPUT]
    if r["iterations"]["replayed"]["all"]["median_abs"] >= TOL_P50:
        bad.append(f"iterations: {r['iterations']['replayed']['all']['median_abs']:.0%}")
    return bad


@pytest.mark.slow
def test_simulator_tracks_the_cpu_reference_engine_within_the_stated_tolerance(report, tmp_path):
    # This machine's speed drifts by up to +-50 % over tens of seconds (the real engine's
    # own run-to-run spread above shows it), and calibration and replay happen at
    # different moments, so one trial can miss by chance. Up to three independent
    # calibrate -> validate trials: a systematic error fails all three.
    from sim.calibrate.calibrate import calibrate
    from sim.calibrate.validate import validate

    failures = [_outside_tolerance(report[0])]
    for trial in range(2):
        if not failures[-1]:
            break
        prof = tmp_path / f"p{trial}"
        calibrate(["tiny-llama"], prof, device="cpu", quick=True, progress=False)
        failures.append(_outside_tolerance(validate(TINY, prof, tmp_path / f"v{trial}", device="cpu")))
    assert not failures[-1], failures


@pytest.mark.slow
def test_validate_writes_the_report_and_both_real_runs_in_the_simulators_formats(report):
    from sim.engine.metrics import REQUEST_COLUMNS, STEP_COLUMNS

    r, out = report
    assert (out / "report.md").read_text().startswith("# Validation: tiny-validate")
    assert json.loads((out / "report.json").read_text())["requests"] == 40
    for run in ("real-1", "real-2", "sim"):
        req = pd.read_csv(out / run / "requests.csv")
        assert list(req.columns) == REQUEST_COLUMNS
        assert (req.status == "finished").all()
        assert list(pd.read_csv(out / run / "steps.csv").columns) == STEP_COLUMNS
        summary = json.loads((out / run / "summary.json").read_text())
        # a measured run has no modelled kernel time: not a number, not 0 %
        assert (summary["gpu_kernel_fraction"] is None) == run.startswith("real")
    metrics = [row["metric"] for row in r["metrics"]]
    assert {f"{k} p{p} (ms)" for k in ("TTFT", "TPOT", "ITL", "E2E") for p in (50, 90, 99)} \
        <= set(metrics)
    assert all(row["spread"] is not None and row["error"] is not None for row in r["metrics"])
    assert {"replayed", "matched", "real_spread_matched"} <= set(r["iterations"])


# ---- the reference engine follows the simulator's plans -------------------------------------

def _plans_match(sc_over: dict) -> None:
    pytest.importorskip("torch")
    import torch

    from sim.calibrate.device import Device
    from sim.calibrate.reference import Llama, ReferenceEngine
    from sim.calibrate.validate import simulate_with
    from sim.config.scenario import scenario_from_dict
    from sim.costmodel.models import load_model
    from sim.costmodel.runtime import RuntimeSpec
    from sim.workload.requests import Workload

    base = {"name": "plans", "model": "tiny-llama", "gpu": "h200-sxm",
            "attention": {"decode": "paged_reference"},  # the kernel the reference engine runs
            "workload": {"num_requests": 1, "arrival": {"kind": "constant", "rate": 1},
                         "prompt": {"kind": "fixed", "value": 8},
                         "output": {"kind": "fixed", "value": 2}}}
    sc = scenario_from_dict({**base, **sc_over})
    rng = np.random.default_rng(3)
    n = 12  # all at t = 0: the plan sequence then depends on the policy alone
    prompt, output = rng.integers(20, 90, n), rng.integers(5, 40, n)
    wl = Workload(np.zeros(n), prompt, output, np.full(n, int(output.max())))
    kv_tokens = sc.kv.num_blocks * sc.kv.block_size
    max_len = sc.kv.max_model_len or 2048  # tiny-llama's window
    dev = Device(torch.device("cpu"), torch.float32)
    real, _ = ReferenceEngine(sc, Llama(load_model("tiny-llama"), dev), kv_tokens, max_len).run(wl)
    sim, _ = simulate_with(sc, wl, ROOT / "gpu_profiles" / "h200-sxm", RuntimeSpec(name="k"),
                           kv_tokens, max_len)
    cols = ("kind", "num_seqs", "num_tokens", "kv_blocks_used")
    assert [tuple(getattr(real.steps, c)) for c in cols] == \
        [tuple(getattr(sim.steps, c)) for c in cols]
    assert [s.preemptions for s in real.seqs] == [s.preemptions for s in sim.seqs]
    assert [s.generated for s in real.seqs] == list(output)


def test_reference_engine_takes_the_simulators_steps_through_preemptions():
    _plans_match({"scheduler": {"policy": "continuous", "max_num_seqs": 8, "max_num_batched_tokens": 256},
                  "kv": {"num_blocks": 24, "block_size": 16, "max_model_len": 256}})  # small: forces recompute


def test_reference_engine_takes_the_simulators_steps_under_static_batching():
    _plans_match({"scheduler": {"policy": "static", "max_batch_size": 5, "max_wait_s": 0},
                  "kv": {"num_blocks": 200, "block_size": 16}})


# ---- kernels ---------------------------------------------------------------------------------

def test_paged_kernels_match_contiguous_attention_with_pages_in_random_order():
    torch = pytest.importorskip("torch")
    from sim.calibrate import ops

    g = torch.Generator().manual_seed(0)
    b, hq, hkv, d, block = 3, 8, 2, 32, 16
    lens = [5, 40, 33]
    nb = sum(-(-n // block) for n in lens)
    kc, vc = torch.randn(nb + 1, block, hkv, d, generator=g), torch.randn(nb + 1, block, hkv, d,
                                                                           generator=g)
    perm = (torch.randperm(nb, generator=g) + 1).tolist()
    tables, i = [], 0
    for n in lens:
        k = -(-n // block)
        tables.append(perm[i:i + k] + [0] * (3 - k))
        i += k
    bt, ctx = torch.tensor(tables), torch.tensor(lens, dtype=torch.int32)
    q = torch.randn(b, hq, d, generator=g)
    for impl in (ops.paged_torch, ops.paged_gather):
        out = impl(q, kc, vc, bt, ctx)
        for row, n in enumerate(lens):
            k = ops.gather_pages(kc, bt[row:row + 1])[:, :n].transpose(1, 2)
            v = ops.gather_pages(vc, bt[row:row + 1])[:, :n].transpose(1, 2)
            want = ops.decode_contiguous(q[row:row + 1, :, None], k, v)[0, :, 0]
            torch.testing.assert_close(out[row], want, rtol=1e-4, atol=1e-4)
    q4, k4, v4 = (torch.randn(1, h, 50, d, generator=g) for h in (hq, hkv, hkv))
    torch.testing.assert_close(ops.prefill_naive(q4, k4, v4), ops.prefill_flash(q4, k4, v4),
                               rtol=1e-4, atol=1e-4)


def test_triton_paged_kernel_passes_the_multi_shape_check_in_the_triton_interpreter():
    pytest.importorskip("torch")
    pytest.importorskip("triton")
    code = ("import torch; from sim.calibrate.triton_paged import check_paged_attention; "
            "print(check_paged_attention(torch.device('cpu'), torch.float32))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                       env={**os.environ, "TRITON_INTERPRET": "1"}, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert float(r.stdout.strip().splitlines()[-1]) < 1e-4


def test_cpu_peak_memory_counts_new_tensors_not_views():
    torch = pytest.importorskip("torch")
    from sim.calibrate.device import Device

    dev = Device(torch.device("cpu"), torch.float32)
    x = torch.randn(256, 256)
    assert dev.peak_bytes(lambda: x.view(-1).t()) == 0
    assert dev.peak_bytes(lambda: x + 1) == 256 * 256 * 4
    assert dev.peak_bytes(lambda: (x + 1).sum()) == 256 * 256 * 4 + 4


# ---- errors, budget, interruption -----------------------------------------------------------

def test_calibrate_without_pytorch_says_how_to_install_it_and_exits_2(tmp_path):
    code = ("import sys; sys.modules['torch'] = None; from sim.cli.main import main; "
            f"sys.exit(main(['calibrate', '--out', {str(tmp_path / 'p')!r}]))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 2
    assert r.stderr.strip() == ("llmsim: error: calibrate needs PyTorch: "
                                "pip install 'llmsim[calibrate]'")


def test_missing_cuda_device_is_one_line_and_exit_2(tmp_path, llmsim):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    r = llmsim("calibrate", "--models", "tiny-llama", "--device", "cuda", "--quick",
               "--out", str(tmp_path / "p"))
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("llmsim: error: --device cuda: ")


def _few_points(monkeypatch, extra):
    """Calibrate only a handful of GEMM points (plus `extra`), no iteration grid."""
    from sim.calibrate import bench, calibrate, itergrid

    real = bench.kernel_points

    def few(models, g):
        return [p for p in real(models, g) if p.table == "gemm"][:4] + extra
    monkeypatch.setattr(calibrate.bench, "kernel_points", few)
    monkeypatch.setattr(itergrid, "iteration_points", lambda models, g, resident: [])


def test_out_of_memory_shape_is_recorded_skipped_and_reported_with_exit_2(tmp_path, monkeypatch,
                                                                         capsys):
    pytest.importorskip("torch")
    from sim.calibrate.bench import Point
    from sim.cli.main import main

    def oom(dev):
        raise RuntimeError("CUDA out of memory. Tried to allocate 80.00 GiB")
    _few_points(monkeypatch, [Point("attn_prefill", 0, "naive prefill b=1 s=16384", oom)])
    out = tmp_path / "p"
    assert main(["calibrate", "--models", "tiny-llama", "--device", "cpu", "--quick",
                 "--no-progress", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"llmsim: error: 1 shapes ran out of memory and were skipped "
                   f"({out}/skipped.csv); the profile was written without them"]
    skipped = pd.read_csv(out / "skipped.csv")
    assert skipped.reason[0].startswith("out of memory: CUDA out of memory")
    assert len(pd.read_csv(out / "gemm.csv")) == 4
    assert json.loads((out / "calibration.json").read_text())["points"]["out_of_memory"] == 1


def test_shape_larger_than_free_memory_is_skipped_before_allocating():
    torch = pytest.importorskip("torch")
    from sim.calibrate.bench import gemm_point
    from sim.calibrate.device import Device, TooLarge

    dev = Device(torch.device("cpu"), torch.float32)
    with pytest.raises(TooLarge, match="needs"):
        gemm_point(1 << 22, 1 << 20, 1 << 20, 0).run(dev)


def test_interrupted_calibration_keeps_the_partial_profile_and_exits_130(tmp_path, monkeypatch):
    pytest.importorskip("torch")
    from sim.calibrate.bench import Point
    from sim.cli.main import main
    from sim.costmodel.profiles import load_profile

    def ctrl_c(dev):
        raise KeyboardInterrupt
    _few_points(monkeypatch, [Point("sampling", 1, "sample", ctrl_c)])  # after the GEMMs
    out = tmp_path / "part"
    assert main(["calibrate", "--models", "tiny-llama", "--device", "cpu", "--quick",
                 "--no-progress", "--out", str(out)]) == 130
    assert len(pd.read_csv(out / "gemm.csv")) == 4
    assert json.loads((out / "calibration.json").read_text())["stopped"] == "interrupted"
    assert load_profile(str(out)).facts.analytic == "partial"


def test_time_budget_measures_the_most_important_tables_first(tmp_path, monkeypatch):
    """A fake clock (1/16 s per point measured, nothing else takes time) makes the budget
    independent of the machine's load: 1 s is over after the 17th point, so the 15 coarse
    GEMMs and the first two decode attentions are measured and nothing later."""
    pytest.importorskip("torch")
    from dataclasses import replace
    from types import SimpleNamespace

    from sim.calibrate import bench
    from sim.calibrate import calibrate as module

    clock = [0.0]

    def timed(point: bench.Point) -> bench.Point:
        def run(dev):
            rows = point.run(dev)
            clock[0] += 1 / 16
            return rows
        return replace(point, run=run)

    ordered = module.ordered
    monkeypatch.setattr(module, "ordered", lambda points: [timed(p) for p in ordered(points)])
    monkeypatch.setattr(module, "time", SimpleNamespace(perf_counter=lambda: clock[0]))
    monkeypatch.setattr(bench, "ceilings", lambda dev, mib, n: {
        "mem_bw_tbs": 0.01, "peak_tflops": 0.1, "pcie_gbs": 5.0})
    res = module.calibrate(["tiny-llama"], tmp_path / "b", device="cpu", quick=True,
                           budget_s=1.0, progress=False)
    assert res.stopped == "budget" and res.measured + res.skipped == 17 < res.total
    assert res.skipped == 0 and clock[0] == 17 / 16
    assert set(res.rows) == {"gemm", "attn_decode"}, res.rows  # the most important first
    assert res.rows["gemm"] >= 15 and res.rows["attn_decode"] >= 2
    assert not (tmp_path / "b" / "iter_grid_eager.csv").exists()
    meta = json.loads((tmp_path / "b" / "calibration.json").read_text())
    assert meta["stopped"] == "budget"
    assert meta["points"] == {"measured": 17, "skipped": 0, "out_of_memory": 0,
                              "total": res.total}


@pytest.mark.parametrize("scenario", sorted(FIXTURES.glob("*.yaml")), ids=lambda p: p.stem)
def test_validation_scenarios_load_and_suit_the_reference_engine(scenario):
    from sim.config.scenario import load_scenario
    from sim.costmodel.models import load_model
    from sim.workload.requests import generate

    sc = load_scenario(scenario)
    assert sc.kv.num_blocks, "validation scenarios fix the KV capacity"
    pytest.importorskip("torch")
    from sim.calibrate.reference import check_supported

    check_supported(sc)
    wl = generate(sc.workload, np.random.default_rng(sc.seed), file=sc.file,
                  base_dir=sc.base_dir)
    assert len(wl) and wl.prompt_tokens.max() <= load_model(sc.model).max_len


def test_the_reference_engine_refuses_fused_elementwise_kernels():
    """It runs RMSNorm, SiLU*mul and adds as PyTorch ops: a scenario naming fused kernels
    would compare unlike with like."""
    pytest.importorskip("torch")
    from sim.calibrate.reference import check_supported
    from sim.config.scenario import load_scenario, replace_scenario
    from sim.io.specload import SpecError

    sc = load_scenario(sorted(FIXTURES.glob("*.yaml"))[0])
    check_supported(replace_scenario(sc, elementwise="unfused"))
    with pytest.raises(SpecError, match="elementwise: 'fused'"):
        check_supported(replace_scenario(sc, elementwise="fused"))


# ---- harness defects (issue 9, item 6) ---------------------------------------------------------

def test_pytorch_paged_kernel_passes_the_multi_shape_check_with_nan_in_unowned_pool_slots():
    torch = pytest.importorskip("torch")
    from sim.calibrate import ops
    from sim.calibrate.kernel_check import CASES, check_paged, make_case

    groups = {c.hq // c.hkv for c in CASES}
    assert {1, 4, 8} <= groups and {64, 128} <= {c.d for c in CASES}
    assert any(max(-(-n // c.block) for n in c.lens) > 64 for c in CASES)  # >1 block per split
    q, k, v, tables, lens = make_case(CASES[0], torch.device("cpu"), torch.float32)
    assert torch.isnan(k).any() and torch.isnan(v).any()  # the tails and block 0
    assert check_paged(ops.paged_torch, torch.device("cpu"), torch.float32) < 1e-4


def test_kernel_check_raises_a_one_line_error_naming_the_shape():
    torch = pytest.importorskip("torch")
    from sim.calibrate import ops
    from sim.calibrate.kernel_check import KernelMismatch, check_paged

    def off_by_a_little(*args):
        return ops.paged_torch(*args) + 1e-3

    with pytest.raises(KernelMismatch, match=r"differs .* by 0.001 \(allowed 0.0001\) on hq=8"
                       ) as e:
        check_paged(off_by_a_little, torch.device("cpu"), torch.float32)
    assert "\n" not in str(e.value)


def test_naive_prefill_budget_has_a_known_answer_and_covers_the_measured_peak():
    torch = pytest.importorskip("torch")
    from sim.calibrate import ops
    from sim.calibrate.bench import naive_prefill_scratch_bytes
    from sim.calibrate.device import Device

    # 1 x 8 heads x 256^2 scores: three fp32 copies (12 B), the bool mask, K and V repeated
    # from 2 to 8 heads in bf16
    assert naive_prefill_scratch_bytes(1, 8, 2, 256, 64, 2) == \
        12 * 8 * 256**2 + 256**2 + 2 * 8 * 256 * 64 * 2
    assert naive_prefill_scratch_bytes(1, 8, 8, 256, 64, 2) == 12 * 8 * 256**2 + 256**2
    for dtype, esize in ((torch.bfloat16, 2), (torch.float32, 4)):
        dev = Device(torch.device("cpu"), dtype)
        for hq, hkv in ((8, 2), (4, 4)):
            q, k, v = dev.randn(1, hq, 128, 32), dev.randn(1, hkv, 128, 32), dev.randn(1, hkv, 128, 32)
            out = q.numel() * esize  # the output, counted with the inputs by the caller
            peak = dev.peak_bytes(lambda q=q, k=k, v=v: ops.prefill_naive(q, k, v))
            budget = naive_prefill_scratch_bytes(1, hq, hkv, 128, 32, esize)
            assert peak - out <= budget <= 1.1 * peak, (dtype, hq, peak, budget)


def _iteration_then(point_after, resident, tmp_path):
    """Run one real iteration point (tiny-llama on the CPU), then `point_after`."""
    import torch

    from sim.calibrate.calibrate import Outcome, _measure
    from sim.calibrate.device import Device, quiet_gc
    from sim.calibrate.grids import GRIDS
    from sim.calibrate.itergrid import iteration_points
    from sim.calibrate.output import TableWriter
    from sim.costmodel.models import load_model

    g = GRIDS["quick"]
    dev = Device(torch.device("cpu"), torch.float32, warmup=1, repeats=3, max_s_per_point=0.01)
    pts = iteration_points([load_model("tiny-llama")], {**g, "iter_repeats": 3,
                                                        "iter_max_s": 0.01}, resident)
    w = TableWriter(tmp_path / "p")
    with quiet_gc():
        _measure([pts[0], point_after], dev, w, Outcome(tmp_path), 0.0, None, False, resident)
    w.close()
    return dev


def test_kernel_tables_after_iterations_run_without_the_reference_model_resident(tmp_path):
    pytest.importorskip("torch")
    import weakref

    from sim.calibrate.bench import Point
    from sim.calibrate.itergrid import Resident

    resident = Resident()
    seen: dict = {}

    def kernel_point(dev):
        seen["model"] = resident.model
        seen["alive"] = [r() is not None for r in seen["refs"]]
        return []

    real_get = Resident.get

    def get(self, *a):
        model, cache = real_get(self, *a)
        seen["refs"] = [weakref.ref(model.embed), weakref.ref(model.layers[0]["wqkv"]),
                        weakref.ref(cache.k), weakref.ref(cache.v)]
        return model, cache
    Resident.get = get
    try:
        _iteration_then(Point("gemm", 1, "after", kernel_point), resident, tmp_path)
    finally:
        Resident.get = real_get
    assert seen["model"] is None and seen["alive"] == [False] * 4


def test_out_of_memory_point_drops_its_tensors_before_the_cache_is_emptied(tmp_path):
    torch = pytest.importorskip("torch")
    import weakref

    from sim.calibrate.bench import Point
    from sim.calibrate.calibrate import Outcome, _measure
    from sim.calibrate.device import Device, quiet_gc
    from sim.calibrate.itergrid import Resident
    from sim.calibrate.output import TableWriter

    refs, alive_at_release = [], []

    class Holder:  # a reference cycle through the failing frame, as closures often make
        pass

    def oom(dev):
        big = torch.empty(1 << 20)
        h = Holder()
        h.me, h.big = h, big
        refs.append(weakref.ref(big))
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 4.00 MiB")

    dev = Device(torch.device("cpu"), torch.float32)
    dev.release = lambda: alive_at_release.append(refs[0]() is not None)
    w = TableWriter(tmp_path / "p")
    res = Outcome(tmp_path)
    with quiet_gc():  # as calibrate measures: the collector paused
        _measure([Point("gemm", 0, "too big", oom)], dev, w, res, 0.0, None, False, Resident())
    w.close()
    assert res.oom == 1 and alive_at_release == [False]


def test_eager_and_graph_decode_rows_both_sample(monkeypatch):
    torch = pytest.importorskip("torch")
    import contextlib

    from sim.calibrate import itergrid, ops
    from sim.calibrate.device import Device
    from sim.calibrate.reference import Llama, PagedCache
    from sim.costmodel.models import load_model

    class FakeStream:  # the CUDA graph API, run eagerly, so the captured step runs here
        def wait_stream(self, other):
            pass

    class FakeGraph:
        def replay(self):
            pass

    monkeypatch.setattr(torch.cuda, "Stream", lambda device=None: FakeStream())
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: FakeStream())
    monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "CUDAGraph", FakeGraph)
    monkeypatch.setattr(torch.cuda, "graph", lambda g: contextlib.nullcontext())
    calls = {"logits": 0, "sample": 0}
    real_logits, real_sample = itergrid.decode_logits, ops.sample

    def logits(*a, **k):
        calls["logits"] += 1
        return real_logits(*a, **k)

    def sample(*a, **k):
        calls["sample"] += 1
        return real_sample(*a, **k)
    monkeypatch.setattr(itergrid, "decode_logits", logits)
    monkeypatch.setattr(ops, "sample", sample)
    dev = Device(torch.device("cpu"), torch.float32)
    spec = load_model("tiny-llama")
    model, cache = Llama(spec, dev), PagedCache(spec, 8, 16, dev)
    itergrid.GraphDecode(model, cache, batch=2, width=2)  # 2 warm-ups + the capture
    assert calls == {"logits": 3, "sample": 3}
    point = itergrid.decode_point(spec, 2, 20, 128, 16, 0, (0.01, 3), itergrid.Resident())
    point.run(Device(torch.device("cpu"), torch.float32, warmup=1))
    assert calls["logits"] > 3 and calls["sample"] == calls["logits"]


def test_recalibrating_a_folder_in_one_process_reloads_its_tables(tmp_path, monkeypatch):
    pytest.importorskip("torch")
    from sim.calibrate.calibrate import calibrate
    from sim.costmodel.profiles import load_profile

    out = tmp_path / "again"
    _few_points(monkeypatch, [])
    calibrate(["tiny-llama"], out, device="cpu", quick=True, progress=False)
    assert load_profile(str(out)).rows["gemm"] == 4
    from sim.calibrate import bench
    few = bench.kernel_points
    monkeypatch.setattr(bench, "kernel_points", lambda models, g: few(models, g)[:2])
    calibrate(["tiny-llama"], out, device="cpu", quick=True, progress=False)
    assert load_profile(str(out)).rows["gemm"] == 2


@pytest.mark.slow
def test_host_terms_without_rows_of_their_kind_follow_the_stated_rule(profile):
    from sim.calibrate.output import _unmeasured_terms
    from sim.costmodel.runtime import RuntimeSpec
    from sim.io.specload import build, load_yaml

    fitted = RuntimeSpec(name="e", host_ms_per_prefill_seq_layer=0.02,
                         host_ms_per_verify_seq_layer=0.3)  # 0.3: what a search might leave
    eager, note = _unmeasured_terms(fitted, {"prefill", "decode"}, None)
    assert eager.host_ms_per_verify_seq_layer == 0.02 and "no verify rows" in note
    graphs, note = _unmeasured_terms(RuntimeSpec(name="g", host_ms_per_prefill_seq_layer=0.1,
                                                 host_ms_per_verify_seq_layer=0.1),
                                     {"decode"}, eager)
    assert graphs.host_ms_per_prefill_seq_layer == graphs.host_ms_per_verify_seq_layer == 0.02
    alone, note = _unmeasured_terms(graphs, {"decode"}, None)
    assert alone.host_ms_per_verify_seq_layer == 0 and "not fitted" in note
    rt = build(RuntimeSpec, load_yaml(profile / "runtime-eager.yaml"))
    assert rt.host_ms_per_verify_seq_layer == rt.host_ms_per_prefill_seq_layer
    assert "no verify rows" in rt.source


def test_kernel_warm_up_covers_every_specialisation_a_real_run_meets():
    torch = pytest.importorskip("torch")
    from sim.calibrate import splits, warmup
    from sim.calibrate.device import Device
    from sim.calibrate.reference import Llama, ReferenceEngine
    from sim.config.scenario import load_scenario
    from sim.costmodel.models import load_model
    from sim.workload.requests import generate

    # known answers: 132 SMs, 8 KV heads; batch 1 wants 66 splits (capped at 64)
    assert splits.split_plan(1, 8, 10, 132) == (10, 1)
    assert splits.split_plan(1, 8, 200, 132) == (50, 4)
    assert warmup.specialisation(1, 16, 8, 132) == (16, (False, True), (True, False),
                                                    (False, True))
    sc = load_scenario(TINY)
    wl = generate(sc.workload, np.random.default_rng(sc.seed), file=sc.file)
    dev = Device(torch.device("cpu"), torch.float32)
    engine = ReferenceEngine(sc, Llama(load_model(sc.model), dev), 4096, 2048)
    shapes, real_attn = [], engine.decode_attn

    def spy(q, kc, vc, tables, lens):
        shapes.append((q.shape[0], tables.shape[1]))
        return real_attn(q, kc, vc, tables, lens)
    engine.decode_attn = spy
    steps = warmup.warm_kernels(engine, wl)
    warmed = {warmup.specialisation(b, w, 2, 4) for b, w in shapes}
    n_warm = len(shapes) // 2  # one decode per class, once per layer
    assert steps == n_warm + 1 and len(warmed) == n_warm
    shapes.clear()
    engine.run(wl, seed=sc.seed)
    met = {warmup.specialisation(b, w, 2, 4) for b, w in shapes}
    assert len(met) > 1 and met <= warmed
