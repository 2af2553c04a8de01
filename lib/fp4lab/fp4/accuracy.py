"""Quantization error of NVFP4, MXFP4 and per-tensor FP8 E4M3 on activation-like data (notebook 06).

Distributions: ``normal`` (standard normal), ``student_t`` (heavy tails, 3 degrees of
freedom) and ``outlier_channels`` (normal, with 1% of the K channels scaled by 50: the
per-channel outliers of LLM activations). Each format round-trips the same bfloat16 tensor;
metrics are over all elements in float64: MSE, SNR in dB (signal power over error power) and
the largest absolute error.
"""

from __future__ import annotations

import torch

from fp4lab.core import params
from fp4lab.fp4 import nvfp4

DISTRIBUTIONS = ("normal", "student_t", "outlier_channels")
FORMATS = ("nvfp4", "mxfp4", "fp8_e4m3_per_tensor")
KERNELS = {"nvfp4": "reference", "mxfp4": "reference", "fp8_e4m3_per_tensor": "torch_fp8_cast"}
"""What round-trips each format: fp4lab's reference, or torch's float8_e4m3fn cast."""
OUTLIER_FRACTION, OUTLIER_GAIN, STUDENT_T_DF = 0.01, 50.0, 3.0
CPU = torch.device("cpu")


def activations(
    distribution: str, m: int, k: int, *, seed: int = 0, dtype: torch.dtype = torch.bfloat16
) -> torch.Tensor:
    """A [m, k] activation-like tensor drawn from ``distribution`` (one of DISTRIBUTIONS)."""
    params.choice("distribution", distribution, DISTRIBUTIONS)
    g = torch.Generator().manual_seed(seed)
    if distribution == "student_t":
        normal = torch.randn(m, k, generator=g, dtype=torch.float64)
        chi2 = _chi2(m, k, g)
        x = normal / torch.sqrt(chi2 / STUDENT_T_DF)
    else:
        x = torch.randn(m, k, generator=g, dtype=torch.float64)
        if distribution == "outlier_channels":
            channels = torch.randperm(k, generator=g)[: max(1, int(k * OUTLIER_FRACTION))]
            x[:, channels] *= OUTLIER_GAIN
    return x.to(dtype)


def _chi2(m: int, k: int, g: torch.Generator) -> torch.Tensor:
    """Chi-squared samples with STUDENT_T_DF (an integer) degrees of freedom, from the generator."""
    return sum(
        torch.randn(m, k, generator=g, dtype=torch.float64) ** 2 for _ in range(int(STUDENT_T_DF))
    )


def fp8_per_tensor(x: torch.Tensor) -> torch.Tensor:
    """Per-tensor FP8 E4M3 round trip: scale 448/amax (1 for an all-zero tensor), round to
    nearest even, back to float32."""
    xf = x.float()
    amax = xf.abs().amax()
    scale = torch.where(amax > 0, nvfp4.E4M3_MAX / amax, torch.ones_like(amax))
    return (xf * scale).clamp(-nvfp4.E4M3_MAX, nvfp4.E4M3_MAX).to(
        torch.float8_e4m3fn
    ).float() / scale


def roundtrip(x: torch.Tensor, fmt: str) -> torch.Tensor:
    """x quantized to ``fmt`` (one of FORMATS; FP4 by the reference) and dequantized, float32."""
    params.choice("format", fmt, FORMATS)
    if fmt == "fp8_e4m3_per_tensor":
        return fp8_per_tensor(x)
    block_size = nvfp4.NVFP4_BLOCK if fmt == "nvfp4" else nvfp4.MXFP4_BLOCK
    codes, scales, gs = nvfp4.reference_quantize(x, block_size=block_size)
    return nvfp4.dequantize(codes, scales, gs, block_size=block_size)


def metrics(x: torch.Tensor, xhat: torch.Tensor) -> dict:
    """MSE, SNR in dB and the largest absolute error of xhat against x (float64)."""
    xd, err = x.double(), xhat.double() - x.double()
    mse = float(err.pow(2).mean())
    signal = float(xd.pow(2).mean())
    snr = float("inf") if mse == 0 else 10.0 * torch.log10(torch.tensor(signal / mse)).item()
    return {
        "mse": mse,
        "snr_db": snr,
        "max_abs_error": float(err.abs().max()),
        "signal_rms": signal**0.5,
    }


def error_rows(
    shapes: list[tuple[int, int]],
    distributions: list[str],
    *,
    seed: int = 0,
    device: torch.device = CPU,
) -> list[dict]:
    """One row per (shape, distribution, format) with the metrics."""
    rows = []
    for m, k in shapes:
        for distribution in distributions:
            x = activations(distribution, m, k, seed=seed).to(device)
            for fmt in FORMATS:
                rows.append(
                    {
                        "M": m,
                        "K": k,
                        "distribution": distribution,
                        "format": fmt,
                        "kernel": KERNELS[fmt],
                        **metrics(x, roundtrip(x, fmt)),
                    }
                )
    return rows
