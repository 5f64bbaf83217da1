"""A trace CSV read by splitting at commas (sim/workload/traces.py `_plain_columns`, the
common case) gives what the csv module gives, or is left to it; whole-number columns read
by int() are the values (and the errors) of the float path."""

from __future__ import annotations

import csv

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.io.specload import SpecError
from sim.workload import traces

_CELL = st.text(st.sampled_from(list('0123456789 ,"x\t\r.-é')), max_size=6)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(_CELL, min_size=1, max_size=4), min_size=1, max_size=8))
def test_plain_columns_are_the_csv_modules_columns_or_none(rows):
    lines = [",".join(r) for r in rows]
    text = "\n".join(lines) + "\n"
    lines = text.splitlines()
    width = len(next(csv.reader(lines[:1]), []))
    plain = traces._plain_columns(text, lines, width)
    if plain is not None:
        read = [r for r in csv.reader(lines[1:]) if r]
        assert all(len(r) == width for r in read) and len(read) == len(lines) - 1
        assert plain == [tuple(c) for c in zip(*read, strict=True)]
    elif '"' not in text and "" not in lines and len(lines) > 1:  # left to csv: a row is short or long
        assert {len(line.split(",")) for line in lines[1:]} != {width}


def test_a_plain_file_and_a_quoted_one_read_alike(tmp_path):
    (tmp_path / "a.csv").write_text("arrival_s,prompt_tokens,output_tokens\n0,10,5\n1.5,20,7\n")
    (tmp_path / "b.csv").write_text('arrival_s,prompt_tokens,"output_tokens"\n0,10,5\n1.5,20,7\n')
    text = (tmp_path / "a.csv").read_text()
    assert traces._plain_columns(text, text.splitlines(), 3) is not None  # the fast path
    a, b = traces._read_csv(tmp_path / "a.csv"), traces._read_csv(tmp_path / "b.csv")
    assert a[0] == b[0] == {"arrival_s": ("0", "1.5"), "prompt_tokens": ("10", "20"),
                            "output_tokens": ("5", "7")}
    assert a[1].tolist() == b[1].tolist() == [2, 3]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(st.sampled_from(list("0123456789")), min_size=1, max_size=20),
                min_size=1, max_size=10))
def test_whole_numbers_by_int_are_the_float_paths(raw):
    lines = np.arange(2, len(raw) + 2)

    def read(values):
        try:
            return traces._numbers("t.csv", values, lines, "n", integer=True, lo=1, hi=10**7)
        except SpecError as e:
            return str(e)

    fast, slow = read(raw), read([s + ".0" for s in raw])  # "12.0": not digits only
    if isinstance(fast, str) or isinstance(slow, str):
        assert fast == slow
    else:
        assert fast.dtype == slow.dtype == np.int64 and fast.tolist() == slow.tolist()
        assert not fast.flags.writeable


@pytest.mark.parametrize("raw", [["12", ""], ["1", "x"], ["1", "１"], ["1", " 2"]])
def test_anything_but_ascii_digits_takes_the_float_path(raw):
    assert not traces._digits_only(raw)


@pytest.mark.parametrize("raw", [["12", "7"], ["0"], ("123456789012345678",)])
def test_strings_of_ascii_digits_take_the_int_path(raw):
    assert traces._digits_only(raw)


@pytest.mark.parametrize("raw", [[12, "7"], ["12", None], ["1234567890123456789"], [b"12"]])
def test_other_values_or_longer_digit_strings_do_not(raw):
    assert not traces._digits_only(raw)
