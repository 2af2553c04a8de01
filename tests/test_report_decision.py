"""The decision report quotes each notebook's last good run: a newer failed, killed or empty run
is listed beside it, never in its place."""

from __future__ import annotations

from fp4lab.core import records
from fp4lab.report import decision

AUDIT = "12_fp4_api_audit"


def _audit_run(monkeypatch, run_id: str, summary: dict | None) -> None:
    monkeypatch.setattr(records, "RUN_ID", run_id)
    records.append(AUDIT, "entry", {"verdict": "one graph"})
    if summary is not None:
        records.append(AUDIT, "summary", summary)


def test_the_report_keeps_the_last_good_run_and_lists_the_newer_ones(isolated_outputs, monkeypatch):
    good = {"status": "measured", "headline": "0.7.4: SM12.0: 3/9", "needs": "cpu"}
    _audit_run(monkeypatch, "good", good)
    _audit_run(monkeypatch, "typo", {"status": "not measured", "headline": "9.9.9: not measured"})
    _audit_run(monkeypatch, "killed", None)
    monkeypatch.setattr(records, "RUN_ID", "runner")
    records.append("reproduce", "notebook", {"notebook": AUDIT, "status": "failed",
                                             "reason": "cell 5 of 9: KeyboardInterrupt"})  # fmt: skip
    row = decision.decision_table().loc["FlashInfer FP4 API under fullgraph=True"]
    assert (row["status here"], row["measured effect"]) == ("measured", "0.7.4: SM12.0: 3/9")
    passed = decision.passed_over_table().loc[AUDIT]
    assert list(passed["records"]) == [2, 1]
    assert list(passed["passed over because"]) == [
        "not measured: 9.9.9: not measured",
        "it wrote no summary: it failed or was cut short",
    ]
    assert set(passed["make reproduce said"]) == {"failed: cell 5 of 9: KeyboardInterrupt"}


def test_nothing_passed_over_gives_an_empty_table_with_its_columns(isolated_outputs):
    table = decision.passed_over_table()
    assert table.empty and "passed over because" in table.columns
