"""The Chromium check of exported pages, shown failing on pages made to break each rule it keeps
(``browser.readable``), and passing on one that keeps them all."""

from __future__ import annotations

import pytest

from browser import FIRST_SCREEN, STREAM_LINES, TALL_CELL, rendered
from fp4lab.core import paths

pytestmark = pytest.mark.browser

GOOD = ("<p><strong>BLOCKED</strong>: 3 of 3.</p><table><tr><th>SM</th><th>what to run</th></tr>"
        "<tr><td>SM12.0</td><td>SGLang 0.5.19</td></tr></table>")  # fmt: skip
STDOUT = '<div data-mime-type="application/vnd.jupyter.stdout"><pre>{}</pre></div>'

BROKEN = {
    "its verdict is not within": f"<div style='height:{FIRST_SCREEN + 200}px'></div>{GOOD}",
    "cells taller than": GOOD + f"<table><tr><td style='height:{TALL_CELL + 60}px'>x</td></tr></table>",
    "truncated table cells": GOOD + "<table><tr><td>1</td></tr><tr><td>\u2026</td></tr></table>",
    "lines of stream output": GOOD + STDOUT.format("\n".join(f"replay {i}" for i in range(STREAM_LINES + 5))),
    "machine paths": GOOD + f"<p>written to {paths.REPO_ROOT}/build/x.json</p>",
}  # fmt: skip


def _page(tmp_path, name: str, body: str):
    page = tmp_path / f"{name}.html"
    page.write_text(f"<!doctype html><html><meta charset='utf-8'><body>{body}</body></html>")
    return page


def test_a_page_that_opens_with_its_answer_passes(tmp_path):
    found = rendered(_page(tmp_path, "good", GOOD), tmp_path / "good.png", answer_first=True)
    assert found["layout"]["verdict_top"] < FIRST_SCREEN and found["layout"]["stream_lines"] == 0


@pytest.mark.parametrize("said", list(BROKEN))
def test_each_rule_fails_on_a_page_made_to_break_it(tmp_path, said):
    page = _page(tmp_path, "broken", BROKEN[said])
    with pytest.raises(AssertionError, match=f"hard to read: .*{said}"):
        rendered(page, tmp_path / "broken.png", answer_first=True)
