"""Notebook 11's decisions without a replay: a failure of fp4lab's harness is "not measured", never
"not applicable"; "not applicable" only on the release's own evidence; the timeline per SM; the
release layouts the replay knows, read from files; one rank's values filled by signature."""

from __future__ import annotations

import os
import subprocess

import pytest

from fp4lab.serving.replay import decide, pool, timeline, upstream, versions
from fp4lab.serving.replay.release import failed, kernels, layout, model, ranks
from fp4lab.serving.replay.shared import flags, models
from resolutions import REACHED, REMOVED


def test_a_registry_that_failed_to_import_is_not_measured_not_not_applicable():
    """Shaped like 0.5.16's replay before its environment held xgrammar: the model registry
    imported nothing, and the parser could not be built either. That is fp4lab's environment,
    not SGLang: not measured, with the frame, never "not applicable"."""
    replay = {"build_error": "LookupError: the release's model registry has none of ...",
              "build_frames": ["fp4lab/serving/replay/release/child.py:230:replay",
                               "fp4lab/serving/replay/release/model.py:108:_architecture"],
              }  # fmt: skip
    row = decide.cell("0.5.16", "12.0", replay)
    assert row["outcome"] == "not measured"
    assert row["harness_frame"] == "fp4lab/serving/replay/release/model.py:108:_architecture"
    assert row["note"].startswith(
        "fp4lab's harness failed at fp4lab/serving/replay/release/model.py:108"
    )
    read = decide.cell("0.5.16", "12.0", {**replay, "resolution": REACHED})
    assert read["outcome"] == "not measured", "the release resolves tc_piecewise: no excuse"


# The frames of real build failures (the last 8, as ``failed.failure`` keeps them).
REFUSED_NVFP4 = [  # 0.5.3.post2, GLM-5 on SM12.0: the MoE's FP4 method asks for SM10.x
    "sglang/srt/utils/offloader.py:36:wrap_modules", "sglang/srt/utils/common.py:517:<genexpr>",
    "sglang/srt/models/deepseek_v2.py:2620:<lambda>", "sglang/srt/models/deepseek_v2.py:2408:__init__",
    "sglang/srt/models/deepseek_v2.py:549:__init__",
    "sglang/srt/layers/moe/fused_moe_triton/layer.py:209:__init__",
    "sglang/srt/layers/quantization/modelopt_quant.py:694:get_quant_method",
    "sglang/srt/layers/quantization/modelopt_quant.py:879:__init__"]  # fmt: skip
NO_DUMMY_WEIGHTS = [  # 0.5.4, Llama: its ModelOpt loader reads weight files, dummy or not
    "fp4lab/serving/replay/release/model.py:257:build", "sglang/srt/model_loader/loader.py:1960:load_model",
    "sglang/srt/model_loader/loader.py:595:load_model",
    "sglang/srt/model_loader/loader.py:603:load_weights_and_postprocess",
    "sglang/srt/models/llama.py:572:load_weights",
    "sglang/srt/model_loader/loader.py:493:_get_all_weights",
    "sglang/srt/model_loader/loader.py:442:_get_weights_iterator",
    "sglang/srt/model_loader/loader.py:387:_prepare_weights"]  # fmt: skip
REGISTRY_MISS = [  # 0.5.5, GLM-5, when its registry was imported before the parallel groups
    # (its dummy loader's path to the class, with the lines of 0.5.5's files)
    "fp4lab/serving/replay/release/model.py:257:build", "sglang/srt/model_loader/loader.py:723:load_model",
    "sglang/srt/model_loader/loader.py:222:_initialize_model",
    "sglang/srt/model_loader/utils.py:101:get_model_architecture",
    "sglang/srt/model_loader/utils.py:51:resolve_transformers_arch"]  # fmt: skip


