"""The fix the story rejected: ``fp4lab::fp4_quantize``, a torch.library custom op with a fake.

Dynamo sees one opaque node with exact output shapes and dtypes, so fullgraph=True holds.
The op's kernel is FlashInfer's on an SM100+ GPU and fp4lab's NVFP4 reference elsewhere.
FlashInfer 0.6.12+ ships its own ``torch.ops.flashinfer.fp4_quantize`` (PR #3081), CUDA-only;
``upstream_op_cpu_kernel`` lends it the reference as CPU kernel for the length of a block.

``observing`` names the kernels that really ran inside a block (each quantize kernel fp4lab
calls reports itself, with the FP4 codes it produced), so a record says what ran, not what
should have.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import torch

from fp4lab.compile import target
from fp4lab.core import probe
from fp4lab.fp4 import kernels, nvfp4

OP_NAME = "fp4lab::fp4_quantize"
_state = {"upstream_cpu_kernel": False}

FLASHINFER = "flashinfer"
"""FlashInfer's FP4 kernel (the one name ``evidence.of_run`` counts as a real FP4 kernel)."""
REFERENCE_DIRECT = "fp4lab reference (called directly)"
REFERENCE_IN_OP = f"fp4lab reference (the kernel of {OP_NAME} off SM100+)"
REFERENCE_FOR_UPSTREAM = "fp4lab reference (CPU kernel registered for flashinfer::fp4_quantize)"
TRITON_DIRECT = "fp4lab Triton kernel (one fused launch, called directly)"
TRITON_IN_OP = f"fp4lab Triton kernel (one fused launch, the kernel of {OP_NAME} on pre-SM100 GPUs)"


@dataclasses.dataclass
class Observed:
    """What ran inside an ``observing`` block: calls per quantize kernel, the codes of each call."""

    calls: Counter = dataclasses.field(default_factory=Counter)
    codes: list[torch.Tensor] = dataclasses.field(default_factory=list)

    @property
    def kernel(self) -> str | None:
        """The kernel that ran (several joined by " + "), or None when none ran."""
        return " + ".join(sorted(self.calls)) or None


_observers: list[Observed] = []


