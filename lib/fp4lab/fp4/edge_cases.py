"""Inputs that probe the quantize edge cases: zeros, signed zeros, rounding ties, underflow,
huge values, infinities and NaN."""

from __future__ import annotations

import torch

from fp4lab.fp4 import accuracy


def adversarial_input(
    rows_per_case: int = 2, k: int = 64, *, dtype: torch.dtype = torch.bfloat16, seed: int = 0
) -> torch.Tensor:
    """Rows that probe the edge cases: zeros, -0, E2M1 ties, SF ties, underflow, huge values, inf, NaN.

    With gs = 448*6/amax of the whole tensor the scales are not powers of two; the tie rows are
    exact only at gs = 1 (see tie_input). K must be a multiple of 32.
    """
    if k % 32:
        raise ValueError(f"k={k} must be a multiple of 32")
    g = torch.Generator().manual_seed(seed)

    def base() -> torch.Tensor:
        return torch.randn(rows_per_case, k, generator=g)

    ties = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0]).repeat(k // 8)
    cases = [
        torch.zeros(rows_per_case, k),
        -torch.zeros(rows_per_case, k),
        base() * 1e-30,  # SF underflows to 0 at moderate gs
        base() * 1e30,
        ties * torch.where(torch.rand(rows_per_case, k, generator=g) < 0.5, -1.0, 1.0),
        base(),
    ]
    with_inf = base()
    with_inf[:, 3] = float("inf")
    with_inf[:, 40] = -float("inf")
    with_nan = base()
    with_nan[:, 5] = float("nan")
    with_nan[:, 1::2][:, :8] = float("nan")  # every odd position of the first 16-block
    cases += [with_inf, with_nan]
    return torch.cat(cases).to(dtype)


def tie_input(k: int = 64, *, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """Blocks whose amax is 6 * 2**j, filled with E2M1 ties and their neighbours: at gs = 1 the SF is
    exactly 2**j and every element scales exactly onto a rounding boundary."""
    boundaries = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
    rows = []
    for j in range(-6, 7):
        row = torch.cat([boundaries, -boundaries, torch.tensor([6.0, 0.0])]) * 2.0**j
        rows.append(row.repeat(k // 16))
    return torch.stack(rows).to(dtype)


def kernel_check_input(seed: int = 0) -> torch.Tensor:
    """The GPU kernel checks' input: the adversarial rows (K = 64) above 256 normal bfloat16 rows."""
    return torch.cat([adversarial_input(k=64), accuracy.activations("normal", 256, 64, seed=seed)])
