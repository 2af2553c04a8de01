"""Notebook 11: SGLang's own GLM-5 through each release's piecewise runner, SM by SM.

Bad releases, SMs, CUDA_HOME values and patch-writer arguments are refused before any install;
an install that fails is recorded and the other releases go on; the notebook, run on the story's
release and every SM, builds the release's GlmMoeDsaForCausalLM,
reproduces the story's three signatures through its runner with the model's frames in the stack,
follows CUDA_HOME to the first frame, and applies the patch part by part until the model compiles
to the expected pieces and equals eager. A later release (``versions.TEST_VERSIONS``), replayed on
SM12.0 the same way, lets the same model through as released: the verdict comes out either way.
"""

from __future__ import annotations

import ast
import json
import logging
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest
import torch

import resolutions
from browser import environment_lines, exported
from fp4lab.compile import piecewise
from fp4lab.core import catalog, paths, records, runner, venvs
from fp4lab.serving import deep_gemm_sources, kernel_binaries, standins
from fp4lab.serving.replay import decide, env, kept, matrix, pool, scan, study, timeline, versions
from fp4lab.serving.replay.release import resolution, split_check
from fp4lab.serving.replay.release import runner as replay_runner
from fp4lab.serving.replay.shared import models, patch
from resolutions import ENABLED, REACHED, REMOVED

pytestmark = pytest.mark.environments
STORY_SIGNATURES = ["subprocess", "file_io", "compiler_disable_under_fullgraph"]
SGLANG_COMPILE = "sglang/srt/compilation/compile.py"
MODELOPT = "sglang/srt/layers/quantization/modelopt_quant.py:"
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


@pytest.mark.parametrize("cuda_home", ["usr/local/cuda", ",", ["unset", 7]])
def test_bad_cuda_home_values_are_refused_before_any_install(cuda_home):
    with pytest.raises(ValueError, match="cuda_home"):
        study.prepare(["0.5.9"], ["12.0"], cuda_home)


PATCH_CASES = [
    (["--sglang", "0.4.0", "--sm", "12.0"], "--sglang='0.4.0' is not allowed; allowed values: 0.5.3.post2"),
    (["--sglang", "0.5.9", "--sm", "8.0"], "--sm='8.0' is not allowed; allowed values: 9.0, 10.0, 12.0"),
    (["--sglang", "0.5.9", "--sm", "12.0", "--write-patch", "{file}"], "is a file; allowed values"),
    (["--sm", "12.0"], "the following arguments are required: --sglang"),
]  # fmt: skip


@pytest.mark.parametrize(("argv", "named"), PATCH_CASES, ids=[a[1] for a, _ in PATCH_CASES])
def test_the_patch_writer_names_a_bad_argument_before_any_work(argv, named, tmp_path, capsys,
                                                               reliability):  # fmt: skip
    (tmp_path / "a-file").write_text("")
    argv = [a.format(file=tmp_path / "a-file") for a in argv]
    argv += [] if "--write-patch" in argv else ["--write-patch", str(tmp_path / "patch")]
    started = time.monotonic()
    with pytest.raises(SystemExit) as exited:
        sys.exit(study.main(argv))
    output = capsys.readouterr()
    reliability({"case": " ".join(["fp4lab.serving.replay", *argv]), "kind": "bad input",
                 "clear_error": named in output.err, "traceback": "Traceback" in output.err,
                 "orphans": 0, "seconds": time.monotonic() - started})  # fmt: skip
    assert exited.value.code == 2 and named in output.err, output
    assert not (tmp_path / "patch").exists()


def test_the_patch_text_holds_the_parts_asked_for(tmp_path):
    text = patch.render("0.5.9", "12.0", ["fp4_quantize_op"], {"module": "m", "name": "fq"})
    compile(text, "plugin", "exec")
    assert 'custom_op("fp4lab_patch::fp4_quantize"' in text and "dsa_indexer" not in text
    written = patch.write(tmp_path, "0.5.9", "12.0", text)
    assert [p.name for p in written] == [
        f"{patch.module_name('0.5.9', '12.0')}{s}" for s in (".py", ".pth")
    ]
    assert written[1].read_text() == f"import {written[0].stem}\n"
    with pytest.raises(ValueError, match="parts contains 'x'; allowed values"):
        patch.render("0.5.9", "12.0", ["x"])


