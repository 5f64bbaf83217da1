"""README's generated blocks (benchmarks/readme/readme_results.py and its readme_* modules): the
markers are well-formed, every marked block has a generator and sits in the section it
names, and replacing blocks touches nothing else. The whole regeneration (~45 s) is not run
here; one fast block is, for its shape."""

from __future__ import annotations

import re

import pytest

from benchmarks.readme import readme_format as fmt
from benchmarks.readme import readme_markers as markers
from benchmarks.readme import readme_results as rr
from benchmarks.readme.readme_runs import Runs

README_TEXT = rr.README.read_text(encoding="utf-8")


def test_markers_are_paired_and_every_block_has_a_generator():
    spans = markers.readme_blocks(README_TEXT)
    assert set(spans) == set(rr.BLOCKS)


def test_each_block_sits_under_the_section_it_names():
    for name, (start, _) in markers.readme_blocks(README_TEXT).items():
        headings = re.findall(r"^#{2,3} (.+)$", README_TEXT[:start], flags=re.M)
        assert headings[-1] == rr.BLOCKS[name].section, name


def test_each_block_holds_text():
    for name, span in markers.readme_blocks(README_TEXT).items():
        assert markers.current(README_TEXT, span).strip(), name


@pytest.mark.parametrize("text, problem", [
    ("<!-- results:a -->\nx\n", "never closed"),
    ("<!-- results:a -->\n<!-- results:b -->\n<!-- /results:b -->\n<!-- /results:a -->", "inside"),
    ("<!-- results:a -->\n<!-- /results:b -->", "closes a"),
    ("<!-- /results:a -->", "closes nothing"),
    ("<!-- results:a -->\n<!-- /results:a -->\n<!-- results:a -->\n<!-- /results:a -->", "twice"),
])
def test_malformed_markers_are_refused(text, problem):
    with pytest.raises(ValueError, match=problem):
        markers.readme_blocks(text)


def test_replacing_blocks_touches_only_them():
    spans = markers.readme_blocks(README_TEXT)
    same = {n: markers.current(README_TEXT, s) for n, s in spans.items()}
    assert markers.replace_blocks(README_TEXT, same) == README_TEXT
    name = next(iter(spans))
    new = markers.replace_blocks(README_TEXT, {name: "| x |\n|---|\n| 1 |"})
    new_spans = markers.readme_blocks(new)
    assert markers.current(new, new_spans[name]) == "| x |\n|---|\n| 1 |"
    for other, span in new_spans.items():
        if other != name:
            assert markers.current(new, span) == same[other]
    assert new.replace("| x |\n|---|\n| 1 |", same[name]) == README_TEXT


def test_rounding_is_half_up_and_counts_are_grouped():
    assert fmt.half_up(0.0575, 3) == "0.058"
    assert fmt.half_up(19.5062, 1) == "19.5"
    assert fmt.grouped(1436565.4) == "1,436,565"
    assert fmt.ms(0.0751) == "75"


def test_a_fast_block_keeps_the_readme_block_shape():
    """The TP table (step model only, no simulation, 0.3 s): README's block as generated,
    so a change to the step model that moves it fails here until the README is regenerated
    (`python benchmarks/readme/readme_results.py --write`)."""
    made = rr.BLOCKS["tp-scaling"].make(Runs()).splitlines()
    there = markers.current(README_TEXT, markers.readme_blocks(README_TEXT)["tp-scaling"]).splitlines()
    assert made == there