def test_a_refusal_of_the_harnesss_choices_is_not_measured_and_the_releases_own_stays():
    """A ValueError in the release's loader is its refusal of the model, unless it refused what
    fp4lab chose: dummy weights, or a class its registry lacks only as imported here."""
    assert failed.refusal(REFUSED_NVFP4) == (True, None)
    stand_in = [*REFUSED_NVFP4, "fp4lab/serving/replay/release/cpu_kernels.py:40:quantize"]
    assert failed.refusal(stand_in) == (False, None), "raised by fp4lab's stand-in, not the release"
    llama4 = ["fp4lab/serving/replay/release/model.py:257:build",
              "sglang/srt/server_args.py:1180:_handle_model_specific_adjustments"]  # fmt: skip
    assert failed.refusal(llama4) == (True, None), "the release's own argument checks"
    for frames, said in ((NO_DUMMY_WEIGHTS, "takes no dummy weights"),
                         (REGISTRY_MISS, "registry, as imported on this machine")):  # fmt: skip
        refused, choice = failed.refusal(frames)
        assert not refused and said in choice
        row = decide.cell("0.5.5", "10.0", {
            "build_error": "ValueError: ...", "build_frames": frames, "refused_by_release": refused,
            "harness_choice_refused": choice, "resolution": REACHED})  # fmt: skip
        assert row["outcome"] == "not measured" and said in row["note"]
        assert row["harness_frame"] == "fp4lab/serving/replay/release/model.py:257:build"
    release = decide.cell("0.5.3.post2", "12.0", {
        "build_error": "ValueError: Current platform does not support NVFP4 quantization.",
        "build_frames": REFUSED_NVFP4, "refused_by_release": True, "resolution": REMOVED})  # fmt: skip
    assert release["outcome"] == "not applicable"
    assert release["note"].startswith("the release refuses GlmMoeDsaForCausalLM on SM12.0")


def test_a_model_sglang_built_in_place_of_the_releases_own_class_is_not_measured():
    """Shaped like Qwen3-MoE on 0.5.5 at 87c133e: SGLang's registry, imported before the release's
    parallel groups existed, lacked Qwen3MoeForCausalLM, so its loader built its Transformers
    fallback, whose layers its ModelRunner then declined; recorded as the release declining."""
    fallback = type("TransformersForCausalLM", (), {})()
    with pytest.raises(model.NotTheReleasesModel, match="SGLang built TransformersForCausalLM, "
                       "not Qwen3MoeForCausalLM, which the release's model files define"):  # fmt: skip
        model.own_class(fallback, "Qwen3MoeForCausalLM")
    model.own_class(type("Qwen3MoeForCausalLM", (), {})(), "Qwen3MoeForCausalLM")
    row = decide.cell("0.5.5", "10.0", {
        "build_error": "NotTheReleasesModel: SGLang built TransformersForCausalLM, ...",
        "build_frames": ["fp4lab/serving/replay/release/child.py:223:replay",
                         "fp4lab/serving/replay/release/model.py:276:build",
                         "fp4lab/serving/replay/release/model.py:98:own_class"],
        "refused_by_release": False, "resolution": REACHED})  # fmt: skip
    assert row["outcome"] == "not measured"
    assert row["harness_frame"] == "fp4lab/serving/replay/release/model.py:98:own_class"


def test_a_stand_in_that_broke_is_not_measured_and_counted_apart():
    broken = {"build_error": "AttributeError: 'ModuleNotFoundError' object has no attribute "
              "'get_num_sms'", "build_frames": ["sglang/srt/layers/attention/dsa/dsa_indexer.py:"
                                                "339:__init__"],
              "resolution": REACHED}  # fmt: skip
    drive = {"resolution": REACHED, "harness_error": {
        "error": "AttributeError: 'PiecewiseCudaGraphRunner' object has no attribute 'input_ids'",
        "frames": ["fp4lab/serving/replay/release/runner.py:307:output"],
        "harness_frame": "fp4lab/serving/replay/release/runner.py:307:output"}}  # fmt: skip
    crashed = {"error": "the GLM-5 replay of SGLang 0.5.13 on SM12.0 timed out after 600 s"}
    rows = [decide.cell("0.5.13", sm, r) for sm, r in
            (("9.0", broken), ("10.0", drive), ("12.0", crashed))]  # fmt: skip
    assert [r["outcome"] for r in rows] == ["not measured"] * 3
    assert rows[0]["harness_frame"].endswith(":__init__") and "get_num_sms" in rows[0]["note"]
    assert rows[1]["harness_frame"] == "fp4lab/serving/replay/release/runner.py:307:output"
    compiles = decide.cell("0.5.16", "12.0", {
        "resolution": REACHED, "chain": [], "fix": {
            "steps": [{"status": "compiled", "signature": "ok"}], "parts": [], "compiles": True,
            "equals_eager": True, "pieces": 3}})  # fmt: skip
    said = decide.decision([*rows, compiles])
    assert said["verdict"] == "UNBLOCKED"
    assert said["number"] == ("compiles in 1, blocked in 0 of 1 reachable release x SM traced; "
                              "3 not measured (fp4lab's harness failed)")  # fmt: skip
    assert "not measured (harness): SM9.0 0.5.13; SM10.0 0.5.13; SM12.0 0.5.13" in said["why"]