def test_the_patch_writer_writes_what_the_replay_needed(tmp_path, monkeypatch):
    """The writer's own logic, on a replay's answer (the replay itself runs in the notebook's
    test): the plugin and its .pth written, exit 0 once the patched model compiles."""
    text = patch.render("0.5.9", "12.0", ["fp4_quantize_op"], {"module": "m", "name": "fq"})
    found = {"fix": {"parts": ["fp4_quantize_op"], "plugin": text, "compiles": True, "pieces": 5,
                     "equals_eager": True, "steps": []}}  # fmt: skip
    monkeypatch.setattr(env, "ensure_env", lambda version: env.CompileEnv(version, "reused"))
    monkeypatch.setattr(pool.venvs, "run_children", lambda *args, **kwargs: [found])
    said: list[str] = []
    assert study.write_patch("0.5.9", "12.0", tmp_path / "out", said.append) == 0
    name = patch.module_name("0.5.9", "12.0")
    assert (tmp_path / "out" / f"{name}.py").read_text() == text
    assert (tmp_path / "out" / f"{name}.pth").exists() and "equals eager" in said[-1]


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
    rec = records.Recorder(NAME, {"sglang_versions": list(missing), "sms": ["12.0"],
                                  "cuda_home": ["unset"], "matrix_models": []})  # fmt: skip
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
    """Notebook 11 run once on the test release and every SM; its records, whether its figure
    was written and where its executed copy is (records and figures in a temporary folder)."""
    out = tmp_path_factory.mktemp("notebook11")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("FP4LAB_DATA_DIR", str(out / "data"))
        patch.setenv("FP4LAB_FIGURES_DIR", str(out / "figures"))
        (nb,) = [n for n in catalog.notebooks() if n.name == NAME]
        parameters = {"sglang_versions": [versions.STORY_VERSION], "sms": list(versions.SMS),
                      "matrix_models": [ALONGSIDE]}  # fmt: skip
        executed = runner.execute(nb, out / "executed", parameters)
        figure = (paths.figures_dir() / f"{NAME}.png").exists()
        return [*records.read(NAME), {"kind": "figure", "values": {"written": figure}},
                {"kind": "executed", "values": {"path": executed}}]  # fmt: skip


ALONGSIDE = "llama-3.3-70b-nvfp4"
"""The model notebook 11's test run walks alongside GLM-5, for notebook 14."""


def test_notebook_14_takes_the_replays_notebook_11_walked_alongside(notebook_records, monkeypatch):
    """Notebook 14's cells of notebook 11's release and SM are taken from the replays notebook
    11's children walked alongside GLM-5 (no child runs), with the same numbers notebook 11
    recorded for GLM-5; a changed walk or fp4lab source finds none kept."""
    given = []

    def no_children(children, *args, **kwargs):
        given.extend(children)
        return []

    monkeypatch.setattr(pool.venvs, "run_children", no_children)
    llama, glm5 = models.named(ALONGSIDE), models.named(pool.GLM5)
    [run] = matrix.measure([llama, glm5], [versions.STORY_VERSION], [versions.STORY_SM])
    assert given == [], "every walk was kept"
    cells = {m.name: matrix.row(m, run.version, versions.STORY_SM,
                                run.by_model[m.name][versions.STORY_SM], run.calls)
             for m in (llama, glm5)}  # fmt: skip
    assert all(c["kept"]["replayed_utc"] for c in cells.values())
    assert (cells[ALONGSIDE]["outcome"], cells[ALONGSIDE]["patch"]) == (
        "blocked",
        ["fp4_quantize_op"],
    )
    [recorded] = [r for r in _of(notebook_records, "decision") if r["sm"] == versions.STORY_SM]
    for field in ("patch", "pieces", "graphs", "equals_eager", "compiles_with_patch"):
        assert cells[glm5.name][field] == recorded[field], field
    environment = run.environment
    digest = kept.key(environment, llama, "patch", ["unset"])
    assert kept.taken(run.version, versions.STORY_SM, llama, "patch", digest) is not None
    assert kept.key(environment, llama, "chain", ["unset"]) != digest
    monkeypatch.setattr(kept, "source_digest", lambda: "another fp4lab")
    changed = kept.key(environment, llama, "patch", ["unset"])
    assert kept.taken(run.version, versions.STORY_SM, llama, "patch", changed) is None


@pytest.fixture(scope="module")
def later_release():
    """The release of TEST_VERSIONS after the story's, replayed on SM12.0 as notebook 11 does:
    its environment record, its replay and its decision."""
    version = versions.TEST_VERSIONS[-1]
    [run] = pool.measure_versions([version], ["12.0"], ["unset"], progress=lambda _: None)
    assert run.environment.ok, run.environment.error
    replay = run.replays["12.0"]
    return run, replay, decide.cell(version, "12.0", replay, run.calls)


