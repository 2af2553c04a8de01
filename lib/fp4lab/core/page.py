"""How fp4lab's tables look on an HTML page: as wide as the page, every cell wrapped, so no report
runs past its window (long paths and frames included).

``WRAPPED`` is the rule set (the report's tables apply it to their ``Styler``); ``in_notebook``
shows it once as a style element in a notebook's output, so every DataFrame the notebook shows
follows it in the exported page too. A notebook's page opens with its cells tagged ``ANSWER``
(``runner.export_html``).
"""

from __future__ import annotations

import logging

from fp4lab.core import progress

WRAPPED = [
    {"selector": "", "props": "width: 100%; table-layout: fixed; border-collapse: collapse;"},
    {
        "selector": "th, td",
        "props": "text-align: left; vertical-align: top; white-space: normal; "
        "overflow-wrap: anywhere; word-break: break-word; padding: 4px 6px;",
    },
]
"""A fixed-layout table as wide as the page, every cell wrapped (long paths and frames too)."""


def css(table: str = "table") -> str:
    """WRAPPED as CSS for the tables ``table`` selects."""
    rules = []
    for rule in WRAPPED:
        parts = rule["selector"].split(",") if rule["selector"] else [""]
        selectors = ", ".join(f"{table} {part.strip()}".strip() for part in parts)
        rules.append(f"{selectors}{{{rule['props']}}}")
    return "".join(rules)


KNOWN_WARNINGS = ("IProgress not found",)
"""Library warnings a notebook's page does not show: tqdm's, when a library imports
``tqdm.auto`` in a kernel without ipywidgets (its bars fall back to text)."""


LOGGED_OFF_PAGE = ("torchao",)
"""Libraries whose log lines go to the progress log and the terminal, not the page: torchao's CUDA
extensions failing to load on a CPU machine, each with its path in the environment."""


class _ToProgress(logging.Handler):
    """A library's log line to the progress log (``core.progress``), which the terminal shows."""

    def emit(self, record: logging.LogRecord) -> None:
        progress.say(f"{record.name}: {record.getMessage()}")


def in_notebook() -> None:
    """WRAPPED shown once as a style element for the notebook's DataFrames, KNOWN_WARNINGS kept
    off the page and LOGGED_OFF_PAGE's log lines sent to the progress log, which the terminal
    shows (nothing outside a notebook)."""
    import sys
    import warnings

    if "ipykernel" not in sys.modules:
        return
    from IPython.display import HTML, display

    for message in KNOWN_WARNINGS:
        warnings.filterwarnings("ignore", message=message)
    for name in LOGGED_OFF_PAGE:
        logger = logging.getLogger(name)
        logger.propagate = False
        logger.addHandler(_ToProgress())
    display(HTML(f"<style>{css('table.dataframe')}</style>"))


def details(summary: str, text: str) -> str:
    """``text`` folded under ``summary`` (an HTML details element, both escaped), for a table
    column ``table`` leaves raw: long text a reader opens when wanted."""
    import html

    return f"<details><summary>{html.escape(summary)}</summary>{html.escape(text)}</details>"


def table(frame: object, widths: dict[str, str] | None = None, raw: tuple[str, ...] = ()) -> object:
    """``frame`` (a DataFrame) as a wrapped table without its index, every row shown (a Styler
    truncates none); ``widths`` per column (CSS), columns in ``raw`` hold HTML (links) and are
    not escaped, every other cell is, and an empty cell (None, NaN) is left empty."""
    import html

    import pandas as pd

    styler = frame.style.hide(axis="index").format(
        lambda v: html.escape("" if v is None or (isinstance(v, float) and pd.isna(v)) else str(v)),
        subset=[c for c in frame.columns if c not in raw],
    )
    styles = list(WRAPPED)
    for i, column in enumerate(frame.columns):
        if widths and column in widths:
            styles.append(
                {"selector": f"th.col_heading.col{i}", "props": f"width: {widths[column]};"}
            )
    return styler.set_table_styles(styles)


ANSWER = "answer"
"""The tag of the cells a notebook's page opens with: its verdict cell and its deciding figure."""
