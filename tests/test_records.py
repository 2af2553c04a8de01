"""records: one JSON line per result, provenance present, appends atomic, latest-run loading."""

from __future__ import annotations

import json
import multiprocessing
import os
import re
import sys

import pytest

from fp4lab.core import history, paths, probe, records


def test_append_writes_one_line_with_provenance(isolated_outputs):
    written = records.append("nb", "kind", {"x": 1.5, "t": (1, 2)}, {"p": "q"})
    lines = (isolated_outputs / "data" / "nb.jsonl").read_text().splitlines()
    assert len(lines) == 1
    record = json.loads(lines[0])
    assert record == json.loads(json.dumps(written))
    assert record["values"] == {"x": 1.5, "t": [1, 2]} and record["params"] == {"p": "q"}
    prov = record["provenance"]
    for key in (
        "packages",
        "device",
        "sm",
        "target_sm",
        "simulated",
        "git",
        "time_utc",
        "run_id",
        "python",
    ):
        assert key in prov, key
    assert prov["packages"]["torch"] and prov["packages"]["flashinfer-python"]
    assert prov["git"]["commit"] is None or len(prov["git"]["commit"]) == 40
    assert prov["simulated"] is False


def test_simulation_is_recorded(isolated_outputs):
    with probe.simulating((12, 0)):
        record = records.append("nb", "kind", {})
    assert record["provenance"]["simulated"] is True and record["provenance"]["target_sm"] == "12.0"
    assert records.append("nb", "kind", {})["provenance"]["simulated"] is False


def test_numbers_made_elsewhere_carry_their_own_target_and_packages(isolated_outputs):
    record = records.append(
        "nb",
        "kind",
        {},
        target={"sm": "12.0", "simulated": True},
        packages={"flashinfer-python": "0.6.3"},
    )
    prov = record["provenance"]
    assert (prov["target_sm"], prov["simulated"], prov["packages"]["flashinfer-python"]) == (
        "12.0",
        True,
        "0.6.3",
    )
    assert prov["packages"]["torch"], "packages not overridden are this process's"


def test_unserialisable_values_fail_before_writing(isolated_outputs):
    records.append("nb", "kind", {"ok": 1})
    with pytest.raises(TypeError, match="cannot record a value of type object"):
        records.append("nb", "kind", {"bad": object()})
    assert len(records.read("nb")) == 1, "nothing already written is lost"


def _hammer(args):
    data_dir, worker = args
    os.environ["FP4LAB_DATA_DIR"] = data_dir
    for i in range(50):
        records.append("shared", "kind", {"worker": worker, "i": i, "pad": "x" * 5000})


def test_concurrent_appends_never_interleave(isolated_outputs):
    with multiprocessing.get_context("fork").Pool(4) as pool:
        pool.map(_hammer, [(str(isolated_outputs / "data"), w) for w in range(4)])
    rows = records.read("shared")
    assert len(rows) == 200
    assert sorted((r["values"]["worker"], r["values"]["i"]) for r in rows) == [
        (w, i) for w in range(4) for i in range(50)
    ]


def test_load_keeps_the_latest_run(isolated_outputs, monkeypatch):
    monkeypatch.setattr(records, "RUN_ID", "old")
    records.append("nb", "kind", {"v": 1})
    monkeypatch.setattr(records, "RUN_ID", "new")
    records.append("nb", "kind", {"v": 2})
    records.append("nb", "kind", {"v": 3})
    frame = records.load("nb")
    assert list(frame["values.v"]) == [2, 3]
    assert len(records.load("nb", latest_run=False)) == 3
    assert records.load("missing").empty


def _run(monkeypatch, run_id: str, *kinds: str, status: str = "measured") -> None:
    monkeypatch.setattr(records, "RUN_ID", run_id)
    for kind in kinds:
        values = {"status": status, "headline": f"from {run_id}"} if kind == "summary" else {}
        records.append("nb", kind, values)


def test_a_failed_or_empty_newer_run_never_hides_the_last_good_one(isolated_outputs, monkeypatch):
    _run(monkeypatch, "first", "row", "summary")
    _run(monkeypatch, "good", "row", "row", "summary")
    assert [r["kind"] for r in records.latest("nb")] == ["row", "row", "summary"]
    assert records.newer_runs("nb") == []
    _run(monkeypatch, "killed", "row")
    _run(monkeypatch, "empty", "row", "summary", status="not measured")
    assert {r["run_id"] for r in records.latest("nb")} == {"good"}
    assert list(records.load("nb")["values.headline"].dropna()) == ["from good"]
    newer = records.newer_runs("nb")
    assert [(n["run_id"], n["records"], n["why"]) for n in newer] == [
        ("killed", 1, "it wrote no summary: it failed or was cut short"),
        ("empty", 2, "not measured: from empty"),
    ]
    assert newer[0]["time_utc"].endswith("+00:00")
    _run(monkeypatch, "better", "summary")
    assert {r["run_id"] for r in records.latest("nb")} == {"better"}
    assert records.newer_runs("nb") == []


def test_without_any_good_run_the_newest_finished_then_the_newest_is_quoted(
    isolated_outputs, monkeypatch
):
    _run(monkeypatch, "a", "row")
    _run(monkeypatch, "b", "row")
    assert {r["run_id"] for r in records.latest("nb")} == {"b"}, "a log with no summaries"
    _run(monkeypatch, "c", "summary", status="not measured here: no GPU")
    _run(monkeypatch, "d", "row")
    assert {r["run_id"] for r in records.latest("nb")} == {"c"}
    assert [n["run_id"] for n in records.newer_runs("nb")] == ["d"]


