"""Exported notebooks in headless Chromium, at the window the decision report must fit.

``rendered`` opens a page at ``WIDTH`` and fails when any element runs past the window or scrolls
sideways; ``clean`` fails when the page shows ``NOISE``; ``exported`` exports an executed notebook
with the project's own exporter (``runner.export_html``) and does both. Without Chromium the
rendering is skipped, visibly (after the checks that need no browser); on CI (``CI`` set) and
under `make pages` it fails, for CI must install it (.ci/run does) and `make pages` renders.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from html.parser import HTMLParser
from pathlib import Path

import pytest

from fp4lab.core import evidence, paths, runner

WIDTH = 1300
"""The window every exported page must fit, in CSS pixels."""
OVERFLOWING = """() => [...document.querySelectorAll('body *')].filter(e => {
    const box = e.getBoundingClientRect();
    return box.right > window.innerWidth + 1 || e.scrollWidth > e.clientWidth + 1 &&
        ['auto', 'scroll', 'hidden'].includes(getComputedStyle(e).overflowX);
}).map(e => `${e.tagName}.${e.className}: ${e.scrollWidth} > ${e.clientWidth}`).slice(0, 10)"""
"""Every element that runs past the window's right edge or scrolls sideways inside its box."""
NOISE = {
    "uv's install lines": re.compile(
        r"^[ \t]*(?:\[env\] {3}|(?:Resolved|Prepared|Installed|Uninstalled|Audited|Downloaded|Built)"
        r" \d+ packages?\b|[+-] [\w.\[\],-]+==)",
        re.MULTILINE,
    ),
    "a library warning": re.compile(r"\b\w*Warning: |Traceback"),
    "a stray return value": re.compile(r"PosixPath\("),
}
"""What a report must not show, by what it is, looked for in the text of the page's body. A
warning is known by its category ("UserWarning: "): dynamo's ``lru_cache`` warning printed is
noise, its words quoted on purpose (notebook 01's cache warnings) are not."""


LAYOUT = """() => {
    const top = e => e.getBoundingClientRect().top + window.scrollY;
    const verdicts = %s;
    const verdict = [...document.querySelectorAll('strong, b')].find(
        e => verdicts.includes(e.innerText.trim()));
    const shown = document.querySelector('img, table');
    const streams = [...document.querySelectorAll('.jp-RenderedText')];
    return {
        verdict_top: verdict ? top(verdict) : null,
        shown_top: shown ? top(shown) : null,
        tall_cells: [...document.querySelectorAll('td, th')].filter(
            c => c.getBoundingClientRect().height > %d).map(c => c.innerText.slice(0, 60)).slice(0, 5),
        truncated: [...document.querySelectorAll('td, th')].filter(
            c => ['...', '\u2026'].includes(c.innerText.trim())).length,
        stream_lines: streams.reduce((n, e) => n + e.innerText.split('\\n').filter(
            l => l.trim() && !l.startsWith('[env] ')).length, 0),
    };
}"""
"""Where a page's answer is and what would make it hard to read: the top of its first verdict
(a bold word of ``evidence.VERDICTS``) and of its first figure or table, table cells taller than
``TALL_CELL``, pandas' truncation rows, and the lines of stream output it shows beyond the one
line per environment it may show (``[env] ...``; nbconvert renders a notebook's printed text,
stdout and stderr, and a value's plain repr as ``.jp-RenderedText``)."""
FIRST_SCREEN = 1400
"""How far down, in CSS pixels at WIDTH, a page's verdict and first figure or table must be."""
TALL_CELL = 240
"""The tallest a table cell may be, in CSS pixels."""
STREAM_LINES = 40
"""The most lines of stream output (stdout, stderr) a page may show."""


def machine_paths(text: str) -> list[str]:
    """Absolute paths of this machine a page's text shows: the checkout, home, temporary folder."""
    import tempfile

    roots = {str(paths.REPO_ROOT), os.path.expanduser("~"), tempfile.gettempdir()}
    return sorted({m.group(0) for root in roots if len(root) > 1
                   for m in re.finditer(re.escape(root) + r"/[^\s'\"]*", text)})[:5]  # fmt: skip


def readable(found: dict, answer_first: bool) -> list[str]:
    """What makes a rendered page (``rendered``'s layout) hard to read, in words; with
    ``answer_first``, also a verdict or first figure or table below ``FIRST_SCREEN``."""
    layout, said = found["layout"], []
    if answer_first and (layout["verdict_top"] is None or layout["verdict_top"] > FIRST_SCREEN):
        said.append(f"its verdict is not within {FIRST_SCREEN} px (at {layout['verdict_top']})")
    if answer_first and (layout["shown_top"] is None or layout["shown_top"] > FIRST_SCREEN):
        said.append(f"no figure or table within {FIRST_SCREEN} px (at {layout['shown_top']})")
    if layout["tall_cells"]:
        said.append(f"cells taller than {TALL_CELL} px: {layout['tall_cells']}")
    if layout["truncated"]:
        said.append(f"{layout['truncated']} truncated table cells")
    if layout["stream_lines"] > STREAM_LINES:
        said.append(f"{layout['stream_lines']} lines of stream output (at most {STREAM_LINES})")
    if machine_paths(found["text"]):
        said.append(f"machine paths: {machine_paths(found['text'])}")
    return said