def test_a_later_release_traces_glm5_through_but_reaches_a_kernel_sm120_lacks(later_release):
    run, replay, row = later_release
    assert run.environment.differs == ["torch: release pins ==2.11.0, installed 2.13.0+cpu"]
    assert "error" not in replay and "harness_error" not in replay, replay
    assert replay["facts"]["model_class"] == "sglang.srt.models.glm4_moe.GlmMoeDsaForCausalLM"
    assert replay["facts"]["layout"]["family"] == "reworked"
    assert replay["eager_release"]["status"] == "compiled", "the eager pass runs whole"
    fixed = replay["fix"]
    assert (fixed["parts"], fixed["compiles"], fixed["equals_eager"]) == ([], True, True)
    assert fixed["pieces"] >= 3 and fixed["kernel"].startswith("fp4lab reference")
    assert "sglang.flashinfer_fp4_quantize" in fixed["graph_custom_ops"], "SGLang's own op"
    assert "ninja_refused" in {s["name"] for s in replay["standins"]}
    assert replay["jit_builds_refused"] == ["sgl_kernel_jit_fused_store_index_k_cache_bf16_t_int64_t_64_true"], (
        "the DSA indexer probes its JIT K-cache store, refused: its fallback is traced"
    )  # fmt: skip
    jit_cache = Path(os.environ.get("TVM_FFI_CACHE_DIR", "~/.cache/tvm-ffi")).expanduser()
    assert not [*jit_cache.rglob("*.o"), *jit_cache.rglob("*.so")], "nvcc or not, nothing built"
    assert (row["traced"], row["flag"]) == ("compiles", "--cuda-graph-backend-prefill tc_piecewise")
    [fmha] = [k for k in row["kernels"] if "TllmGenFmhaRunner" in k["kernel"]]
    assert (fmha["available"], fmha["chosen"]) == (
        "no",
        "the release resolved dsa_prefill_backend=trtllm",
    ), "0.5.16 on SM12.0 resolves trtllm DSA prefill (FP8 KV), whose FMHA runner admits SM10x only"
    assert "fmhaRunner.cuh" in fmha["evidence"] and "kSM_100" in fmha["evidence"]
    assert row["outcome"] == "kernel unavailable" and row["kernels_missing"] == [fmha["kernel"]]
    assert {k["kernel"]: k["available"] for k in row["kernels"]}["FlashInfer mm_fp4"] == "yes"
    assert row["default_prefill"] == "disabled", "0.5.16 switches breakable off for MLA models"
    assert row["default_rule"].startswith("sglang/srt/server_args.py:") and (
        "Breakable CUDA graph is incompatible with MLA attention" in row["default_rule"]
    )
    assert row["graph_flags"]["breakable"] == "--cuda-graph-backend-prefill breakable"
    assert replay["fix"]["steps"][0]["entry"].endswith("ModelRunner.init_cuda_graphs")


AVAILABILITY = """
import json, sys
from fp4lab.serving.replay.release.inside import simulated_gpu
with simulated_gpu((int(sys.argv[1]), 0)):
    import flashinfer
    from fp4lab.serving.replay.release import availability
    reached = dict.fromkeys(sys.argv[2].split(","), 1)
    found = availability.check(reached, {"attention_backend": "dsa", "dsa_prefill_backend": "trtllm"},
                               (int(sys.argv[1]), 0))
print(json.dumps(found))
"""


def _availability(run: pool.VersionRun, major: int, reached: list[str]) -> dict[str, dict]:
    done = subprocess.run([str(run.environment.python), "-c", AVAILABILITY, str(major), ",".join(reached)],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(paths.REPO_ROOT / "lib")})  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    return {k["kernel"]: k for k in json.loads(done.stdout.splitlines()[-1])}


SGL_KERNEL_READ = (
    r"\(read from (the installed file|sglang_kernel-[\w.]+-cp310-abi3-manylinux\w+\.whl)\)$"
)
"""Where an environment's op library targets were read: its installed file, or (an environment
built before fp4lab read them) the published wheel."""


@pytest.mark.parametrize("major", [9, 10, 12])
def test_a_kernel_is_unavailable_on_one_sm_and_available_on_another(later_release, major):
    """The release's own FlashInfer says so: trtllm-gen FMHA's arch check admits SM10x only, and
    mm_fp4 declares no SM9.0 backend. sgl_kernel's loader picks its SM90 build on SM9.0, its SM100
    build elsewhere, and each carries a cubin for the SM; FlashInfer's norm module has no arch
    restriction of its own."""
    run, _, _ = later_release
    said = _availability(run, major, ["attention_backend.forward", "sglang::fp4_gemm",
                                      "sgl_kernel::rmsnorm", "flashinfer.norm.rmsnorm",
                                      "sglang::k_cache_and_topk_result"])  # fmt: skip
    ops = said["sgl_kernel::rmsnorm"]
    build = "sm90" if major == 9 else "sm100"
    assert (ops["library"], ops["available"]) == ("sgl_kernel", "yes"), ops
    assert ops["evidence"].startswith(
        f"sgl_kernel/load_utils.py:_load_architecture_specific_ops "
        f"picks sgl_kernel/{build}/common_ops.abi3.so on SM{major}.0: "
    )
    assert re.search(
        rf": (\d+) of its \1 compilation units carry an sm_{major}0 cubin", ops["evidence"]
    )
    assert re.search(SGL_KERNEL_READ, ops["evidence"]), ops["evidence"]
    norm = said["FlashInfer RMSNorm"]
    assert norm["available"] == "yes" and "with no arch restriction of its own" in norm["evidence"]
    fmha = said["FlashInfer trtllm-gen FMHA (TllmGenFmhaRunner)"]
    assert fmha["available"] == ("yes" if major == 10 else "no"), fmha
    assert re.search(r"fmhaRunner\.cuh:\d+: FLASHINFER_CHECK\(mSM == kSM_100", fmha["evidence"])
    gemm = said["FlashInfer mm_fp4"]
    assert gemm["available"] == ("no" if major == 9 else "yes"), gemm
    assert f"({major}0) is {major != 9}" in gemm["evidence"]
    logits = said["DeepGEMM fp8_mqa_logits"]
    assert logits["library"] == "deep_gemm" and logits["evidence"].startswith(
        "sgl-deep-gemm 0.1.4.post1 ships "
    ), logits
    assert (
        "(read from sgl_deep_gemm-0.1.4.post1-py3-none-manylinux2014_x86_64.whl, its sha256 "
        "as PyPI's index lists it)" in logits["evidence"]
    )
    assert logits["available"] == {9: "yes", 10: "unknown", 12: "no"}[major], logits
    assert {9: "impls/sm90_fp8_mqa_logits.cuh", 10: "none named sm100_fp8_mqa_logits",
            12: "kernel sources for sm90, sm100 only, none for SM12.x"}[major] in logits["evidence"]  # fmt: skip