def test_not_applicable_needs_the_releases_own_evidence():
    absent = decide.cell("0.5.3.post2", "12.0", {
        "build_error": "ModelAbsent: ...", "model_absent": "the release's model files define "
        "none of GlmMoeDsaForCausalLM, DeepseekV32ForCausalLM", "resolution": REMOVED})  # fmt: skip
    assert absent["outcome"] == "not applicable" and "model files define none" in absent["note"]
    said = (
        "ValueError: The quantization method modelopt_fp4 is not supported for the current GPU. "
        "Minimum capability: 100. Current capability: 90."
    )
    refused = decide.cell("0.5.9", "9.0", {"build_error": said, "min_capability": 100,
                                           "resolution": REACHED})  # fmt: skip
    assert refused["outcome"] == "not applicable" and "SM10.0+" in refused["note"]
    no_option = decide.cell("0.5.2", "12.0", {"build_error": "LookupError: ...",
                                              "resolution": REMOVED})  # fmt: skip
    assert no_option["outcome"] == "not applicable", "the release resolved; no option reaches it"
    assert no_option["note"].startswith("the release resolves breakable by default (sglang/srt/")
    assert (
        "no option reaches tc_piecewise: refused: the parser: argument --cuda-graph-backend-"
        "prefill: tc_piecewise was removed" in no_option["note"]
    )


def _row(version: str, sm: str, outcome: str, **extra: object) -> dict:
    base = {"sglang_version": version, "sm": sm, "outcome": outcome, "flag": "none needed",
            "blocked_at": None, "patch": [], "compiles_with_patch": None, "equals_eager": None,
            "harness_frame": None, "why_short": "", "note": ""}  # fmt: skip
    return {**base, **extra}


def test_the_timeline_groups_runs_of_releases_and_names_the_turning_points():
    v = versions.VERSIONS
    rows = [
        _row(v[0], "12.0", "not applicable", why_short="the release refuses NVFP4"),
        _row(v[7], "12.0", "blocked", blocked_at="subprocess", patch=["fp4_quantize_op"],
             compiles_with_patch=True, equals_eager=True, flag="--enable-piecewise-cuda-graph"),
        _row(v[8], "12.0", "blocked", blocked_at="subprocess"),
        _row(v[11], "12.0", "compiles", equals_eager=True, flag="--enforce-piecewise-cuda-graph"),
        _row(v[12], "12.0", "compiles", equals_eager=True, flag="--enforce-piecewise-cuda-graph"),
        _row(v[19], "12.0", "blocked", blocked_at="SGLang's is_musa() import probe"),
        _row(v[20], "12.0", "not measured", harness_frame="fp4lab/x.py:1:f"),
    ]  # fmt: skip
    runs = timeline.runs(list(reversed(rows)), "12.0")  # release order, whatever the rows' order
    assert [(r["from"], r["to"], r["state"]) for r in runs] == [
        (v[0], v[0], "not applicable (the release refuses NVFP4)"),
        (v[7], v[8], "blocked at FlashInfer's FP4 quantize JIT (the story's nvcc subprocess)"),
        (v[11], v[12], "compiles with --enforce-piecewise-cuda-graph"),
        (v[19], v[19], "blocked at SGLang's is_musa() import probe"),
        (v[20], v[20], "not measured (harness: fp4lab/x.py:1:f)"),
    ]
    points = timeline.turning_points(rows, "12.0")
    assert (points["first_compiles"], points["stops_again"]) == (v[11], v[19])
    assert timeline.recommendation(rows, "12.0").startswith(
        f"SGLang {v[12]} with `--enforce-piecewise-cuda-graph`"
    )
    never = [r for r in rows if r["outcome"] != "compiles"]
    assert timeline.recommendation(never, "12.0").startswith(f"SGLang {v[7]} with ")
    assert "--write-patch" in timeline.recommendation(never, "12.0")
    assert timeline.to_run(rows, "12.0") == (
        f"SGLang {v[12]}, `--enforce-piecewise-cuda-graph` (tc_piecewise)"
    )
    assert timeline.to_run(never, "12.0").endswith("+ fp4lab's patch (tc_piecewise)")
    sentence = timeline.sentence(rows, "12.0")
    assert (
        sentence.startswith(f"SM12.0: {v[0]} not applicable")
        and f"first compiles in {v[11]}" in sentence
    )


