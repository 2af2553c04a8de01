"""Notebook 11: the story through SGLang's own compile path, release by release, SM by SM.

Bad versions and SMs are refused before any install; an install that fails is recorded and the
other releases go on; the notebook, run on two releases (``versions.TEST_VERSIONS``), names the
quantize SGLang takes on each SM, reproduces the story's three signatures through SGLang 0.5.9's
``install_torch_compiled`` with SGLang's frames in the stack, and compiles the same layer through
SGLang's backend with a wrapped op (SGLang's counts, output equal to eager).
"""

from __future__ import annotations

import ast
import json
import re

import nbformat
import pytest

from fp4lab.compile import piecewise
from fp4lab.core import catalog, paths, records, runner, venvs
from fp4lab.serving import standins
from fp4lab.serving.replay import decide, env, scan, split_check, study, versions

pytestmark = pytest.mark.environments
STORY_SIGNATURES = ["subprocess", "file_io", "compiler_disable_under_fullgraph"]
SGLANG_COMPILE = "sglang/srt/compilation/compile.py"
NAME = "11_sglang_piecewise_replay"


@pytest.mark.parametrize(
    ("given", "sms", "named"),
    [(["0.5.99"], ["12.0"], "sglang_versions"), ("0.5.9", ["8.0"], "sms"),
     (17, ["12.0"], "sglang_versions"), (["0.5.9"], 12.0, "sms"), ([], ["9.0"], "sglang_versions")],
)  # fmt: skip
def test_bad_versions_and_sms_are_refused_before_any_install(given, sms, named):
    with pytest.raises(ValueError, match=named) as raised:
        study.prepare(given, sms)
    if "contains" in str(raised.value):  # an unknown value: the allowed ones are named
        assert "allowed values: " in str(raised.value)
    assert not (paths.build_dir() / "sglang-compile" / "0.5.99").exists()


def test_the_scan_names_direct_and_wrapped_calls(tmp_path):
    source = tmp_path / "sglang" / "srt" / "m.py"
    source.parent.mkdir(parents=True)
    source.write_text(
        "from flashinfer import fp4_quantize as fq, mm_fp4\nimport flashinfer\n"
        "from sgl_kernel import scaled_fp4_quant as fq\n"
        "def a(x):\n    return fq(x)\n"
        "def b(x):\n    return mm_fp4(x)\n"
        "b = register_custom_op_from_extern(b, op_name='b')\n"
        "def c(x):\n    return flashinfer.nvfp4_quantize(x)\n"
    )
    rows = scan.scan(tmp_path / "sglang")
    assert [(r["line"], r["entry_point"], r["wrapped"]) for r in rows] == [
        (5, "flashinfer.fp4_quantize", False),
        (7, "flashinfer.mm_fp4", True),
        (10, "flashinfer.nvfp4_quantize", False),
    ]
    assert rows[0]["also_bound_from"] == ["sgl_kernel.scaled_fp4_quant"]
    assert [r["line"] for r in scan.direct(rows)] == [5, 10]


def test_a_failed_install_is_recorded_and_the_others_go_on(isolated_outputs):
    """Two releases that do not exist: each is recorded as failed (the loop goes on after the
    first), nothing is left on disk, and no release is replayed twice in the suite."""
    missing = ("0.5.99", "0.5.98")
    rec = records.Recorder(NAME, {"sglang_versions": list(missing), "sms": ["12.0"]})
    assert study.measure_and_record(rec, extra=missing) == []
    found = records.latest(rec.notebook)
    failed = [
        r["values"]
        for r in found
        if r["kind"] == "environment" and r["values"]["status"] == "failed"
    ]
    assert [f["version"] for f in failed] == list(missing)
    assert all(f"sglang=={f['version']}" in f["error"] for f in failed)
    summary = [r["values"] for r in found if r["kind"] == "summary"][-1]
    assert summary["versions_measured"] == [] and set(missing) <= set(summary["versions_failed"])
    assert not any((paths.build_dir() / "sglang-compile" / v).exists() for v in missing)


@pytest.fixture(scope="module")
def notebook_records(tmp_path_factory):
    """Notebook 11 run once on the two test releases and every SM; its records, and whether its
    figure was written (records and figures in a temporary folder)."""
    out = tmp_path_factory.mktemp("notebook11")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("FP4LAB_DATA_DIR", str(out / "data"))
        patch.setenv("FP4LAB_FIGURES_DIR", str(out / "figures"))
        (nb,) = [n for n in catalog.notebooks() if n.name == NAME]
        parameters = {"sglang_versions": list(versions.TEST_VERSIONS), "sms": list(versions.SMS)}
        runner.execute(nb, out / "executed", parameters)
        figure = (paths.figures_dir() / f"{NAME}.png").exists()
        return [*records.read(NAME), {"kind": "figure", "values": {"written": figure}}]