def test_deepgemm_gains_sm120_kernels_in_a_later_pin_and_ships_in_the_kernel_package_before():
    """The DeepGEMM 0.5.17 pins (sgl-deep-gemm 0.1.5.post1) ships SM120 sources where 0.5.16's
    has none; the story's release (0.5.9) ships DeepGEMM inside sgl-kernel, read as installed."""
    later = deep_gemm_sources.published("==0.1.5.post1")
    assert deep_gemm_sources.runs_on(later, "fp8_mqa_logits", (12, 0)) == (
        True, f"{later['package']} ships {deep_gemm_sources.SOURCES}sm120_fp8_mqa_logits.cuh "
        f"(read from {later['read_from']})")  # fmt: skip
    story = env.ensure_env(versions.STORY_VERSION).deep_gemm
    assert (story["package"], story["read_from"]) == (
        "deep_gemm of sgl-kernel 0.3.21",
        "the installed files",
    )
    assert deep_gemm_sources.runs_on(story, "fp8_mqa_logits", (12, 0))[0] is False
    assert deep_gemm_sources.runs_on(story, "fp8_mqa_logits", (9, 0))[0] is True
    assert deep_gemm_sources.runs_on(story, "clean_logits", (12, 0))[0] is None, "smxx: any arch"


def test_an_sm_sgl_kernels_op_library_has_no_code_for_is_a_kernel_unavailable(later_release):
    """SM11.0 (Jetson Thor): sgl_kernel's loader picks its SM100 build, which carries cubins for
    SM8.0-SM12.0 but none of major 11 and no PTX."""
    run, _, _ = later_release
    ops = _availability(run, 11, ["sgl_kernel::rmsnorm"])["sgl_kernel::rmsnorm"]
    assert ops["available"] == "no", ops
    assert "picks sgl_kernel/sm100/common_ops.abi3.so on SM11.0: 0 of its" in ops["evidence"]
    assert "none holds PTX at or below compute_110" in ops["evidence"]


def test_the_published_wheel_gives_the_targets_the_environment_recorded(later_release):
    """The two sources of an op library's targets agree: the environment's manifest (read from
    the installed file when it was built) and the same file in the wheel PyPI publishes, fetched
    by range and checked against the installed RECORD."""
    run, _, _ = later_release
    site = standins.site_packages(str(run.environment.python))
    [entry] = [e for e in json.loads((site.parents[2] / standins.MANIFEST).read_text())
               if e["name"] == standins.BINARIES_REMOVED]  # fmt: skip
    [dist_info] = site.glob("sglang_kernel-*.dist-info")
    published = kernel_binaries.published(dist_info, sorted(entry["targets"]))

    def without_source(found: dict) -> dict:
        return {k: {f: v for f, v in t.items() if f != "read_from"} for k, t in found.items()}

    assert without_source(published) == without_source(entry["targets"])
    assert {k: t["units"] > 0 for k, t in published.items()} == {
        "sgl_kernel/sm100/common_ops.abi3.so": True, "sgl_kernel/sm90/common_ops.abi3.so": True}  # fmt: skip


