"""The Chromium check of exported pages, shown failing on pages made to break each rule it keeps
(``browser.readable``), and passing on one that keeps them all."""

from __future__ import annotations

import nbformat
import pytest

from browser import FIRST_SCREEN, STREAM_LINES, TALL_CELL, rendered
from fp4lab.core import paths, runner

pytestmark = pytest.mark.browser

GOOD = ("<p><strong>BLOCKED</strong>: 3 of 3.</p><table><tr><th>SM</th><th>what to run</th></tr>"
        "<tr><td>SM12.0</td><td>SGLang 0.5.19</td></tr></table>")  # fmt: skip

BROKEN = {
    "its verdict is not within": f"<div style='height:{FIRST_SCREEN + 200}px'></div>{GOOD}",
    "cells taller than": GOOD + f"<table><tr><td style='height:{TALL_CELL + 60}px'>x</td></tr></table>",
    "truncated table cells": GOOD + "<table><tr><td>1</td></tr><tr><td>\u2026</td></tr></table>",
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


def _exported(tmp_path, printed: list[str]):
    """A notebook that opens with its answer and prints ``printed``, exported as the runner
    exports every notebook (nbconvert's own markup for printed text)."""
    v4 = nbformat.v4
    cell = v4.new_code_cell("print(...)", outputs=[
        v4.new_output("stream", name="stdout", text="\n".join(printed) + "\n")])  # fmt: skip
    answer = "**BLOCKED**: 3 of 3.\n\n| SM | what to run |\n|---|---|\n| SM12.0 | SGLang 0.5.19 |"
    notebook = v4.new_notebook(cells=[v4.new_markdown_cell(answer), cell])
    executed = tmp_path / "executed" / "printed.ipynb"
    executed.parent.mkdir(parents=True)
    nbformat.write(notebook, executed)
    return runner.export_html(executed, tmp_path / "html")


def test_printed_lines_past_the_limit_fail_a_page_and_environment_lines_do_not_count(tmp_path):
    environments = [f"[env] build/sglang-compile/0.5.{i}/venv: reused in 0 s, 9 MiB of its own "
                    f"(log: build/sglang-compile/0.5.{i}/venv.build.log)" for i in range(30)]  # fmt: skip
    page = _exported(tmp_path, [*environments, "66 cells: 17 blocked"])
    found = rendered(page, tmp_path / "env.png", answer_first=True)
    assert found["layout"]["stream_lines"] == 1
    page = _exported(tmp_path / "replays", [f"replay {i}" for i in range(STREAM_LINES + 5)])
    with pytest.raises(AssertionError, match=f"{STREAM_LINES + 5} lines of stream output"):
        rendered(page, tmp_path / "replays.png", answer_first=True)


@pytest.mark.parametrize("required", ["CI", "FP4LAB_PAGES"])
def test_without_chromium_make_pages_and_ci_fail_where_a_test_run_skips(monkeypatch, required):
    """`make pages` exists to render the pages: a missing Chromium fails it (and CI), never a
    skip that reads as a pass; elsewhere the rendering is skipped, visibly."""
    import browser

    monkeypatch.setattr(browser.shutil, "which", lambda name: None)
    for name in ("CI", "FP4LAB_PAGES"):
        monkeypatch.delenv(name, raising=False)
    assert browser.chromium() is None
    monkeypatch.setenv(required, "1")
    with pytest.raises(pytest.fail.Exception, match="chromium"):
        browser.chromium()
