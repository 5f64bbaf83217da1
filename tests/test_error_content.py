"""An error about a data file names the file, the line and the column, never the
file's content: a path mistyped as (or pointed at) a system file must not print its
lines (issue 18, item 6)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from sim.io.specload import SpecError, build
from sim.workload.requests import WorkloadSpec, generate

SECRET = "s3cr3t-token-9f2c"


def _error(tmp_path: Path, workload: dict) -> str:
    spec = build(WorkloadSpec, {"num_requests": 5, **workload}, file="scenario.yaml", path="workload")
    with pytest.raises(SpecError) as e:
        generate(spec, np.random.default_rng(1), file="scenario.yaml", base_dir=tmp_path)
    return str(e.value)


FILES = {  # a file that is not a trace, each line holding the secret somewhere
    "passwd-like": f"root:x:0:0:{SECRET}:/root:/bin/bash\nuser,{SECRET},1,2\n",
    "env-like": f"TOKEN={SECRET}\nPATH=/usr/bin\n",
    "csv header": f"arrival_s,{SECRET}\n0,1\n",
    "bad cells": f"arrival_s,prompt_tokens,output_tokens\n0,10,5\n1,{SECRET},5\n",
    "bad count": f"arrival_s,prompt_tokens,output_tokens\n0,10,5\n1,-{len(SECRET)}{len(SECRET)}7,5\n",
    "short row": f"arrival_s,prompt_tokens,output_tokens\n0,10,5\n{SECRET},1\n",
    "azure": f"TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,5,6\n{SECRET},5,6\n",
    "out of order": "arrival_s,prompt_tokens,output_tokens\n987654,10,5\n123456,10,5\n",
    "jsonl": json.dumps({"timestamp": SECRET, "input_length": 1, "output_length": 1, "hash_ids": []}) + "\n",
    "jsonl hashes": json.dumps({"timestamp": 1, "input_length": 1, "output_length": 1,
                                "hash_ids": [SECRET]}) + "\n",
}


@pytest.mark.parametrize("name", sorted(FILES))
@pytest.mark.parametrize("as_", ["csv", "azure", "mooncake", "lengths"])
def test_an_unreadable_data_file_is_named_never_echoed(tmp_path, name, as_):
    (tmp_path / "f").write_text(FILES[name])
    workload = ({"lengths": {"path": "f"}, "arrival": {"kind": "poisson", "rate": 1.0}}
                if as_ == "lengths" else {"trace": {"path": "f", "format": as_}})
    msg = _error(tmp_path, workload)
    assert "f" in msg and len(msg.splitlines()) == 1
    assert SECRET not in msg and "987654" not in msg and "123456" not in msg, msg
    assert "root:x" not in msg and "TOKEN" not in msg and "1717" not in msg, msg
