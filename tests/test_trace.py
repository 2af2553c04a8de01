"""trace.attempt / classify on small real functions that really do what FlashInfer's JIT does."""

from __future__ import annotations

import datetime
import os
import subprocess

import pytest
import torch

from fp4lab.compile import frames, trace


def calls_subprocess(x):
    subprocess.check_output(["nvcc", "--version"])
    return x + 1


def opens_a_file(x):
    with open(os.devnull) as handle:
        handle.read()
    return x + 1


def checks_a_path(x):
    return x + 1 if os.path.exists(os.devnull) else x


@torch.compiler.disable
def opaque(x):
    return x * 2


def calls_disabled(x):
    return opaque(x + 1) + 1


def checks_device(x):
    if x.device.type != "cuda":
        raise ValueError("device must be a cuda device")
    return x


def counts_devices(x):
    return x + torch.cuda.device_count()


def asks_the_clock(x):
    datetime.datetime.now()
    return x + 1


@torch.library.custom_op("fp4lab_test::double", mutates_args=())
def double(x: torch.Tensor) -> torch.Tensor:
    return x * 2


@double.register_fake
def _(x):
    return torch.empty_like(x)


def calls_custom_op(x):
    return torch.ops.fp4lab_test.double(x + 1) + 1


X = torch.arange(4.0)


@pytest.mark.parametrize(
    ("fn", "signature", "builtin"),
    [
        (calls_subprocess, "subprocess", "_thread.allocate_lock"),
        (opens_a_file, "file_io", "open"),
        (checks_a_path, "file_io", "posix.stat"),
        (calls_disabled, "compiler_disable_under_fullgraph", None),
        (checks_device, "device_check", None),
        (counts_devices, "non_tensor_torch_op", None),
        (asks_the_clock, "unsupported_other", None),
    ],
)
def test_failures_are_named_from_dynamo_messages(fn, signature, builtin):
    outcome = trace.attempt(fn, X, fullgraph=True)
    assert outcome.status == "unsupported"
    assert outcome.exception == "torch._dynamo.exc.Unsupported"
    assert outcome.signature == trace.classify(outcome) == signature
    assert outcome.skipped_builtin == builtin
    assert outcome.message and outcome.explanation, "dynamo's first line and explanation are kept"
    assert any(f.function == fn.__name__ and f.file == "test_trace.py" for f in outcome.frames)
    assert outcome.seconds > 0


def test_subprocess_frames_show_the_nvcc_query_and_stdlib():
    outcome = trace.attempt(calls_subprocess, X)
    assert outcome.shows_nvcc_query
    assert any(f.file == "<stdlib>/subprocess.py" for f in outcome.frames)
    assert outcome.blocker_frame.function == "calls_subprocess"
    assert "nvcc" in outcome.blocker_frame.source


def test_compiler_disable_hint_is_dynamos_own():
    outcome = trace.attempt(calls_disabled, X)
    assert "torch.compiler.disable" in outcome.message
    assert any("Remove the `torch.compiler.disable` call" in h for h in outcome.hints)


def test_fullgraph_false_counts_graphs_and_breaks_with_explain():
    outcome = trace.attempt(calls_disabled, X, fullgraph=False)
    assert outcome.signature == "ok"
    assert (outcome.graph_count, outcome.graph_break_count) == (2, 1)
    assert outcome.graph_calls == 2
    assert outcome.break_reasons[0].startswith(
        "Skip calling `torch.compiler.disable()`d function at test_trace.py:"
    )
    assert torch.equal(outcome.output, calls_disabled(X))


@pytest.mark.parametrize("backend", ["eager", "inductor"])
def test_custom_op_compiles_to_one_graph(backend):
    outcome = trace.attempt(calls_custom_op, X, fullgraph=True, backend=backend)
    assert outcome.signature == "ok"
    assert (outcome.graph_count, outcome.graph_break_count, outcome.graph_calls) == (1, 0, 1)
    assert torch.equal(outcome.output, calls_custom_op(X))


def test_runtime_errors_are_not_compile_failures():
    def bad_shapes(x):
        return x @ torch.ones(3, 3)

    outcome = trace.attempt(bad_shapes, X)
    assert outcome.status == "runtime_error" and outcome.signature == "runtime_error"
    assert outcome.exception


def test_record_is_json_ready():
    import json

    record = trace.attempt(calls_subprocess, X).as_record()
    json.dumps(record)
    assert record["signature"] == "subprocess" and record["frames"][0].startswith("test_trace.py:")
    assert "output" not in record and "compiled" not in record


def test_unknown_backend_is_refused_before_tracing():
    with pytest.raises(ValueError, match=r"backend='nope'.*allowed values: .*inductor"):
        trace.attempt(calls_subprocess, X, backend="nope")


def test_relative_paths():
    assert frames.relative_path(torch.__file__) == "torch/__init__.py"
    assert frames.relative_path(subprocess.__file__) == "<stdlib>/subprocess.py"
