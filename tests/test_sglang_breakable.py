"""Breakable prefill graphs (SGLang 0.5.15 on) captured by the release's own runner on a CPU
and replayed (``serving/replay/release/breakable``): a model that works, and each fault a real capture
or replay would show, planted in the same real release and seen."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from fp4lab.core import paths
from fp4lab.serving.replay import check, env
from fp4lab.serving.replay.shared import breakable_outcome, models

VERSION, SM = "0.5.16", "12.0"
"""The newest release the other replay tests build; breakable by default on CUDA."""
FAULT = Path(__file__).parent / "fixtures" / "breakable_fault.py"


@pytest.mark.environments
def test_check_answers_the_releases_default_breakable_graph_with_segments_and_replays():
    lines: list[str] = []
    model = models.named("llama-3.3-70b-nvfp4")
    assert check.check(model, VERSION, SM, None, progress=lines.append) == 0
    text = "\n".join(lines)
    assert f"SGLang {VERSION} gives llama-3.3-70b-nvfp4 on SM{SM} breakable by default" in text
    assert "through breakable" in text and ": WORKS" in text, text
    assert "bucket 16: 3 segments, 2 breaks (unified_attention_with_output)" in text, text
    for bucket in (4, 8, 12):
        assert f"replay of bucket {bucket}: max |diff| vs eager 0" in text, text
    # sglang#37606's precondition, counted from the release's own objects: each break's q, k, v
    # and output are held by weak reference (4 x 2 breaks x 4 buckets); all but the last layer's
    # output are held by nothing else once captured, and 3 of the 4 buckets are captured before
    # another; the release's last-layer output is the case that comes out the other way
    assert ("held by weak reference at sglang/srt/model_executor/runner_backend_utils/"
            "breakable_cuda_graph/breakable_cuda_graph.py:240:<genexpr>: 32, of which 28 held by "
            "nothing else after the capture, 21 with a bucket captured after theirs "
            "(sglang#37606)") in text, text  # fmt: skip
    assert "21 of 32 tensors the breaks hold by weak reference" in text, text


@pytest.mark.environments
def test_glm5_on_0_5_16_is_switched_off_by_default_and_asked_for_reaches_a_kernel_sm120_lacks():
    """sglang#29562's failure: on SM12.0 the release picks TRT-LLM's FMHA for GLM-5's DSA
    prefill, a kernel FlashInfer builds for SM100 and SM103 only; the capture itself works."""
    lines: list[str] = []
    model = models.named("glm-5-nvfp4")
    assert check.check(model, VERSION, SM, None, progress=lines.append, backend="breakable") == 0
    text = "\n".join(lines)
    assert f"SGLang {VERSION} gives glm-5-nvfp4 on SM{SM} disabled by default" in text, text
    assert "Breakable CUDA graph is incompatible with MLA attention" in text, text
    assert ": KERNEL UNAVAILABLE" in text and "TllmGenFmhaRunner" in text, text
    assert "Unsupported architecture" in text and "the capture: works" in text, text


@pytest.mark.environments
def test_full_graphs_are_captured_whole_by_the_release_and_replay_equal_to_eager():
    """``--backend full``: the release's FullCudaGraphBackend captures each bucket's whole body in
    one graph (no breaks); its replays equal eager; the flag that reaches it is the release's."""
    lines: list[str] = []
    model = models.named("llama-3.3-70b-nvfp4")
    assert check.check(model, VERSION, SM, None, progress=lines.append, backend="full") == 0
    text = "\n".join(lines)
    assert "through full in SGLang" in text and ": WORKS" in text, text
    assert "bucket 16: 1 segments, 0 breaks (none)" in text, text
    assert "held by weak reference" not in text, "a full graph has no break to hold inputs"
    assert "--cuda-graph-backend-prefill full resolves full" in text, text


