"""What a break of the breakable prefill graph costs (``capture.breakable_timing``): the release's
own capture runs installed and from its two files on another release, its replays equal eager
and run each break once, a planted stale argument is seen, and the cost per break is fitted."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from fp4lab.core import records, venvs
from fp4lab.serving.capture import break_study, breakable_timing, bundled
from fp4lab.serving.replay import env, versions

VERSION = "0.5.16"
"""A breakable release the other replay tests build."""
SHAPE, COUNTS, TIMING = (8, 32, 4), (0, 1, 4), (2, 1)


def _run(python: Path, folder: str, tmp_path: Path, plant: str = "") -> dict:
    child = venvs.Child(python, "fp4lab.serving.capture.breakable_timing",
                        (folder, ",".join(map(str, SHAPE)), ",".join(map(str, COUNTS)),
                         ",".join(map(str, TIMING)), plant), f"bc-{plant or 'plain'}", "timing")  # fmt: skip
    found = venvs.run_child(child, tmp_path, 300)
    assert "error" not in found, found.get("traceback", found["error"])
    return found


def _release_files(version: str) -> Path:
    [found] = env.env_dir(version).glob(
        "venv/lib/python*/site-packages/"
        + breakable_timing.MODULE.rsplit(".", 1)[0].replace(".", "/")
    )
    return found


@pytest.mark.environments
def test_the_releases_capture_replays_equal_to_eager_with_a_segment_per_break(tmp_path):
    built = env.ensure_env(VERSION)
    found = _run(built.python, "-", tmp_path)
    assert (found["capture"], found["loaded_from"]) == ("simulated", "installed")
    rows = found["rows"]
    assert [(r["variant"], r["breaks"]) for r in rows] == [
        ("eager", 0),
        ("graph", 0),
        *(("breakable", c) for c in COUNTS),
    ]
    for r in rows[1:]:
        assert r["segments"] == r["breaks"] + 1 and r["eager_calls_per_replay"] == r["breaks"]
        assert r["equal"] and break_study.works(r) and r["replay_ms"] is None, r
    assert rows[-1]["break_layers"] == [0, 1, 2, 3]
    assert [s["name"] for s in found["standins"]] == ["weak_ref_tensor_cuda_view",
                                                      "cuda_graph_recorder"]  # fmt: skip


@pytest.mark.environments
def test_the_release_files_run_on_another_release_and_a_stale_argument_is_seen(tmp_path):
    """The offline bundle's case: 0.5.16's two files on 0.5.9's SGLang; a Python argument the
    capture keeps makes every replay differ from eager (the check coming out the other way)."""
    folder = tmp_path / "files"
    folder.mkdir()
    for name in breakable_timing.FILES:
        shutil.copy2(_release_files(VERSION) / name, folder / name)
    base = env.ensure_env(versions.STORY_VERSION)
    found = _run(base.python, str(folder), tmp_path)
    assert found["loaded_from"] == "files" and all(break_study.works(r) for r in found["rows"])
    installed = _run(env.ensure_env(VERSION).python, "-", tmp_path)
    assert found["files"] == installed["files"], "the same release's code ran both ways"
    planted = _run(base.python, str(folder), tmp_path, "stale_argument")
    stale = [r for r in planted["rows"] if r["variant"] != "eager"]
    assert stale and not any(break_study.works(r) for r in stale)
    assert all(r["max_abs_diff"] > 0.01 for r in stale)
    assert [r["eager_calls_per_replay"] for r in stale] == [0, *COUNTS]


def test_the_cost_per_break_is_the_slope_of_replay_time_over_breaks():
    rows = [{"variant": "breakable", "breaks": b, "replay_ms": 2.0 + 0.05 * b} for b in (0, 2, 8)]
    cost = break_study.fit(rows)
    assert cost["us_per_break"] == pytest.approx(50.0) and cost["intercept_ms"] == pytest.approx(2)
    assert break_study.fit(rows[:1]) is None, "one count gives no slope"
    assert break_study.fit([{**r, "replay_ms": None} for r in rows]) is None, "untimed"
    timed = [{**r, "sglang_version": VERSION, "segments": r["breaks"] + 1, "max_abs_diff": 0.0,
              "max_abs_expected": 1.0, "eager_calls_per_replay": r["breaks"],
              "device": "NVIDIA H200", "capture": "cuda"} for r in rows]  # fmt: skip
    assert break_study.summary(timed, VERSION) == (
        f"SGLang {VERSION}: 3 of 3 replays equal eager; 8 breaks made 9 segments; 50.0 µs per "
        "break on NVIDIA H200 (sglang#35851: ~590 µs of idle GPU per break, breaks doing real work)"
    )
    timed[1]["eager_calls_per_replay"] = 0
    assert "2 of 3 replays equal eager (not: breakable 2)" in break_study.summary(timed, VERSION)


def test_bad_parameters_are_named_with_what_is_allowed():
    with pytest.raises(ValueError, match=r"break_releases contains '0\.5\.99'.*0\.5\.23"):
        break_study.releases(["0.5.99"])
    with pytest.raises(ValueError, match=r"break_counts contains 9.*0, 1, 2"):
        break_study.break_counts([0, 9], 8)
    with pytest.raises(ValueError, match=r"break_shape=\[8, 32\] must be \[tokens, hidden"):
        break_study.shape([8, 32])
    assert breakable_timing.positions(8, 2) == frozenset({3, 7})


@pytest.mark.environments
def test_each_release_is_recorded_as_measured_or_not_applicable(tmp_path, monkeypatch):
    monkeypatch.setenv("FP4LAB_DATA_DIR", str(tmp_path / "data"))
    rec = records.Recorder("bc_test", {"break_releases": [versions.STORY_VERSION, VERSION]})
    rows = break_study.measure(rec, SHAPE, list(COUNTS), TIMING)
    written = [json.loads(line) for line in (tmp_path / "data" / "bc_test.jsonl").open()]
    kinds = [(r["kind"], r["values"].get("sglang_version")) for r in written]
    assert kinds[0] == ("breakable_break_cost_not_applicable", versions.STORY_VERSION)
    assert written[0]["values"]["why"] == (f"SGLang {versions.STORY_VERSION} has no breakable CUDA "
                                           "graph (no backend file)")  # fmt: skip
    assert {k for k, v in kinds[1:-1]} == {"breakable_break_cost"} and len(rows) == 5
    assert kinds[-1] == ("skipped", None) and "nothing was timed" in written[-1]["values"]["reason"]
    assert rows[0]["evidence"] == ["simulated_capture"]
    assert written[1]["provenance"]["packages"]["sglang"] == VERSION
    [line] = break_study.lines(rows)
    assert line == (f"SGLang {VERSION}: 4 of 4 replays equal eager; 4 breaks made 5 segments; "
                    "cost per break not timed (simulated capture)")  # fmt: skip
    shown = break_study.table(rows)
    assert list(shown["equals eager"]) == ["", True, True, True, True]
    assert "replay ms" not in shown.columns and list(shown["segments"])[:2] == ["", 1]


def test_in_the_offline_bundle_a_release_it_does_not_carry_is_not_applicable(tmp_path, monkeypatch):
    monkeypatch.setenv(bundled.OFFLINE, "1")
    monkeypatch.setenv("FP4LAB_BUILD_DIR", str(tmp_path))
    assert break_study.releases("all") == [], "the bundle carries none here"
    (bundled.env.env_dir(bundled.RELEASE) / "bundled" / bundled.BREAKABLE / "0.5.23").mkdir(
        parents=True
    )
    assert break_study.releases("all") == ["0.5.23"]
    assert break_study._where("0.5.13") == (None, "", (
        "n/a: the bundle carries no breakable capture of SGLang 0.5.13 (its wheel has none, "
        "read when the bundle was built)"))  # fmt: skip
