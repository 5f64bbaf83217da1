"""A report as a document: sections of text, tables and plots, written as one
self-contained HTML page (inline CSS, plots as base64 PNG data URIs) or as Markdown.

Every value that goes into the HTML is escaped: titles, key numbers, table headers and
cells always; a section's text too, unless it is `Markup` (llmsim's own tags, built with
`markup()`, which escapes each value it is given). Names and values come from input
files and result files that get shared (a plan.json, a sweep's columns): a value is
never markup."""

from __future__ import annotations

import base64
import html
import io
import math
import re
from dataclasses import dataclass, field

import pandas as pd
from matplotlib.figure import Figure

CSS = """body{font:14px/1.45 system-ui,sans-serif;margin:2em auto;max-width:1100px;color:#222}
h1{font-size:1.6em}h2{font-size:1.2em;border-bottom:1px solid #ddd;padding-bottom:.2em;margin-top:1.6em}
table{border-collapse:collapse;margin:.6em 0;font-size:12px;display:block;overflow-x:auto;max-width:100%}
th,td{border:1px solid #ccc;padding:3px 7px;text-align:right}
th{background:#f3f3f3}td:first-child,th:first-child{text-align:left}img{max-width:100%;border:1px solid #eee}
.key{display:inline-block;margin:.3em 1.2em .3em 0}.key b{display:block;font-size:1.5em}.note{color:#666}
.ok{color:#186a1f;font-weight:bold}.bad{color:#a11;font-weight:bold}"""


class Markup(str):
    """Text that is already HTML: llmsim's own tags around escaped values (`markup`)."""


def markup(template: str, *values: object) -> Markup:
    """`template` (llmsim's own HTML, `{}` where a value goes) with each value escaped:
    markup("Recommended: <b>{}</b>", name)."""
    return Markup(template.format(*(html.escape(str(v)) for v in values)))


@dataclass
class Section:
    title: str
    text: list[str] = field(default_factory=list)  # plain text (escaped) or Markup
    tables: list[tuple[str, pd.DataFrame]] = field(default_factory=list)
    images: list[tuple[str, bytes]] = field(default_factory=list)  # (name, PNG bytes)


@dataclass
class Report:
    title: str
    key_numbers: list[tuple[str, str]]
    sections: list[Section]


def png(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    return buf.getvalue()


def slug(s: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", s.lower()).strip("_")


def fmt_cell(v) -> str:
    if v is None or (isinstance(v, float) and v != v):
        return "-"
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def plot_value(v) -> float:
    """A value from a result file as a float to plot: NaN where it is missing or no number
    (a shared plan.json may hold anything), so one odd cell leaves a gap, not a failed page."""
    try:
        return float(v)
    except (TypeError, ValueError):
        return math.nan


def to_html(rep: Report) -> str:
    e = html.escape
    out = [f"<!doctype html><html><head><meta charset='utf-8'><title>{e(rep.title)}</title>",
           f"<style>{CSS}</style></head><body><h1>{e(rep.title)}</h1><div id='key-numbers'>"]
    out += [f"<span class='key'>{e(k)}<b>{e(v)}</b></span>" for k, v in rep.key_numbers]
    out.append("</div>")
    for s in rep.sections:
        out.append(f"<h2>{e(s.title)}</h2>")
        out += [f"<p>{t if isinstance(t, Markup) else e(t)}</p>" for t in s.text]
        for name, df in s.tables:
            cells = "".join(f"<th>{e(str(c))}</th>" for c in df.columns)
            body = "".join("<tr>" + "".join(f"<td>{e(fmt_cell(v))}</td>" for v in row) + "</tr>"
                           for row in df.itertuples(index=False))
            out.append(f"<table id='{slug(name)}'><thead><tr>{cells}</tr></thead><tbody>{body}</tbody></table>")
        for name, data in s.images:
            b64 = base64.b64encode(data).decode()
            out.append(f"<p><img alt='{e(name)}' src='data:image/png;base64,{b64}'></p>")
    out.append("<p class='note'>written by llmsim report</p></body></html>")
    return "\n".join(out)


def _plain(t: str) -> str:
    """A section's text without its tags (Markup: llmsim's tags dropped, values unescaped)."""
    return html.unescape(re.sub(r"<[^>]+>", "", t)) if isinstance(t, Markup) else t


def to_markdown(rep: Report) -> str:
    lines = [f"# {rep.title}", ""] + [f"- **{k}**: {v}" for k, v in rep.key_numbers]
    for s in rep.sections:
        lines += ["", f"## {s.title}", ""] + [_plain(t) + "\n" for t in s.text]
        for _, df in s.tables:
            lines.append("| " + " | ".join(map(str, df.columns)) + " |")
            lines.append("|" + "---|" * len(df.columns))
            lines += ["| " + " | ".join(fmt_cell(v) for v in row) + " |" for row in df.itertuples(index=False)]
            lines.append("")
        lines += [f"![{name}](report_{slug(name)}.png)" for name, _ in s.images]
    return "\n".join(lines) + "\n"

