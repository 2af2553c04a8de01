"""Every page the last ``make reproduce`` exported (build/html), in headless Chromium: ``make
pages`` runs this file after a reproduce. Each page is free of noise and NaN cells (``clean``),
fits the window and is readable, with its verdict and a figure or table on its first screen
(``rendered``; 00, an inventory of the machine, records no verdict). Where no page was exported
(``make test`` on a fresh clone, whose workers have build folders of their own) it is skipped,
visibly."""

from __future__ import annotations

from pathlib import Path

import pytest

from browser import clean, rendered
from fp4lab.core import paths

pytestmark = pytest.mark.browser

EXPORTED = sorted((paths.build_dir() / "html").glob("*.html"))
"""The pages of the last reproduce in this build folder."""
NO_VERDICT = {"00_environment"}
"""Pages whose answer is a table, not a verdict."""


@pytest.mark.skipif(not EXPORTED, reason="no exported pages in build/html: run `make reproduce`")
@pytest.mark.parametrize("page", EXPORTED, ids=[p.stem for p in EXPORTED])
def test_every_exported_page_opens_with_its_answer_and_reads(page: Path) -> None:
    clean(page)
    shot = paths.build_dir() / "test" / "pages" / f"{page.stem}.png"
    rendered(page, shot, answer_first=page.stem not in NO_VERDICT)
    assert shot.stat().st_size > 10_000