def test_the_recorders_summary_ends_the_run_with_its_evidence(isolated_outputs):
    rec = records.Recorder("nb", {"n": 1})
    rec.add("row", {"evidence": ["trace", "simulated_target"]})
    rec.add("row", {"evidence": ["trace", "reference_kernel"]})
    summary = rec.summary(
        "two rows", verdict="WORKS", number="2 rows", why="both ran", needs="cpu",
        provenance={"target": {"sm": "12.0", "simulated": True}},
    )  # fmt: skip
    assert summary["values"] == {
        "status": "measured",
        "headline": "two rows",
        "evidence": ["trace", "simulated_target", "reference_kernel"],
        "verdict": "WORKS",
        "number": "2 rows",
        "why": "both ran",
        "needs": "cpu",
    }
    assert (summary["provenance"]["target_sm"], summary["provenance"]["simulated"]) == (
        "12.0",
        True,
    )
    assert [r["kind"] for r in rec.written] == ["row", "row", "summary"]
    assert records.latest("nb") == rec.written


def test_interactive_runs_write_under_build_and_read_committed_records(tmp_path, monkeypatch):
    monkeypatch.delenv("FP4LAB_DATA_DIR", raising=False)
    monkeypatch.delenv("FP4LAB_FIGURES_DIR", raising=False)
    monkeypatch.setenv("FP4LAB_BUILD_DIR", str(tmp_path / "build"))
    committed = tmp_path / "committed"
    committed.mkdir()
    (committed / "nb_old.jsonl").write_text(json.dumps({"run_id": "r0", "kind": "k"}) + "\n")
    monkeypatch.setattr(paths, "COMMITTED_DATA", committed)
    assert paths.figures_dir() == tmp_path / "build" / "figures"
    records.append("nb_new", "kind", {"x": 1})
    assert (tmp_path / "build" / "data" / "nb_new.jsonl").exists()
    assert not (committed / "nb_new.jsonl").exists(), "an interactive run never writes data/"
    assert [r["kind"] for r in records.read("nb_old")] == ["k"], "the report still sees data/"
    monkeypatch.setenv("FP4LAB_DATA_DIR", str(tmp_path / "elsewhere"))
    assert records.read("nb_old") == [], "an explicit folder is the only one read"


def test_recorder_adds_with_its_notebook_and_parameters(isolated_outputs, capsys):
    rec = records.Recorder("nb", {"p": 1})
    rec.add("one", {"x": 1})
    assert rec.add_all("row", [{"i": 0}, {"i": 1}]) == [{"i": 0}, {"i": 1}]
    rec.skip("gpu_check", "no CUDA GPU")
    rows = records.read("nb")
    assert [r["kind"] for r in rows] == ["one", "row", "row", "skipped"]
    assert all(r["params"] == {"p": 1} and r["notebook"] == "nb" for r in rows)
    assert rows[-1]["values"] == {
        "check": "gpu_check",
        "status": "skipped",
        "reason": "no CUDA GPU",
    }
    assert "SKIPPED gpu_check: no CUDA GPU" in capsys.readouterr().out


def test_committed_results_come_from_clean_trees():
    """Every committed record, and every figure, was made at a clean commit."""
    for path in sorted(paths.COMMITTED_DATA.rglob("*.jsonl")):  # data/gpu/<machine>/ too
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        for r in rows:
            git = r["provenance"]["git"]
            assert git["dirty"] is False and len(git["commit"] or "") == 40, (path.name, git)
    for sidecar in sorted((paths.REPO_ROOT / "figures").rglob("*.json")):
        git = json.loads(sidecar.read_text())["provenance"]["git"]
        assert git["dirty"] is False, (sidecar.name, git)


def test_non_finite_numbers_are_written_as_null_and_named(isolated_outputs):
    written = records.append("00_t", "x", {"rate": float("inf"), "rows": [1.0, float("nan")]})
    line = (paths.data_dir() / "00_t.jsonl").read_text().splitlines()[-1]
    strict = json.loads(line, parse_constant=_refuse)
    assert strict["values"] == {"rate": None, "rows": [1.0, None]} == written["values"]
    assert strict["non_finite"] == {"values.rate": "Infinity", "values.rows[1]": "NaN"}


def test_paths_of_this_machine_are_written_relative(isolated_outputs):
    site = f"{sys.prefix}/lib/python3.11/site-packages/torch/cuda/memory.py"
    values = {"frame": f"{paths.REPO_ROOT}/lib/fp4lab/core/records.py:1:f", "file": site,
              "model": f"{paths.build_dir()}/live/abc/tiny_model", "other": "/usr/local/cuda"}  # fmt: skip
    written = records.append("00_t", "x", values)["values"]
    assert written == {"frame": "lib/fp4lab/core/records.py:1:f", "file": "torch/cuda/memory.py",
                       "model": "build/live/abc/tiny_model", "other": "/usr/local/cuda"}  # fmt: skip


def _refuse(constant: str) -> None:
    raise ValueError(f"{constant} is not strict JSON")


def test_every_committed_line_is_strict_json_naming_no_machine_path():
    """Every line of data/ parses with a strict reader (no NaN, no Infinity) and names no absolute
    path of a checkout or an installed package."""
    machine = re.compile(r"(?:/[^\s\"']+)+/(?:site-packages|dist-packages|lib/fp4lab|build)/")
    for path in sorted(paths.COMMITTED_DATA.rglob("*.jsonl")):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            json.loads(line, parse_constant=_refuse)
            found = machine.search(line)
            assert found is None, f"{path.name}:{number}: {found and found[0]}"


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
