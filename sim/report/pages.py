"""`llmsim report DIR`: one self-contained HTML page (plus Markdown and CSV) for a run,
sweep, curve or plan folder.

The HTML has inline CSS and its plots as base64 PNG data URIs: it opens with no
network and can be mailed as one file. `report.md` carries the same text and tables,
with the plots as PNG files beside it; each table is also a CSV (`report_<table>.csv`).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd

from sim.io.outdir import add_to_output, folder_kind, manifest, write_output
from sim.io.specload import SpecError
from sim.report.document import Report, Section, fmt_cell, markup, slug, to_html, to_markdown


def report_files(rep: Report, out: Path) -> None:
    """report.html, report.md, report_<table>.csv and report_<plot>.png into `out`."""
    for s in rep.sections:
        for name, df in s.tables:
            df.to_csv(out / f"report_{slug(name)}.csv", index=False)
        for name, data in s.images:
            (out / f"report_{slug(name)}.png").write_bytes(data)
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


READS = {"run": ["summary.json"], "sweep": ["results.csv"], "curve": ["curve.csv", "knees.csv", "curve.png"],
         "plan": ["plan.json"]}  # the files each kind's page reads (and a run's plots)


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
    for name in READS[kind]:  # a link in a shared folder could pull any file into the page
        if (p / name).is_symlink():
            raise SpecError(p, name, "is a link (allowed: the file llmsim wrote there)")
    try:
        return makers[kind](p)
    except OSError as e:  # a file its manifest promises is missing or unreadable
        raise SpecError(p, Path(e.filename or "").name, f"{e.strerror or e} (allowed: the complete "
                        f"{kind} folder llmsim wrote)") from None
    except (ValueError, KeyError, TypeError, IndexError, AttributeError, RecursionError) as e:
        # damaged JSON or CSV: the problem in words, never a quoted value from the file
        what = " ".join(str(e).split())[:120]
        what = what if isinstance(e, KeyError) else re.sub(r"'[^']*'|\"[^\"]*\"", "'...'", what)
        raise SpecError(p, "", f"damaged {kind} folder: {type(e).__name__}: {what} "
                        f"(allowed: the complete {kind} folder llmsim wrote)") from None


def run_report(p: Path) -> Report:
    from sim.report.text import ROWS

    s = json.loads((p / "summary.json").read_text())
    rows = []
    for label, f in ROWS:
        try:
            rows.append((label, str(f(s))))
        except (KeyError, TypeError):
            continue
    sec = Section("summary", tables=[("summary", pd.DataFrame(rows, columns=["metric", "value"]))])
    listed = set((manifest(p) or {}).get("files") or [f.name for f in p.glob("*.png")])
    sec.images = [(f.stem, f.read_bytes()) for f in sorted(p.glob("*.png"))  # its own plots only
                  if f.name in listed and not f.name.startswith("report_") and not f.is_symlink() and f.is_file()]
    keys = [("requests/s", fmt_cell(s["request_throughput"])), ("p99 TTFT (s)", fmt_cell(s["ttft_s"]["p99"])),
            ("p99 TPOT (s)", fmt_cell(s["tpot_s"]["p99"]))]
    sections = [sec]
    if s.get("per_replica"):  # a fleet: the table `llmsim run` prints
        from sim.report.text import REPLICA_COLUMNS, REPLICA_NOTE, replica_cells

        reps = s["per_replica"]
        note = [REPLICA_NOTE + "."] if any(r["role"] == "prefill" for r in reps) else []
        frame = pd.DataFrame(replica_cells(reps), columns=list(REPLICA_COLUMNS))
        sections.append(Section("replicas", note, [("replicas", frame)]))
    if s.get("pipeline"):  # pipeline stages: the table `llmsim run` prints
        from sim.report.text import STAGE_COLUMNS, STAGE_NOTE, stage_cells

        frame = pd.DataFrame(stage_cells(s["pipeline"]), columns=list(STAGE_COLUMNS))
        sections.append(Section("pipeline stages", [STAGE_NOTE + "."], [("stages", frame)]))
    if s.get("energy") or s.get("cost"):
        sections.append(energy_section(s))
    return Report(f"llmsim run: {s.get('scenario', p.name)}", keys, sections)


def energy_section(s: dict) -> Section:
    """The run's energy and dollars, with every figure's source (escaped as table cells)."""
    e, c = s.get("energy") or {}, s.get("cost") or {}
    rows: list[tuple[str, str]] = []
    if e.get("available"):
        rows += [("energy (kWh)", fmt_cell(e["energy_j"] / 3.6e6)),
                 ("energy per request (J)", fmt_cell(e["joules_per_request"])),
                 ("energy per M output tokens (kWh)", fmt_cell(e["kwh_per_m_output_tokens"])),
                 ("average power (W)", fmt_cell(e["average_power_w"])),
                 ("MWh per day at this rate", fmt_cell(e["mwh_per_day"]))]
    if "gpu_hours" in c:
        rows.append(("GPU-hours", fmt_cell(c["gpu_hours"])))
    for kind, usd in (c.get("usd") or {}).items():
        rows += [(f"$ ({kind})", fmt_cell(usd)),
                 (f"$ / M output tokens ({kind})", fmt_cell(c["usd_per_m_output_tokens"][kind]))]
    sources = [("energy", x) for x in e.get("sources", [])]
    sources += [("prices " + str(c.get("prices_date", "")), x) for x in c.get("sources", [])]
    notes = [str(x) for x in (e.get("basis"), e.get("note"), c.get("note")) if x]  # escaped as text
    return Section("energy and cost", notes,
                   [("energy", pd.DataFrame(rows, columns=["metric", "value"])),
                    ("energy sources", pd.DataFrame(sources, columns=["figure", "source"]))])


def sweep_report(p: Path) -> Report:
    meta = manifest(p) or {}  # the sweep's fields and scenario (sim/planning/sweep.py)
    t = pd.read_csv(p / "results.csv")
    fields = [c for c in meta.get("fields", []) if c in t.columns]
    cols = fields + [c for c in ("request_throughput", "ttft_s.p99", "tpot_s.p99", "e2e_s.p99",
                                 "goodput.fraction_met", "gpu_busy_fraction", "gpu_kernel_fraction", "preemptions")
                                 if c in t.columns]
    from sim.planning.sweep import swept_metrics

    cols += [c for c in swept_metrics(fields, t) if c not in cols]
    sec = Section("results", [markup("{} configurations of <code>{}</code>; the full table is "
                                     "results.csv / results.parquet.", len(t), meta.get("scenario"))],
                  [("results", t[cols])])
    return Report(f"llmsim sweep: {p.name}", [("configurations", str(len(t)))], [sec])


def curve_report(p: Path) -> Report:
    t = pd.read_csv(p / "curve.csv")
    k = pd.read_csv(p / "knees.csv")
    from sim.planning.curve import KNEE_THROUGHPUT_RATIO

    text = [f"Knee: the highest offered rate at which this and every lower rate keep p99 TTFT under the "
            f"bound, p99 TPOT under the scenario's TPOT SLO (where it sets one) and steady throughput at "
            f"least {KNEE_THROUGHPUT_RATIO:.0%} of offered; where every rate tried passes, the curve has "
            f"no knee up to the highest rate tried."]
    sec = Section("throughput-latency curves", text, [("knees", k), ("curve", t)],
                  [("curves", (p / "curve.png").read_bytes())])
    words = k["knee"] if "knee" in k else [f"{fmt_cell(r)} req/s" for r in k.knee_rate]  # older folders
    keys = [(f"knee: {n}", str(w)) for n, w in zip(k.scenario, words, strict=True)]
    return Report(f"llmsim curve: {p.name}", keys, [sec])


def plan_report(p: Path) -> Report:
    from sim.report.plan_page import plan_sections

    return plan_sections(json.loads((p / "plan.json").read_text()))
