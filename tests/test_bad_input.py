"""Malformed input: one line `llmsim: error: <file>: <field.path>: ...`, exit 2, nothing written.

One case per reproducer of issue 7 ("Malformed input that crashes or is accepted") and
per class the fuzzer found. Each runs the CLI in-process in an empty temporary folder.
"""

from __future__ import annotations

import json

import pytest

from sim.cli.main import main
from tests.conftest import QUICK_YAML as B

TRACE = "name: t\nworkload:\n  trace: {path: t.csv}\n"
MOONCAKE = "name: m\nworkload:\n  trace: {path: m.jsonl, format: mooncake}\n"
GOOD_ROW = {"timestamp": 0, "input_length": 600, "output_length": 20, "hash_ids": [1, 2]}


def _b(old: str, new: str) -> str:
    assert old in B
    return B.replace(old, new)


def _laughs(levels: int = 9) -> str:
    lines = ['l0: &l0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for i in range(1, levels + 1):
        lines.append(f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * 10) + "]")
    return "\n".join(lines) + f"\ndescription: *l{levels}\n" + B


def _trace(cell: str) -> dict[str, str]:
    return {"b.yaml": TRACE, "t.csv": f"arrival_s,prompt_tokens,output_tokens\n0,10,5\n1,{cell},5\n"}


def _mooncake(**row) -> dict[str, str]:
    lines = [json.dumps(GOOD_ROW), json.dumps({**GOOD_ROW, **row})]
    return {"b.yaml": MOONCAKE, "m.jsonl": "\n".join(lines) + "\n"}