def test_the_layout_is_read_from_the_releases_files_and_an_unknown_one_is_named(tmp_path):
    root = tmp_path / "sglang"
    (root / "srt" / "models").mkdir(parents=True)
    with pytest.raises(layout.LayoutError, match="runner lacks srt/model_executor/piecewise_cuda"):
        layout.family(root)
    for file in (*layout.FAMILIES["runner"], "srt/layers/attention/nsa/nsa_indexer.py"):
        (root / file).parent.mkdir(parents=True, exist_ok=True)
        (root / file).write_text("")
    assert layout.family(root) == "runner"
    (root / "srt/models/glm4_moe.py").write_text("class GlmMoeDsaForCausalLM(Base):\n    pass\n")
    assert layout.classes_in_source(root, ("GlmMoeDsaForCausalLM", "DeepseekV32ForCausalLM")) == (
        "GlmMoeDsaForCausalLM",
    )
    for file in layout.FAMILIES["reworked"]:
        (root / file).parent.mkdir(parents=True, exist_ok=True)
        (root / file).write_text("")
    assert layout.family(root) == "runner", "the first family whose files are all there"


def test_one_ranks_values_fill_a_set_up_call_by_name_and_an_unknown_parameter_is_named():
    def set_up(*, server_args, tp_size, moe_ep_rank, gpu_id, timeout=30):
        return server_args, tp_size, moe_ep_rank, gpu_id, timeout

    assert ranks.call(set_up, server_args="args", unused=1) == ("args", 1, 0, 0, 30)

    def needs_more(*, spec_algorithm):
        return spec_algorithm

    with pytest.raises(layout.LayoutError, match="requires 'spec_algorithm'"):
        ranks.call(needs_more)


def test_a_model_that_traced_then_failed_when_run_blames_no_compiler():
    """A pass whose only failure is a runtime error (here a stand-in op missing, as 0.5.8 met
    before sgl_kernel's fused rotary had one) is not measured; after a real trace blocker, the
    blocker stands and the patch's result is not measured."""
    ran = {"status": "runtime_error", "signature": "runtime_error",
           "blocker_frame": "torch/_ops.py:1392:__getattr__",
           "message": "'_OpNamespace' 'sgl_kernel' object has no attribute 'fast_hadamard_transform'"}  # fmt: skip
    alone = decide.cell("0.5.8", "12.0", {"resolution": REACHED,
                                          "fix": {"steps": [ran], "parts": [], "compiles": False}})  # fmt: skip
    assert alone["outcome"] == "not measured" and "failed when run" in alone["note"]
    traced = {"status": "unsupported", "signature": "subprocess",
              "blocker_frame": "flashinfer/jit/cpp_ext.py:49:get_cuda_path", "message": "..."}  # fmt: skip
    after = decide.cell("0.5.8", "12.0", {
        "resolution": REACHED, "chain": [traced],
        "fix": {"steps": [traced, ran], "parts": ["fp4_quantize_op"], "compiles": False}})  # fmt: skip
    assert (after["outcome"], after["blocked_at"]) == ("blocked", "subprocess")
    assert after["compiles_with_patch"] is None and "(not measured)" in after["note"]


def test_each_child_walks_glm5s_chain_and_every_models_patch_walk_once():
    """Notebook 11's child on the story's release and SM walks GLM-5's story chain and its patch
    walk, and the patch walk of a model alongside; elsewhere GLM-5's chain is the plain one;
    notebook 14's asks patch walks only, a model asked twice walked once; where the release has
    breakable and full graphs, every model's capture of each too."""
    glm5, llama = models.named(pool.GLM5), models.named("llama-3.3-70b-nvfp4")
    story = pool.walks(versions.STORY_VERSION, versions.STORY_SM, [glm5], "chain", [llama])
    assert [(m.name, w) for m, w in story] == [
        (glm5.name, "story"), (glm5.name, "patch"), (llama.name, "patch")]  # fmt: skip
    other = pool.walks(versions.STORY_VERSION, "10.0", [glm5], "chain", [llama, glm5])
    assert [w for _, w in other] == ["chain", "patch", "patch"]
    assert [(m.name, w) for m, w in pool.walks("0.5.16", "9.0", [llama, glm5], "patch", [])] == [
        (llama.name, "patch"), (glm5.name, "patch")]  # fmt: skip
    captured = pool.walks("0.5.16", "9.0", [llama], "patch", [glm5], ("breakable", "full"))
    assert [(m.name, w) for m, w in captured] == [
        (llama.name, "patch"), (glm5.name, "patch"), (llama.name, "breakable"),
        (glm5.name, "breakable"), (llama.name, "full"), (glm5.name, "full")]  # fmt: skip