@pytest.mark.environments
def test_each_planted_fault_is_seen_and_the_same_capture_without_it_works(tmp_path):
    """A host sync inside a captured segment (a GPU tensor's value read, or copied, to the host) is
    flagged with the frame that asked (a real capture refuses it), while a host tensor's value
    read there is kept as a host read (frozen into the graph, allowed); host data copied into the
    GPU there is flagged, a tensor made on the GPU there is not; a replay that runs
    nothing leaves the captured output (wrong output); a JIT build first asked for inside a
    segment is flagged, the same build asked for by the warm-ups first is not; the same capture
    without a fault works."""
    built = env.ensure_env(VERSION)
    checkpoint = models.write_tiny(*models.named("llama-3.3-70b-nvfp4").tiny()[:2],
                                   tmp_path / "model")  # fmt: skip
    faults = ("none", "host_sync", "to_host", "host_read", "from_host", "host_to_gpu", "gpu_made",
              "stale_replay", "side_joined", "side_forked_by_event", "side_not_forked",
              "event_across_break", "jit_build", "jit_build_warm")  # fmt: skip
    subprocess.run([str(built.python), str(FAULT), str(checkpoint), SM, str(tmp_path), ",".join(faults)],
                   env={**os.environ, "PYTHONPATH": str(paths.REPO_ROOT / "lib")},
                   check=True, capture_output=True, timeout=600)  # fmt: skip
    found = {f: json.loads((tmp_path / f"{f}.json").read_text()) for f in faults}
    assert breakable_outcome.capture_outcome(found["none"])[0] == "works"
    result, why = breakable_outcome.capture_outcome(found["host_sync"])
    assert result == "blocked", why
    assert why.startswith("host sync _local_scalar_dense inside captured segment 2 of bucket 16 at "
                          "breakable_fault.py:") and why.endswith(":<lambda>"), why  # fmt: skip
    result, why = breakable_outcome.capture_outcome(found["to_host"])
    assert result == "blocked" and why.startswith(
        "host sync cpu (a GPU tensor copied to the host)"
    ), why
    result, why = breakable_outcome.capture_outcome(found["host_read"])  # a host tensor: allowed
    assert result == "works", why
    assert [(r["what"], r["frame"].rsplit(":", 1)[-1]) for r in found["host_read"]["host_reads"]] == [
        ("host read _local_scalar_dense", "<lambda>")], found["host_read"]["host_reads"]  # fmt: skip
    for fault, name in (("from_host", "tensor"), ("host_to_gpu", "to")):
        result, why = breakable_outcome.capture_outcome(found[fault])
        assert (
            result == "blocked"
            and why.startswith(
                f"host-to-GPU copy {name} from unpinned host memory (torch's capture refuses it"
            )
            and "inside captured segment 2 of bucket 16 at breakable_fault.py:" in why
        ), why
    result, why = breakable_outcome.capture_outcome(found["gpu_made"])
    assert result == "works", ("a tensor made on the GPU copies no host memory", why)
    result, why = breakable_outcome.capture_outcome(found["stale_replay"])
    assert result == "wrong output" and "bucket 4: max |diff|" in why, why
    result, why = breakable_outcome.capture_outcome(found["side_joined"])
    assert result == "works" and "side-stream forks inside segments, each joined back" in why, why
    for fault, said in {
        "side_forked_by_event": "a side stream forked into the capture at breakable_fault.py:",
        "side_not_forked": "work on a stream outside the capture",
        "event_across_break": "a capturing stream waits on an event recorded outside this capture",
    }.items():
        result, why = breakable_outcome.capture_outcome(found[fault])
        assert result == "blocked" and why.startswith(said), (fault, why)
    assert "inside captured segment 3 of bucket 16" in breakable_outcome.capture_outcome(
        found["event_across_break"])[1]  # fmt: skip
    result, why = breakable_outcome.capture_outcome(found["jit_build"])
    assert result == "blocked" and why.startswith(
        "JIT build of fp4lab_planted_module (the warm-ups did not build it) inside captured "
        "segment 2 of bucket 16"), why  # fmt: skip
    result, why = breakable_outcome.capture_outcome(found["jit_build_warm"])
    assert result == "works", ("the warm-ups asked for it first: built before any capture", why)


