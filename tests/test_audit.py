"""The FP4 API audit: the simulated GPU against torch's and FlashInfer's own answers, eager first
(a rejected input is never a graph break), the whole surface of the installed FlashInfer, the
command on callables of our own, bad input named, and notebook 12 on one version."""

from __future__ import annotations

import os
import re
import shutil
import textwrap

import pytest
import torch

from browser import exported
from fp4lab.compile import target
from fp4lab.compile.audit import __main__ as cli
from fp4lab.compile.audit import (
    backends,
    child,
    eager,
    inputs,
    mega_moe,
    moe_runners,
    rules,
    run,
    simulation,
    study,
    surface,
    toolkit,
)
from fp4lab.compile.trace import SIGNATURES

HANDFUL = [
    "fp4_quantize",
    "torch.ops.flashinfer.fp4_quantize",
    "mm_nvfp4_lora",
    "shuffle_matrix_a",
    "make_nvfp4_global_scale",
]
"""Notebook 12's test set: the story's call, the op beside it, an SM-bound GEMM, a layout helper
decided on CPU tensors, a data-dependent branch."""


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    (tmp_path / "audit_user_code.py").write_text(
        textwrap.dedent(
            """
            import torch

            def tiny(x, scale=2.0):
                return torch.relu(x) * scale

            def reads_a_file(x):
                with open(__file__) as f:
                    f.read()
                return x + 1

            def strict(x):
                if x.dtype != torch.float8_e4m3fn:
                    raise ValueError("x must have dtype torch.float8_e4m3fn")
                return x

            def needs_blackwell(x):
                major, minor = torch.cuda.get_device_capability(x.device)
                if major < 10:
                    raise RuntimeError(f"needs compute capability 100 or later, got {major}{minor}")
                return x * 2

            def to_gpu(x):
                return x.cuda() * 2

            def unknown_param(zebra):
                return zebra

            def branches_on_data(x):
                if x.sum() > 0:
                    return x + 1
                return x - 1
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    return "audit_user_code"


def _audit(module: str, name: str, sm: str = "12.0", spec: str = "f32[4,8]") -> dict:
    import importlib

    fn = getattr(importlib.import_module(module), name)
    build = inputs.bind(fn, *inputs.parse(spec))
    return run.audit(fn, build, tuple(int(p) for p in sm.split(".")), package=module)


def test_torch_answers_as_a_cuda_build_inside_the_simulation_and_as_itself_after():
    assert not torch.cuda.is_available() and torch.version.cuda is None
    with simulation.simulated_cuda((12, 0)) as seen, simulation.fake_cuda():
        assert torch.cuda.is_available() and torch.cuda.device_count() == 1
        assert torch.cuda.get_device_capability() == (12, 0)
        props = torch.cuda.get_device_properties(torch.device("cuda"))
        assert isinstance(props, torch.cuda._CudaDeviceProperties) and props.major == 12
        assert torch.version.cuda == simulation.CUDA_VERSION
        x = simulation.on_gpu(lambda: torch.randn(4, 8))
        assert x.device == torch.device("cuda", 0)
        compiled = torch.compile(lambda t: t * torch.cuda.get_device_capability(t.device)[0],
                                 fullgraph=True, backend="eager")  # fmt: skip
        assert compiled(x).device.type == "cuda", "dynamo folds torch's own device query"
        assert seen["simulated"] is True and seen["sm"] == "12.0"
    assert not torch.cuda.is_available() and torch.version.cuda is None
    assert torch.cuda.device_count() == 0


@pytest.mark.parametrize("mode", toolkit.RUN_MODES)
def test_flashinfers_own_toolkit_query_finds_the_toolkit_as_each_install_mode_does(mode):
    from flashinfer.jit import cpp_ext

    before = {k: os.environ.get(k) for k in ("CUDA_HOME", "CUDA_PATH", "PATH")}
    with toolkit.installed(mode):
        assert str(cpp_ext.get_cuda_version()) == simulation.CUDA_VERSION
        assert cpp_ext.get_cuda_path() == str(toolkit.folder())
        found_on_path = shutil.which("nvcc") == str(toolkit.folder() / "bin" / "nvcc")
        assert found_on_path == (mode == "jit")
        assert ("CUDA_HOME" in os.environ) == (mode == "jit_cuda_home")
    assert {k: os.environ.get(k) for k in before} == before


def test_the_kernel_boundary_stops_the_eager_call_at_flashinfers_jit_build():
    with simulation.simulated_cuda((12, 0)), toolkit.installed("jit"), simulation.fake_cuda():
        x, scale = simulation.on_gpu(lambda: (torch.randn(128, 128, dtype=torch.bfloat16),
                                              torch.ones(1)))  # fmt: skip
        found = eager.call(target.flashinfer.fp4_quantize, (x, scale), {})
    assert found.outcome == "kernel" and found.kernel.startswith("JIT build of fp4_quantization_12")
    assert any(line.startswith("flashinfer/jit/cpp_ext.py:") for line in found.executed), (
        "the eager call went through FlashInfer's toolkit query"
    )
    assert "/" not in found.kernel.removeprefix("JIT build of "), "no path of this machine"


def test_the_kernel_boundary_stops_at_a_cute_dsl_compile_and_cpu_tensors_keep_one_graph():
    from cutlass.base_dsl.dsl import BaseDSL

    step = vars(BaseDSL)["_preprocess_and_replace_code"]
    found = {e.name: e for e in surface.discover(target.flashinfer)}
    row = child.audit_entry(found["rmsnorm_fp4quant"], (12, 0))
    assert row["eager"]["outcome"] == "kernel", row["eager"]
    assert row["eager"]["kernel"] == "CuTe DSL compile of RMSNormFP4QuantKernel.__call__"
    assert vars(BaseDSL)["_preprocess_and_replace_code"] is step, "the static method is restored"
    row = child.audit_entry(found["shuffle_matrix_a"], (12, 0))
    assert (row["verdict"], row["tensors"]) == ("one graph", "cpu"), row["why"]
    assert row["eager"]["outcome"] == "completed" and row["chain"][0]["status"] == "compiled"


@pytest.mark.parametrize(
    ("name", "sm", "verdict", "outcome"),
    [
        ("tiny", "12.0", "one graph", "completed"),
        ("reads_a_file", "12.0", "graph break", "completed"),
        ("strict", "12.0", "input rejected", "raised"),
        ("needs_blackwell", "9.0", "target unsupported", "raised"),
        ("needs_blackwell", "12.0", "one graph", "completed"),
        ("to_gpu", "12.0", "undetermined on CPU", "cpu_build"),
        ("branches_on_data", "12.0", "graph break", "needs_values"),
    ],
)
def test_the_eager_call_decides_before_the_trace_is_blamed(user_module, name, sm, verdict, outcome):
    found = _audit(user_module, name, sm)
    assert (found["verdict"], found["eager"]["outcome"]) == (verdict, outcome), found["why"]
    assert found["tensors"] == "fake cuda" and found["simulated"] is True
    if verdict == "graph break":
        assert f"{user_module}.py:" in found["trace"]["blocker_frame"]
        assert "ran that line" in found["why"], "the eager call executed the line dynamo broke at"
    if verdict == "input rejected":
        assert found["trace"]["status"] == "unsupported", "dynamo broke too, and is not blamed"


def test_a_cuda_only_op_with_a_fake_compiles_and_its_eager_call_runs_the_fake():
    @torch.library.custom_op("fp4lab_test::cuda_only", mutates_args=())
    def cuda_only(x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError("this kernel runs on CUDA only")

    cuda_only.register_fake(lambda x: torch.empty_like(x))
    found = run.audit(lambda x: cuda_only(x) + 1, inputs.bind(lambda x: x, ["f32[8,16]"], {}),
                      (12, 0), op="fp4lab_test::cuda_only", package="tests")  # fmt: skip
    assert found["verdict"] == "one graph" and found["eager"]["outcome"] == "completed"
    assert found["custom_op"] == {"qualname": "fp4lab_test::cuda_only", "present": True,
                                  "fake_or_meta": True}  # fmt: skip


def test_the_surface_reaches_subpackages_wrapper_methods_and_registered_ops():
    found = {e.name: e for e in surface.discover(target.flashinfer)}
    assert {"fp4_quantize", "mm_fp4"} <= set(found)
    forms = {e.form for e in found.values()}
    assert forms == set(surface.FORMS)
    assert "torch.ops.flashinfer.fp4_quantize" in found
    assert found["torch.ops.flashinfer.fp4_quantize"].group == "torch.ops.flashinfer"
    nested = [e for e in found.values() if e.form == "function" and "." in e.name]
    assert nested and all(e.group.startswith("flashinfer.") for e in nested)
    assert all(e.kind in surface.KINDS for e in found.values())
    assert not any(part.startswith("_") for name in found for part in name.split(".")[:-1])
    assert not any(e.group.split(".")[-1] in surface.INTERNAL for e in found.values())
    chosen, missing = surface.find(list(found.values()), ["mm_fp4", "no_such_fp4"], "x")
    assert [e.name for e in chosen] == ["mm_fp4"]
    assert [m["entry_point"] for m in missing] == ["no_such_fp4"]
    assert "'no_such_fp4' is not an FP4 entry point of flashinfer x" in missing[0]["reason"]
    unspecified = []
    for entry in found.values():
        try:
            child.call_for(entry, (12, 0))
        except inputs.SpecError:
            unspecified.append(entry.name)
    if target.flashinfer.__version__ == "0.7.4":
        assert len(unspecified) <= len(found) // 4, ("at most a quarter unspecified", unspecified)
        assert not [n for n in unspecified if n.endswith("Runner.forward")], "runners are built"


SGLANG_NVFP4_MOE = [
    "cutlass_fused_moe",
    "trtllm_fp4_block_scale_moe",
    "trtllm_fp4_block_scale_routed_moe",
    "fused_moe.TrtllmFp4RoutedRunner.forward",
    "CuteDslMoEWrapper.run",
    "moe_ep.MoEEpMegaLayer.forward",
]
"""The FlashInfer MoE entry points SGLang's NVFP4 MoE backends call (its layers/moe/moe_runner
flashinfer_cutlass and flashinfer_trtllm, 0.5.3 on; flashinfer_cutedsl's ``CuteDslMoEWrapper``,
0.5.11 on; layers/moe/flashinfer_megamoe's ``MoEEpMegaLayer``, 0.5.20 on), and the unified
runner of the same kernel."""


@pytest.mark.parametrize("sm", [(12, 0), (10, 0)])
def test_every_moe_runner_sglang_uses_for_nvfp4_gets_an_eager_checked_verdict(sm):
    found = {e.name: e for e in surface.discover(target.flashinfer)}
    for name in SGLANG_NVFP4_MOE:
        row = child.audit_entry(found[name], sm)
        assert row["status"] == "audited" and row["verdict"] in run.VERDICTS, (name, row)
        assert row["eager"] is not None, name
        if row["verdict"] in run.MUST_WRAP:
            assert row["eager"]["outcome"] in ("kernel", "completed", "needs_values"), (name, row)
    trtllm = child.audit_entry(found["fused_moe.TrtllmFp4RoutedRunner.forward"], sm)
    if sm == (12, 0):  # FlashInfer's own check; first in this process, then SM10 must not see it
        assert trtllm["verdict"] == "target unsupported" and "SM120" in trtllm["why"], trtllm
    else:  # building the runner fetches its cubins' checksums: a kernel, never a network wait
        assert (trtllm["verdict"], trtllm["eager"]["outcome"]) == ("undetermined on CPU", "kernel")
        assert trtllm["eager"]["kernel"].startswith("cubin download of "), trtllm["eager"]
        assert trtllm["eager"]["frame"].startswith("flashinfer/jit/cubin_loader.py:"), trtllm
    runner = found["fused_moe.TrtllmFp4RoutedRunner.forward"].owner
    assert moe_runners.is_runner(runner) and moe_runners.backend_config(runner).__name__ == (
        "TrtllmFp4Config"
    ), "the backend config FlashInfer's MoELayer maps to the runner"
    wrapper = found["CuteDslMoEWrapper.run"]
    assert wrapper.form == "method" and wrapper.reason == "MoE entry point documented for FP4"
    mega = child.call_for(found["moe_ep.MoEEpMegaLayer.forward"], sm)
    assert mega_moe.CONFIG in mega.notes[0], "built with the kernel config SGLang uses for NVFP4"


def test_a_new_simulated_sm_forgets_flashinfers_memoised_device_queries():
    from flashinfer import utils

    seen = []
    for sm in [(12, 0), (10, 0), (10, 0)]:
        with simulation.simulated_cuda(sm):
            seen.append(utils.get_compute_capability(torch.device("cuda")))
    assert seen == [(12, 0), (10, 0), (10, 0)], "functools.cache keys on the device, not the SM"
    assert simulation.device_caches_cleared((10, 0)) == 0, "the same SM keeps them"
    assert simulation.device_caches_cleared((9, 0)) > 10, "utils' device queries among them"


def test_a_runner_declaring_one_quant_variant_is_described_and_a_harness_failure_is_an_error_row():
    import enum

    class Variant(enum.Enum):  # 0.6.18's layout: one QuantVariant per declared quant
        NVFP4 = 4

    declared = type("OldRunner", (), {"supported_quant_variants": (Variant.NVFP4,)})
    assert moe_runners.describe(declared)["quant"] == repr(Variant.NVFP4)
    none = type("NoQuantRunner", (), {"supported_quant_variants": ()})
    assert moe_runners.describe(none)["quant"] == "none declared"
    broken = type("BrokenRunner", (), {"supported_quant_variants": 3, "pack_inputs": None,
                                       "check_support": None, "forward": lambda self: None})  # fmt: skip
    entry = surface.EntryPoint("BrokenRunner.forward", "tests", "moe", "fault injected",
                               broken.forward, "method", "tests", broken)  # fmt: skip
    row = child.audit_entry(entry, (12, 0))
    assert (row["status"], row["verdict"]) == ("error", "error"), row
    assert row["reason"].startswith("TypeError: 'int' object is not subscriptable"), row


def test_a_moe_wrapper_is_fp4_by_its_run_methods_documentation():
    def wrapper(doc: str) -> type:
        def run(self, x: torch.Tensor, x_sf: torch.Tensor) -> torch.Tensor:
            return x

        run.__doc__ = doc
        return type("SomeMoEWrapper", (), {"run": run, "__module__": "flashinfer.some"})

    fp4 = surface.entry_of("SomeMoEWrapper", "flashinfer", wrapper("x: packed NVFP4 input."))
    assert fp4 is not None and fp4.name == "SomeMoEWrapper.run" and fp4.form == "method"
    assert surface.entry_of("SomeMoEWrapper", "flashinfer", wrapper("x: BF16 input.")) is None


def test_a_docstring_gives_shapes_and_a_scalar_annotation_a_neutral_value():
    def entry(a_packed, scales, other, mystery):
        """Parameters
        ----------
        a_packed : torch.Tensor
            ``uint8`` ``[num_tokens, hidden / 2]`` packed values.
        scales, other
            ``float32`` ``(num_experts, 16)``.
        mystery : torch.Tensor
            ``bfloat16`` ``[rows, 7]`` with any ``rows``.
        """

    assert rules.from_doc(entry, "a_packed") == "u8[M,K/2]"
    assert rules.from_doc(entry, "other") == "f32[E,16]"
    assert rules.from_doc(entry, "mystery") is None, "an unknown dimension word is not guessed"
    assert [rules.from_annotation(a) for a in ("float", "Union[float, torch.Tensor]", "bool",
                                               "int", "str")] == ["1.0", "1.0", "False", None,
                                                                  None]  # fmt: skip
    assert inputs.for_signature(entry, "entry", "other", {"mystery": "1"}, notes := [])[1] == {
        "a_packed": "u8[M,K/2]",
        "scales": "f32[E,16]",
        "other": "f32[E,16]",
        "mystery": "1",
    }
    assert notes and all("from the docstring" in n for n in notes)


def test_a_backend_is_one_flashinfer_declares_for_the_sm():
    from flashinfer.utils import backend_requirement, supported_compute_capability

    @supported_compute_capability([100])
    def only_b200(x, backend="fast"):
        return True

    @supported_compute_capability([100, 120])
    def everywhere(x, backend="fast"):
        return True

    @backend_requirement({"fast": only_b200, "portable": everywhere})
    def kernel(x: torch.Tensor, backend: str = "fast") -> torch.Tensor:
        return x

    assert backends.backend_for(kernel, "kernel", (10, 0)) == (None, "")
    chosen, note = backends.backend_for(kernel, "kernel", (12, 0))
    assert chosen == "'portable'" and "the default 'fast'" in note
    call = inputs.for_function(kernel, "kernel", "other", (12, 0))
    assert call.kwargs["backend"] == "'portable'" and call.notes == [note]


def test_inputs_from_a_signature_name_an_unknown_required_parameter():
    def entry(input, global_scale, mystery_knob, bias: torch.Tensor | None):
        return input

    with pytest.raises(inputs.SpecError, match="mystery_knob"):
        inputs.for_signature(entry, "entry", "quantize")

    def optional(input, bias: torch.Tensor | None, knob: int = 3):
        return input

    assert inputs.for_signature(optional, "optional", "quantize") == (
        [],
        {"input": "bf16[M,K]", "bias": "None"},
    ), "a required Optional parameter is left out (None); defaults are kept"


def test_spec_values_are_read_with_an_entrys_own_sizes():
    x = inputs.value("bf16[M,K/16]")
    assert x.dtype == torch.bfloat16 and list(x.shape) == [128, 8]
    assert [t.dtype for t in inputs.value("[f32[E],f8[2,16]]")] == [
        torch.float32,
        torch.float8_e4m3fn,
    ]
    assert inputs.value("P*PS") == 64 and inputs.value("dtype:bf16") is torch.bfloat16
    assert inputs.parse("f32[1] a=2 b='x'") == (["f32[1]"], {"a": "2", "b": "'x'"})
    with inputs.sized("fused_moe.alphamoe_nvfp4_routed_moe"):
        assert inputs.value("K") == 256
    assert inputs.value("K") == inputs.SIZES["K"]


def test_the_command_prints_the_verdict_and_how_it_was_reached(user_module, capsys):
    assert cli.main([f"{user_module}:tiny", "--sm", "12.0", "--inputs", "f32[4,8] scale=3.0"]) == 0
    out = capsys.readouterr().out
    assert "eager: completed" in out and "step 0 [none, baseline] ok" in out
    assert "verdict: one graph" in out
    assert cli.main([f"{user_module}:reads_a_file", "--inputs", "f32[4,8]"]) == 0
    out = capsys.readouterr().out
    assert "verdict: graph break" in out and "file_io" in out
    assert f"at {user_module}.py:" in out and ":reads_a_file" in out


def test_help_explains_every_verdict_outcome_install_mode_and_stand_in(capsys):
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    out = capsys.readouterr().out
    names = [*run.VERDICTS, *eager.OUTCOMES, *toolkit.INSTALL_MODES, *run.STAGE_NOTES,
             *SIGNATURES, *(s["name"] for s in simulation.STANDINS)]  # fmt: skip
    for name in names:
        assert f"{name}:" in out or name in out.split("signatures")[-1], name
    assert "which a verdict covers" in out


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["{m}:tiny", "--sm", "9.9", "--inputs", "f32[4]"], "sms='9.9' is not a known SM"),
        (["{m}:tiny", "--versions", "abc"], "versions contains 'abc', which is not a version"),
        (["{m}:nope", "--inputs", "f32[4]"], "has no attribute 'nope'"),
        (["{m}", "--inputs", "f32[4]"], "must be module:function"),
        (["{m}:tiny", "--inputs", "f32[4] f32[4] f32[4]"], "does not match tiny(x, scale=2.0)"),
        (["{m}:tiny", "--inputs", "q7[4]"], "dtype 'q7' is unknown"),
        (["{m}:tiny", "--inputs", "f32[4,Z]"], "dimension 'Z'"),
        (["{m}:unknown_param", "--sm", "12.0"], "no input spec for parameter(s) zebra"),
    ],
)
def test_bad_input_is_named(user_module, capsys, argv, named):
    assert cli.main([a.format(m=user_module) for a in argv]) == 2
    captured = capsys.readouterr()
    assert named in captured.err and captured.out == "", "nothing was traced"


@pytest.mark.parametrize(
    ("bad", "named"),
    [
        (17, "sms=17 must be a comma-separated string or a list of strings"),
        (["12.0", 12], "sms=['12.0', 12] must be a comma-separated string"),
        (" , ", "sms is empty; allowed values: SMs such as 12.0,10.0"),
        (["12.0", "13.7"], "sms='13.7' is not a known SM; allowed values: 7.5"),
    ],
)
def test_sms_are_checked_before_anything_runs(bad, named):
    with pytest.raises(ValueError, match=re.escape(named)):
        study.prepare(["0.7.4"], bad, [])


def test_an_unknown_entry_point_is_named_before_any_environment_is_built():
    with pytest.raises(ValueError, match="entry_points contains 'no_such_fp4' is not an FP4"):
        study.prepare(["0.7.4"], ["12.0"], ["fp4_quantize", "no_such_fp4"])


@pytest.mark.notebook
@pytest.mark.browser
def test_12_audits_one_version_eager_first(run_notebook):
    version = target.flashinfer.__version__
    rows, executed = run_notebook(
        "12_fp4_api_audit", versions=[version], sms=["12.0", "10.0"], entry_points=HANDFUL
    )
    cells = {(r["values"]["entry_point"], r["values"]["sm"]): r for r in rows
             if r["kind"] == "entry"}  # fmt: skip
    assert set(cells) == {(e, sm) for e in HANDFUL for sm in ("12.0", "10.0")}
    for (name, sm), r in cells.items():
        v = r["values"]
        assert v["status"] == "audited" and v["verdict"] in run.VERDICTS, (name, sm, v)
        assert r["provenance"]["target_sm"] == sm and r["provenance"]["simulated"] is True
        assert r["provenance"]["packages"]["flashinfer-python"] == version
        if v["verdict"] in run.MUST_WRAP:
            assert v["eager"]["outcome"] in ("kernel", "completed", "needs_values"), (name, v)
            assert v["trace"]["blocker_frame"] and v["trace"]["signature"] in SIGNATURES
    story = cells[("fp4_quantize", "12.0")]["values"]
    assert (story["verdict"], story["trace"]["signature"]) == ("graph break", "subprocess")
    assert story["trace"]["blocker_frame"].startswith("flashinfer/jit/cpp_ext.py")
    assert story["trace"]["blocker_frame"].endswith(":get_cuda_path"), "which nvcc: no CUDA_HOME"
    assert story["install"]["jit_cuda_home"]["blocker_frame"].endswith(":get_cuda_version")
    assert story["install"]["prebuilt"]["holds"] is True
    assert story["eager"]["outcome"] == "kernel", "FlashInfer accepted the inputs"
    assert [s["stage"] for s in story["chain"][1:]][:1] == ["patch_cuda_version"]
    op = cells[("torch.ops.flashinfer.fp4_quantize", "12.0")]["values"]
    assert (op["verdict"], op["form"], op["eager"]["outcome"]) == ("one graph", "op", "completed")
    if version == "0.7.4":
        lora = cells[("mm_nvfp4_lora", "12.0")]["values"]
        assert lora["verdict"] == "target unsupported", "FlashInfer's own check, eagerly"
    [summary] = [r["values"] for r in rows if r["kind"] == "summary"]
    assert summary["versions_measured"] == [version] and version in summary["headline"]
    cell = summary["versions"][version]["sms"]["12.0"]
    assert cell["ops_one_graph"] == ["torch.ops.flashinfer.fp4_quantize"]
    assert "fp4_quantize" in cell["wrap"] and not set(cell["undetermined"]) & set(cell["wrap"])
    assert (executed.parent.parent / "figures" / "12_fp4_api_audit.png").exists()
    counted = study.counts([r["values"] for r in rows if r["kind"] == "entry"])
    [sm12] = counted[counted.SM == "12.0"].to_dict("records")
    assert sm12["registered ops compile"] == f"1/{1 + len(cell['ops_wrap'])}"
    assert (
        sm12["compile to one graph"]
        == f"{len(cell['one_graph'])}/{len(cell['one_graph']) + len(cell['wrap'])}"
    )
    shown = study.table([r["values"] for r in rows if r["kind"] == "entry"], newest_only=True)
    assert len(shown.columns) <= 8, "short columns; the long text folded in detail"
    [told] = shown[(shown["entry point"] == "fp4_quantize") & (shown.SM == "12.0")].to_dict(
        "records"
    )
    assert (told["verdict"], told["blocker"]) == ("graph break", "subprocess")
    assert told["detail"].startswith("<details>") and ":get_cuda_path" in told["detail"]
    text = exported(executed)  # its tables fit the window, no warnings on the page
    assert "registered ops compile" in text, "the counts per version and SM, with the verdict"


def test_the_heat_map_groups_rows_by_package_and_keeps_its_legend_off_the_footer():
    from fp4lab.compile.audit import plots as audit_plots
    from fp4lab.core import figures

    rows = [
        {"version": v, "sm": sm, "entry_point": name, "group": group, "verdict": verdict,
         "status": "audited"}
        for v in ("0.6.3", "0.7.4")
        for sm in ("12.0", "10.0")
        for name, group, verdict in [
            ("fp4_quantize", "flashinfer", "graph break"),
            ("gemm.group_gemm_nvfp4_nt_groupwise", "flashinfer.gemm", "input rejected"),
            ("torch.ops.flashinfer.fp4_quantize", "torch.ops.flashinfer", "one graph"),
        ]
    ]  # fmt: skip
    order = audit_plots.rows_by_group(rows)
    assert [g for g, _ in order] == ["flashinfer", "flashinfer.gemm", "torch.ops.flashinfer"]
    fig = audit_plots.plot_heatmap(rows)
    figures.annotate_provenance(fig, {"device": "cpu", "time_utc": "now"}, ["trace"])
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    legend = fig.legends[0].get_window_extent(renderer)
    footer = fig.texts[-1].get_window_extent(renderer)
    panels = [ax.get_window_extent(renderer) for ax in fig.axes]
    assert not legend.overlaps(footer)
    assert legend.y0 > max(p.y1 for p in panels) - 1, "the legend sits above the panels"


def test_no_audited_entry_point_gives_no_figure_and_a_clear_verdict(isolated_outputs, capsys):
    from fp4lab.compile.audit import plots as audit_plots

    assert audit_plots.save_heatmap([], study.NOTEBOOK) is None
    assert "no entry point was audited" in capsys.readouterr().out
    with pytest.raises(AssertionError, match="no entry point could be audited"):
        study.counts([])
