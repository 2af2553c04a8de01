"""How the report's tables look in HTML: wrapped to the page, never wider than it."""

from __future__ import annotations

import html

import pandas as pd
from pandas.io.formats.style import Styler

from fp4lab.core.page import WRAPPED


def link(notebook: str) -> str:
    """An HTML link to a notebook's exported page, which lies beside the report's."""
    return f'<a href="{html.escape(notebook)}.html">{html.escape(notebook[:2])}</a>'


def table(
    frame: pd.DataFrame, widths: dict[str, str] | None = None, raw: tuple[str, ...] = ()
) -> Styler:
    """``frame`` as a wrapped table without its index; ``widths`` per column (CSS), columns in
    ``raw`` hold HTML (links) and are not escaped, every other cell is."""
    styler = frame.style.hide(axis="index").format(
        lambda v: html.escape("" if v is None else str(v)),
        subset=[c for c in frame.columns if c not in raw],
    )
    styles = list(WRAPPED)
    for i, column in enumerate(frame.columns):
        if widths and column in widths:
            styles.append(
                {"selector": f"th.col_heading.col{i}", "props": f"width: {widths[column]};"}
            )
    return styler.set_table_styles(styles)