RUN = ["run", "b.yaml", "--out", "out", "--no-plots"]
# name -> (files, extra argv after RUN or a full argv, substrings of the one error line)
CASES: dict[str, tuple[dict[str, str | bytes], list[str], list[str]]] = {
    # files that are not UTF-8 text
    "binary file": ({"b.yaml": bytes(range(256))}, [], ["b.yaml: line 1: ", "UTF-8"]),
    "utf-16 file": ({"b.yaml": B.encode("utf-16")}, [], ["b.yaml: line 1: UTF-16"]),
    "nul byte": ({"b.yaml": B.replace("seed: 1", "seed: 1\x00")}, [], ["b.yaml: line 2: ", "NUL"]),
    "latin-1 byte": ({"b.yaml": B.encode() + b"# caf\xe9\n"}, [], ["b.yaml: line 8: ", "not UTF-8"]),
    # YAML structure
    "duplicate key": ({"b.yaml": B + "seed: 2\n"}, [], ["b.yaml: seed: duplicate key on line 8 (first on line 2"]),
    "duplicate nested key": ({"b.yaml": _b("rate: 5}", "rate: 5, rate: 6}")}, [],
                             ["b.yaml: workload.arrival.rate: duplicate key"]),
    "billion laughs": ({"b.yaml": _laughs()}, [], ["b.yaml: ", "aliases expand to over"]),
    "recursive alias": ({"b.yaml": B + "x: &x [*x]\n"}, [], ["b.yaml: x", "no cycles"]),
    "deep nesting": ({"b.yaml": B + "x: " + "[" * 5000 + "]" * 5000 + "\n"}, [], ["b.yaml: ", "nested too deeply"]),
    "bad date": ({"b.yaml": _b("seed: 1", "seed: 2001-13-45")}, [], ["b.yaml: ", "malformed YAML"]),
    "5000-digit integer": ({"b.yaml": _b("seed: 1", "seed: " + "9" * 5000)}, [], ["b.yaml: ", "malformed YAML"]),
    "top level list": ({"b.yaml": "- 1\n- 2\n"}, [], ["b.yaml: expected a mapping"]),
    "long unknown key": ({"b.yaml": B + "x" * 1000 + ": 1\n"}, [], ["b.yaml: xxx", "unknown key"]),
    "huge unknown key": ({"b.yaml": B + "x" * 100_000 + ": 1\n"}, [], ["b.yaml: line 8: malformed YAML"]),
    # names of files that cannot exist
    "trace path too long": ({"b.yaml": TRACE.replace("t.csv", "x" * 5000)}, [], ["b.yaml: workload.trace.path: file not found"]),
    "trace path of an unknown user": ({"b.yaml": TRACE.replace("t.csv", "~nosuchuser/t.csv")}, [],
                                      ["b.yaml: workload.trace.path: file not found"]),
    "model path too long": ({"b.yaml": B + "model: " + "x" * 5000 + ".yaml\n"}, [], ["b.yaml: model: model file not found"]),
    "scenario path too long": ({}, ["run", "x" * 5000, "--out", "out"], ["xxx", "file not found"]),
    # command-line values
    "--set unclosed list": ({"b.yaml": B}, ["--set", "name=[1,"], ["--set: name: malformed value"]),
    "--set alias bomb": ({"b.yaml": B}, ["--set", "description=[*a]"], ["--set: description: malformed value"]),
    "--set of an empty field name": ({"b.yaml": B}, ["--set", "=5"], ["--set: =5: expected FIELD.PATH=VALUE"]),
    "--set misspelt key": ({"b.yaml": B}, ["--set", "workload.arival.rate=3"],
                           ["--set workload.arival.rate=3: workload.arival: unknown key (allowed: arrival, "]),
    "--set list index out of range": ({"b.yaml": B + "cluster: {groups: [{count: 1}]}\n"},
                                      ["--set", "cluster.groups[1].gpu=h100-sxm"],
                                      ["--set cluster.groups[1].gpu=h100-sxm: cluster.groups[1]: index 1 is out "
                                       "of range of a list of 1 (allowed: 0 to 0)"]),
    "--set unknown gpu of a group": ({"b.yaml": B + "cluster: {groups: [{count: 1}]}\n"},
                                     ["--set", "cluster.groups.0.gpu=h10"],
                                     ["--set cluster.groups.0.gpu=h10: cluster.groups[0].gpu: unknown 'h10' (known: "]),
    "--set not an integer": ({"b.yaml": B}, ["--set", "scheduler.max_num_seqs=lots"],
                             ["--set scheduler.max_num_seqs=lots: scheduler.max_num_seqs: expected an integer, "
                              "got 'lots' (allowed: an integer > 0)"]),
    "--set a YAML bool for a number": ({"b.yaml": B}, ["--set", "workload.arrival.rate=true"],
                                       ["workload.arrival.rate: expected a number, got true (allowed: a finite number > 0)"]),
    "--set rate inf": ({"b.yaml": B}, ["--set", "workload.arrival.rate=inf"],
                       ["workload.arrival.rate: expected a number, got 'inf' (allowed: a finite number > 0)"]),
    "--set step budget below the window": ({"b.yaml": B}, ["--set", "scheduler.policy=continuous",
                                                           "--set", "scheduler.max_num_batched_tokens=100"],
                                           ["--set scheduler.max_num_batched_tokens=100: scheduler.max_num_batched_tokens: "
                                            "100 is below the context window 8192 (allowed: >= the context window, a smaller kv.max_model_len, or policy: chunked)"]),
    "sweep grid list index out of range": ({"b.yaml": B + "cluster: {groups: [{count: 1}]}\n"},
                                           ["sweep", "b.yaml", "--grid", "cluster.groups.3.gpu=a,b", "--out", "out"],
                                           ["--grid/--zip cluster.groups.3.gpu=a: cluster.groups[3]: index 3 is out of range"]),
    "curve negative rate": ({"b.yaml": B}, ["curve", "b.yaml", "--rates", "-1,2", "--out", "out"],
                            ["--rates: -1,2: a rate is not positive (allowed: numbers > 0"]),
    "scenario that is a folder": ({}, ["run", ".", "--out", "out"],
                                  [".: is a folder, not a scenario file (allowed: a YAML file)"]),
    "sweep unclosed list": ({"b.yaml": B}, ["sweep", "b.yaml", "--field", "workload.arrival.rate",
                                            "--values", "[a", "--out", "out"],
                            ["--values: workload.arrival.rate: malformed value"]),
    # numbers
    "negative seed": ({"b.yaml": _b("seed: 1", "seed: -1")}, [], ["b.yaml: seed: -1 is out of range (allowed: >= 0)"]),
    "seed of 2**63": ({"b.yaml": _b("seed: 1", f"seed: {2**63}")}, [], ["b.yaml: seed: ", "out of range"]),
    "num_requests 1e10": ({"b.yaml": _b("num_requests: 20", "num_requests: 1e10")}, [],
                          ["b.yaml: workload.num_requests: ", "(allowed: <= 100,000,000)"]),
    "num_requests 1e30": ({"b.yaml": _b("num_requests: 20", "num_requests: 1.0e+30")}, [],
                          ["b.yaml: workload.num_requests: ", "out of range"]),
    "num_requests 1e10 via --set": ({"b.yaml": B}, ["--set", "workload.num_requests=10000000000"],
                                    ["--set workload.num_requests=10000000000: workload.num_requests: ", "out of range"]),
    "continuous step budget below the window": ({"b.yaml": B + "scheduler: {policy: continuous, "
                                                            "max_num_batched_tokens: 100}\n"}, [],
                                                ["b.yaml: scheduler.max_num_batched_tokens: 100 is below the context "
                                                 "window 8192 (allowed: >= the context window, a smaller kv.max_model_len, or policy: chunked)"]),
    "duration inf": ({"b.yaml": B + "  duration_s: .inf\n"}, [], ["b.yaml: workload.duration_s: inf is not finite"]),
    "duration nan": ({"b.yaml": B + "  duration_s: .nan\n"}, [], ["b.yaml: workload.duration_s: nan is not finite"]),
    "rate inf": ({"b.yaml": _b("rate: 5", "rate: .inf")}, [], ["b.yaml: workload.arrival.rate: inf is not finite"]),
    "rate so low arrivals pass 1e9 s": ({"b.yaml": _b("rate: 5", "rate: 1.0e-300")}, [],
                                        ["b.yaml: workload.arrival.rate: arrivals reach"]),
    "gamma cv 1e-200": ({"b.yaml": _b("{kind: poisson, rate: 5}", "{kind: gamma, rate: 5, cv: 1.0e-200}")}, [],
                        ["b.yaml: workload.arrival.cv: ", "out of range"]),
    "fixed length 1e30": ({"b.yaml": _b("value: 100", "value: 1.0e+30")}, [],
                          ["b.yaml: workload.prompt.value: ", "(allowed: <= 10,000,000)"]),
    "uniform high 1e30": ({"b.yaml": _b("{kind: fixed, value: 20}", "{kind: uniform, low: 1, high: 1.0e+30}")}, [],
                          ["b.yaml: workload.output.high: ", "out of range"]),
    "lognormal median 1e30": ({"b.yaml": _b("{kind: fixed, value: 100}", "{kind: lognormal, median: 1.0e+30, sigma: 1}")},
                              [], ["b.yaml: workload.prompt.median: ", "out of range"]),
    "lognormal huge sigma": ({"b.yaml": _b("{kind: fixed, value: 100}", "{kind: lognormal, median: 100, sigma: 1.0e+3}")},
                             [], ["b.yaml: workload.prompt.sigma: ", "(allowed: <= 10.0)"]),
    "max_output_tokens 1e30": ({"b.yaml": B + "  max_output_tokens: 1.0e+30\n"}, [],
                               ["b.yaml: workload.max_output_tokens: ", "out of range"]),
    "shared prefix of 1e12 tokens": ({"b.yaml": B + "  shared_prefix: {tokens: 1000000000000}\n"}, [],
                                     ["b.yaml: workload.shared_prefix.tokens: ", "out of range"]),
    "shared prefix hashes past the cap": ({"b.yaml": _b("num_requests: 20", "num_requests: 1000") + "  shared_prefix: {tokens: 10000000}\n"},
                                          [], ["b.yaml: workload.shared_prefix.tokens: the prompts would need"]),
    "multi-turn hashes past the cap": ({"b.yaml": _b("num_requests: 20", "num_requests: 100000").replace("value: 100", "value: 10000")
                                        + "  multi_turn: {turns: 1000}\n"}, [], ["b.yaml: workload.multi_turn.turns: the prompts would need"]),
    "static max_wait inf": ({"b.yaml": B + "scheduler: {policy: static, max_wait_s: .inf}\n"}, [],
                            ["b.yaml: scheduler.max_wait_s: inf is not finite"]),
    "slo nan": ({"b.yaml": B + "slo: {ttft_s: .nan}\n"}, [], ["b.yaml: slo.ttft_s: nan is not finite"]),
    "kv block_size 1e9": ({"b.yaml": B + "kv: {block_size: 1.0e9}\n"}, [],
                          ["b.yaml: kv.block_size: 1000000000 is out of range (allowed: <= 1024)"]),
    "max_model_len over the model's window": ({"b.yaml": B + "kv: {max_model_len: 100000}\n"}, [],
                                              ["b.yaml: kv.max_model_len: 100000 is over llama-3-8b's context window (allowed: <= 8192)"]),
    "swap space 1e300 GiB": ({"b.yaml": B + "kv: {swap_space_gib: 1.0e+300}\n"}, [],
                             ["b.yaml: kv.swap_space_gib: ", "out of range"]),
    "host prefix cache 1e300 GiB": ({"b.yaml": B + "kv: {prefix_caching: true, prefix_cache_host_gib: 1.0e+300}\n"}, [],
                                    ["b.yaml: kv.prefix_cache_host_gib: ", "out of range"]),
    "int over 64 bits": ({"b.yaml": B + f"scheduler: {{max_num_seqs: {2**70}}}\n"}, [],
                         ["b.yaml: scheduler.max_num_seqs: ", "too large"]),
    # traces
    "trace out of time order": ({"b.yaml": TRACE, "t.csv": "arrival_s,prompt_tokens,output_tokens\n5,100,10\n1,100,20\n"},
                                [], ["t.csv: line 3: arrival_s: 4 s before the previous row's (line 2; allowed: "
                                     "non-decreasing arrival times)"]),
    "mooncake out of time order": ({"b.yaml": MOONCAKE, "m.jsonl": json.dumps({**GOOD_ROW, "timestamp": 9}) + "\n"
                                    + json.dumps(GOOD_ROW) + "\n"}, [],
                                   ["m.jsonl: line 2: timestamp: 0.009 s before the previous row's (line 1;"]),
    "trace cell 1e19": (_trace("1e19"), [], ["t.csv: line 3: prompt_tokens: out of range"]),
    "trace cell 1e30": (_trace("1e30"), [], ["t.csv: line 3: prompt_tokens: out of range"]),
    "trace cell 1e400": (_trace("1e400"), [], ["t.csv: line 3: prompt_tokens: out of range"]),
    "trace cell negative": (_trace("-5"), [], ["t.csv: line 3: prompt_tokens: out of range"]),
    "trace cell non-integer": (_trace("2.5"), [], ["t.csv: line 3: prompt_tokens: out of range"]),
    "trace field over the csv size limit": (_trace('"' + "x" * 200_000 + '"'), [], ["t.csv: line 3: malformed CSV"]),
    "trace with a NUL": ({"b.yaml": TRACE, "t.csv": "arrival_s,prompt_tokens,output_tokens\n0,10,5\x00\n"}, [],
                         ["t.csv: line 2: ", "NUL"]),
    "trace time_scale 1e308": ({**_trace("10"), "b.yaml": TRACE.replace("t.csv}", "t.csv, time_scale: 1.0e+308}")}, [],
                               ["b.yaml: workload.trace.time_scale: arrivals reach 1e+308 s"]),
    "mooncake input_length true": (_mooncake(input_length=True), [], ["m.jsonl: line 2: input_length: a JSON boolean (allowed: a number)"]),
    "mooncake input_length string": (_mooncake(input_length="5"), [], ["m.jsonl: line 2: input_length: a JSON string"]),
    "mooncake timestamp null": (_mooncake(timestamp=None), [], ["m.jsonl: line 2: timestamp: a JSON null"]),
    "mooncake output 1e30": (_mooncake(output_length=1e30), [], ["m.jsonl: line 2: output_length: ", "out of range"]),
    "mooncake huge integer": (_mooncake(input_length=10**400), [], ["m.jsonl: line 2: input_length: out of range"]),
    "mooncake hash_ids strings": (_mooncake(hash_ids=["a"]), [], ["m.jsonl: line 2: hash_ids: "]),
    "mooncake invalid json": ({"b.yaml": MOONCAKE, "m.jsonl": json.dumps(GOOD_ROW) + "\n{oops\n"}, [],
                              ["m.jsonl: line 2: not valid JSON"]),
    "mooncake a list": ({"b.yaml": MOONCAKE, "m.jsonl": "[1, 2]\n"}, [], ["m.jsonl: line 1: a JSON list"]),
    "mooncake utf-16": ({"b.yaml": MOONCAKE, "m.jsonl": json.dumps(GOOD_ROW).encode("utf-16")}, [],
                        ["m.jsonl: line 1: UTF-16"]),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_malformed_input_is_one_line_exit_2_and_writes_nothing(tmp_path, monkeypatch, capsys, case):
    files, argv, expected = CASES[case]
    for name, content in files.items():
        target = tmp_path / name
        if isinstance(content, bytes):
            target.write_bytes(content)
        else:
            target.write_text(content, encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    argv = argv if argv[:1] in (["run"], ["sweep"], ["compare"], ["curve"]) else RUN + argv
    code = main(argv)  # an exception here is the traceback the contract forbids
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert code == 2, err
    assert len(lines) == 1, err[:2000]
    assert lines[0].startswith("llmsim: error: "), lines[0]
    assert len(lines[0]) < 400, lines[0][:500]
    for text in expected:
        assert text in lines[0], lines[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(files)  # nothing written
