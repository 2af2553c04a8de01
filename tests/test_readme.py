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


def test_fresh_clone_timings_say_met_or_missed_from_each_newest_record():
    """The cold reproduce and CI lines come from the newest record holding each, and say whether
    each goal was met, both ways."""
    from fp4lab.report import findings

    prov = {"git": {"commit": "0123456789abcdef"}}
    notebooks = {
        "11_sglang": ["ran", 900.0],
        "14_models": ["failed", 1200.0],
        "00_env": ["ran", 5.0],
    }
    slow = {
        "reproduce_cold_s": 3000.0,
        "build_cold_bytes": 20 * 2**30,
        "reproduce_cold_notebooks": notebooks,
        "pages_cold_checked": ["00_env", "index"],
        "pages_cold_exit": 1,
        "pages_cold_chromium": True,
        "pages_cold_commit": prov["git"]["commit"],
    }
    fast = {
        "reproduce_cold_s": 2000.0,
        "build_cold_bytes": 30 * 2**30,
        "reproduce_cold_notebooks": {},
    }
    rows = [{"values": v, "provenance": prov} for v in (fast, slow, {"ci_s": 1300.0, "ci_exit": 2})]
    cold, ci = findings._fresh_clone_lines(rows)
    assert (
        "3000 s, goal 45 min MISSED; slowest: 14_models 1200 s, 11_sglang 900 s, 00_env 5 s" in cold
    )
    assert "did not run to the end: 14_models; its build/ 20.00 GiB, goal 25 GiB met" in cold
    assert cold.endswith("; its 2 pages in headless Chromium (`make pages`): FAILED (exit 1);")
    assert "1300 s, goal 20 min MISSED, FAILED (exit 2)" in ci
    passed = {"ci_s": 900.0, "ci_exit": 0, "ci_chromium_installed_before": True}
    cold, ci = findings._fresh_clone_lines(
        [rows[1], rows[0], {"values": passed, "provenance": prov}]
    )
    assert cold.endswith(
        "2000 s, goal 45 min met; its build/ 30.00 GiB, goal 25 GiB MISSED; its 2 pages in "
        "headless Chromium (`make pages`): FAILED (exit 1);"
    ), "the pages of that commit, from the record that checked them"
    slow["pages_cold_exit"] = 0
    [cold] = findings._fresh_clone_lines(rows[1:2])
    assert cold.endswith(
        "goal 25 GiB met; its 2 pages in headless Chromium (`make pages`): all pass;"
    )
    for unrendered in ({"pages_cold_chromium": False}, {"pages_cold_commit": "fedcba9876543210"}):
        [cold] = findings._fresh_clone_lines(
            [{"values": {**slow, **unrendered}, "provenance": prov}]
        )
        assert cold.endswith("its pages: no record of them rendered in Chromium;"), unrendered
    assert (
        "900 s (Chromium already installed: its apt install not timed), goal 20 min met, passed"
        in ci
    )
    passed["ci_chromium_installed_before"] = False
    [ci] = findings._fresh_clone_lines([{"values": passed, "provenance": prov}])
    assert "900 s (Chromium installed by it), goal 20 min met" in ci


def test_each_finding_is_short_prose_and_the_replays_answers_are_tables(committed_data):
    """At most ``findings.WORDS`` words a finding (what is cut is on the notebook's page); the
    SGLang replays' answers are tables, their releases as ranges (never one release after another)."""
    from fp4lab.report import findings, view

    said = findings.findings()
    bullets = [line for line in said.splitlines() if line.startswith("- ")]
    assert bullets and max(len(b.split()) for b in bullets) <= findings.WORDS
    table = said[said.index("#### GLM-5 per SM (notebook 11)") :]
    assert "| SM | tc_piecewise compiles in | blocked in |" in table
    assert re.search(r"\| SM12\.0 \| 0\.5\.\d+–0\.5\.\d+", table), "releases as ranges"
    assert not re.search(r"0\.5\.\d+, 0\.5\.\d+, 0\.5\.\d+", table), "no enumerations"
    cut = view.within("One two three. Four five six seven eight nine ten.", 9, "04_x")
    assert cut == "One two three; the rest on 04_x's page."


def test_flashinfer_versions_are_written_as_ranges_of_those_measured():
    """Neighbours in the measured list join into one range; a gap in it starts another."""
    from fp4lab.report import findings

    measured = ["0.6.3", "0.6.12", "0.7.0", "0.7.1", "0.7.4"]
    assert findings._ranges(["0.7.0", "0.6.12", "0.7.1"], measured) == "0.6.12–0.7.1"
    assert findings._ranges(["0.6.3", "0.7.0", "0.7.4"], measured) == "0.6.3, 0.7.0, 0.7.4"
