"""Any FP4 model: a config is read, checked and shrunk before anything is built, and one model
besides GLM-5 is replayed through a real release's piecewise runner by the ``check`` command.

Bad configs (no file, unreadable JSON, an unknown architecture, no FP4 quantization) get a named
error and exit 2 before any environment or checkpoint is made. The built-in set keeps each
architecture's features when shrunk, and names its source and assumed fields.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import configs
from fp4lab.compile import frames
from fp4lab.core import paths
from fp4lab.serving.replay import decide, env, matrix, pool, versions
from fp4lab.serving.replay.shared import models
from resolutions import ENABLED


def _check(*args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fp4lab.serving.replay", "check", *args],
                          capture_output=True, text=True, timeout=timeout)  # fmt: skip


def test_the_built_in_set_has_eleven_models_of_nine_architectures_in_three_formats_with_sources():
    names = models.built_in()
    found = {models.named(n).architecture for n in names}
    assert len(names) >= 11
    assert {"GlmMoeDsaForCausalLM", "DeepseekV3ForCausalLM", "Qwen3MoeForCausalLM",
            "LlamaForCausalLM", "GptOssForCausalLM", "Qwen3ForCausalLM", "Glm4MoeForCausalLM",
            "Llama4ForConditionalGeneration", "MiniMaxM2ForCausalLM"} <= found  # fmt: skip
    assert {models.named(n).method for n in names} == set(models.FORMATS)
    for name in names:
        model = models.named(name)
        assert model.source["published"].split()[0].startswith("https://"), name
        assert isinstance(model.source["assumed"], list), name
    assert models.named("gpt-oss-120b-mxfp4").quantization == "mxfp4"
    assert models.named("glm-5-nvfp4-fp8kv").kv_cache == "FP8", "the KV field the other way"
    assert models.named("glm-5-nvfp4").kv_cache is None
    assert models.named("llama-3.3-70b-nvfp4").kv_cache is None, "null in hf_quant_config.json"
    assert models.named("qwen3-235b-a22b-nvfp4").excluded == ("lm_head", "model.layers.*.mlp.gate")


def test_the_shrink_keeps_each_architectures_features():
    glm, _, notes = models.named("glm-5-nvfp4").tiny()
    assert (glm["num_hidden_layers"], glm["first_k_dense_replace"]) == (2, 1), "dense prefix kept"
    assert glm["index_topk"] > 16 and glm["kv_lora_rank"] == 64 and glm["n_shared_experts"] == 1
    assert (
        glm["model_type"] == "deepseek_v3" and "*kv_b_proj" in glm["quantization_config"]["ignore"]
    )
    assert any("glm_moe_dsa" in n for n in notes)
    oss, _, _ = models.named("gpt-oss-120b-mxfp4").tiny()
    assert oss["layer_types"] == ["sliding_attention", "full_attention"]
    assert oss["sliding_window"] == 128 and oss["num_local_experts"] == 8
    deepseek, quant, notes = models.named("deepseek-r1-nvfp4").tiny()
    assert (deepseek["n_group"], deepseek["topk_group"]) == (2, 1)
    assert quant["quantization"]["exclude_modules"] == ["lm_head", "model.layers.*.self_attn*"]
    assert not any("kv_b_proj" in n for n in notes), "its exclusions already cover kv_b_proj"
    qwen, _, _ = models.named("qwen3-235b-a22b-nvfp4").tiny()
    llama, _, _ = models.named("llama-3.3-70b-nvfp4").tiny()
    assert qwen["num_key_value_heads"] == llama["num_key_value_heads"] == 2, "GQA kept"
    assert glm["num_key_value_heads"] == glm["num_attention_heads"] == 4, "MHA kept"
    minimax, _, _ = models.named("minimax-m2.5-nvfp4").tiny()
    assert (minimax["head_dim"], minimax["rotary_dim"]) == (64, 32), "a partial rotary kept"
    assert minimax["num_mtp_modules"] == 0, "MTP layers left out"
    assert "rotary_dim" not in llama, "no partial rotary where the config has none"


@pytest.mark.parametrize(
    ("content", "said"),
    [(None, "no such file"), ("{not json", "not valid JSON"), ("[1, 2]", "not a JSON object"),
     ({"architectures": "BertModel"}, "architectures='BertModel'; allowed: a list of model class"),
     ({"architectures": ["LlamaForCausalLM"]}, "has no FP4 quantization"),
     ({"architectures": ["LlamaForCausalLM"], "quantization_config": {"quant_method": "fp8"}},
      "quant_method=fp8")],
)  # fmt: skip
def test_a_bad_config_is_refused_by_name_before_anything_is_built(tmp_path, content, said):
    config = tmp_path / "config.json"
    if content is not None:
        config.write_text(content if isinstance(content, str) else json.dumps(content))
    done = _check("--config", str(config), "--sglang", "0.5.9", "--sm", "12.0", timeout=60)
    assert done.returncode == 2 and said in done.stderr, done.stderr
    assert "--config" in done.stderr and "Traceback" not in done.stderr
    assert "[env]" not in done.stdout, "no environment was built or checked"


def test_a_bad_release_or_sm_is_refused_by_name():
    done = _check("--config", "models/llama-3.3-70b-nvfp4", "--sglang", "0.4.0", "--sm", "12.0",
                  timeout=60)  # fmt: skip
    assert done.returncode == 2 and "--sglang" in done.stderr and "0.5.9" in done.stderr
    done = _check("--config", "models/llama-3.3-70b-nvfp4", "--sglang", "0.5.9", "--sm", "8.0",
                  timeout=60)  # fmt: skip
    assert done.returncode == 2 and "--sm" in done.stderr and "12.0" in done.stderr


def test_dynamos_graph_break_code_comes_from_torchs_own_registry():
    assert frames.graph_break_code("Observed exception") == "GB0088"
    assert frames.graph_break_code("Attempted to call function marked as skipped") == "GB0007"
    assert frames.graph_break_code("a message dynamo never gives") is None


def test_a_stop_where_eager_also_fails_at_a_missing_kernel_is_not_blamed_on_the_compiler():
    """Both ways on one replay: the same trace stop is a blocker when the release's code runs
    eagerly, and "not measured" when eager fails at a kernel the replay does not stand in for."""
    stop = {"status": "unsupported", "signature": "other",
            "blocker_frame": "sglang/srt/layers/moe/topk.py:310:forward_cuda",
            "message": "Observed exception", "frames": []}  # fmt: skip
    replay = {"resolution": ENABLED, "chain": [stop],
              "fix": {"steps": [stop], "parts": [], "compiles": False}}  # fmt: skip
    ran = decide.cell("0.5.9", "12.0", {**replay, "eager_release": {"status": "compiled"}})
    assert ran["outcome"] == "blocked" and ran["blocked_at"].startswith("sglang/srt/layers/moe")
    missing = {"status": "runtime_error",
               "message": "'_OpNamespace' 'sgl_kernel' object has no attribute 'topk_softmax'",
               "frames": ["sgl_kernel/moe.py:47:topk_softmax", "torch/_ops.py:1392:__getattr__"]}  # fmt: skip
    gap = decide.cell("0.5.9", "12.0", {**replay, "eager_release": missing})
    assert gap["outcome"] == "not measured" and "topk_softmax" in gap["note"]
    assert gap["harness_frame"] == (
        "sgl_kernel/moe.py:47:topk_softmax: '_OpNamespace' 'sgl_kernel' object has no attribute "
        "'topk_softmax'")  # fmt: skip
    refused = {**missing, "message": "Unknown keyword argument 'topk_indices' for operator "
               "'sglang::unified_attention_with_output'",
               "frames": ["torch/nn/modules/module.py:1789:_call_impl", "torch/_ops.py:1243:__call__"]}  # fmt: skip
    own = decide.cell("0.5.6", "12.0", {**replay, "eager_release": refused})
    assert own["outcome"] == "blocked", "an op's own schema refusing an argument is the release's"
    assert "fails eagerly too, at torch/_ops.py:1243:__call__" in own["note"]
    body = {**missing, "message": "'NoneType' object has no attribute 'forward_impl'",
            "frames": ["torch/_ops.py:1243:__call__", "sglang/srt/layers/moe/fused_moe_triton/"
                       "layer.py:1507:moe_forward_piecewise_cuda_graph_impl"]}  # fmt: skip
    llama4 = decide.cell("0.5.16", "12.0", {**replay, "eager_release": body})
    assert llama4["outcome"] == "blocked", "a custom op's own Python body failing is the release's"
    assert "layer.py:1507:moe_forward_piecewise_cuda_graph_impl: 'NoneType'" in llama4["note"]
    assert "fails eagerly" not in ran["note"], "said only where the eager pass failed"
    stream = {**missing, "message": "Torch not compiled with CUDA enabled",
              "frames": ["sgl_kernel/elementwise.py:332:apply_rope_with_cos_sin_cache_inplace",
                         "sgl_kernel/utils.py:23:get_cuda_stream",
                         "torch/cuda/__init__.py:1244:current_stream",
                         "torch/cuda/__init__.py:522:_lazy_init"]}  # fmt: skip
    cuda = decide.cell("0.5.4", "9.0", {**replay, "eager_release": stream})
    assert cuda["outcome"] == "not measured", "a kernel wrapper asking a CPU build for CUDA"
    assert cuda["harness_frame"].startswith("sgl_kernel/utils.py:23:get_cuda_stream: Torch not")


def test_a_failure_both_ways_is_the_releases_only_where_it_refuses_in_its_own_words():
    """A compiled run and the eager pass failing the same way clear the compiler. The cell is the
    release's ("blocked") where its quantization code raised NotImplementedError (MiniMax-M2.5
    on 0.5.16 SM10.0: the NVFP4 MoE refusing the TRT-LLM backend the release resolved), and
    stays "not measured" where the same failure is an AttributeError, which fp4lab's set-up may
    have caused."""
    said = ("Unsupported moe_runner_backend for NVFP4 MoE: MoeRunnerBackend.FLASHINFER_TRTLLM. "
            "Use --moe-runner-backend flashinfer_cutlass instead.")  # fmt: skip
    stop = {"status": "runtime_error", "signature": "runtime_error", "message": said,
            "blocker_frame": "torch/_ops.py:1279:__call__",
            "frames": ["sglang/srt/models/minimax_m2.py:600:forward",
                       "sglang/srt/layers/quantization/modelopt_quant.py:2621:apply",
                       "torch/_ops.py:1279:__call__"]}  # fmt: skip
    replay = {"resolution": ENABLED, "fix": {"steps": [stop], "parts": [], "compiles": False}}
    eager = {"status": "runtime_error", "exception": "builtins.NotImplementedError",
             "message": said, "frames": ["torch/_ops.py:1279:__call__"], "moe_unlisted": []}  # fmt: skip
    refused = decide.cell("0.5.16", "10.0", {**replay, "eager_release": eager})
    assert refused["outcome"] == "blocked", refused["note"]
    assert refused["blocked_at"] == "sglang/srt/layers/quantization/modelopt_quant.py:2621:apply"
    assert "refuses the path it resolved" in refused["note"], refused["note"]
    other = {**eager, "exception": "builtins.AttributeError"}
    open_question = decide.cell("0.5.16", "10.0", {**replay, "eager_release": other})
    assert open_question["outcome"] == "not measured", open_question["note"]
    assert "not decided here" in open_question["note"]


@pytest.mark.environments
def test_qwen3_moe_nvfp4_is_replayed_through_a_real_releases_runner(tmp_path):
    """FlashInfer issue #2999's model, from its config alone, on SGLang 0.5.9 for SM12.0: the
    release's own Qwen3MoeForCausalLM meets FlashInfer's FP4 quantize JIT, and fp4lab's patch
    lets it compile and equal eager; dynamo's structured trace is kept."""
    trace = tmp_path / "trace"
    done = _check("--config", "models/qwen3-235b-a22b-nvfp4/config.json", "--sglang", "0.5.9",
                  "--sm", "12.0", "--trace-dir", str(trace))  # fmt: skip
    said = done.stdout
    assert done.returncode == 0, said + done.stderr
    assert said.splitlines()[1].startswith(
        "SGLang 0.5.9 gives qwen3-235b-a22b-nvfp4 on SM12.0 disabled by default"
    ), "its first line: what the release gives the model by default"
    assert (
        "(Qwen3MoeForCausalLM, NVFP4) through tc_piecewise in SGLang 0.5.9 on SM12.0 "
        "(simulated on a CPU): BLOCKED" in said
    )
    assert "flag: --enable-piecewise-cuda-graph (the release resolves disabled" in said
    assert "built: sglang.srt.models.qwen3_moe.Qwen3MoeForCausalLM" in said
    assert "blocker at flashinfer/jit/cpp_ext.py:" in said and "[GB0007]" in said
    assert "fp4lab's patch (fp4_quantize_op) fixes it" in said and "equals eager" in said
    reached = next(line for line in said.splitlines() if "stand-in kernels reached" in line)
    installed = next(line for line in said.splitlines() if "installed, not reached" in line)
    assert "attention_backend" in reached and "fp4_quantize_eager_only" in reached
    assert "fused_topk_deepseek_eager_only" in installed, "DeepSeek's routing: installed only"
    assert "fused_topk_deepseek_eager_only" not in reached
    assert list(trace.glob("*.log")), "TORCH_TRACE wrote dynamo's structured trace"
    tiny = json.loads((paths.build_dir() / pool.LOGS / "qwen3-235b-a22b-nvfp4-0.5.9-sm12.0-model"
                       / "config.json").read_text())  # fmt: skip
    assert (tiny["num_experts"], tiny["hidden_size"]) == (8, 256)
    assert Path(trace).is_dir()


