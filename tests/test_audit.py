"""The FP4 API audit: the command on callables of our own (one graph, file I/O named), bad
input named, fake tensors where a kernel cannot run here, and notebook 12 on one version."""

from __future__ import annotations

import re
import textwrap

import pytest
import torch

from fp4lab.compile import target
from fp4lab.compile.audit import __main__ as cli
from fp4lab.compile.audit import inputs, run, study, surface
from fp4lab.compile.trace import SIGNATURES

HANDFUL = ["fp4_quantize", "mm_fp4", "block_scale_interleave", "shuffle_matrix_a"]
EXPECTED_0_7_4 = {
    "fp4_quantize": ("graph break", "subprocess"),
    "mm_fp4": ("graph break", "unsupported_other"),
    "block_scale_interleave": ("graph break", "subprocess"),
    "shuffle_matrix_a": ("one graph", "ok"),
}
"""What notebook 12 measured for FlashInfer 0.7.4 (the pinned release) on SM100 and SM120."""


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
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    return "audit_user_code"


def test_the_command_prints_one_graph_for_a_tiny_callable(user_module, capsys):
    assert cli.main([f"{user_module}:tiny", "--sm", "12.0", "--inputs", "f32[4,8] scale=3.0"]) == 0
    out = capsys.readouterr().out
    assert "step 0 [none, baseline] ok" in out
    assert "target (stages: none): one graph (ok)" in out


def test_the_command_names_the_file_io_blocker_and_its_frame(user_module, capsys):
    assert cli.main([f"{user_module}:reads_a_file", "--inputs", "f32[4,8]"]) == 0
    out = capsys.readouterr().out
    assert "graph break (file_io)" in out
    assert f"at {user_module}.py:" in out and ":reads_a_file" in out


def test_help_names_the_stages_and_the_signatures(capsys):
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    out = capsys.readouterr().out
    for name in [*run.STAGE_NOTES, *SIGNATURES, *run.VERDICTS]:
        assert name in out


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
    ],
)
def test_bad_input_is_named(user_module, capsys, argv, named):
    assert cli.main([a.format(m=user_module) for a in argv]) == 2
    assert named in capsys.readouterr().err


def test_an_unknown_sm_among_known_ones_is_refused_before_any_trace(user_module, capsys):
    code = cli.main([f"{user_module}:tiny", "--sm", "12.1", "--sm", "13.7", "--inputs", "f32[4]"])
    captured = capsys.readouterr()
    assert code == 2 and "sms='13.7' is not a known SM; allowed values: 7.5, 8.0" in captured.err
    assert captured.out == "", "nothing was traced"


def test_a_cuda_only_kernel_is_traced_on_fake_tensors_and_said_so():
    @torch.library.custom_op("fp4lab_test::cuda_only", mutates_args=())
    def cuda_only(x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError("this kernel runs on CUDA only")

    cuda_only.register_fake(lambda x: torch.empty_like(x))
    found = run.audit(
        lambda x: cuda_only(x) + 1,
        inputs.bind(lambda x: x, ["f32[8,16]"], {}),
        (12, 0),
        op="fp4_lab_test::cuda_only",
    )
    assert found["tensors"] == "fake" and "this kernel runs on CUDA only" in found["fake_because"]
    assert found["target"]["verdict"] == "one graph"
    op = run.custom_op("fp4lab_test::cuda_only")
    assert op == {"qualname": "fp4lab_test::cuda_only", "present": True, "fake_or_meta": True}


def test_the_surface_is_found_in_the_package_and_unknown_names_are_named():
    found = {e.name: e for e in surface.discover(target.flashinfer)}
    assert {"fp4_quantize", "mm_fp4"} <= set(found)
    assert all(e.kind in surface.KINDS for e in found.values())
    assert not any(name.startswith("_") for name in found)
    chosen, missing = surface.find(target.flashinfer, ["mm_fp4", "no_such_fp4", "rmsnorm"])
    assert [e.name for e in chosen] == ["mm_fp4"]
    assert [m["entry_point"] for m in missing] == ["no_such_fp4", "rmsnorm"]
    assert "'no_such_fp4' does not exist" in missing[0]["reason"]
    assert "is not an FP4 entry point" in missing[1]["reason"]


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


def test_spec_values_are_read():
    x = inputs.value("bf16[M,K/16]")
    assert x.dtype == torch.bfloat16 and list(x.shape) == [128, 8]
    assert [t.dtype for t in inputs.value("[f32[E],f8[2,16]]")] == [
        torch.float32,
        torch.float8_e4m3fn,
    ]
    assert inputs.value("P*PS") == 64 and inputs.value("dtype:bf16") is torch.bfloat16
    assert inputs.parse("f32[1] a=2 b='x'") == (["f32[1]"], {"a": "2", "b": "'x'"})


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


@pytest.mark.notebook
def test_12_audits_one_version_and_a_handful_of_entry_points(run_notebook):
    version = target.flashinfer.__version__
    rows, executed = run_notebook(
        "12_fp4_api_audit",
        versions=[version],
        sms=["12.0", "10.0"],
        entry_points=HANDFUL,
    )
    entries = [r for r in rows if r["kind"] == "entry"]
    cells = {(r["values"]["entry_point"], r["values"]["sm"]): r for r in entries}
    assert set(cells) == {(e, sm) for e in HANDFUL for sm in ("12.0", "10.0")}
    for (name, sm), r in cells.items():
        v = r["values"]
        assert v["status"] == "audited" and v["verdict"] in run.VERDICTS
        if version == "0.7.4":
            assert (v["verdict"], v["target"]["signature"]) == EXPECTED_0_7_4[name], (name, sm)
        staged = ["simulated_target"] if v["target_stages"] else []
        assert v["target"]["evidence"] == ["trace", *staged], "simulated only where a stage was"
        assert r["provenance"]["target_sm"] == sm and r["provenance"]["simulated"] is True
        assert r["provenance"]["packages"]["flashinfer-python"] == version
        if v["verdict"] != "one graph":
            assert v["target"]["blocker_frame"] and v["target"]["frames"]
            assert v["target"]["signature"] in SIGNATURES
        assert all(s in ("simulated_sm", "populated_arch_set") for s in v["target_stages"])
    story = cells[("fp4_quantize", "12.0")]["values"]
    assert story["cpu"]["signature"] == "device_check", "a CPU tensor, before the target is staged"
    assert story["target"]["signature"] == "subprocess", "the story's msg 988 on the target"
    assert story["target"]["blocker_frame"].startswith("flashinfer/jit/cpp_ext.py")
    assert story["custom_op"]["present"] == story["custom_op"]["fake_or_meta"]
    [summary] = [r["values"] for r in rows if r["kind"] == "summary"]
    assert summary["versions_measured"] == [version] and version in summary["headline"]
    counts = summary["versions"][version]["sms"]["12.0"]
    assert len(counts["one_graph"]) + len(counts["wrap"]) == len(HANDFUL)
    assert len(counts["one_graph"]) >= 1 and len(counts["wrap"]) >= 1
    assert (executed.parent.parent / "figures" / "12_fp4_api_audit.png").exists()


def test_no_audited_entry_point_gives_no_figure_and_a_clear_verdict(isolated_outputs, capsys):
    from fp4lab.compile.audit import plots as audit_plots

    assert audit_plots.save_heatmap([], study.NOTEBOOK) is None
    assert "no entry point was audited" in capsys.readouterr().out
    with pytest.raises(AssertionError, match="no entry point could be audited"):
        study.audit_verdict([])