@pytest.mark.environments
def test_an_allocation_outside_the_graph_pool_and_a_collective_no_replay_repeats_are_flagged(
    tmp_path,
):
    """Inside a captured segment of a real release's model: an allocation after the graph's pool
    routing is ended (as SGLang's symmetric-memory context does) is flagged, one under
    ``use_mem_pool`` alone goes to the graph's pool (the allocator's rule) and is not; a collective
    on a CPU group and a barrier are flagged, an all-reduce on the device group is held by the
    graph; torch's capture query answers true there and false outside."""
    built = env.ensure_env(VERSION)
    checkpoint = models.write_tiny(*models.named("llama-3.3-70b-nvfp4").tiny()[:2],
                                   tmp_path / "model")  # fmt: skip
    faults = ("none", "capturing_asked", "pool_paused", "pool_routed", "collective_cpu_group",
              "collective_device_group", "barrier_device_group")  # fmt: skip
    subprocess.run([str(built.python), str(FAULT), str(checkpoint), SM, str(tmp_path), ",".join(faults)],
                   env={**os.environ, "PYTHONPATH": str(paths.REPO_ROOT / "lib")},
                   check=True, capture_output=True, timeout=600)  # fmt: skip
    found = {f: json.loads((tmp_path / f"{f}.json").read_text()) for f in faults}
    said = {f: breakable_outcome.capture_outcome(r) for f, r in found.items()}
    for works in ("none", "capturing_asked", "pool_routed", "collective_device_group"):
        assert said[works][0] == "works", (works, said[works])
    assert found["none"]["collectives"]["in_segments"] == 0, found["none"]["collectives"]
    assert found["collective_device_group"]["collectives"]["in_segments"] > 0
    for fault, start in {
        "pool_paused": "allocation by empty into the MemPool made at breakable_fault.py:",
        "collective_cpu_group": "collective all_reduce on tp:0's CPU group (gloo: it runs on the "
        "host once, at capture, and is in no replay)",
        "barrier_device_group": "collective barrier on tp:0's device group (it waits on the host",
    }.items():
        result, why = said[fault]
        assert result == "blocked" and why.startswith(start), (fault, why)
        assert "inside captured segment 2 of bucket 16 at breakable_fault.py:" in why, why


@pytest.mark.environments
def test_deepseeks_shared_experts_fork_a_side_stream_inside_a_segment_and_join_it(tmp_path):
    """A real release's own use of a side stream inside a captured segment, held to CUDA's
    capture rules: with shared-experts fusion off, DeepSeek runs its shared experts on its
    alternate stream, forked from and joined back to the capture within one segment."""
    built = env.ensure_env(VERSION)
    checkpoint = models.write_tiny(*models.named("deepseek-r1-nvfp4").tiny()[:2],
                                   tmp_path / "model")  # fmt: skip
    subprocess.run([str(built.python), str(FAULT), str(checkpoint), "10.0", str(tmp_path), "none",
                    "--disable-shared-experts-fusion"],
                   env={**os.environ, "PYTHONPATH": str(paths.REPO_ROOT / "lib")},
                   check=True, capture_output=True, timeout=600)  # fmt: skip
    found = json.loads((tmp_path / "none.json").read_text())
    result, why = breakable_outcome.capture_outcome(found)
    assert result == "works", why
    assert found["streams"]["forks"] == found["streams"]["joins"] > 0, found["streams"]
    assert found["streams"]["side_work"] > 0 and "each joined back" in why, why


def test_a_backend_not_offered_is_refused_by_name_before_anything_runs(capsys):
    said = check.main(["--config", "models/llama-3.3-70b-nvfp4", "--sglang", VERSION, "--sm", SM,
                       "--backend", "piecewise"])  # fmt: skip
    assert said == 2
    err = capsys.readouterr().err
    assert "--backend" in err and "default, breakable, full, tc_piecewise" in err, err