def test_an_op_library_runs_where_every_unit_carries_the_sms_cubin_and_not_where_none_can():
    built = {"units": 4, "cubin": {"90": 4, "100": 4, "120": 3}, "ptx": {}}
    assert kernel_binaries.runs_on(built, (10, 0))[0] is True
    assert kernel_binaries.runs_on(built, (12, 0))[0] is None, "3 of 4 units: which op is unknown"
    assert kernel_binaries.runs_on(built, (10, 3))[0] is None, "sm_100 code of its major"
    assert kernel_binaries.runs_on(built, (11, 0))[0] is False
    assert kernel_binaries.runs_on({**built, "ptx": {"90": 4}}, (11, 0))[0] is None, "PTX to JIT"


REGISTRY = """
import importlib, json, sys
from pathlib import Path
from fp4lab.serving.replay.release import model, registry
with model.imported((12, 0)):
    if sys.argv[1] == "planted":  # a model module that asks for what only a walk sets up
        real = importlib.import_module
        def planted(name, *args):
            if name == "sglang.srt.models.deepseek_v2":
                raise AssertionError("tensor model parallel group is not initialized")
            return real(name, *args)
        importlib.import_module = planted
    found = registry.imported_once((12, 0), Path(sys.argv[2]))
    found["in_this_process"] = "sglang.srt.models.registry" in sys.modules
print(json.dumps(found))
"""


@pytest.mark.parametrize("case", ["as released", "planted"])
def test_the_registry_is_imported_once_only_where_no_model_module_needs_a_walks_set_up(
    later_release, case, tmp_path
):
    """The release's registry imports cleanly before the walks fork (a module missing a package
    fails the same in every process); a model module failing for want of the parallel groups
    leaves the import to each walk, as the release's loader does it."""
    run, replay, _ = later_release
    done = subprocess.run([str(run.environment.python), "-c", REGISTRY, case,
                           str(tmp_path / "registry.json")], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "PYTHONPATH": str(paths.REPO_ROOT / "lib")})  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    found = json.loads(done.stdout.splitlines()[-1])
    clean = case == "as released"
    assert (found["imported_once"], found["in_this_process"]) == (clean, clean), found
    assert found["first"] == (
        []
        if clean
        else ["sglang.srt.models.deepseek_v2: tensor model parallel group is not initialized"]
    )
    assert replay["registry"]["imported_once"] is True, "notebook 11's child imported it once"


def test_a_patch_walk_is_the_same_whatever_walked_before_it(later_release):
    """GLM-5's patch walk in notebook 11's child (after its chain walk, each in a fork of its
    own) equals the patch walk alone in a fresh child, graph for graph. SGLang's backend receives
    one graph, as on a GPU: sgl_kernel's ``is_arch_support_pdl`` memo is filled before the compile
    as the release's eager forwards fill it; left empty, dynamo recompiled once the first compiled
    forward filled it (two graphs, 6 pieces)."""
    run, replay, _ = later_release
    glm5 = models.named(pool.GLM5)
    [alone] = matrix.measure([glm5], [run.version], ["12.0"], fresh=True)
    fresh = alone.by_model[glm5.name]["12.0"]
    assert "kept" not in fresh and "chain" not in fresh and replay["chain"]
    assert {k: fresh["fix"][k] for k in ("graphs", "pieces", "parts", "compiles")} == {
        k: replay["fix"][k] for k in ("graphs", "pieces", "parts", "compiles")
    }
    assert fresh["fix"]["graphs"] == 1, "no recompile on sgl_kernel's is_arch_support_pdl memo"


def test_the_timeline_puts_the_two_outcomes_in_release_order(notebook_records, later_release):
    _, _, later = later_release
    story = [r for r in _of(notebook_records, "decision") if r["sm"] == "12.0"]
    runs = timeline.runs([*story, later], "12.0")
    assert [(g["from"], g["outcome"]) for g in runs] == [
        (versions.STORY_VERSION, "blocked"),
        (versions.TEST_VERSIONS[-1], "kernel unavailable"),
    ]
    points = timeline.turning_points([*story, later], "12.0")
    assert points["first_compiles"] is None, "traced through, but a kernel it reaches is missing"
    summary = _of(notebook_records, "summary")[-1]
    assert summary["timeline"]["12.0"]["sentence"].startswith(
        f"SM12.0: {versions.STORY_VERSION} blocked at FlashInfer's FP4 quantize JIT (the story's nvcc"
    )
    assert summary["timeline"]["12.0"]["run"] == timeline.to_run(story, "12.0"), "the table's cell"
    assert summary["timeline"]["12.0"]["run"].startswith(f"SGLang {versions.STORY_VERSION}, `--")


def _of(found: list[dict], kind: str) -> list[dict]:
    return [r["values"] for r in found if r["kind"] == kind]


def _replay(found: list[dict], sm: str) -> dict:
    (replay,) = [
        r for r in _of(found, "replay") if r["sm"] == sm and r["sglang_version"] == "0.5.9"
    ]
    return replay


