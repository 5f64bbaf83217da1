"""A plan's candidates are checked before any run: a typo (unknown key or name, wrong
type) refuses the plan with one line; a known value the scenario refuses in
combination (TP 3 for 32 heads) is a skipped row and the plan goes on."""

from __future__ import annotations

from pathlib import Path

import pytest

from sim.cli.main import main
from sim.planning.plan import evaluate
from sim.planning.planspec import load_plan, load_prices

ROOT = Path(__file__).resolve().parent.parent
QUICKSTART = ROOT / "scenarios" / "quickstart.yaml"
TP3 = ("refused by the scenario: parallel.tensor: 3 does not divide heads=32 of llama-3-8b "
       "(allowed: 1, 2, 4, 8)")


def _plan(tmp_path: Path, candidates: str, extra: str = "") -> Path:
    """A plan light enough to run in seconds: 4 req/s, one seed, 40 requests a replica."""
    p = tmp_path / "p.yaml"
    p.write_text(f"scenario: {QUICKSTART}\ntarget_rate: 4\nslo: {{ttft_p99_s: 1.0, tpot_p99_s: 0.06}}\n"
                 f"search: {{seeds: 1, requests: 40, rate_start: 2}}\ncandidates: {candidates}\n{extra}")
    return p


def _refused(tmp_path, capsys, candidates: str) -> str:
    """The one line a refused plan prints (exit 2, nothing written)."""
    p = _plan(tmp_path, candidates)
    assert main(["plan", str(p), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and not (tmp_path / "o").exists()
    return err.removeprefix(f"llmsim: error: {p}: ").rstrip("\n")


def test_tp_the_model_refuses_is_skipped_and_the_plan_goes_on_under_the_worker_pool(tmp_path, capsys):
    import json

    p = _plan(tmp_path, "{gpu: [h100-sxm], tensor: [1, 3, 2]}")
    assert main(["plan", str(p), "--out", str(tmp_path / "o")]) == 0  # default: a process pool
    out = capsys.readouterr().out
    assert f"h100-sxm tp3                   skipped: {TP3}" in out
    plan = json.loads((tmp_path / "o" / "plan.json").read_text())
    rows = {r["candidate"]: r for r in plan["candidates"]}
    assert rows["h100-sxm tp3"]["status"] == "skipped" and rows["h100-sxm tp3"]["note"] == TP3
    assert rows["h100-sxm tp1"]["status"] == rows["h100-sxm tp2"]["status"] == "ok"
    rec, check = plan["recommended"], plan["fleet_check"]
    assert rec["candidate"] in ("h100-sxm tp1", "h100-sxm tp2") and check["holds"]
    at_n = next(c for c in check["checks"] if c["replicas"] == check["replicas"])
    assert rec["replicas"] == check["replicas"] and rec["gpus"] == check["replicas"] * rec["tp"]
    assert rec["usd_per_hour"] == pytest.approx(3.0 * rec["gpus"])  # prices.yaml: h100-sxm $3/h
    assert (rec["ttft_p99_s"], rec["tpot_p99_s"], rec["e2e_p99_s"]) == \
        (at_n["ttft_p99_s"], at_n["tpot_p99_s"], at_n["e2e_p99_s"])
    mean = plan["output_tokens_per_request"]["per_request"]  # one figure for the whole plan
    assert rec["usd_per_m_output_tokens"] == pytest.approx(rec["usd_per_hour"] / (4 * mean * 3600) * 1e6)


def test_plan_whose_every_candidate_is_refused_exits_2_with_one_line(tmp_path, capsys):
    assert _refused(tmp_path, capsys, "{gpu: [h100-sxm], tensor: [3]}") == \
        f"candidates: every candidate is skipped, e.g. h100-sxm tp3: {TP3}"


def test_a_refusal_at_run_time_in_a_worker_is_a_skipped_row_not_an_exception(tmp_path):
    spec = load_plan(_plan(tmp_path, "{tensor: [3]}"))
    row = evaluate(spec, {"parallel.tensor": 3}, load_prices(None))
    assert row["status"] == "skipped" and row["note"] == TP3


def test_unknown_gpu_among_the_candidates_is_an_error_not_a_skip(tmp_path, capsys):
    assert _refused(tmp_path, capsys, "{gpu: [a100-80gb, h100, h200-sxm]}") == \
        ("candidates.gpu[1]: unknown 'h100' (known: a100-80gb, b200, b300, gb200-nvl72, "
         "gb300-nvl72, h100-sxm, h20, h200-sxm, l40s, mi300x, mi325x, mi355x)")


@pytest.mark.parametrize(("candidates", "says"), [
    ("{policy: [continuous, continous]}",
     "candidates.policy[1]: unknown 'continous' (allowed: continuous, static, chunked)"),
    ("{runtime: [vllm, vlm]}", "candidates.runtime[1]: unknown 'vlm' (known: "),
    ("{tensor: [1, x]}", "candidates.tensor[1]: expected an integer, got 'x'"),
    ("{max_num_seqs: [0]}", "candidates.max_num_seqs[0]: 0 is out of range (allowed: > 0)"),
])
def test_a_value_wrong_on_its_own_names_its_place_in_the_plan(tmp_path, capsys, candidates, says):
    assert _refused(tmp_path, capsys, candidates).startswith(says)


def test_a_misspelt_candidate_key_lists_the_candidate_names(tmp_path, capsys):
    assert _refused(tmp_path, capsys, "{gpu: [h100-sxm], tensr: [1, 2, 4]}") == (
        "candidates.tensr: unknown key (allowed: gpu, tensor, policy, chunk_tokens, block_size, "
        "max_num_seqs, speculative, expert, data, pipeline, ratio, prefill.KEY, decode.KEY, both.KEY (a cluster's pools), "
        "or a dotted scenario field)")


def test_a_misspelt_dotted_key_lists_the_fields_of_its_section(tmp_path, capsys):
    err = _refused(tmp_path, capsys, "{scheduler.polcy: [static]}")
    assert err.startswith("candidates.scheduler.polcy: unknown key (allowed: ") and "max_num_seqs" in err


def test_known_gpu_without_a_price_is_skipped_and_shown_in_the_table(tmp_path, capsys):
    prices = tmp_path / "prices.yaml"
    prices.write_text("gpus: {h100-sxm: {usd_per_hour: 3.0, source: test}}\n")
    p = _plan(tmp_path, "{gpu: [h200-sxm, h100-sxm]}")
    assert main(["plan", str(p), "--prices", str(prices), "--out", str(tmp_path / "o"), "--workers", "1"]) == 0
    out = capsys.readouterr().out
    assert "h200-sxm                       skipped: no price for GPU 'h200-sxm' in the prices file" in out
    assert "recommended: h100-sxm x " in out