def test_a_replay_is_its_patch_walk_with_the_chain_and_not_measured_if_the_chain_failed():
    patched = {"eager_release": {"status": "compiled"}, "fix": {"parts": [], "compiles": True}}
    chained = {"eager_release": {"status": "compiled"}, "chain": [{"signature": "ok"}],
               "cuda_home": [{"cuda_home": "unset",
                              "blocker_frame": "flashinfer/jit/cpp_ext.py:49:get_cuda_path"}]}  # fmt: skip
    assert pool.merged(patched, None) == patched
    both = pool.merged(patched, chained)
    assert both["fix"] == patched["fix"] and both["chain"] == chained["chain"]
    assert "harness_error" not in both and both["cuda_home"] == chained["cuda_home"]
    timed_out = pool.merged(patched, {"error": "the fork timed out after 480 s and was killed"})
    assert decide.cell("0.5.9", "12.0", timed_out)["outcome"] == "not measured"
    assert decide.cell("0.5.9", "12.0", both)["outcome"] != "not measured"


def test_the_ninja_of_jit_builds_builds_nothing_and_names_each_module_it_refused(
    tmp_path, monkeypatch
):
    monkeypatch.setenv("FP4LAB_BUILD_DIR", str(tmp_path / "build"))
    monkeypatch.setenv("PATH", os.environ["PATH"])  # restored after the test
    [standin] = kernels.ninja_refused()
    assert standin["name"] == "ninja_refused" and standin["why"]
    log = tmp_path / "refused"
    monkeypatch.setenv("FP4LAB_REFUSED_BUILDS", str(log))
    folders = [tmp_path / "tvm-ffi" / "sgl_kernel_jit_qknorm_64_true_bf16_t_0ef23ea0b99d5ef3__arch_10.0",
               tmp_path / "jit" / "sm_120" / "fused_store_index_k_cache" / "build-3f2a" / ".staging-9c1d"]  # fmt: skip
    for folder in folders:
        folder.mkdir(parents=True)
        done = subprocess.run(
            ["ninja", "-f", "build.ninja"], cwd=folder, capture_output=True, text=True
        )
        assert done.returncode == 1 and "no CUDA module is built" in done.stderr
        assert list(folder.iterdir()) == [], "nothing built, nothing written"
    assert kernels.refused_builds(log) == [
        "fused_store_index_k_cache",
        "sgl_kernel_jit_qknorm_64_true_bf16_t",
    ]
    assert not log.exists() and kernels.refused_builds(log) == []


def _compiled(**fix: object) -> dict:
    """A replay whose patch walk met no blocker, with ``fix``'s comparison and pieces."""
    steps = [{"status": "compiled", "signature": "ok"}]
    return {"resolution": REACHED, "chain": [],
            "fix": {"steps": steps, "parts": [], "compiles": True, **fix}}  # fmt: skip


def test_compiles_needs_pieces_that_ran_and_logits_equal_to_eager():
    works = decide.cell("0.5.16", "12.0", _compiled(equals_eager=True, pieces=3))
    wrong = decide.cell("0.5.16", "10.0", _compiled(equals_eager=False, pieces=3,
                                                    max_abs_diff=2.5e-3))  # fmt: skip
    empty = decide.cell("0.5.16", "9.0", _compiled(equals_eager=True, pieces=0))
    assert works["outcome"] == "compiles" and "equals eager" in works["note"]
    assert wrong["outcome"] == "wrong output" and "max |compiled - eager| 0.0025" in wrong["note"]
    assert empty["outcome"] == "not measured" and "no piecewise graph ran" in empty["note"]
    said = decide.decision([works, wrong, empty])
    assert said["verdict"] == "PARTLY BLOCKED"
    assert said["number"].startswith("compiles in 1, blocked in 0, wrong output in 1 of 2 ")
    assert decide.decision([wrong])["verdict"] == "WRONG OUTPUT"
    assert timeline.recommendation([{**wrong, "model": "GLM-5"}], "10.0").startswith("no release")