def test_the_module_under_test_is_the_releases_own_glm5(notebook_records):
    facts = _replay(notebook_records, versions.STORY_SM)["facts"]
    assert facts["model_class"] == "sglang.srt.models.glm4_moe.GlmMoeDsaForCausalLM"
    assert facts["loader"] == "DummyModelLoader"
    methods = facts["quant_methods"]
    assert methods["FusedMoE: ModelOptNvFp4FusedMoEMethod"] == 1, "one MoE layer, NVFP4"
    assert methods["ReplicatedLinear: ModelOptFp4LinearMethod"] > 0
    assert facts["quantize"]["implementation"] == "flashinfer_direct"
    assert facts["quantize"]["call_site"].startswith(
        "sglang/srt/layers/quantization/modelopt_quant.py:"
    )
    assert facts["server_args"]["attention_backend"] == "nsa", "the release's own choice for DSA"


def test_the_story_replays_through_the_releases_runner_on_its_glm5(notebook_records):
    replay = _replay(notebook_records, versions.STORY_SM)
    assert decide.blockers(replay["chain"]) == STORY_SIGNATURES
    for row in replay["chain"]:
        assert row["signature"] != "ok"
        assert any(
            f.endswith(":_ensure_compiled") for f in row["frames"] if f.startswith(SGLANG_COMPILE)
        )
        assert any("piecewise_cuda_graph_runner.py" in f for f in row["frames"])
    subprocess_row = next(r for r in replay["chain"] if r["signature"] == "subprocess")
    assert any(f.startswith("sglang/srt/models/deepseek_v2.py:") for f in subprocess_row["frames"])
    assert any(f.startswith(MODELOPT) for f in subprocess_row["frames"])
    assert subprocess_row["blocker_frame"].startswith("flashinfer/jit/")
    assert "simulated_target" in replay["evidence"]
    eager = replay["eager_release"]
    assert eager["status"] == "runtime_error", "the release's piecewise path fails eagerly too"
    assert "topk_indices" in eager["message"], "at DSA attention's split op: no compiler to blame"


def test_the_first_blocker_frame_follows_cuda_home(notebook_records):
    cases = {c["cuda_home"]: c for c in _replay(notebook_records, versions.STORY_SM)["cuda_home"]}
    assert set(cases) == {"unset", "/usr/local/cuda"}
    assert all(c["signature"] == "subprocess" for c in cases.values())
    assert cases["unset"]["blocker_frame"].endswith(":get_cuda_path"), "which nvcc"
    assert cases["/usr/local/cuda"]["blocker_frame"].endswith(":get_cuda_version"), "nvcc --version"


def test_the_patch_makes_glm5_compile_to_the_expected_pieces_and_equal_eager(notebook_records):
    fixed = _replay(notebook_records, versions.STORY_SM)["fix"]
    story_parts = ["fp4_quantize_op", "dsa_indexer_split_op", "dsa_attention_split_op"]
    assert fixed["parts"] == story_parts
    steps = fixed["steps"]
    assert [s["parts"] for s in steps] == [story_parts[:i] for i in range(4)]
    assert "nsa_indexer.py" in steps[1]["blocker_frame"], "the next wall is the DSA indexer"
    assert "radix_attention.py" in steps[2]["blocker_frame"], "then DSA attention's split op"
    assert fixed["compiles"] and fixed["equals_eager"] is True and fixed["finite"]
    assert fixed["pieces"] == fixed["expected_pieces"] > fixed["graphs"]
    ops = fixed["graph_custom_ops"]
    assert ops["fp4lab_patch.fp4_quantize"] > 0 and ops["fp4lab_patch.dsa_indexer"] > 0
    assert "sglang.moe_forward_piecewise_cuda_graph_impl" in ops
    assert fixed["kernel"].startswith("fp4lab reference")
    assert {"trace", "reference_kernel"} <= set(fixed["evidence"])
    compile(fixed["plugin"], "plugin", "exec")  # the file a user installs is Python


def test_each_sm_takes_the_releases_own_path(notebook_records):
    decisions = {r["sm"]: r for r in _of(notebook_records, "decision")}
    story = decisions[versions.STORY_SM]
    assert (story["outcome"], story["blocked_at"]) == ("blocked", "subprocess")
    assert story["flag"] == "--enable-piecewise-cuda-graph"
    assert (story["default_prefill"], story["default_rule"]) == (
        "disabled",
        "the parsed value stood",
    )
    assert story["kernel_backends"]["kv_cache_dtype"] == "fp8_e4m3", "the release's choice on SM12"
    assert story["kernel_backends"]["nsa_prefill_backend"] == "flashmla_auto"
    assert story["moe_op"] == "sglang::moe_forward_piecewise_cuda_graph_impl"
    assert decisions["10.0"]["quantize"] == "sgl_kernel_op"
    assert decisions["10.0"]["patch"] == ["dsa_indexer_split_op", "dsa_attention_split_op"]
    assert (
        decisions["10.0"]["moe_op"]
        == "sglang::flashinfer_fp4_moe_forward_piecewise_cuda_graph_impl"
    )
    assert decisions["9.0"]["outcome"] == "not applicable" and "SM10.0+" in decisions["9.0"]["note"]
    summary = _of(notebook_records, "summary")[-1]
    assert summary["sm120_specific_0_5_9"] is True
    assert summary["story_blockers_0_5_9"] == STORY_SIGNATURES
    assert _of(notebook_records, "figure") == [{"written": True}]