def _ran(kernel: str, out: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    for seen in _observers:
        seen.calls[kernel] += 1
        seen.codes.append(out[0].detach().view(torch.uint8).cpu().clone())
    return out


@contextlib.contextmanager
def observing() -> Iterator[Observed]:
    """Collect, for the block, which quantize kernels ran and the codes each call produced."""
    seen = Observed()
    _observers.append(seen)
    try:
        yield seen
    finally:
        _observers.remove(seen)


def reporting(kernel: str, quantize: Callable) -> Callable:
    """``quantize`` reporting each call to ``observing`` blocks as ``kernel``."""

    def reported(x: torch.Tensor, global_scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return _ran(kernel, quantize(x, global_scale))

    return reported


def base_quantize(device: torch.device) -> Callable:
    """The quantize kernel itself, called directly (and reporting to ``observing``)."""
    return reporting(*direct_quantize(device))


QUANTIZE_VARIANTS = (
    "eager",
    "compiled_with_breaks",
    "compiled_fullgraph_custom_op",
    "full_cuda_graph",
)
"""The ways a layer calls the quantize: directly, behind ``torch.compiler.disable`` (the story's
msg 1002 patch: graph breaks), through the custom op (the fix, piecewise or in one full graph)."""


def quantize_for(variant: str, device: torch.device) -> Callable:
    """The quantize callable a variant's layers make."""
    if variant == "eager":
        return base_quantize(device)
    if variant == "compiled_with_breaks":
        return torch.compiler.disable(base_quantize(device))
    if variant in ("compiled_fullgraph_custom_op", "full_cuda_graph"):
        return lambda x, global_scale: torch.ops.fp4lab.fp4_quantize(x, global_scale)
    raise ValueError(
        f"variant={variant!r} is not allowed; allowed values: {', '.join(QUANTIZE_VARIANTS)}"
    )


def same_code(a: str | None, b: str | None) -> bool:
    """Whether two kernel names are one implementation: FlashInfer's, or fp4lab's reference
    however it was called."""
    family = {k: "reference" for k in (REFERENCE_DIRECT, REFERENCE_IN_OP, REFERENCE_FOR_UPSTREAM)}
    family |= {TRITON_DIRECT: "triton", TRITON_IN_OP: "triton", FLASHINFER: FLASHINFER}
    return a in family and b in family and family[a] == family[b]


def _flashinfer_layout(
    quantize: Callable, x: torch.Tensor, global_scale: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """One of fp4lab's quantize kernels (``kernels.quantize``'s contract, swizzled) in FlashInfer's
    output layout: codes [M, K/2], swizzled scales [M↑128, S↑4] uint8."""
    m, k = x.shape
    codes, scales, _ = quantize(x, global_scale if global_scale is not None else 1.0, swizzle=True)
    return codes, scales.view(torch.uint8).reshape(nvfp4.swizzled_shape(m, k // 16))


def reference_fp4_quantize(
    x: torch.Tensor, global_scale: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """fp4lab.fp4.nvfp4's reference quantize in FlashInfer's output layout."""
    return _flashinfer_layout(nvfp4.reference_quantize, x, global_scale)


def triton_fp4_quantize(
    x: torch.Tensor, global_scale: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``reference_fp4_quantize``'s contract in one fused Triton launch (bit-equal to it: notebook 06)."""
    return _flashinfer_layout(kernels.triton_quantize, x, global_scale)


def fused_capable(device: torch.device) -> bool:
    """Whether fp4lab's fused Triton kernel runs on ``device`` (a CUDA GPU with Triton)."""
    return device.type == "cuda" and kernels.triton_available() is None


def direct_quantize(device: torch.device) -> tuple[str, Callable]:
    """The quantize kernel a layer calls directly on ``device``, with its name: FlashInfer's on
    SM100+, fp4lab's fused Triton kernel on other CUDA GPUs (one launch, as FlashInfer's), the
    reference elsewhere."""
    if fp4_capable(device):
        return FLASHINFER, target.fp4_quantize
    if fused_capable(device):
        return TRITON_DIRECT, triton_fp4_quantize
    return REFERENCE_DIRECT, reference_fp4_quantize


def fp4_capable(device: torch.device) -> bool:
    """Whether FlashInfer's FP4 kernel runs on ``device`` (a real CUDA GPU of SM100 or newer)."""
    return device.type == "cuda" and torch.cuda.get_device_capability(device) >= probe.FP4_MIN_SM


@torch.library.custom_op(OP_NAME, mutates_args=())
def _fp4_quantize_op(
    x: torch.Tensor, global_scale: torch.Tensor | None, sf_vec_size: int = 16
) -> tuple[torch.Tensor, torch.Tensor]:
    """FlashInfer's kernel where the device runs it; fp4lab's fused Triton kernel on other CUDA
    GPUs; the nvfp4 reference elsewhere (CPU)."""
    if fp4_capable(x.device):
        return _ran(FLASHINFER, target.FLASHINFER_FP4_QUANTIZE(x, global_scale, sf_vec_size))
    if sf_vec_size != 16:
        raise ValueError(
            f"sf_vec_size={sf_vec_size} is not allowed for fp4lab's kernels; allowed values: 16"
        )
    if fused_capable(x.device):
        return _ran(TRITON_IN_OP, triton_fp4_quantize(x, global_scale))
    return _ran(REFERENCE_IN_OP, reference_fp4_quantize(x, global_scale))


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
        return _ran(REFERENCE_FOR_UPSTREAM, reference_fp4_quantize(x, global_scale))

    if "cpu" not in opdef._backend_fns:
        opdef.register_kernel("cpu")(cpu_kernel)
    _state["upstream_cpu_kernel"] = True
    try:
        yield op
    finally:
        _state["upstream_cpu_kernel"] = False