@pytest.mark.environments
def test_14_replays_two_models_per_release_process_and_records_each_cell(run_notebook):
    """Notebook 14, small: Llama-3.3-70B and Qwen3-235B-A22B (NVFP4) on SGLang 0.5.9 and 0.5.16
    for SM12.0, both models in one process per release: on 0.5.9 each is blocked at FlashInfer's
    quantize JIT and fixed by the patch (the patch loaded for the first model never reaches the
    second, which its fork keeps apart); on 0.5.16 each compiles as released, and its breakable
    graphs (the release's default, one break per layer) and full graphs (one segment) capture
    and replay equal to eager. One decision record per
    cell with its blocker's frame and graph-break code; a bad model name is refused first."""
    with pytest.raises(ValueError, match="models contains 'llama-70b'; allowed values: "):
        matrix.prepare(["llama-70b"], "0.5.9", ["12.0"])
    names = ["llama-3.3-70b-nvfp4", "qwen3-235b-a22b-nvfp4"]
    found, _ = run_notebook(matrix.NAME, models=names, sglang_versions=list(versions.TEST_VERSIONS),
                            sms=["12.0"])  # fmt: skip
    cells = {(r["values"]["model"], r["values"]["sglang_version"]): r["values"]
             for r in found if r["kind"] == "decision"}  # fmt: skip
    assert sorted(cells) == sorted((n, v) for n in names for v in versions.TEST_VERSIONS)
    for name in names:
        blocked, compiles = cells[name, "0.5.9"], cells[name, "0.5.16"]
        assert (blocked["outcome"], blocked["patch"], blocked["compiles_with_patch"]) == (
            "blocked", ["fp4_quantize_op"], True), blocked["note"]  # fmt: skip
        assert blocked["blocker_frames"][0]["frame"].startswith("flashinfer/jit/")
        assert blocked["blocker_frames"][0]["graph_break"] == "GB0007"
        assert (compiles["outcome"], compiles["equals_eager"], compiles["patch"]) == (
            "compiles", True, []), compiles["note"]  # fmt: skip
        assert "attention_backend" in blocked["standins"]
        assert blocked["breakable"] == "not applicable", "0.5.9 has no breakable graphs"
        assert (compiles["breakable"], compiles["breakable_evidence"]) == (
            "works", ["simulated_capture"]), compiles["breakable_note"]  # fmt: skip
        assert compiles["breakable_breaks"] == ["unified_attention_with_output"]
        assert (compiles["breakable_break_count"], compiles["breakable_breaks_per_layer"]) == (
            2,
            1.0,
        )
        assert (compiles["full"], compiles["full_segments"], compiles["full_break_count"]) == (
            "works", 1, 0), compiles["full_note"]  # fmt: skip
    assert cells["llama-3.3-70b-nvfp4", "0.5.16"]["breakable_segments"] == 3, "2 layers, 2 breaks"
    assert cells["llama-3.3-70b-nvfp4", "0.5.9"]["architecture"] == "LlamaForCausalLM"
    [summary] = [r["values"] for r in found if r["kind"] == "summary"]
    assert summary["verdict"] == "PARTLY BLOCKED" and summary["number"].startswith(
        "2 of 4 reachable"
    )
    assert "llama-3.3-70b-nvfp4 SM12.0: 0.5.9 blocked" in summary["headline"]
    assert ("breakable graphs (simulated capture): 2 of 2 cells work (2 with weak-referenced "
            "break inputs at risk, sglang#37606)") in summary["number"]  # fmt: skip
    assert "full graphs (simulated capture): 2 of 2 cells work" in summary["number"]
    assert "full graphs (simulated capture): 2 of 2 cells work (" not in summary["number"]
    assert "simulated_capture" in summary["evidence"], "the breakable cells' evidence is the run's"
    assert (paths.figures_dir() / f"{matrix.NAME}.png").is_file()


