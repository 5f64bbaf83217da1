"""`llmsim report DIR`: one self-contained HTML page (plus Markdown and CSV) for a run,
sweep, curve or plan folder.

The HTML has inline CSS and its plots as base64 PNG data URIs: it opens with no
network and can be mailed as one file. `report.md` carries the same text and tables,
with the plots as PNG files beside it; each table is also a CSV (`report_<table>.csv`).
"""

from __future__ import annotations

import base64
import html
import io
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
from matplotlib.figure import Figure

from .outdir import add_to_output, folder_kind, manifest, write_output
from .specload import SpecError

CSS = """body{font:14px/1.45 system-ui,sans-serif;margin:2em auto;max-width:1100px;color:#222}
h1{font-size:1.6em}h2{font-size:1.2em;border-bottom:1px solid #ddd;padding-bottom:.2em;margin-top:1.6em}
table{border-collapse:collapse;margin:.6em 0;font-size:12px}th,td{border:1px solid #ccc;padding:3px 7px;text-align:right}
th{background:#f3f3f3}td:first-child,th:first-child{text-align:left}img{max-width:100%;border:1px solid #eee}
.key{display:inline-block;margin:.3em 1.2em .3em 0}.key b{display:block;font-size:1.5em}.note{color:#666}
.ok{color:#186a1f;font-weight:bold}.bad{color:#a11;font-weight:bold}"""


@dataclass
class Section:
    title: str
    text: list[str] = field(default_factory=list)
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


