"""The FlashInfer version matrix: version checks, verdicts and their ranges, origins derived from
every version, an install failure that spares the others, the child, two real versions."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from browser import environment_lines, exported
from fp4lab.compile.matrix import result, study, versions
from fp4lab.core import paths, probe

FORWARDS_ENABLE_PDL_AS_INVERSED = {
    "0.6.12": True,
    "0.6.18.post1": True,
    "0.7.0": True,
    "0.7.1": False,
    "0.7.2": False,
    "0.7.4": False,
}
"""What the detector saw each release's ``torch.ops.flashinfer.fp4_quantize`` forward, measured
in each version's environment (notebook 09 with the default versions); released wheels do not
change."""
PAIR = ["0.7.0", "0.7.1"]
"""The last release measured to forward enable_pdl into is_global_scale_inversed and the first
measured to forward by keyword: the pair `make test` measures."""


@pytest.mark.parametrize("bad", [[], ["latest"], ["0.6.12", "0.7,4"], 17])
def test_versions_are_checked(bad):
    with pytest.raises(ValueError, match="versions"):
        versions.check_versions(bad)


def test_versions_may_be_one_comma_separated_string():
    assert versions.check_versions(" 0.6.12, 0.7.4,0.6.12") == ["0.6.12", "0.7.4"]


def test_the_child_traces_the_installed_flashinfer_as_json(tmp_path):
    """What each version's environment runs, here on the installed FlashInfer."""
    out = tmp_path / "child.json"
    subprocess.run(
        [sys.executable, "-m", "fp4lab.compile.matrix.child", str(out)],
        env=dict(os.environ, PYTHONPATH=str(paths.REPO_ROOT / "lib")),
        timeout=600,
        check=True,
        capture_output=True,
    )
    found = json.loads(out.read_text())
    simulated = "fp4-gpu" not in probe.machine().capabilities()
    assert found["target"]["simulated"] is simulated, "a target is simulated only without one"
    assert found["chain"][-1]["signature"] == "file_io"
    assert found["chain"][-1]["evidence"] == ["trace", *(["simulated_target"] if simulated else [])]
    assert found["fp4lab_op"] == {**found["fp4lab_op"], "signature": "ok", "graph_count": 1}
    assert found["fp4lab_op"]["kernel"].startswith("fp4lab reference")
    installed = probe.package_version("flashinfer-python")
    assert found["packages"]["flashinfer-python"] == installed
    assert found["packages"]["torch"] == probe.package_version("torch")
    assert found["packages"]["numpy"] == probe.package_version("numpy"), "FlashInfer's requirements"
    assert found["upstream_op"]["present"] is True, "the pinned release registers the op"
    expected = "present" if FORWARDS_ENABLE_PDL_AS_INVERSED[installed] else "absent"
    assert found["forwarding"]["capture"]["status"] == expected


CHAIN = [
    {"step": 0, "stage": "none", "origin": "baseline", "signature": "device_check"},
    {"step": 1, "stage": "patch_cuda_version", "origin": "story", "signature": "file_io"},
]
OK = {"present": True, "signature": "ok", "graph_count": 1}


def _version(
    v: str, *, upstream: dict, forwarding: str | None, ours: dict = OK
) -> result.VersionResult:
    capture = (
        {"status": forwarding} if forwarding else {"status": "not testable here", "reason": "r"}
    )
    return result.VersionResult(
        v,
        "built",
        chain=CHAIN,
        upstream_op=upstream,
        fp4lab_op=ours,
        forwarding={"capture": capture},
    )


def test_verdicts_follow_the_trace_and_the_forwarding_detector():
    absent = {"present": False}
    wrong = _version("0.6.12", upstream=OK, forwarding="present")
    right = _version("0.7.0", upstream=OK, forwarding="absent")
    mine_only = _version("0.6.3", upstream=absent, forwarding=None)
    nothing = _version(
        "0.5.0", upstream=absent, forwarding=None, ours={"signature": "unsupported_other"}
    )
    assert [r.verdict for r in (nothing, wrong, right, mine_only)] == list(result.VERDICTS)
    assert [r.story_decision_holds for r in (nothing, wrong, right, mine_only)] == [
        True,
        True,
        False,
        True,
    ]
    undecided = _version("0.6.13", upstream=OK, forwarding=None)
    assert undecided.verdict.startswith("not measured: the argument-forwarding detector")
    assert undecided.story_decision_holds is None
    failed = result.VersionResult("1", "failed", error="pip install failed")
    assert failed.verdict.startswith("not measured") and failed.story_decision_holds is None