def test_a_stop_of_fp4labs_own_making_is_not_measured_and_the_releases_own_is_blocked():
    def stop(error: str, frame: str = "sglang/srt/x.py:1:f", **extra: object) -> dict:
        return {"breakable": {"blocked": {"error": error, "frames": [frame], **extra}}}

    cases = {
        "blocked": stop("RuntimeError: capture_end: operation not permitted"),
        "not measured": stop(
            "AttributeError: 'KVPool' object has no attribute 'x'", harness_object=True
        ),
    }
    for said in ("ValueError: op requires CUDA tensors",
                 "RuntimeError: Ninja build failed. Ninja output: no CUDA module is built on this machine",
                 "AssertionError: StandInAttentionBackend does not support it"):  # fmt: skip
        assert breakable_outcome.outcome(stop(said))[0] == "not measured", said
    absent_op = stop("AttributeError: '_OpNamespace' 'sgl_kernel' object has no attribute "
                     "'moe_align_block_size'", "sgl_kernel/moe.py:17:moe_align_block_size")  # fmt: skip
    cubins = stop("AssertionError: Failed to get checksums.txt from abc/batched_gemm//checksums.txt",
                  "flashinfer/jit/fused_moe.py:256:gen_trtllm_gen_fused_moe_sm100_module")  # fmt: skip
    for missing in (absent_op, cubins):
        result, why = breakable_outcome.outcome(missing)
        assert (result, why.split(":")[0]) == ("not measured", "a kernel with no CPU stand-in here")
    elsewhere = stop("AttributeError: 'Foo' object has no attribute 'moe_align_block_size'")
    assert breakable_outcome.outcome(elsewhere)[0] == "blocked", "the release's own code failing"
    ours = stop(
        "NotImplementedError: no deferred-finalize outputs", "fp4lab/serving/replay/x.py:1:f"
    )
    assert breakable_outcome.outcome(ours)[0] == "not measured"
    machine = stop(
        "AssertionError: libcuda.so cannot found!", "triton/backends/nvidia/driver.py:46:f"
    )
    assert breakable_outcome.outcome(machine)[0] == "not measured"
    compiled = {"breakable": {"blocked": {
        "error": "TypeError: 'bool' object is not subscriptable",
        "frames": ["sglang/srt/layers/moe/topk.py:2632:f", "torch/_dynamo/eval_frame.py:1166:w",
                   "sglang/srt/layers/moe/topk.py:1923:g"]}}}  # fmt: skip
    inductor = {"breakable": {"blocked": {
        "error": "torch._dynamo.exc.BackendCompilerFailed: backend='inductor' raised: RuntimeError",
        "frames": ["torch/_inductor/compile_fx.py:2924:fw_compiler_base"]}}}  # fmt: skip
    for harness in (compiled, inductor):
        assert breakable_outcome.outcome(harness)[0] == "not measured", harness
    assert "torch.compile" in breakable_outcome.outcome(inductor)[1]
    for expected, replay in cases.items():
        assert breakable_outcome.outcome(replay)[0] == expected, replay
    refused = {"build_error": "ValueError: Minimum capability: 100", "refused_by_release": True}
    assert breakable_outcome.outcome(refused)[0] == "not applicable"
    assert breakable_outcome.outcome({**refused, "refused_by_release": False})[0] == "not measured"
    launched = {"build_error": "AssertionError: libcuda.so cannot found!", "build_frames": [
        "triton/backends/nvidia/driver.py:46:libcuda_dirs"],
        "build_release_frame": "sglang/srt/layers/quantization/mxfp4.py:990:process_weights"}  # fmt: skip
    assert breakable_outcome.outcome(launched)[1].endswith(
        "[at triton/backends/nvidia/driver.py:46:libcuda_dirs, "
        "from sglang/srt/layers/quantization/mxfp4.py:990:process_weights]"
    )
    lacking = {**stop("x"), "breakable": {"buckets": [{"bucket": 4}], "flags": [], "replays": [
        {"bucket": 4, "max_abs_diff": 0.0, "equals_eager": True, "output_changed_by_replay": True}]},
        "kernel_availability": [{"kernel": "K", "available": "no", "library": "flashinfer",
                                 "evidence": "gate"}]}  # fmt: skip
    assert breakable_outcome.outcome(lacking)[0] == "kernel unavailable"
    assert breakable_outcome.outcome({**lacking, "kernel_availability": []})[0] == "works"


@pytest.mark.environments
def test_0_5_23_weak_refs_the_break_inputs_of_a_gpu_tensor_it_keeps_on_a_cpu():
    """From 0.5.20 the release's ``_weak_ref_if_tensor`` keeps CPU tensors as they are; asked of
    tensors that stand for GPU ones with their device read as the GPU's, it weak-refs every break
    input, and the release holds none of them once captured."""
    lines: list[str] = []
    model = models.named("llama-3.3-70b-nvfp4")
    assert check.check(model, "0.5.23", "10.0", None, progress=lines.append) == 0
    text = "\n".join(lines)
    assert ": WORKS" in text, text
    assert ("held by weak reference at sglang/srt/model_executor/runner_backend_utils/"
            "breakable_cuda_graph/breakable_cuda_graph.py:300:<genexpr>: 32, of which 32 held by "
            "nothing else after the capture, 24 with a bucket captured after theirs") in text, text  # fmt: skip


