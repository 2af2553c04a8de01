"""history: a notebook's record file keeps the run its readers quote and any newer one."""

from __future__ import annotations

from fp4lab.core import history, records


def _run(monkeypatch, run_id: str, *kinds: str, status: str = "measured") -> None:
    monkeypatch.setattr(records, "RUN_ID", run_id)
    for kind in kinds:
        values = {"status": status, "headline": f"from {run_id}"} if kind == "summary" else {}
        records.append("nb", kind, values)


def test_prune_drops_only_the_runs_no_reader_quotes(isolated_outputs, monkeypatch):
    _run(monkeypatch, "first", "row", "summary")
    _run(monkeypatch, "good", "row", "row", "summary")
    _run(monkeypatch, "killed", "row")
    _run(monkeypatch, "empty", "row", "summary", status="not measured")
    path = isolated_outputs / "data" / "nb.jsonl"
    written = path.read_text().splitlines()
    quoted, newer = records.latest("nb"), records.newer_runs("nb")
    assert history.prune("nb") == 2, "the first run's row and summary"
    assert path.read_text().splitlines() == written[2:], "the rest kept as written, in order"
    assert records.latest("nb") == quoted and records.newer_runs("nb") == newer
    assert history.prune("nb") == 0 and history.prune("missing") == 0


def test_an_unknown_notebook_is_refused_naming_the_known_ones(isolated_outputs, capsys):
    assert history.main(["prune", "99_nothing"]) == 2
    err = capsys.readouterr().err
    assert "unknown notebooks ['99_nothing']" in err and "04_fullgraph_false_tradeoff" in err
