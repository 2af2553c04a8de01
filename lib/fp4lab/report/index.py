"""The reports' front page, ``index.html``: the decision report's answer first, linked, then
every notebook with its verdict and deciding number, all from records.

    python -m fp4lab.report.index HTML_DIR [NOTEBOOKS_DIR]

``core.runner`` runs it after the exports (the report reads records; core never imports it).
"""

from __future__ import annotations

import os
import sys
from html import escape
from pathlib import Path

import mistune

from fp4lab.core import catalog, page, paths, records
from fp4lab.report import decision, view

REPORT = "10_decision_report"

STYLE = (
    "body{font-family:system-ui,sans-serif;max-width:1260px;margin:16px auto;padding:0 12px;"
    "line-height:1.45}"
    + page.css()
    + "th,td{border:1px solid #ccc}th{background:#f3f3f3}.answer{font-size:1.05em}"
)
"""The report's table styles (``core.page``), on a page as wide as the report's."""

COLUMNS = ("notebook", "shows", "verdict", "deciding number", "evidence", "status", "seconds",
           "ran at (UTC)", "reason")  # fmt: skip
WIDTHS = ("11%", "14%", "9%", "26%", "12%", "6%", "5%", "8%", "9%")


def _row(nb: catalog.Notebook, html_dir: Path, ran: dict | None) -> str:
    summary = next((r["values"] for r in reversed(records.latest(nb.name))
                    if r["kind"] == "summary"), {})  # fmt: skip
    said = ran["values"] if ran else {}
    name = escape(nb.name)
    link = f'<a href="{name}.html">{name}</a>' if (html_dir / f"{nb.name}.html").exists() else name
    cells = [
        link, escape(nb.title), f"<strong>{escape(summary.get('verdict', ''))}</strong>",
        escape(view.within(summary["number"], view.CELL_WORDS, nb.name) if summary.get("number") else ""),
        escape(", ".join(summary.get("evidence", []))),
        escape(said.get("status", "not run")), escape(str(said.get("seconds", ""))),
        escape(ran["provenance"]["time_utc"] if ran else ""), escape(said.get("reason", "")),
    ]  # fmt: skip
    return "<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>"


def page(notebooks: list[catalog.Notebook], html_dir: Path) -> str:
    """The front page's HTML."""
    ran = {r["values"]["notebook"]: r for r in records.read("reproduce")}
    lead = ""
    if any(nb.name == REPORT for nb in notebooks):
        report = f'<p><a href="{REPORT}.html">The decision report, with its evidence &rarr;</a></p>'
        lead = f"<div class='answer'>{mistune.html(decision.answer())}</div>{report}"
    head = "".join(
        f"<th style='width:{w}'>{escape(c)}</th>" for c, w in zip(COLUMNS, WIDTHS, strict=True)
    )
    rows = "".join(_row(nb, html_dir, ran.get(nb.name)) for nb in notebooks)
    return (
        "<!doctype html><html lang='en'><meta charset='utf-8'><title>fp4lab reports</title>"
        f"<style>{STYLE}</style><h1>fp4lab: which serving optimizations work for FP4 models</h1>"
        f"{lead}<h2>Every notebook</h2><table><tr>{head}</tr>{rows}</table></html>"
    )


def write(html_dir: Path, folder: Path | None = None) -> Path:
    """``html_dir/index.html`` for the notebooks of ``folder`` (the project's by default),
    written whole or not at all."""
    notebooks = catalog.notebooks(folder) if folder else catalog.notebooks()
    html_dir.mkdir(parents=True, exist_ok=True)
    index = html_dir / "index.html"
    partial = html_dir / f".index.{os.getpid()}.partial.html"
    partial.write_text(page(notebooks, html_dir))
    partial.replace(index)
    return index


if __name__ == "__main__":
    written = write(Path(sys.argv[1]), Path(sys.argv[2]) if len(sys.argv) > 2 else None)
    print(f"index: {paths.shown(written)}")