def test_published_fp4_formats_and_any_architecture_are_read(tmp_path):
    """A compressed-tensors NVFP4 checkpoint (LLM Compressor's) and an architecture fp4lab never
    named are read, not refused; each layer pattern survives the shrink."""
    dense = models.read(configs.written(tmp_path / "ct", {**configs.QWEN3,
                        "quantization_config": configs.COMPRESSED_TENSORS}))  # fmt: skip
    assert (dense.quantization, dense.method, dense.excluded) == ("nvfp4", "compressed-tensors",
                                                                  ("lm_head",))  # fmt: skip
    air = models.read(configs.written(tmp_path / "air", configs.GLM45_AIR, configs.MODELOPT))
    tiny, _, _ = air.tiny()
    assert (air.architecture, air.method) == ("Glm4MoeForCausalLM", "modelopt_fp4")
    assert (tiny["num_hidden_layers"], tiny["first_k_dense_replace"]) == (2, 1)
    assert tiny["num_nextn_predict_layers"] == 0, "MTP layers left out"
    hybrid = {**configs.QWEN3, "quantization_config": configs.COMPRESSED_TENSORS,
              "num_hidden_layers": 8, "layer_types": ["linear_attention"] * 3 + ["full_attention"]
              + ["linear_attention"] * 3 + ["full_attention"]}  # fmt: skip
    kept, _, notes = models.read(configs.written(tmp_path / "next", hybrid)).tiny()
    assert kept["layer_types"] == ["linear_attention"] * 3 + ["full_attention"]
    assert kept["num_hidden_layers"] == 4 and any("4 layers kept" in n for n in notes)
    weight_only = {**configs.COMPRESSED_TENSORS, "config_groups": {"g": {"weights": {
        **configs.NVFP4_GROUP, "num_bits": 8}}}}  # fmt: skip
    with pytest.raises(models.ConfigError, match="has no FP4 quantization"):
        models.read(configs.written(tmp_path / "int8", {**configs.QWEN3,
                                                        "quantization_config": weight_only}))  # fmt: skip