def _of(found: list[dict], kind: str) -> list[dict]:
    return [r["values"] for r in found if r["kind"] == kind]


def test_sglang_0_5_9_takes_flashinfer_directly_only_on_sm120(notebook_records):
    chosen = {
        r["sm"]: r for r in _of(notebook_records, "selection") if r["sglang_version"] == "0.5.9"
    }
    assert chosen["12.0"]["implementation"] == "flashinfer_direct"
    assert chosen["12.0"]["object"] == "flashinfer.fp4_quantization.fp4_quantize"
    for sm in ("9.0", "10.0"):
        assert chosen[sm]["implementation"] == "sgl_kernel_op"
        assert chosen[sm]["op"] == "sgl_kernel::scaled_fp4_quant"
    assert all(r["call_site"].startswith("sglang/srt/layers/quantization/modelopt_quant.py:")
               for r in chosen.values())  # fmt: skip
    summary = _of(notebook_records, "summary")[-1]
    assert summary["sm120_specific_0_5_9"] is True
    assert summary["story_blockers_0_5_9"] == STORY_SIGNATURES


def test_the_story_replays_through_sglang_0_5_9s_own_compile_path(notebook_records):
    (replay,) = [r for r in _of(notebook_records, "replay") if r["sglang_version"] == "0.5.9"]
    assert replay["sm"] == versions.STORY_SM
    assert decide.blockers(replay["chain"]) == STORY_SIGNATURES
    for row in replay["chain"]:
        assert row["signature"] != "ok"
        functions = [f for f in row["frames"] if f.startswith(SGLANG_COMPILE)]
        assert any(f.endswith(":_ensure_compiled") for f in functions), row["frames"]
        assert any(f.endswith(":trampoline") for f in functions)
        assert row["entry"] == "sglang.srt.compilation.compile.install_torch_compiled"
    assert "simulated_target" in replay["evidence"]
    subprocess_row = next(r for r in replay["chain"] if r["signature"] == "subprocess")
    assert subprocess_row["blocker_frame"].startswith("flashinfer/jit/")
    names = {s["name"] for s in replay["runtime_standins"]}
    assert "weak_ref_tensor_identity" in names


def test_the_layer_compiles_through_sglangs_backend_with_a_wrapped_op(notebook_records):
    replays = {r["sglang_version"]: r for r in _of(notebook_records, "replay")}
    ours = replays["0.5.9"]["fp4lab_op"]
    assert ours["signature"] == "ok" and ours["equals_eager"] is True
    assert ours["sglang_counter"]["num_graphs_seen"] == 1
    assert ours["sglang_counter"]["num_piecewise_graphs_seen"] == 1
    assert replays["0.5.9"]["sglang_op"] == {"present": False}
    theirs = replays["0.5.21"]["sglang_op"]
    assert theirs["op"] == "sglang::flashinfer_fp4_quantize"
    assert theirs["signature"] == "ok" and theirs["equals_eager"] is True
    assert theirs["sglang_counter"]["num_graphs_seen"] == 1
    assert theirs["kernel"].startswith("fp4lab reference")


def test_later_releases_take_sglangs_wrapped_op_everywhere(notebook_records):
    chosen = [r for r in _of(notebook_records, "selection") if r["sglang_version"] == "0.5.21"]
    assert sorted(r["sm"] for r in chosen) == sorted(versions.SMS)
    for r in chosen:
        assert r["implementation"] == "sglang_op" and r["fake_registered"] is True
        assert r["chain"][-1]["signature"] == "ok"
    decisions = {(r["sglang_version"], r["sm"]): r for r in _of(notebook_records, "decision")}
    assert decisions[("0.5.21", "12.0")]["outcome"] == "compiles"
    assert decisions[("0.5.21", "12.0")]["flag"] == "--cuda-graph-backend-prefill tc_piecewise"
    assert decisions[("0.5.21", "12.0")]["glm5_auto_disabled"] == {
        "disabled": False,
        "from": "sglang.srt.configs.model_config.is_piecewise_cuda_graph_disabled_model",
    }
    assert decisions[("0.5.9", "12.0")]["outcome"] == "blocked"
    assert decisions[("0.5.9", "12.0")]["flag"] == "--enable-piecewise-cuda-graph"
    assert decisions[("0.5.9", "12.0")]["glm5_auto_disabled"] == {"disabled": False, "from": None}
    assert decisions[("0.5.9", "9.0")]["outcome"] == "not traceable here"
    assert _of(notebook_records, "figure") == [{"written": True}]