def _slug(s: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", s.lower()).strip("_")


def _fmt(v) -> str:
    if v is None or (isinstance(v, float) and v != v):
        return "-"
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def to_html(rep: Report) -> str:
    e = html.escape
    out = [f"<!doctype html><html><head><meta charset='utf-8'><title>{e(rep.title)}</title>",
           f"<style>{CSS}</style></head><body><h1>{e(rep.title)}</h1><div id='key-numbers'>"]
    out += [f"<span class='key'>{e(k)}<b>{e(v)}</b></span>" for k, v in rep.key_numbers]
    out.append("</div>")
    for s in rep.sections:
        out.append(f"<h2>{e(s.title)}</h2>")
        out += [f"<p>{t}</p>" for t in s.text]  # text is trusted markup built below
        for name, df in s.tables:
            cells = "".join(f"<th>{e(str(c))}</th>" for c in df.columns)
            body = "".join("<tr>" + "".join(f"<td>{e(_fmt(v))}</td>" for v in row) + "</tr>"
                           for row in df.itertuples(index=False))
            out.append(f"<table id='{_slug(name)}'><thead><tr>{cells}</tr></thead><tbody>{body}</tbody></table>")
        for name, data in s.images:
            b64 = base64.b64encode(data).decode()
            out.append(f"<p><img alt='{e(name)}' src='data:image/png;base64,{b64}'></p>")
    out.append("<p class='note'>written by llmsim report</p></body></html>")
    return "\n".join(out)


def to_markdown(rep: Report) -> str:
    lines = [f"# {rep.title}", ""] + [f"- **{k}**: {v}" for k, v in rep.key_numbers]
    for s in rep.sections:
        lines += ["", f"## {s.title}", ""] + [re.sub(r"<[^>]+>", "", t) + "\n" for t in s.text]
        for _, df in s.tables:
            lines.append("| " + " | ".join(map(str, df.columns)) + " |")
            lines.append("|" + "---|" * len(df.columns))
            lines += ["| " + " | ".join(_fmt(v) for v in row) + " |" for row in df.itertuples(index=False)]
            lines.append("")
        lines += [f"![{name}](report_{_slug(name)}.png)" for name, _ in s.images]
    return "\n".join(lines) + "\n"


def report_files(rep: Report, out: Path) -> None:
    """report.html, report.md, report_<table>.csv and report_<plot>.png into `out`."""
    for s in rep.sections:
        for name, df in s.tables:
            df.to_csv(out / f"report_{_slug(name)}.csv", index=False)
        for name, data in s.images:
            (out / f"report_{_slug(name)}.png").write_bytes(data)
    (out / "report.md").write_text(to_markdown(rep))
    (out / "report.html").write_text(to_html(rep))


def is_report_file(name: str) -> bool:
    """A file `report_files` writes (an earlier report's, replaced by the next one)."""
    return name in ("report.html", "report.md") or name.startswith("report_")


def write_report(rep: Report, folder: str | Path, out: str | Path | None = None) -> Path:
    """Add the report to the llmsim folder it describes (rewritten atomically, its
    manifest listing the report too), or write it to its own folder `out`."""
    if out is not None and Path(out).resolve() != Path(folder).resolve():
        write_output(out, "report", lambda f: report_files(rep, f), {"of": str(folder)})
        return Path(out) / "report.html"
    add_to_output(folder, lambda f: report_files(rep, f), is_report_file)
    return Path(folder) / "report.html"


def build_report(folder: str | Path) -> Report:
    """A report for whatever llmsim folder `folder` is (run, sweep, curve, plan)."""
    p = Path(folder)
    kind = folder_kind(p) or ("run" if (p / "summary.json").is_file() else None)
    makers = {"run": run_report, "sweep": sweep_report, "curve": curve_report, "plan": plan_report}
    allowed = "(allowed: a run, sweep, curve or plan folder)"
    if kind is None:
        raise SpecError(p, "", f"{'not an llmsim output folder' if p.exists() else 'folder not found'} {allowed}")
    if kind not in makers:
        raise SpecError(p, "", f"an llmsim {kind} folder has no report {allowed}")
    try:
        return makers[kind](p)
    except OSError as e:  # a file its manifest promises is missing or unreadable
        raise SpecError(p, Path(e.filename or "").name, f"{e.strerror or e} (allowed: the complete "
                        f"{kind} folder llmsim wrote)") from None
    except (ValueError, KeyError, TypeError, IndexError) as e:  # damaged JSON or CSV
        what = " ".join(str(e).split())[:120]
        raise SpecError(p, "", f"damaged {kind} folder: {type(e).__name__}: {what} "
                        f"(allowed: the complete {kind} folder llmsim wrote)") from None


def run_report(p: Path) -> Report:
    from .cli import ROWS

    s = json.loads((p / "summary.json").read_text())
    rows = []
    for label, f in ROWS:
        try:
            rows.append((label, str(f(s))))
        except (KeyError, TypeError):
            continue
    sec = Section("summary", tables=[("summary", pd.DataFrame(rows, columns=["metric", "value"]))])
    sec.images = [(f.stem, f.read_bytes()) for f in sorted(p.glob("*.png")) if not f.name.startswith("report_")]
    keys = [("requests/s", _fmt(s["request_throughput"])), ("p99 TTFT (s)", _fmt(s["ttft_s"]["p99"])),
            ("p99 TPOT (s)", _fmt(s["tpot_s"]["p99"]))]
    return Report(f"llmsim run: {s.get('scenario', p.name)}", keys, [sec])


def sweep_report(p: Path) -> Report:
    meta = manifest(p) or {}  # the sweep's fields and scenario (sim/sweep.py)
    t = pd.read_csv(p / "results.csv")
    fields = [c for c in meta.get("fields", []) if c in t.columns]
    cols = fields + [c for c in ("request_throughput", "ttft_s.p99", "tpot_s.p99", "e2e_s.p99",
                                 "goodput.fraction_met", "gpu_busy_fraction", "gpu_kernel_fraction", "preemptions")
                                 if c in t.columns]
    sec = Section("results", [f"{len(t)} configurations of <code>{html.escape(str(meta.get('scenario')))}</code>;"
                              " the full table is results.csv / results.parquet."], [("results", t[cols])])
    return Report(f"llmsim sweep: {p.name}", [("configurations", str(len(t)))], [sec])


def curve_report(p: Path) -> Report:
    t = pd.read_csv(p / "curve.csv")
    k = pd.read_csv(p / "knees.csv")
    from .curve import KNEE_THROUGHPUT_RATIO

    text = [f"Knee: the highest offered rate at which this and every lower rate keep p99 TTFT under the "
            f"bound and steady throughput at least {KNEE_THROUGHPUT_RATIO:.0%} of offered."]
    sec = Section("throughput-latency curves", text, [("knees", k), ("curve", t)],
                  [("curves", (p / "curve.png").read_bytes())])
    keys = [(f"knee: {n}", f"{_fmt(r)} req/s") for n, r in zip(k.scenario, k.knee_rate, strict=True)]
    return Report(f"llmsim curve: {p.name}", keys, [sec])


def plan_report(p: Path) -> Report:
    from .plan_report import plan_sections

    return plan_sections(json.loads((p / "plan.json").read_text()))