def chromium() -> str | None:
    """Chromium's executable, None where it is not installed; on CI, and under `make pages`
    (``FP4LAB_PAGES``), whose whole point is rendering the pages, a missing one fails."""
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None and os.environ.get("CI"):
        pytest.fail("CI must install Debian's chromium (.ci/run does) to check the rendered pages")
    if found is None and os.environ.get("FP4LAB_PAGES"):
        pytest.fail("`make pages` renders every page in headless Chromium: install Debian's "
                    "chromium (apt-get install chromium, as .ci/run does)")  # fmt: skip
    return found


def rendered(page_path: Path, shot: Path, answer_first: bool = False) -> dict:
    """The page at WIDTH in headless Chromium, which it must fit and be readable in (``readable``;
    with ``answer_first`` its verdict and a figure or table on the first screen): its first
    screen's text, width, overflowing elements, table row counts, layout, whole text; a full-page
    screenshot in ``shot``."""
    executable = chromium()
    if executable is None:
        pytest.skip(
            f"chromium is not installed on this machine (.ci/run installs it): "
            f"{page_path.name} not rendered"
        )
    from playwright.sync_api import sync_playwright

    shot.parent.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=executable,
            args=[
                "--no-sandbox",
                "--disable-gpu",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--no-first-run",
            ],
        )
        try:
            page = browser.new_page(viewport={"width": WIDTH, "height": 900})
            page.goto(page_path.as_uri())
            found = {
                "first_screen": page.inner_text("body")[:3000],
                "page_width": page.evaluate("() => document.documentElement.scrollWidth"),
                "overflowing": page.evaluate(OVERFLOWING),
                "tables": page.evaluate(
                    "() => [...document.querySelectorAll('table')].map(t => t.rows.length)"
                ),
                "text": page.inner_text("body"),
                "layout": page.evaluate(LAYOUT % (json.dumps(list(evidence.VERDICTS)), TALL_CELL)),
            }
            page.screenshot(path=str(shot), full_page=True)
        finally:
            browser.close()
    assert found["page_width"] <= WIDTH, f"the page is {found['page_width']} px wide at {WIDTH} px"
    assert found["overflowing"] == [], f"elements wider than their box: {found['overflowing']}"
    hard = readable(found, answer_first)
    assert hard == [], f"{page_path.name} is hard to read: {'; '.join(hard)}"
    return found


class _Text(HTMLParser):
    """The text of a page's body, without its scripts and styles."""

    def __init__(self) -> None:
        super().__init__()
        self.parts: list[str] = []
        self.hidden = 0

    def handle_starttag(self, tag: str, attrs: list) -> None:
        self.hidden += tag in ("head", "script", "style")

    def handle_endtag(self, tag: str) -> None:
        self.hidden -= tag in ("head", "script", "style")

    def handle_data(self, data: str) -> None:
        if not self.hidden:
            self.parts.append(data)


def clean(page_path: Path) -> str:
    """The text of the page's body, after failing on the first NOISE it shows or a NaN cell the
    HTML holds (no browser needed)."""
    html = page_path.read_text()
    reader = _Text()
    reader.feed(html)
    text = "".join(reader.parts)
    for what, pattern in NOISE.items():
        seen = pattern.search(text)
        assert seen is None, f"{page_path.name} shows {what}: {seen and seen.group(0)!r}"
    assert "<td>NaN</td>" not in html, f"{page_path.name} shows a NaN cell"
    return text


def exported(executed: Path) -> str:
    """``executed`` exported as the runner exports it (to html/ beside its folder); the text of
    its page, once it is free of NOISE (``clean``) and fits WIDTH in Chromium, readable with its
    answer on the first screen (``rendered``, the screenshot in build/test/)."""
    page = runner.export_html(executed, executed.parent.parent / "html")
    text = clean(page)
    rendered(page, paths.build_dir() / "test" / f"{executed.stem}.png", answer_first=True)
    return text


def environment_lines(text: str, where: str) -> list[str]:
    """What each line ``core.venvs`` says of the environment at ``where`` (as ``paths.shown``
    writes it) in a page's ``text`` tells: built or reused."""
    at = re.escape(where)
    line = rf"^\[env\] {at}: (built|reused) in \d+ s, \d+ MiB of its own \(log: {at}\.build\.log\)$"
    return re.findall(line, text, re.MULTILINE)