@pytest.mark.environments
def test_published_formats_and_architectures_get_an_answer_from_a_real_release(tmp_path):
    """A compressed-tensors NVFP4 Qwen3, a ModelOpt NVFP4 GLM-4.5-Air (an architecture fp4lab
    never named), Llama-4 Scout (a multimodal wrapper) and the built-in DeepSeek-R1, from their
    configs alone, through SGLang 0.5.16's own classes and runner on SM12.0: the first two and
    DeepSeek compile as released and equal eager (DeepSeek's fused QKV-A GEMM a stand-in);
    Scout's compiled run fails in the release's MoE op, which fails uncompiled too, because the
    release's own prefill-graph layer table lists none of its MoE layers (Llama-4 keeps them in
    ``feed_forward``): blocked, the release's and not the compiler's; GLM-4.5-Air's MoE layers
    are all listed.
    GLM-4.5-Air's MoE routing is a torch.compile'd helper of the release, which inductor
    compiles for its CPU tensors once Triton's driver probe has its stand-in
    (``setup_standins.triton_driver_probe``)."""
    qwen = models.read(configs.written(tmp_path / "qwen3-ct", {
        **configs.QWEN3, "quantization_config": configs.COMPRESSED_TENSORS}))  # fmt: skip
    air = models.read(
        configs.written(tmp_path / "glm-4.5-air", configs.GLM45_AIR, configs.MODELOPT)
    )
    scout = models.read(configs.written(tmp_path / "llama-4-scout", configs.LLAMA4_SCOUT,
                                        configs.MODELOPT_LLAMA4))  # fmt: skip
    deepseek = models.named("deepseek-r1-nvfp4")
    [run] = matrix.measure([qwen, air, scout, deepseek], [versions.TEST_VERSIONS[-1]], ["12.0"],
                           fresh=True)  # fmt: skip
    for model, built in ((qwen, "qwen3.Qwen3ForCausalLM"), (air, "glm4_moe.Glm4MoeForCausalLM")):
        replay = run.by_model[model.name]["12.0"]
        row = matrix.row(model, run.version, "12.0", replay, run.calls)
        assert replay["facts"]["model_class"] == f"sglang.srt.models.{built}"
        assert (row["outcome"], row["equals_eager"]) == ("compiles", True), row["note"]
    assert run.by_model[qwen.name]["12.0"]["facts"]["quantization"] == "compressed-tensors"
    row = matrix.row(deepseek, run.version, "12.0", run.by_model[deepseek.name]["12.0"], run.calls)
    assert (row["outcome"], row["equals_eager"]) == ("compiles", True), row["note"]
    assert "sglang::cutedsl_dsv3_fused_a_gemm_cpu_kernel" in row["standins_reached"], (
        "on SM12.0 the release picks its CuTe-DSL fused QKV-A GEMM, whose real kernel would "
        "refuse the shrunk hidden size (K a multiple of 1024)"
    )
    assert "sglang::jit_dsv3_fused_a_gemm_cpu_kernel" not in row["standins_reached"]
    standins = {s["name"] for s in run.by_model[air.name]["12.0"]["standins"]}
    assert "triton_driver_probe" in standins
    row = matrix.row(scout, run.version, "12.0", run.by_model[scout.name]["12.0"], run.calls)
    assert row["model_class"] == "sglang.srt.models.mllama4.Llama4ForConditionalGeneration"
    assert row["outcome"] == "blocked", row["note"]
    assert row["blocked_at"].startswith("sglang/srt/layers/moe/fused_moe_triton/layer.py:")
    assert ("lists no MoE for layers" in row["note"]
            and "not the compiler's" in row["note"]), row["note"]  # fmt: skip
    assert run.by_model[air.name]["12.0"]["eager_release"]["moe_unlisted"] == []