FMHA_NO = {
    "kernel": "FlashInfer trtllm-gen FMHA (TllmGenFmhaRunner)",
    "library": "flashinfer",
    "available": "no",
    "chosen": "the release resolved dsa_prefill_backend=trtllm",
    "evidence": "fmhaRunner.cuh:37: FLASHINFER_CHECK(mSM == kSM_100 || mSM == kSM_103, ...)",
}
"""Shaped like 0.5.16's SM12.0 replay's record of its trtllm DSA prefill kernel."""


def test_a_kernel_the_sm_lacks_ranks_ahead_of_compiles_and_blocked_and_unknown_does_not():
    unknown = {"kernel": "sgl_kernel::rmsnorm", "library": None, "available": "unknown",
               "evidence": "no arch evidence read for this kernel", "chosen": "reached"}  # fmt: skip
    lacks = decide.cell("0.5.16", "12.0", {**_compiled(equals_eager=True, pieces=3),
                                           "kernel_availability": [unknown, FMHA_NO]})  # fmt: skip
    known = decide.cell("0.5.16", "10.0", {**_compiled(equals_eager=True, pieces=3),
                                           "kernel_availability": [unknown]})  # fmt: skip
    assert (lacks["outcome"], lacks["traced"]) == ("kernel unavailable", "compiles")
    assert lacks["kernels_missing"] == [FMHA_NO["kernel"]]
    assert "does not exist for SM12.0" in lacks["note"] and "fmhaRunner.cuh:37" in lacks["note"]
    assert known["outcome"] == "compiles" and known["kernels"] == [unknown]
    assert timeline.state(lacks) == f"kernel unavailable: {FMHA_NO['kernel']}"
    said = decide.decision([lacks, known])
    assert said["verdict"] == "PARTLY BLOCKED" and "kernel unavailable in 1" in said["number"]
    assert decide.decision([lacks])["verdict"] == "BLOCKED"
    blocked = {**_compiled(), "fix": {"steps": [{"status": "unsupported", "signature": "x",
               "blocker_frame": "f.py:1", "message": "m"}], "parts": [], "compiles": False},
               "kernel_availability": [FMHA_NO]}  # fmt: skip
    assert decide.cell("0.5.16", "12.0", blocked)["outcome"] == "kernel unavailable"
    absent = decide.cell("0.5.16", "12.0", {"resolution": REACHED, "not_driven": "x",
                                            "kernel_availability": [FMHA_NO]})  # fmt: skip
    assert absent["outcome"] == "not applicable", (
        "no graph to run: the SM's kernels do not decide it"
    )


def test_a_verdicts_guard_raises_under_python_O_and_lib_holds_no_assert():
    import ast
    from pathlib import Path

    code = "from fp4lab.core import evidence\nevidence.guard(False, 'upstream behaviour changed')"
    ran = subprocess.run([os.sys.executable, "-O", "-c", code], capture_output=True, text=True)
    assert ran.returncode == 1 and "GuardFailed: upstream behaviour changed" in ran.stderr
    lib = Path(decide.__file__).parents[2]
    asserted = [f"{path.relative_to(lib)}:{node.lineno}" for path in sorted(lib.rglob("*.py"))
                for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.Assert)]  # fmt: skip
    assert asserted == []


