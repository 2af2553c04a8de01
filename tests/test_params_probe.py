"""Parameter checks name the parameter and the allowed values; probe describes this machine."""

from __future__ import annotations

import pytest
import torch

from fp4lab.compile import segment, story
from fp4lab.core import params, probe


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (
            lambda: params.choice("backend", "tvm", params.BACKENDS),
            r"backend='tvm' is not allowed; allowed values: eager, aot_eager, inductor",
        ),
        (
            lambda: params.choices("backends", [], params.BACKENDS),
            r"backends is empty; allowed values",
        ),
        (
            lambda: params.choices("backends", ["eager", "x"], params.BACKENDS),
            r"backends contains 'x'",
        ),
        (lambda: params.positive("tokens", 0), r"tokens=0 must be a positive integer"),
        (lambda: params.positive("tokens", True), r"tokens=True must be a positive integer"),
        (lambda: params.multiple_of("ffn", 40, 16), r"ffn=40 must be a multiple of 16"),
        (lambda: params.multiple_of("ffn", -16, 16), r"ffn=-16 must be a positive integer"),
        (
            lambda: params.sm("target_sm", "12.5"),
            r"target_sm='12.5' is not a known SM; allowed values: 7.5, .*12.0",
        ),
        (lambda: params.sm("target_sm", "abc"), r"target_sm='abc' is not a known SM"),
        (lambda: segment.LayerShape.glm5(3), r"scale=3 is not allowed; allowed values: 1, 2, 4"),
        (lambda: story.check(cuda_home=""), r"cuda_home='' must be a non-empty string"),
        (lambda: story.check(cuda_home=None), r"cuda_home=None must be a non-empty string"),
        (lambda: story.check(hidden=100, heads=2), r"hidden=100 must be a multiple of 32"),
        (lambda: story.check(device="tpu"), r"device='tpu' is not allowed; allowed values: auto"),
        (lambda: story.check(scale=3), r"scale=3 is not allowed"),
    ],
)
def test_bad_parameters_are_named(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_story_set_up_records_the_parameters_as_given():
    run = story.prepare(
        "01_nvcc_subprocess_crash",
        target_sm="12.0",
        backend="eager",
        tokens=16,
        hidden=64,
        heads=2,
        ffn=128,
        cuda_home="/opt/cuda",
    )
    assert run.sm == (12, 0) and run.shape == segment.LayerShape(64, 2, 128) and run.layers == 1
    assert run.x.shape == (16, 64) and len(run.model.layers) == 1
    assert run.params["cuda_home"] == "/opt/cuda" and run.rec.notebook == "01_nvcc_subprocess_crash"
    scaled = story.prepare("04", scale=64, layers=2, tokens=8, device="auto")
    assert scaled.sm is None and scaled.params["device"] in ("cpu", "cuda")
    assert scaled.describe().startswith("2 layers of LayerShape(hidden=96, heads=1, ffn=192)")
    with pytest.raises(TypeError, match="unknown story parameters"):
        story.check(tokenz=1)


def test_sm_accepts_both_spellings():
    assert params.sm("target_sm", "12.0") == params.sm("target_sm", [12, 0]) == (12, 0)


def test_probe_matches_torch():
    m = probe.machine()
    assert (
        m.packages["torch"] == torch.__version__.split("+")[0]
        or m.packages["torch"] == torch.__version__
    )
    assert m.cuda_available == torch.cuda.is_available()
    assert "cpu" in m.capabilities()
    if not torch.cuda.is_available():
        assert m.device_name == "cpu" and m.sm is None and m.gpu_count == 0
        assert m.missing("gpu").startswith("no CUDA GPU")
        assert (
            "SM100" in m.missing("fp4-gpu")
            and m.missing("multi-gpu") == "needs 2 or more GPUs; this machine has 0"
        )
    assert m.missing("cpu") is None
    with pytest.raises(
        ValueError, match="need='tpu' is not known; allowed values: cpu, gpu, fp4-gpu, multi-gpu"
    ):
        m.missing("tpu")


def test_simulating_restores():
    before = probe.target()
    with probe.simulating((10, 0)):
        assert probe.target() == {"sm": "10.0", "simulated": True}
    assert probe.target() == before


def test_the_record_form_names_no_path_of_this_machine():
    data = probe.machine().as_dict()
    assert data["nvcc_path"] in (None, "nvcc")
    assert "/" not in str(data)