@pytest.mark.environments
def test_full_graphs_on_0_5_23_ask_the_class_the_release_builds_and_its_answer_decides():
    """0.5.23's runner asks the attention backend whether it supports chunked-prefix full graphs;
    the stand-in answers as the class the release's registry builds for Llama on SM10.0
    (TRT-LLM's MHA backend: no), and the release's own assertion stops the capture."""
    lines: list[str] = []
    model = models.named("llama-3.3-70b-nvfp4")
    assert check.check(model, "0.5.23", "10.0", None, progress=lines.append, backend="full") == 0
    text = "\n".join(lines)
    assert ": BLOCKED" in text, text
    assert ("AssertionError: TRTLLMHAAttnBackend does not support chunked-prefix Full prefill CUDA "
            "graphs [at sglang/srt/model_executor/runner/prefill_cuda_graph_runner.py:") in text, text  # fmt: skip
    assert "trtllm_mha_backend.TRTLLMHAAttnBackend; the runner asked it " in text, text


def test_a_stop_on_a_borrowed_answer_is_the_releases_and_any_other_at_the_stand_in_is_not():
    """``borrowed_stop`` both ways: the release's assertion on an answer the stand-in gave as the
    real class gives it is blocked; the same stop with no answer borrowed, or an attribute the
    stand-in lacks, is not measured."""
    stop = {"error": "AssertionError: StandInAttentionBackend does not support chunked-prefix Full "
            "prefill CUDA graphs", "frames": ["sglang/srt/model_executor/runner/x.py:570:__init__"],
            "release_frame": "sglang/srt/model_executor/runner/x.py:570:__init__"}  # fmt: skip
    real = {"class": "sglang.srt.layers.attention.trtllm_mha_backend.TRTLLMHAAttnBackend"}
    asked = {
        "blocked": stop,
        "attention": {**real, "asked": {"supports_full_cuda_graph_chunked_prefix": False}},
    }
    result, why = breakable_outcome.capture_outcome(asked)
    assert result == "blocked" and why.startswith("AssertionError: TRTLLMHAAttnBackend does not"), (
        why
    )
    assert "supports_full_cuda_graph_chunked_prefix = False" in why, why
    for unasked in ({"blocked": stop, "attention": {**real, "asked": {}}},
                    {"blocked": {**stop, "error": "AttributeError: 'StandInAttentionBackend' object has "
                                 "no attribute 'x'"}, "attention": asked["attention"]}):  # fmt: skip
        assert breakable_outcome.capture_outcome(unasked)[0] == "not measured", unasked


def test_a_graph_no_option_reaches_is_not_applicable_and_a_failed_child_is_not_measured():
    """0.5.14 ships the full backend but its options reach no full graph: not applicable, with
    the reason; a child that failed (its error a line) is not measured, with that line."""
    result, why = breakable_outcome.outcome({"not_driven": "no option reaches full"}, "full")
    assert (result, why) == ("not applicable", "the release's options reach no full graph: no "
                             "option reaches full"), why  # fmt: skip
    result, why = breakable_outcome.outcome({"error": "the child timed out"}, "breakable")
    assert (result, why) == ("not measured", "the child timed out")


def test_a_release_that_builds_no_prefill_runner_switches_the_graph_off_in_its_own_words():
    """Where the release's ``init_cuda_graphs`` builds no ``PrefillCudaGraphRunner`` and logs
    why (0.5.14-0.5.15 for Llama-4's multimodal wrapper), the graph is not applicable, in the
    release's words; where it logged nothing and captured nothing, not measured."""
    said = "Disable prefill CUDA graph because the model is not a language model"
    result, why = breakable_outcome.capture_outcome({"declined": said, "buckets": []})
    assert (result, why) == (
        "not applicable",
        f"the release builds no prefill graph runner: {said}",
    )
    result, why = breakable_outcome.capture_outcome({"buckets": []})
    assert (result, why) == ("not measured", "no bucket was captured and replayed")
