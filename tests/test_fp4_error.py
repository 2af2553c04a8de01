"""fp4lab.fp4.accuracy and notebook 06's parameter checks: shapes, distributions, FP8 baseline, metrics."""

from __future__ import annotations

import pytest
import torch

from fp4lab.core import params
from fp4lab.fp4 import accuracy, harness


@pytest.mark.parametrize(
    "shapes, message",
    [
        ([], "must be a non-empty list"),
        ([[4, 64, 2]], "3-D inputs are not allowed"),
        ([[4, 40]], "shapes K=40 must be a multiple of 32"),
        ([[0, 64]], "shapes M=0 must be a positive integer"),
        ("64x64", "must be a non-empty list"),
    ],
)
def test_check_shapes_names_the_problem(shapes, message):
    with pytest.raises(ValueError, match=message):
        harness.check_shapes("shapes", shapes)


def test_validate_names_the_parameter_and_starts_a_run():
    good = dict(
        shapes=[[64, 256]],
        distributions=["normal"],
        seed=1,
        device="cpu",
        throughput_shapes=[[128, 256]],
        throughput_iters=2,
    )
    run = harness.validate(**good)
    assert run.shapes == [(64, 256)] and run.device == torch.device("cpu")
    assert run.recorder.params == good and run.recorder.written == []
    for bad, message in [
        ({"seed": 1.5}, "seed=1.5 must be an integer"),
        ({"throughput_iters": 0}, "throughput_iters=0 must be a positive integer"),
        ({"throughput_shapes": [[8, 20]]}, "throughput_shapes K=20 must be a multiple of 32"),
        ({"distributions": ["cauchy"]}, "distributions contains 'cauchy'"),
    ]:
        with pytest.raises(ValueError, match=message):
            harness.validate(**{**good, **bad})


def test_resolve_device():
    assert params.device("device", "cpu") == torch.device("cpu")
    with pytest.raises(ValueError, match="device='gpu' is not allowed"):
        params.device("device", "gpu")
    if not torch.cuda.is_available():
        assert params.device("device", "auto") == torch.device("cpu")
        with pytest.raises(ValueError, match="torch sees no CUDA GPU"):
            params.device("device", "cuda")


def test_distributions_are_reproducible_and_shaped():
    normal = accuracy.activations("normal", 64, 256, seed=1)
    assert normal.dtype == torch.bfloat16 and torch.equal(
        normal, accuracy.activations("normal", 64, 256, seed=1)
    )
    heavy = accuracy.activations("student_t", 64, 256, seed=1).float()
    kurtosis = lambda t: float(((t - t.mean()) ** 4).mean() / t.var() ** 2)  # noqa: E731
    assert kurtosis(heavy) > kurtosis(normal.float()) + 1
    outliers = accuracy.activations("outlier_channels", 64, 256, seed=1).float()
    channel_rms = outliers.pow(2).mean(0).sqrt()
    assert int((channel_rms > 10).sum()) == 2  # 1% of 256 channels, scaled by 50
    with pytest.raises(ValueError, match="distribution='cauchy' is not allowed"):
        accuracy.activations("cauchy", 4, 32)


def test_fp8_baseline_and_metrics():
    x = accuracy.activations("normal", 32, 64)
    assert torch.equal(accuracy.fp8_per_tensor(x * 0), torch.zeros(32, 64))
    exact = torch.tensor([[448.0, -1.0, 0.5, 0.0]])
    assert torch.equal(accuracy.fp8_per_tensor(exact), exact)
    m = accuracy.metrics(x, accuracy.roundtrip(x, "nvfp4"))
    assert m["mse"] > 0 and 15 < m["snr_db"] < 25 and m["max_abs_error"] > 0
    assert accuracy.metrics(exact, exact)["snr_db"] == float("inf")