def test_the_summary_gives_verdict_ranges_and_derives_each_steps_scope():
    registry = {"step": 2, "stage": "bypassed_jit_registry", "origin": "fresh_process"}
    late = [
        *CHAIN[:1],
        {**CHAIN[1], "signature": "unsupported_other"},
        {**registry, "signature": "file_io"},
    ]
    found = [
        _version("0.7.0", upstream=OK, forwarding="absent"),
        _version("0.6.3", upstream={"present": False}, forwarding=None),
        _version("0.6.12", upstream=OK, forwarding="present"),
    ]
    found[0].chain = late
    summary = result.summarize_versions(found)
    assert summary["versions_measured"] == ["0.6.3", "0.6.12", "0.7.0"]
    assert summary["verdict_ranges"] == {
        "blocked": [],
        "compiles, wrong arguments forwarded": ["0.6.12"],
        "unblocked through the upstream op": ["0.7.0"],
        "unblocked only with fp4lab's op": ["0.6.3"],
    }
    assert (summary["story_decision_holds_up_to"], summary["upstream_op_unblocks_from"]) == (
        "0.6.12",
        "0.7.0",
    )
    stages = summary["stages_across_versions"]
    assert stages["patch_cuda_version"]["scope"] == "every version measured"
    assert stages["bypassed_jit_registry"] == {
        "versions": ["0.7.0"],
        "origin": "fresh_process",
        "on_every_version_measured": False,
        "scope": "version-specific: only 0.7.0",
    }
    assert summary["blockers_across_versions"]["file_io"]["on_every_version_measured"]


def test_a_version_that_cannot_install_is_recorded_and_the_others_go_on(
    isolated_outputs, monkeypatch
):
    monkeypatch.setenv("FP4LAB_BUILD_DIR", str(isolated_outputs / "build"))
    [failed] = study.measure_versions(["0.0.1"], progress=lambda line: None)
    assert failed.env == "failed" and "failed" in failed.error
    assert not (isolated_outputs / "build" / "matrix" / "flashinfer-0.0.1").exists(), (
        "a failed environment is removed"
    )
    assert result.summarize_versions([failed])["versions_failed"] == ["0.0.1"]


@pytest.mark.notebook
@pytest.mark.environments
@pytest.mark.browser
def test_09_measures_two_versions_with_the_forwarding_detector(run_notebook):
    """Each version in its own environment, and the exported page shows each environment as one
    line: built (where build/matrix/ has none, as on CI's clean checkout) or reused, never uv's
    install lines (``browser.NOISE``); the page fits the window."""
    rows, executed = run_notebook("09_version_matrix", versions=",".join(PAIR))
    measured = {r["values"]["version"]: r for r in rows if r["kind"] == "version"}
    assert list(measured) == PAIR
    for version, r in measured.items():
        v = r["values"]
        expected = "present" if FORWARDS_ENABLE_PDL_AS_INVERSED[version] else "absent"
        assert v["upstream_op_present"] is True and v["upstream_op_forwarding"] == expected
        assert v["verdict"] == (
            "compiles, wrong arguments forwarded"
            if expected == "present"
            else "unblocked through the upstream op"
        )
        assert v["blockers"][-1] == "file_io" and "subprocess" in v["blockers"]
        assert v["story_patches_needed"] == ["patch_cuda_version"]
        assert v["upstream_op"]["kernel"].startswith("fp4lab reference")
        assert r["provenance"]["packages"]["flashinfer-python"] == version
        assert r["provenance"]["packages"]["torch"] == v["packages"]["torch"]
        assert r["provenance"]["packages"]["papermill"] is None, "the child's packages, not ours"
        assert r["provenance"]["simulated"] is True and r["provenance"]["target_sm"] == "12.0"
    [summary] = [r["values"] for r in rows if r["kind"] == "summary"]
    assert summary["verdict_ranges"]["compiles, wrong arguments forwarded"] == PAIR[:1]
    assert summary["verdict_ranges"]["unblocked through the upstream op"] == PAIR[1:]
    assert (summary["verdict"], summary["evidence"]) == ("UNBLOCKED", ["trace", "simulated_target"])
    assert summary["number"].startswith(f"FlashInfer's own op unblocks from {PAIR[1]}")
    assert (summary["story_decision_holds_up_to"], summary["upstream_op_unblocks_from"]) == tuple(
        PAIR
    )
    for stage, seen in summary["stages_across_versions"].items():
        on = [v for v in PAIR if stage in measured[v]["values"]["stages_applied"]]
        assert seen["versions"] == on and seen["on_every_version_measured"] == (on == PAIR)
    page = exported(executed)
    for version in PAIR:
        said = environment_lines(page, f"build/matrix/flashinfer-{version}")
        assert said == [measured[version]["values"]["env"]], f"one line for {version}'s environment"