@pytest.mark.environments
def test_0_5_4_builds_a_prequantized_modelopt_checkpoint_with_its_own_dummy_loader():
    """SGLang 0.5.4 sends ModelOpt checkpoints to its ModelOptModelLoader ahead of the dummy load
    format. Llama-3.3-70B (with ``hf_quant_config.json``, which 0.5.4 counts as quantized
    already) is built by the release's own DummyModelLoader, listed, and gets a verdict: blocked
    at FlashInfer's quantize JIT, as on 0.5.3 and 0.5.5. GLM-5 (its quantization inline only)
    is what 0.5.4 would quantize from real weights: it stays "not measured", said why, with no
    machine path in the note. gpt-oss reaches sgl-kernel 0.3.16's fused rotary, whose wrapper
    passes the CUDA stream handle: the op's schema takes it where the wrapper passes it
    (``op_schemas``), the handle is stood in for, and the cell gets a verdict."""
    llama, glm5 = models.named("llama-3.3-70b-nvfp4"), models.named("glm-5-nvfp4")
    oss = models.named("gpt-oss-120b-mxfp4")
    [run] = matrix.measure([llama, glm5, oss], ["0.5.4"], ["10.0"], fresh=True)
    replay = run.by_model[llama.name]["10.0"]
    row = matrix.row(llama, run.version, "10.0", replay, run.calls)
    assert "dummy_loader_for_prequantized" in {s["name"] for s in replay["standins"]}
    assert row["outcome"] == "blocked", row["note"]
    assert row["note"].startswith("blockers: FlashInfer's FP4 quantize JIT")
    other = matrix.row(glm5, run.version, "10.0", run.by_model[glm5.name]["10.0"], run.calls)
    assert other["outcome"] == "not measured"
    assert "counts this checkpoint as unquantized" in other["note"], other["note"]
    assert (
        "build/sglang-compile/logs/" in other["note"] and str(paths.REPO_ROOT) not in other["note"]
    )
    row = matrix.row(oss, run.version, "10.0", run.by_model[oss.name]["10.0"], run.calls)
    assert row["outcome"] == "blocked", row["note"]
    assert {"get_cuda_stream_replaced", "sgl_kernel_ops"} <= set(row["standins_reached"])


