"""README.md quotes data/: its generated blocks equal what the committed records say."""

from __future__ import annotations

import re

import pytest

from fp4lab.core import paths
from fp4lab.report import readme


@pytest.fixture
def committed_data(monkeypatch):
    monkeypatch.setenv("FP4LAB_DATA_DIR", str(paths.COMMITTED_DATA))


def test_readme_blocks_agree_with_the_committed_records(committed_data):
    text = (paths.REPO_ROOT / "README.md").read_text()
    assert "<!-- generated: findings -->" in text and "<!-- generated: timings -->" in text
    assert readme.render(text) == text, "README.md is stale or edited by hand: run `make readme`"


def test_a_number_changed_by_hand_is_caught(committed_data):
    text = (paths.REPO_ROOT / "README.md").read_text()
    start = text.index("<!-- generated: timings -->")
    measured = re.compile(r"(\d+\.\d+) s together").search(text, start)
    assert measured, "the timings block quotes the story's seconds"
    changed = f"{float(measured.group(1)) + 1:.2f}"
    edited = text[: measured.start(1)] + changed + text[measured.end(1) :]
    assert readme.render(edited) == text, "the measured number is restored from the records"


def test_an_unknown_block_is_refused():
    with pytest.raises(ValueError, match="allowed: notebooks, findings, timings"):
        readme.render("<!-- generated: gossip -->\nx\n<!-- end: gossip -->")
