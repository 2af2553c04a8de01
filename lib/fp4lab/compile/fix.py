"""The fix the story rejected: ``fp4lab::fp4_quantize``, a torch.library custom op with a fake.

Dynamo sees one opaque node with exact output shapes and dtypes, so fullgraph=True holds.
The op's kernel is FlashInfer's on an SM100+ GPU and fp4lab's NVFP4 reference elsewhere.
FlashInfer 0.6.12+ ships its own ``torch.ops.flashinfer.fp4_quantize`` (PR #3081), CUDA-only;
``upstream_op_cpu_kernel`` lends it the reference as CPU kernel for the length of a block.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from fp4lab.compile import target
from fp4lab.core import probe
from fp4lab.fp4 import nvfp4

OP_NAME = "fp4lab::fp4_quantize"
_state = {"upstream_cpu_kernel": False}


def reference_fp4_quantize(
    x: torch.Tensor, global_scale: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """fp4lab.fp4.nvfp4's quantize in FlashInfer's output layout: codes [M, K/2], swizzled scales [M↑128, S↑4] uint8."""
    m, k = x.shape
    codes, scales, _ = nvfp4.quantize(
        x, global_scale if global_scale is not None else 1.0, swizzle=True
    )
    return codes, scales.view(torch.uint8).reshape(nvfp4.swizzled_shape(m, k // 16))


def fp4_capable(device: torch.device) -> bool:
    """Whether FlashInfer's FP4 kernel runs on ``device`` (a real CUDA GPU of SM100 or newer)."""
    return device.type == "cuda" and torch.cuda.get_device_capability(device) >= probe.FP4_MIN_SM


@torch.library.custom_op(OP_NAME, mutates_args=())
def _fp4_quantize_op(
    x: torch.Tensor, global_scale: torch.Tensor | None, sf_vec_size: int = 16
) -> tuple[torch.Tensor, torch.Tensor]:
    """FlashInfer's kernel where the device runs it; elsewhere (CPU, pre-Blackwell GPUs) the nvfp4 reference."""
    if fp4_capable(x.device):
        return target.FLASHINFER_FP4_QUANTIZE(x, global_scale, sf_vec_size)
    if sf_vec_size != 16:
        raise ValueError(
            f"sf_vec_size={sf_vec_size} is not allowed for the reference kernel; allowed values: 16"
        )
    return reference_fp4_quantize(x, global_scale)


@_fp4_quantize_op.register_fake
def _fp4_quantize_fake(
    x: torch.Tensor, global_scale: torch.Tensor | None, sf_vec_size: int = 16
) -> tuple[torch.Tensor, torch.Tensor]:
    """Empty outputs of the kernel's shapes: codes [M, K/2], scales [M↑128, (K/sf_vec_size)↑4] uint8."""
    m, k = x.shape
    rows, cols = -(-m // 128) * 128, -(-(k // sf_vec_size) // 4) * 4
    return x.new_empty((m, k // 2), dtype=torch.uint8), x.new_empty((rows, cols), dtype=torch.uint8)


def custom_op() -> Any:
    """fp4lab's custom op: FlashInfer's kernel on SM100+ GPUs, the nvfp4 reference elsewhere."""
    return torch.ops.fp4lab.fp4_quantize.default


@contextlib.contextmanager
def custom_op_fp4_quantize() -> Iterator[None]:
    """The fix: ``flashinfer.fp4_quantize`` routed through the custom op for the block."""

    def fp4_quantize_through_op(
        x: torch.Tensor,
        global_scale: torch.Tensor | None = None,
        sf_vec_size: int = 16,
        *args: Any,
        **kwargs: Any,
    ):
        return torch.ops.fp4lab.fp4_quantize(x, global_scale, sf_vec_size)

    with target.rebound("fp4_quantize", target.FLASHINFER_FP4_QUANTIZE, fp4_quantize_through_op):
        yield


def upstream_op() -> Any | None:
    """FlashInfer's own ``torch.ops.flashinfer.fp4_quantize`` (PR #3081, 0.6.12+), or None."""
    try:
        return torch.ops.flashinfer.fp4_quantize.default
    except (AttributeError, RuntimeError):
        return None


@contextlib.contextmanager
def upstream_op_cpu_kernel() -> Iterator[Any]:
    """Give the upstream op the nvfp4 reference as its CPU kernel for the block (its own is CUDA-only).

    Yields the op, or None where the installed FlashInfer has none.
    """
    op = upstream_op()
    if op is None:
        yield None
        return
    opdef = torch._library.custom_ops._maybe_get_opdef("flashinfer::fp4_quantize")
    if opdef is None:
        raise RuntimeError(
            "torch.ops.flashinfer.fp4_quantize exists but is not a torch.library.custom_op"
        )

    def cpu_kernel(x, global_scale=None, sf_vec_size=16, *args, **kwargs):
        if not _state["upstream_cpu_kernel"]:
            raise NotImplementedError(
                "flashinfer::fp4_quantize has a CPU kernel only inside fp4lab's upstream_op_cpu_kernel()"
            )
        return reference_fp4_quantize(x, global_scale)

    if "cpu" not in opdef._backend_fns:
        opdef.register_kernel("cpu")(cpu_kernel)
    _state["upstream_cpu_kernel"] = True
    try:
        yield op
    finally:
        _state["upstream_cpu_kernel"] = False
