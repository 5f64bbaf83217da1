"""How README's generated blocks write numbers, sentences and tables: grouped counts,
three significant figures, milliseconds, percentages, half-up decimals, paragraphs wrapped
as README's are, and Markdown tables (benchmarks/readme/readme_results.py)."""

from __future__ import annotations

import textwrap
from decimal import ROUND_HALF_UP, Decimal


def grouped(x: float) -> str:
    """An integer with thousands separators: 1,436,565."""
    return f"{round(x):,}"


def sig3(x: float) -> str:
    """Three significant figures, grouped: 1,253 -> 1,250; 787 -> 790."""
    return grouped(float(f"{x:.3g}"))


def ms(seconds: float, digits: int = 0) -> str:
    return f"{seconds * 1e3:,.{digits}f}"


def pct(share: float, digits: int = 0) -> str:
    return f"{share * 100:.{digits}f} %"


def times(x: float) -> str:
    return f"{x:.2f}×"


def half_up(x: float, digits: int) -> str:
    """A decimal written as people round it (0.0575 -> 0.058), not as binary floats do."""
    q = Decimal(1).scaleb(-digits)
    return str(Decimal(repr(round(x, 10))).quantize(q, rounding=ROUND_HALF_UP))


def prose(text: str) -> str:
    """A generated sentence or paragraph, wrapped as the README's paragraphs are."""
    return textwrap.fill(text, width=88, break_long_words=False, break_on_hyphens=False)


def table(header: list[str], rows: list[list[str]], align: list[str] | None = None) -> str:
    rule = align or ["---"] * len(header)
    def line(cells: list[str]) -> str:
        return "|" + "|".join(f" {c} " if c else " " for c in cells) + "|"

    return "\n".join([line(header), "|" + "|".join(rule) + "|", *map(line, rows)])