def test_every_environment_says_where_its_torch_differs_from_the_pin(notebook_records):
    envs = {r["version"]: r for r in _of(notebook_records, "environment")}
    assert envs["0.5.9"]["differs"] == ["torch: release pins ==2.9.1, installed 2.13.0+cpu"]
    assert envs["0.5.21"]["differs"] == []
    assert envs["0.5.9"]["pins"]["flashinfer-python"] == "==0.6.3"
    for version, found in envs.items():
        [removed] = [s for s in found["standins"] if s["name"] == standins.BINARIES_REMOVED]
        site = standins.site_packages(str(env.env_dir(version) / "venv" / "bin" / "python"))
        assert not list((site / standins.KERNEL_BINARIES).rglob("*.so*")), version
        assert removed["removed"] and removed["bytes"] > 100 * 2**20, "the CUDA op libraries"


@pytest.mark.parametrize("version", versions.TEST_VERSIONS)
def test_sglangs_own_split_cuts_the_same_graph_into_the_same_pieces(version, tmp_path):
    """compile.piecewise splits as the release's split_graph does, and notebook 04's token counts
    (its CPU default and the GPU run's) are sizes the release's prefill capture list holds."""
    built = env.ensure_env(version)
    assert built.ok, built.error
    child = venvs.Child(built.python, "fp4lab.serving.replay.split_check", (), f"split-{version}",
                        f"the split check in SGLang {version}")  # fmt: skip
    found = venvs.run_child(child, tmp_path, 300)
    assert "error" not in found, found.get("error")
    assert found["sglang_version"] == version
    assert found["sglang"] == found["fp4lab"]
    pieces = [p for p in found["sglang"] if not p["split_op"]]
    splits = [p for p in found["sglang"] if p["split_op"]]
    assert (len(pieces), len(splits)) == (split_check.LAYERS + 1, split_check.LAYERS)
    assert all(p["calls"] == list(piecewise.SPLIT_OPS) for p in splits)
    assert any(c.startswith("fp4lab.fp4_quantize") for p in pieces for c in p["calls"]), (
        "the quantize is inside a piece"
    )
    assert set(_token_counts_04()) <= set(found["capture_sizes"]), found["capture_sizes"]


def _token_counts_04() -> list[int]:
    """Notebook 04's default token counts and those scripts/gpu.sh passes it."""
    cells = nbformat.read(paths.NOTEBOOKS_DIR / "04_fullgraph_false_tradeoff.ipynb", 4).cells
    [source] = [c.source for c in cells if "parameters" in c.metadata.get("tags", [])]
    default = next(ast.literal_eval(line.split("=", 1)[1].split("#")[0])
                   for line in source.splitlines() if line.startswith("token_counts"))  # fmt: skip
    gpu = re.search(
        r"token_counts=(\[[0-9,]+\])", (paths.REPO_ROOT / "scripts" / "gpu.sh").read_text()
    )
    return [*default, *json.loads(gpu[1])]


def _option(
    flag: str, help: str = "", choices: list[str] | None = None, default: str | None = None
) -> dict:
    return {"options": [flag], "help": help, "choices": choices, "default": default}


def test_the_glm5_flags_follow_each_releases_parser_and_auto_disable_rule():
    """Shaped like the releases' own parsers (0.5.9, 0.5.12, 0.5.21, 0.5.23); the notebook's
    test above reads the real ones."""
    enable = _option(
        "--enable-piecewise-cuda-graph", "Optimize the model with piecewise cuda graph"
    )
    assert decide.glm5_flags([enable], False) == (
        ["--enable-piecewise-cuda-graph"],
        "off unless enabled",
    )
    deprecated = _option(
        "--enable-piecewise-cuda-graph", "Deprecated: Piecewise cuda graph is enabled by default."
    )
    enforce = _option(
        "--enforce-piecewise-cuda-graph",
        "Enforce piecewise cuda graph, skipping all auto-disable conditions.",
    )
    flags, how = decide.glm5_flags([deprecated, enforce], True)
    assert flags == ["--enforce-piecewise-cuda-graph"] and "auto-disable list" in how
    assert decide.glm5_flags([deprecated, enforce], False)[0] == [], "on by default"
    assert decide.glm5_flags([deprecated], True)[0] is None, "disabled and nothing overrides it"
    prefill = _option(
        "--cuda-graph-backend-prefill", choices=["full", "breakable", "tc_piecewise", "disabled"]
    )
    assert decide.glm5_flags([prefill], False)[0] == [
        "--cuda-graph-backend-prefill",
        "tc_piecewise",
    ]
    gone = _option("--cuda-graph-backend-prefill", choices=["full", "breakable", "disabled"])
    flags, how = decide.glm5_flags([gone], False)
    assert flags is None and how.startswith("the release removed torch.compile piecewise graphs")
    row = decide.cell(
        "0.5.23", "12.0", {"implementation": "sglang_op", "piecewise_options": [gone]}, {}
    )
    assert (row["outcome"], row["flag"]) == ("not applicable", "none reaches it")
