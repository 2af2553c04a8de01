"""Inside one SGLang environment: SGLang's Python functions whose body is one Triton kernel launch,
each stood in for by an op of ``fp4lab_triton``.

On a GPU dynamo takes such a launch as one node (its Triton wrapper); on a CPU build it cannot,
and would trace into Triton's launcher. So each is one opaque node while traced and its CPU
kernel, by the Triton kernel's definition, when run.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from fp4lab.serving.replay.release import cpu_kernels
from fp4lab.serving.replay.release.reached import counted


def rms_sumsq(x1: torch.Tensor, x2: torch.Tensor) -> torch.Tensor:
    """MiniMax-M2's QK-norm first pass (``rms_sumsq_serial``): each row's float32 sum of squares
    of ``x1`` at its row, of ``x2`` at its row plus B, in a buffer padded to a multiple of 4."""
    rows = x1.shape[0]
    sums = torch.zeros((2 * rows + 3) // 4 * 4, dtype=torch.float32, device=x1.device)
    sums[:rows] = x1.float().square().sum(-1)
    sums[rows : 2 * rows] = x2.float().square().sum(-1)
    return sums


def rms_sumsq_fake(x1: torch.Tensor, x2: torch.Tensor) -> torch.Tensor:
    return x1.new_empty((2 * x1.shape[0] + 3) // 4 * 4, dtype=torch.float32)


def rms_apply(x1, x2, w1, w2, sum_sq, tp_world: int = 1, eps: float = 1e-5):
    """Its second pass (``rms_apply_serial``): each row times the reciprocal root of its mean
    square over every rank's width, and the weight, in float32, cast back."""
    rows = x1.shape[0]
    outs = []
    for x, w, sums in ((x1, w1, sum_sq[:rows]), (x2, w2, sum_sq[rows : 2 * rows])):
        scale = torch.rsqrt(sums / x.shape[1] / tp_world + eps).unsqueeze(-1)
        outs.append((x.float() * scale * w.float()).to(x.dtype))
    return tuple(outs)


def rms_apply_fake(x1, x2, w1, w2, sum_sq, tp_world: int = 1, eps: float = 1e-5):
    return torch.empty_like(x1), torch.empty_like(x2)


def pack_topk_ids(topk_ids: torch.Tensor, topk_weights: torch.Tensor, out: torch.Tensor) -> None:
    """SGLang's Triton packing of the routed MoE's top-k (``PackTopkIds``): each expert id in the
    high 16 bits, its weight's bfloat16 bits in the low 16, one int32 per entry."""
    bits = topk_weights.to(torch.bfloat16).view(torch.int16).to(torch.int32) & 0xFFFF
    out.copy_((topk_ids.to(torch.int32) << 16) | bits)


LAUNCHES = {
    "act_quant": ("act_quant(Tensor x, int block_size=128, str? scale_fmt=None) -> (Tensor, Tensor)",
                  cpu_kernels.act_quant, cpu_kernels.act_quant_fake),
    "rms_sumsq_serial": ("rms_sumsq_serial(Tensor x1, Tensor x2) -> Tensor", rms_sumsq,
                         rms_sumsq_fake),
    "rms_apply_serial": ("rms_apply_serial(Tensor x1, Tensor x2, Tensor w1, Tensor w2, Tensor "
                         "sum_sq, int tp_world=1, float eps=1e-05) -> (Tensor, Tensor)",
                         rms_apply, rms_apply_fake),
    "pack_topk_ids": ("pack_topk_ids(Tensor topk_ids, Tensor topk_weights, Tensor(a!) out) -> ()",
                      pack_topk_ids, lambda topk_ids, topk_weights, out: None),
}  # fmt: skip
"""Each launching function stood in for: the op's schema, CPU kernel, fake."""

LIBRARY: list[torch.library.Library] = []


def op(name: str) -> Callable:
    """The ``fp4lab_triton`` op for the launching function ``name`` (defined on first use)."""
    if not LIBRARY:
        LIBRARY.append(torch.library.Library("fp4lab_triton", "FRAGMENT"))
    if not hasattr(torch.ops.fp4lab_triton, name):
        schema, kernel, fake = LAUNCHES[name]
        LIBRARY[0].define(schema)
        LIBRARY[0].impl(name, counted(f"fp4lab_triton::{name}", kernel), "CPU")
        LIBRARY[0]._register_fake(name, fake)
    return getattr(torch.ops.fp4lab_triton, name)


def act_quant_launch(x, block_size=128, scale_fmt=None):
    return op("act_quant")(x, block_size, scale_fmt)


def rms_sumsq_launch(x1, x2):
    return op("rms_sumsq_serial")(x1, x2)


def rms_apply_launch(x1, x2, w1, w2, sum_sq, tp_world=1, eps=1e-5):
    return op("rms_apply_serial")(x1, x2, w1, w2, sum_sq, tp_world, eps)


def pack_topk_ids_launch(grid, topk_ids, topk_weights, out, numel, **constants) -> None:
    """``_pack_topk_ids_triton_kernel[grid](...)`` as one op writing ``out``."""
    op("pack_topk_ids")(topk_ids, topk_weights, out)