def test_every_stand_in_is_listed_with_its_boundary_and_why(notebook_records):
    names = {s["name"]: s for s in _replay(notebook_records, versions.STORY_SM)["standins"]}
    for name in ("attention_backend", "sgl_kernel_ops", "sglang::fp4_gemm_cpu_kernel",
                 "ninja_refused", "cutlass_moe_fp4_eager_only", "cuda_graph_capture_not_run",
                 "eager_pass"):  # fmt: skip
        assert name in names and names[name]["why"], name


def test_the_environment_says_where_its_torch_differs_from_the_pin(notebook_records):
    envs = {r["version"]: r for r in _of(notebook_records, "environment")}
    assert envs["0.5.9"]["differs"] == ["torch: release pins ==2.9.1, installed 2.13.0+cpu"]
    assert envs["0.5.9"]["pins"]["flashinfer-python"] == "==0.6.3"
    [removed] = [s for s in envs["0.5.9"]["standins"] if s["name"] == standins.BINARIES_REMOVED]
    site = standins.site_packages(str(env.env_dir("0.5.9") / "venv" / "bin" / "python"))
    assert not list((site / standins.KERNEL_BINARIES).rglob("*.so*"))
    assert removed["removed"] and removed["bytes"] > 100 * 2**20, "the CUDA op libraries"
    assert envs["0.5.9"]["installed"]["triton"] == "3.5.1", "the Triton torch 2.9.1 requires"
    assert env.triton_required(">=2.9") is None, "no exact torch pin: Triton left to the resolver"


@pytest.mark.browser
def test_the_exported_page_says_the_environment_in_one_line_and_fits(notebook_records):
    """The release's environment (built, or reused where notebook 04 or an earlier run made it)
    is one line on the exported page, uv's install lines are not there (``browser.NOISE``), and
    the page fits the window."""
    [executed] = _of(notebook_records, "executed")
    page = exported(executed["path"])
    said = environment_lines(page, f"build/sglang-compile/{versions.STORY_VERSION}/venv")
    [environment] = _of(notebook_records, "environment")
    assert said == [environment["status"]], "one line for the release's environment"


