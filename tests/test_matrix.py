"""The FlashInfer version matrix: version checks, an install failure that spares the others, two real versions."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from fp4lab.compile import matrix, matrix_result
from fp4lab.core import paths, probe

BOUNDARY = ["0.6.11.post3", "0.6.12"]
"""The last release before the upstream op and the first with it: the pair `make test` measures."""


@pytest.mark.parametrize("bad", [[], ["latest"], ["0.6.12", "0.7,4"]])
def test_versions_are_checked(bad):
    with pytest.raises(ValueError, match="versions"):
        matrix.check_versions(bad)


def test_versions_may_be_one_comma_separated_string():
    assert matrix.check_versions(" 0.6.12, 0.7.4,0.6.12") == ["0.6.12", "0.7.4"]


def test_the_child_traces_the_installed_flashinfer_as_json():
    """What each version's environment runs, here on the installed FlashInfer."""
    env = dict(os.environ, PYTHONPATH=str(paths.REPO_ROOT / "lib"))
    done = subprocess.run(
        [sys.executable, "-m", "fp4lab.compile.matrix_child"],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=True,
    )
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["chain"][-1]["signature"] == "file_io"
    assert found["fp4lab_op"] == {**found["fp4lab_op"], "signature": "ok", "graph_count": 1}
    assert found["packages"]["flashinfer-python"] == probe.package_version("flashinfer-python")
    assert found["target"]["simulated"] or "fp4-gpu" in probe.machine().capabilities()


def test_verdicts_follow_the_trace():
    chain_blocked = [{"step": 0, "stage": "none", "origin": "baseline", "signature": "file_io"}]
    ok = {"present": True, "signature": "ok", "graph_count": 1}
    assert (
        matrix_result.VersionResult(
            "1", "built", chain=chain_blocked, upstream_op=ok, fp4lab_op=ok
        ).verdict
        == matrix_result.VERDICTS[1]
    )
    mine_only = matrix_result.VersionResult(
        "1", "built", chain=chain_blocked, upstream_op={"present": False}, fp4lab_op=ok
    )
    assert mine_only.verdict == matrix_result.VERDICTS[2] and mine_only.story_decision_holds is True
    nothing = matrix_result.VersionResult(
        "1",
        "built",
        chain=chain_blocked,
        upstream_op={"present": False},
        fp4lab_op={"signature": "unsupported_other"},
    )
    assert nothing.verdict == matrix_result.VERDICTS[0]
    failed = matrix_result.VersionResult("1", "failed", error="pip install failed")
    assert failed.verdict.startswith("not measured") and failed.story_decision_holds is None


def test_a_version_that_cannot_install_is_recorded_and_the_others_go_on(
    isolated_outputs, monkeypatch
):
    monkeypatch.setenv("FP4LAB_BUILD_DIR", str(isolated_outputs / "build"))
    [result] = matrix.measure_versions(["0.0.1"], progress=lambda line: None)
    assert result.env == "failed" and "failed" in result.error
    assert not (isolated_outputs / "build" / "matrix" / "flashinfer-0.0.1").exists(), (
        "a failed environment is removed"
    )
    assert matrix_result.summarize_versions([result])["versions_failed"] == ["0.0.1"]


@pytest.mark.notebook
def test_09_measures_the_boundary_versions(run_notebook):
    rows, _ = run_notebook("09_version_matrix", versions=",".join(BOUNDARY))
    versions = {r["values"]["version"]: r for r in rows if r["kind"] == "version"}
    before, after = versions["0.6.11.post3"], versions["0.6.12"]
    assert (
        before["values"]["upstream_op_present"] is False
        and after["values"]["upstream_op_present"] is True
    )
    assert before["values"]["verdict"] == "unblocked only through fp4lab's custom op"
    assert after["values"]["verdict"] == "unblocked through torch.ops.flashinfer.fp4_quantize"
    for r in versions.values():
        assert r["values"]["blockers"][-1] == "file_io" and "subprocess" in r["values"]["blockers"]
        assert r["values"]["story_patches_needed"] == ["patch_cuda_version"]
        assert r["provenance"]["packages"]["flashinfer-python"] == r["values"]["version"]
        assert r["provenance"]["simulated"] is True and r["provenance"]["target_sm"] == "12.0"
    [summary] = [r["values"] for r in rows if r["kind"] == "summary"]
    assert (summary["story_decision_holds_up_to"], summary["upstream_op_unblocks_from"]) == (
        "0.6.11.post3",
        "0.6.12",
    )
