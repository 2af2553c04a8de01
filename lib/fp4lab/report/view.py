"""How the report's tables look in HTML: wrapped to the page, never wider than it."""

from __future__ import annotations

import html
import re

from fp4lab.core.page import table

__all__ = ["link", "table", "within"]


def link(notebook: str) -> str:
    """An HTML link to a notebook's exported page, which lies beside the report's."""
    return f'<a href="{html.escape(notebook)}.html">{html.escape(notebook[:2])}</a>'


CELL_WORDS = 45
"""The most words a table cell of the report or the index says; the rest is on the notebook's page."""


def within(text: str, words: int, notebook: str) -> str:
    """``text`` cut to its first sentences (or clauses) of at most ``words`` words; where cut,
    a pointer to the notebook's page, which says the rest."""
    if len(text.split()) <= words:
        return text.rstrip(".") + "."
    kept: list[str] = []
    for part in re.split(r"(?<=[.;])\s+", text):
        if len(" ".join([*kept, part]).split()) > words - 6:
            break
        kept.append(part)
    said = " ".join(kept).rstrip(".;") if kept else " ".join(text.split()[: words - 6])
    return f"{said}; the rest on {notebook}'s page."