@pytest.mark.parametrize("version", [versions.STORY_VERSION])
def test_sglangs_own_split_cuts_the_same_graph_into_the_same_pieces(version, tmp_path):
    """compile.piecewise splits as the release's split_graph does, and notebook 04's token counts
    (its CPU default and the GPU run's) are sizes the release's prefill capture list holds."""
    built = env.ensure_env(version)
    assert built.ok, built.error
    child = venvs.Child(built.python, "fp4lab.serving.replay.release.split_check", (), f"split-{version}",
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


def test_the_flags_a_user_needs_come_from_the_releases_resolution():
    """Shaped like 0.5.9's, 0.5.16's and 0.5.23's resolutions (``resolution.reach``); the real
    ones are read in the tests of those releases above."""
    enabled = decide.cell("0.5.9", "12.0", {"resolution": ENABLED, "not_driven": "x"})
    assert (enabled["flag"], enabled["default_prefill"]) == (
        "--enable-piecewise-cuda-graph",
        "disabled",
    )
    assert enabled["flag_why"].startswith(
        "the release resolves disabled by default (the parsed value stood)"
    )
    reached = decide.cell("0.5.16", "12.0", {"resolution": REACHED, "not_driven": "x"})
    assert reached["flag"] == "--cuda-graph-backend-prefill tc_piecewise"
    assert reached["graph_flags"]["breakable"] == "--cuda-graph-backend-prefill breakable"
    by_default = resolutions.resolved([], default="tc_piecewise")
    assert decide.cell("0.5.14", "12.0", {"resolution": by_default})["flag"] == "none needed"
    row = decide.cell("0.5.23", "12.0", {"resolution": REMOVED, "fix": {"compiles": True}})
    assert (row["outcome"], row["flag"]) == ("not applicable", "none reaches it")
    assert (
        "tc_piecewise was removed" in row["note"]
        and "traced anyway: compiles as released" in row["note"]
    )
    unknown = decide.cell("0.5.23", "12.0", {"error": "the child timed out"})
    assert (unknown["flag"], unknown["outcome"]) == ("unknown", "not measured")


def test_the_command_lines_that_may_ask_for_a_graph_come_from_the_parsers_options():
    prefill = {"options": ["--cuda-graph-backend-prefill"], "help": "Backend for the prefill phase.",
               "choices": ["breakable", "tc_piecewise", "disabled"]}  # fmt: skip
    enable = {"options": ["--enable-piecewise-cuda-graph"], "help": "Deprecated: on by default."}
    enforce = {
        "options": ["--enforce-piecewise-cuda-graph"],
        "help": "Skip auto-disable conditions.",
    }
    assert resolution.candidates([prefill], "breakable") == [
        [],
        ["--cuda-graph-backend-prefill", "breakable"],
    ]
    assert resolution.candidates([enable, enforce], "tc_piecewise") == [
        [], ["--enable-piecewise-cuda-graph"], ["--enforce-piecewise-cuda-graph"],
        ["--enable-piecewise-cuda-graph", "--enforce-piecewise-cuda-graph"]]  # fmt: skip
    assert resolution.candidates([enable], "breakable") == [[]], "no option asks for it"


GQA = "Disable piecewise CUDA graph because some layers do not apply Standard GQA"


def test_a_runner_the_release_declines_is_not_applicable_with_the_reason_it_logged():
    """Shaped like 0.5.3.post2's replay: its ModelRunner.__init__ builds no runner for GLM-5."""
    step = {
        "status": "declined",
        "signature": "declined",
        "message": GQA,
        "entry": replay_runner.INIT,
    }
    replay = {"resolution": ENABLED, "chain": [step],
              "fix": {"steps": [step], "parts": [], "compiles": False}}  # fmt: skip
    row = decide.cell("0.5.3.post2", "10.0", replay)
    assert (row["outcome"], row["flag"]) == ("not applicable", "--enable-piecewise-cuda-graph")
    assert row["note"] == ("the release's ModelRunner builds no piecewise runner for GlmMoeDsaForCausalLM "
                           f'(ModelRunner.__init__ logged "{GQA}")')  # fmt: skip
    assert (row["blockers"], row["compiles_with_patch"], row["blocked_at"]) == ([], None, None)
    assert timeline.what(row).startswith("not applicable (the release's ModelRunner builds no")
    silent = {**step, "message": None, "entry": replay_runner.ENTRY}
    row = decide.cell("0.5.9", "10.0", {**replay, "fix": {"steps": [silent], "compiles": False}})
    assert row["note"].endswith("(ModelRunner.init_piecewise_cuda_graphs logged no reason)")


def test_why_a_release_declines_is_read_from_its_model_runner_log():
    logger = logging.getLogger(replay_runner.LOGGER)
    level, handlers = logger.level, list(logger.handlers)
    with replay_runner.logged(replay_runner.LOGGER) as lines:
        logger.info("Init torch distributed begin.")
        logger.info(GQA)
        logger.debug("below INFO: not kept")
    logger.warning("after the while: not kept")
    assert lines == ["Init torch distributed begin.", GQA]
    assert (
        replay_runner.declined_reason(lines) == GQA
        and replay_runner.declined_reason(lines[:1]) is None
    )
    assert (logger.level, logger.handlers) == (level, handlers)


def test_a_release_no_option_reaches_is_not_applicable_without_being_driven():
    """Shaped like 0.5.23's replay: the model is built, its parser offers no tc_piecewise."""
    replay = {"resolution": REMOVED, "not_driven": "removed",
              "facts": {"model_class": "sglang.srt.models.glm4_moe.GlmMoeDsaForCausalLM"}}  # fmt: skip
    row = decide.cell("0.5.23", "12.0", replay)
    assert (row["outcome"], row["flag"], row["blockers"]) == (
        "not applicable",
        "none reaches it",
        [],
    )
    assert "GlmMoeDsaForCausalLM built; its runner not driven" in row["note"]


def test_a_dynamo_error_sglang_re_raised_is_read_from_dynamo_and_its_part_chosen():
    """0.5.2x re-raises the compile pass's dynamo error as "Capture prefill CUDA graph failed";
    the blocker is dynamo's, and is_musa's import probe has its patch part."""
    from fp4lab.compile import trace
    from fp4lab.serving.replay.release import child, inside

    def probe() -> None:
        raise torch._dynamo.exc.Unsupported("Import failure")

    try:
        try:
            probe()
        except RuntimeError as error:
            raise RuntimeError(f"Capture prefill CUDA graph failed: {error}") from error
    except RuntimeError as wrapped:
        outcome = trace.TraceOutcome(status="compiled", fullgraph=True, backend="sglang", seconds=0)
        inside.failed(outcome, wrapped)
    assert (outcome.status, outcome.exception) == ("unsupported", "torch._dynamo.exc.Unsupported")
    row = {"status": "unsupported", "frames": ["sglang/srt/utils/common.py:226:is_musa"]}
    assert child.part_for(row) == "musa_probe_constant"
    assert child.part_for({**row, "status": "runtime_error"}) is None
    text = patch.render("0.5.21", "12.0", ["musa_probe_constant"])
    assert "assume_constant_result" in text and '_after_import("sglang.srt.utils.common"' in text
