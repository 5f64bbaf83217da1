"""YAML read through libyaml's parser where it is safe gives what PyYAML's gives: the same
values for every shipped file, the same one-line errors, and PyYAML alone for a text
deep enough to overflow libyaml's C recursion."""

from __future__ import annotations

from pathlib import Path

import pytest

from sim.io import specload
from sim.io.specload import ROOT, SpecError, parse_yaml

pytestmark = pytest.mark.skipif(specload._FastLoader is None, reason="PyYAML without libyaml")


def both(text: str) -> tuple:
    """(libyaml's answer, PyYAML's answer): ("ok", value) or ("error", message)."""
    out = []
    for loader in (specload._FastLoader, specload._Loader):
        ld = loader(text)
        try:
            out.append(("ok", specload._parse(ld, "f.yaml", "", "YAML")))
        except SpecError as e:
            out.append(("error", str(e)))
        finally:
            ld.dispose()
    return tuple(out)


def test_every_shipped_yaml_file_reads_the_same_through_either_parser():
    files = [p for p in ROOT.rglob("*.yaml") if ".venv" not in p.parts]
    assert len(files) > 50
    for p in files:
        fast, slow = both(p.read_text())
        assert repr(fast) == repr(slow), p


@pytest.mark.parametrize("text", [
    "a: 1e3\nb: 2.5E-4\nc: 1_000\nd: 0x1f\ne: 2001-12-14\nf: ~\ng: yes\n",
    "a: &x {b: [1, 2]}\nc: *x\nd:\n  <<: *x\n  e: 3\n",
    "a: 'quoted: yes'\nb: \"tab\\there\"\nc: |\n  two\n  lines\n",
])
def test_values_are_the_same_through_either_parser(text):
    fast, slow = both(text)
    assert fast[0] == "ok" and repr(fast) == repr(slow)


@pytest.mark.parametrize("text, needle", [
    ("a: 1\na: 2\n", "duplicate key on line 2 (first on line 1"),
    ("a: b: c\n", "line 1: malformed YAML: mapping values are not allowed here"),
    ("a: [1, 2\n", "malformed YAML"),
    ("a: *nowhere\n", "malformed YAML"),
    ("[" * 70 + "]" * 70, "nested too deeply (allowed: at most 64 levels)"),
])
def test_errors_read_as_pyyaml_words_them(text, needle):
    with pytest.raises(SpecError) as e:
        parse_yaml(text, Path("f.yaml"))
    assert needle in str(e.value)
    assert str(e.value) == both(text)[1][1]  # PyYAML's own message


def test_a_text_that_could_nest_past_the_c_limit_is_left_to_pyyaml():
    deep = "- " * (specload._C_MAX_LEVELS + 1) + "x\n"
    assert specload._fast_loader(deep) is None
    indented = "a:\n" + " " * (specload._C_MAX_LEVELS + 1) + "b: 1\n"
    assert specload._fast_loader(indented) is None
    assert specload._fast_loader("a: [1, 2]\n") is not None
    with pytest.raises(SpecError, match="nested too deeply"):
        parse_yaml(deep, Path("f.yaml"))
