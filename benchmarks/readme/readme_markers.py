"""README.md's generated blocks, found and replaced by their markers,

    <!-- results:NAME -->
    ...generated Markdown...
    <!-- /results:NAME -->

as text: offsets of each block's body, its current text, and a copy of the README with
some bodies replaced and every other byte kept (benchmarks/readme/readme_results.py)."""

from __future__ import annotations

import re

MARKER = re.compile(r"<!-- (/?)results:([a-z0-9_-]+) -->")


def readme_blocks(text: str) -> dict[str, tuple[int, int]]:
    """name -> (start, end) offsets of the text between its markers. Raises ValueError
    on unpaired, nested, misordered or repeated markers."""
    found: dict[str, tuple[int, int]] = {}
    open_name, open_end = None, 0
    for m in MARKER.finditer(text):
        closing, name = m.group(1) == "/", m.group(2)
        if not closing:
            if open_name is not None:
                raise ValueError(f"results:{name} opens inside results:{open_name}")
            if name in found:
                raise ValueError(f"results:{name} appears twice")
            open_name, open_end = name, m.end()
        else:
            if open_name != name:
                raise ValueError(f"/results:{name} closes {open_name or 'nothing'}")
            found[name] = (open_end, m.start())
            open_name = None
    if open_name is not None:
        raise ValueError(f"results:{open_name} is never closed")
    return found


def current(text: str, span: tuple[int, int]) -> str:
    return text[span[0]:span[1]].strip("\n")


def replace_blocks(text: str, new: dict[str, str]) -> str:
    spans = readme_blocks(text)
    for name in sorted(new, key=lambda n: spans[n][0], reverse=True):
        a, b = spans[name]
        text = text[:a] + "\n" + new[name] + "\n" + text[b:]
    return text