@pytest.mark.environments
def test_gpt_oss_on_hopper_is_measured_through_its_dequantized_moe_and_the_stand_ins_it_reached():
    """On SM9.0 the release's MXFP4 MoE dequantizes its weights to BF16 at load with
    triton_kernels' Triton upcast, then runs SGLang's Triton MoE: both Triton kernels, whose
    launch finds no libcuda here. Each is stood in for at its boundary, listed as reached, and
    the cell is measured; the upcast stand-in agrees with triton_kernels' own torch upcast."""
    oss = models.named("gpt-oss-120b-mxfp4")
    [run] = matrix.measure([oss], [versions.TEST_VERSIONS[-1]], ["9.0"], fresh=True)
    row = matrix.row(oss, run.version, "9.0", run.by_model[oss.name]["9.0"], run.calls)
    assert row["breakable"] == "works", row["breakable_note"]
    assert {"upcast_from_mxfp_load_time", "fused_experts_impl_eager_only"} <= set(
        row["standins_reached"]
    ), row["standins_reached"]
    agree = (
        "import torch; from triton_kernels.numerics_details import mxfp;"
        "from fp4lab.serving.replay.release import cpu_quant_kernels as q;"
        "g = torch.Generator().manual_seed(0);"
        "w = torch.randint(0, 256, (4, 6, 32), dtype=torch.uint8, generator=g);"
        "s = torch.randint(118, 136, (4, 6, 2), dtype=torch.uint8, generator=g);"
        "assert torch.equal(q.upcast_from_mxfp(w, s, -1, torch.bfloat16),"
        " mxfp.upcast_from_mxfp_torch(w, s, torch.bfloat16, -1))"
    )
    python = env.ensure_env(run.version).python
    subprocess.run([str(python), "-c", agree], check=True, timeout=300,
                   env={**os.environ, "PYTHONPATH": str(paths.REPO_ROOT / "lib")})  # fmt: skip
