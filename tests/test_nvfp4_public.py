"""The public quantize: capture-safe (no tensor from Python data once warm), the fast path chosen
where it gives the reference's bytes, and those bytes on the edge cases and several shapes."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from fp4lab.fp4 import edge_cases, kernels, nvfp4

HOST_DATA_OPS = ("aten.lift_fresh", "aten.lift_fresh_copy")
"""What torch.tensor / as_tensor / asarray of Python data dispatch: a copy from the host."""


class _HostDataSpy(TorchDispatchMode):
    """Records every op that turns Python data into a tensor."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if str(func.overloadpacket) in HOST_DATA_OPS:
            self.seen.append(str(func))
        return func(*args, **(kwargs or {}))


def _calls(x: torch.Tensor) -> list:
    gs = nvfp4.global_scale_for(x)
    return [
        lambda: nvfp4.reference_quantize(x),
        lambda: nvfp4.reference_quantize(x, gs, swizzle=True),
        lambda: nvfp4.reference_quantize(x, 3.7),
        lambda: nvfp4.reference_quantize(x, block_size=32, swizzle=True),
        lambda: kernels.quantize(x),  # small: the public call takes the reference here
        lambda: nvfp4.dequantize(*nvfp4.reference_quantize(x, 2.0)),
    ]


def test_no_tensor_from_python_data_once_warm():
    """A host-to-device copy is illegal during CUDA-graph capture: after a first call on a device
    the quantize path must build nothing from Python data (on a CPU the same ops show it)."""
    x = edge_cases.adversarial_input()
    calls = _calls(x)
    for call in calls:
        call()  # warm-up: per-device tables may be built here
    with _HostDataSpy() as spy:
        for call in calls:
            call()
    assert spy.seen == []


def test_the_spy_sees_a_tensor_built_from_python_data():
    with _HostDataSpy() as spy:
        torch.tensor([0.0, 1.0]) * torch.as_tensor(2.0)
    assert len(spy.seen) == 2


def test_public_kernel_choice():
    small, large = torch.randn(64, 256), torch.empty(1024, kernels.FAST_PATH_MIN_ELEMENTS // 1024)
    assert kernels.public_kernel(small) == "reference"
    assert kernels.public_kernel(large) == "compiled"
    assert kernels.public_kernel(large.to("meta")) == "reference"
    with _HostDataSpy():  # any dispatch mode: plain torch ops it can see
        assert kernels.public_kernel(large) == "reference"
    assert set(kernels.KERNELS) == {"reference", "compiled", "triton"}


def _same(a: tuple, b: tuple) -> None:
    assert torch.equal(a[0], b[0]), "codes"
    assert a[1].dtype == b[1].dtype and torch.equal(a[1].view(torch.uint8), b[1].view(torch.uint8))
    assert (a[2] is None and b[2] is None) or torch.equal(a[2], b[2]), "global scale"


def _edges(dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """Every edge case in one [29, 64] input: the adversarial rows and the E2M1 ties."""
    return torch.cat([edge_cases.adversarial_input(dtype=dtype), edge_cases.tie_input(dtype=dtype)])


def test_compiled_quantize_gives_the_reference_bytes():
    """The compiled formulation (bit-op E4M3, word packing, fused global max) against the reference
    on the edge cases, each input dtype, both formats, given and computed global scales (SFs in
    E4M3's subnormal range and below), and changing shapes. Four graphs in all: each costs seconds
    to compile."""
    g = torch.Generator().manual_seed(0)
    tiny = torch.randn(29, 64, generator=g) * 1e-30
    cases = [
        (_edges(), {}),
        (_edges(), {"block_size": 32, "swizzle": True}),
        (_edges(torch.float16), {}),
        (_edges(torch.float32), {"global_scale": 3.7}),
        (_edges(torch.float32), {"global_scale": torch.tensor(-2.0), "swizzle": True}),
        (tiny, {"global_scale": 1e30}),
    ]
    for m, k in ((130, 256), (7, 64), (300, 512)):  # bfloat16: the same graph, other shapes
        cases.append((torch.randn(m, k, generator=g).bfloat16() * 100, {"swizzle": True}))
    cases.append((tiny.bfloat16(), {}))
    for x, kwargs in cases:
        _same(nvfp4.reference_quantize(x, **kwargs), kernels.compiled_quantize(x, **kwargs))


def test_compiled_quantize_compiles_once_for_every_shape():
    """One graph per dtype and format serves every M and K (the block count is dynamic from the
    first call); counted in a fresh process, where no earlier test has compiled anything."""
    code = (
        "import fp4lab; fp4lab.setup()\n"
        "import torch\n"
        "from torch._dynamo.utils import counters\n"
        "from fp4lab.fp4 import kernels\n"
        "for m, k in ((64, 256), (96, 512), (33, 1024)):\n"
        "    kernels.compiled_quantize(torch.randn(m, k))\n"
        "print('graphs', counters['stats']['unique_graphs'])\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "graphs 1" in done.stdout.splitlines()


def test_public_quantize_takes_the_fast_path_and_gives_the_reference_bytes(monkeypatch):
    monkeypatch.setattr(kernels, "FAST_PATH_MIN_ELEMENTS", 1024)
    x = _edges()
    assert kernels.public_kernel(x) == "compiled"
    for kwargs in ({}, {"block_size": 32, "swizzle": True}):
        _same(nvfp4.reference_quantize(x, **kwargs), kernels.quantize(x, **kwargs))
    with pytest.raises(ValueError, match="MXFP4 has no global scale"):
        kernels.quantize(x, 1.0, block_size=32)


def test_e4m3_by_bits_is_the_fp8_cast_on_every_boundary():
    """Every E4M3 value, the midpoints between neighbours and their float32 neighbours, signs,
    saturation, subnormals and NaN: the bit formulation equals the reference encode."""
    finite = torch.arange(0, 127, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    mid = (finite[:-1] + finite[1:]) / 2
    probes = torch.cat(
        [
            finite,
            mid,
            torch.nextafter(mid, torch.zeros_like(mid)),
            torch.nextafter(mid, torch.full_like(mid, 1e9)),
            torch.tensor([448.0, 464.0, 1e9, float("inf"), float("nan"), 2.0**-10, 1e-30, 0.0]),
            torch.rand(100_000, generator=torch.Generator().manual_seed(1)) * 500,
        ]
    )
    probes = torch.cat([probes, -probes])
    value, byte = kernels.e4m3_by_bits(probes)
    expected = nvfp4.e4m3_encode(probes)
    assert torch.equal(byte, expected)
    decoded = expected.view(torch.float8_e4m3fn).float()
    assert torch.equal(value.nan_to_num(99.0), decoded.nan_to_num(99.0))