def test_upstreams_facts_are_held_against_the_replays_cells_both_ways():
    trtllm = {"dsa_prefill_backend": "trtllm", "dsa_decode_backend": "trtllm",
              "kv_cache_dtype": "fp8_e4m3"}  # fmt: skip
    musa = decide.BLOCKERS["musa_probe_constant"]
    rows = [
        _row("0.5.13", "10.0", "compiles"), _row("0.5.14", "10.0", "compiles"),
        _row("0.5.15", "10.0", "blocked", note="blockers: x"),
        _row("0.5.16", "12.0", "kernel unavailable", kernel_backends=trtllm, kernels=[FMHA_NO]),
        _row("0.5.17", "12.0", "compiles", kernel_backends=trtllm, kernels=[]),
        _row("0.5.21", "12.0", "blocked", blockers=[musa],
             kernel_backends={**trtllm, "dsa_prefill_backend": "flashinfer_sparse_mla"}),
        _row("0.5.12", "12.0", "compiles", deep_gemm={"available": "no", "evidence": "sm90 only"}),
    ]  # fmt: skip
    held = {(r["source"], r["release"], r["SM"]): r["verdict"] for r in upstream.agreement(rows)}
    ci = "upstream CI (test_pcg_glm5_fp4.py)"
    assert held[ci, "0.5.13", "10.0"] == held[ci, "0.5.14", "10.0"] == "agree"
    assert held[ci, "0.5.15", "10.0"] == "disagree"
    assert held["sglang#29562", "0.5.16", "12.0"] == "agree"
    assert held["sglang#29562", "0.5.17", "12.0"] == "not comparable", "no FMHA kernel recorded"
    assert held["sglang#29562", "0.5.21", "12.0"] == "disagree"
    assert held["sglang#26087", "0.5.12", "12.0"] == "agree", "DeepGEMM has no SM12.x kernel"
    assert held["sglang#39054", "0.5.21", "12.0"] == "agree"
    assert held["sglang#37606", "0.5.15", "10.0"] == "not comparable", "no capture counted"
    rows[2]["breakable"], rows[2]["breakable_weak_refs_at_risk"] = "works", 21
    rows[3]["breakable"], rows[3]["breakable_weak_refs_at_risk"] = "works", 0
    rows[-1]["deep_gemm"] = {"available": "unknown", "evidence": "not read"}
    found = upstream.agreement(rows)
    held = {(r["source"], r["release"], r["SM"]): r["verdict"] for r in found}
    assert held["sglang#37606", "0.5.15", "10.0"] == "agree"
    assert held["sglang#26087", "0.5.12", "12.0"] == "not comparable", "its kernels: not read"
    replayed = {(r["source"], r["release"]): r["replay"] for r in found if r["SM"] == "10.0"}
    assert replayed["sglang#37606", "0.5.15"] == "breakable: works", "the graph the fact concerns"
    assert replayed[ci, "0.5.15"] == "tc_piecewise: blocked"
    assert held["sglang#37606", "0.5.16", "12.0"] == "disagree"
    grouped = upstream.grouped(upstream.agreement(rows))
    assert [(r["release"], r["verdict"]) for r in grouped if r["source"] == ci] == [
        ("0.5.13–0.5.14", "agree"), ("0.5.15", "disagree")]  # fmt: skip
    missing = upstream.agreement([_row("0.5.9", "12.0", "blocked")])
    assert {r["why"] for r in missing} == {"not replayed in this run"}


def test_releases_are_written_as_ranges_in_release_order():
    v = versions.VERSIONS
    assert (
        versions.ranges([v[13], v[11], v[12], v[20], v[8]]) == f"{v[8]}, {v[11]}–{v[13]}, {v[20]}"
    )
    assert versions.by_sm([(v[11], "12.0"), (v[12], "12.0"), (v[12], "9.0")]) == (
        f"SM9.0 {v[12]}; SM12.0 {v[11]}–{v[12]}"
    )


def test_a_stop_at_tritons_libcuda_probe_is_this_machines_not_a_blocker():
    """Shaped like GLM-4.5-Air on 0.5.16: a torch.compile'd helper of the release sent inductor
    to Triton's NVIDIA driver, which finds no libcuda on a CPU machine; an MXFP4 model whose build
    stops there is not the NVFP4 config's refusal either."""
    probe = {"status": "unsupported", "signature": "other", "message": "libcuda.so cannot found!",
             "blocker_frame": "triton/backends/nvidia/driver.py:46:libcuda_dirs",
             "frames": ["torch/_inductor/compile_fx.py:1608:codegen_and_compile",
                        "triton/backends/nvidia/driver.py:46:libcuda_dirs"]}  # fmt: skip
    row = decide.cell("0.5.16", "12.0", {"resolution": REACHED, "chain": [],
                                         "fix": {"steps": [probe], "parts": [], "compiles": False}})  # fmt: skip
    assert row["outcome"] == "not measured" and "no CUDA driver for Triton" in row["note"]
    real = {
        **probe,
        "blocker_frame": "sglang/srt/layers/moe/topk.py:310:forward_cuda",
        "frames": [],
    }
    blocked = decide.cell("0.5.16", "12.0", {"resolution": REACHED, "chain": [],
                                             "fix": {"steps": [real], "parts": [], "compiles": False}})  # fmt: skip
    assert blocked["outcome"] == "blocked", "the same stop in the release's own code is a blocker"
    mxfp4 = decide.cell("0.5.9", "9.0", {
        "build_error": "AssertionError: libcuda.so cannot found!", "min_capability": 100,
        "resolution": REACHED, "build_frames": ["triton/backends/nvidia/driver.py:46:libcuda_dirs"]})  # fmt: skip
    assert mxfp4["outcome"] == "not measured", "not the NVFP4 config's refusal"


