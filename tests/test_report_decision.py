"""The decision report quotes each notebook's last good run: a newer failed, killed or empty run
is listed beside it, never in its place."""

from __future__ import annotations

import pytest

from fp4lab.core import records
from fp4lab.report import decision

AUDIT = "12_fp4_api_audit"


def _audit_run(monkeypatch, run_id: str, summary: dict | None) -> None:
    monkeypatch.setattr(records, "RUN_ID", run_id)
    records.append(AUDIT, "entry", {"verdict": "one graph"})
    if summary is not None:
        records.append(AUDIT, "summary", summary)


def test_the_report_keeps_the_last_good_run_and_lists_the_newer_ones(isolated_outputs, monkeypatch):
    good = {"status": "measured", "headline": "0.7.4: SM12.0: 3/9", "needs": "cpu",
            "verdict": "PARTLY BLOCKED", "number": "3 of 9 compile", "why": "traced"}  # fmt: skip
    _audit_run(monkeypatch, "good", good)
    _audit_run(monkeypatch, "typo", {"status": "not measured", "headline": "9.9.9: not measured"})
    _audit_run(monkeypatch, "killed", None)
    monkeypatch.setattr(records, "RUN_ID", "runner")
    records.append("reproduce", "notebook", {"notebook": AUDIT, "status": "failed",
                                             "reason": "cell 5 of 9: KeyboardInterrupt"})  # fmt: skip
    table = decision.verdict_table().set_index("optimization")
    row = table.loc["FlashInfer's FP4 API under fullgraph=True"]
    assert (row["verdict"], row["number"], row["see"]) == (
        "PARTLY BLOCKED",
        "3 of 9 compile",
        [AUDIT],
    )
    passed = decision.passed_over_table().set_index("notebook").loc[AUDIT]
    assert list(passed["records"]) == [2, 1]
    assert list(passed["passed over because"]) == [
        "not measured: 9.9.9: not measured",
        "it wrote no summary: it failed or was cut short",
    ]
    assert set(passed["make reproduce said"]) == {"failed: cell 5 of 9: KeyboardInterrupt"}


def test_nothing_passed_over_gives_an_empty_table_with_its_columns(isolated_outputs):
    table = decision.passed_over_table()
    assert table.empty and "passed over because" in table.columns


def test_a_question_without_records_is_unmeasured_and_says_why(isolated_outputs):
    table = decision.verdict_table().set_index("optimization")
    assert set(table["verdict"]) == {"UNMEASURED"}
    row = table.loc["Piecewise CUDA graphs, as the story compiled them"]
    assert row["why"].startswith("01_nvcc_subprocess_crash has no records: run make reproduce")
    assert "**UNMEASURED**" in decision.answer()


def test_a_summary_without_a_verdict_is_not_quoted_as_one(isolated_outputs, monkeypatch):
    monkeypatch.setattr(records, "RUN_ID", "old")
    records.append(AUDIT, "summary", {"status": "measured", "headline": "1/38", "needs": "cpu"})
    row = (
        decision.verdict_table()
        .set_index("optimization")
        .loc["FlashInfer's FP4 API under fullgraph=True"]
    )
    assert row["verdict"] == "UNMEASURED" and "predates recorded verdicts" in row["why"]


def test_a_bad_verdict_is_refused_before_it_is_written(isolated_outputs):
    rec = records.Recorder(AUDIT, {})
    with pytest.raises(ValueError, match="verdict='FINE' is not allowed; allowed values: BLOCKED"):
        rec.summary("h", verdict="FINE", number="1", why="w")
    assert rec.written == []