def test_the_kernels_table_runs_releases_of_one_availability_and_a_gap_ends_a_run():
    from fp4lab.serving.replay import tables

    unread = {"kernel": "sgl_kernel::rmsnorm", "library": None, "available": "unknown",
              "chosen": "reached as sgl_kernel::rmsnorm", "evidence": "no arch evidence read"}  # fmt: skip
    cells = [("0.5.14", [FMHA_NO, unread]), ("0.5.15", [FMHA_NO]), ("0.5.16", None),
             ("0.5.17", [FMHA_NO])]  # fmt: skip
    rows = [{"model": "glm", "sm": "12.0", "sglang_version": v, "kernels": k} for v, k in cells]
    table = tables.kernels_table(rows).data
    assert list(table["releases"]) == ["0.5.14–0.5.15", "0.5.17", ""]
    assert list(table["available"]) == ["no", "no", "unknown"]
    assert "model" not in table and table["evidence"].iloc[-1] == (
        "<details><summary>which 1</summary>sgl_kernel::rmsnorm</details>"
    ), "the kernels with no evidence read are folded, so a long list keeps its row short"


def test_the_recommendation_names_the_newest_release_and_captured_graph_that_work():
    """Per SM, the newest release whose breakable or full graphs work, with its flag; where both
    work there, the one the release gives by default; with none working, the traced answer."""
    base = {"sm": "10.0", "outcome": "not applicable", "flag": flags.UNREACHED, "model": "m",
            "breakable_flag": flags.NEEDED, "full_flag": "--cuda-graph-backend-prefill full"}  # fmt: skip
    rows = [{**base, "sglang_version": "0.5.22", "default_prefill": "breakable",
             "breakable": "works", "full": "blocked"},
            {**base, "sglang_version": "0.5.23", "default_prefill": "breakable",
             "breakable": "not measured", "full": "works"}]  # fmt: skip
    said = timeline.recommendation(rows, "10.0")
    assert said.startswith("SGLang 0.5.23 with `--cuda-graph-backend-prefill full` (full graphs"), (
        said
    )
    assert (
        timeline.to_run(rows, "10.0") == "SGLang 0.5.23, `--cuda-graph-backend-prefill full` (full)"
    )
    rows[1]["breakable"] = "works"
    said = timeline.recommendation(rows, "10.0")
    assert said.startswith("SGLang 0.5.23 with no flag (breakable graphs"), said
    assert timeline.to_run(rows, "10.0") == "SGLang 0.5.23, no flag (breakable)"
    rows[1]["breakable_weak_refs_at_risk"] = 21  # break inputs a later bucket's capture may take
    said = timeline.recommendation(rows, "10.0")
    assert "its breaks hold 21 tensors by weak reference only" in said and "sglang#37606" in said
    assert timeline.to_run(rows, "10.0") == (
        "SGLang 0.5.23, no flag (breakable; weak-referenced break inputs, sglang#37606)"
    )
    for row in rows:
        row["breakable"] = row["full"] = "blocked"
    assert timeline.recommendation(rows, "10.0").startswith("no release measured here")
    assert timeline.to_run(rows, "10.0") == "none measured here works"


def test_a_recommendations_kernels_name_what_the_sm_lacks_and_count_what_it_has():
    """The per-SM kernel line fits a table cell: the kernels the SM lacks and those of unknown
    availability by name, the available ones and those never asked counted."""
    yes = {"kernel": "FlashInfer mm_fp4", "library": "flashinfer", "available": "yes"}
    row = {"kernel_backends": {"attention_backend": "dsa", "moe_runner_backend": "auto"},
           "kernels": [FMHA_NO, yes, {**yes, "kernel": "sgl_kernel::rmsnorm"},
                       {"kernel": "DeepGEMM x", "library": "deep_gemm", "available": "unknown"},
                       {"kernel": "aten::mm", "library": None, "available": "unknown"}]}  # fmt: skip
    assert timeline.kernels(row) == (
        "attention=dsa; lacks trtllm-gen FMHA (TllmGenFmhaRunner); unknown: DeepGEMM x; "
        "2 available; 1 more with no arch evidence read"
    )
    assert timeline.kernels({**row, "kernels": None}) == "attention=dsa; availability not recorded"
