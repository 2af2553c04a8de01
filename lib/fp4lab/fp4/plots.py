"""Plots of the FP4 concern: error by format, the 128x4 swizzle, quantize throughput."""

from __future__ import annotations

import pandas as pd


def plot_fp4_errors(rows: list[dict]) -> object:
    """SNR (dB), MSE and largest absolute error per distribution, one bar per format (from fp4_error rows)."""
    import matplotlib.pyplot as plt

    frame = pd.DataFrame(rows)
    distributions = list(dict.fromkeys(frame["distribution"]))
    formats = list(dict.fromkeys(frame["format"]))
    panels = (
        ("snr_db", "SNR (dB, higher is better)", False),
        ("mse", "MSE", True),
        ("max_abs_error", "largest |error|", True),
    )
    fig, axes = plt.subplots(1, len(panels), figsize=(11, 3.4))
    width = 0.8 / len(formats)
    for ax, (key, label, log) in zip(axes, panels, strict=True):
        for i, fmt in enumerate(formats):
            values = [
                frame[(frame["distribution"] == d) & (frame["format"] == fmt)][key].mean()
                for d in distributions
            ]
            ax.bar(
                [j + (i - (len(formats) - 1) / 2) * width for j in range(len(distributions))],
                values,
                width,
                label=fmt,
            )
        ax.set_xticks(range(len(distributions)), distributions, fontsize=8)
        ax.set_title(label, fontsize=9)
        if log:
            ax.set_yscale("log")
    axes[0].legend(fontsize=7)
    shapes = sorted({(r["M"], r["K"]) for r in rows})
    fig.suptitle(
        "Round-trip error of bfloat16 activations, " + ", ".join(f"{m}x{k}" for m, k in shapes),
        fontsize=10,
    )
    fig.tight_layout()
    return fig


def plot_swizzle_128x4(rows: int = 256, scale_cols: int = 8) -> object:
    """The 128x4 swizzled scale layout: each scale (m, k) of a [rows, scale_cols] grid labelled with its byte offset."""
    import matplotlib.pyplot as plt
    import numpy as np

    from fp4lab.fp4 import swizzle

    m, k = np.meshgrid(np.arange(rows), np.arange(scale_cols), indexing="ij")
    offset = swizzle.swizzled_offset(m, k, scale_cols)
    fig, ax = plt.subplots(figsize=(4 + scale_cols * 0.4, 7))
    ax.imshow(offset // 512, aspect="auto", cmap="tab20", interpolation="nearest")
    for r in range(0, rows, 8):
        for c in range(scale_cols):
            ax.text(c, r, str(int(offset[r, c])), ha="center", va="center", fontsize=5)
    for r in range(32, rows, 32):
        ax.axhline(r - 0.5, color="white", lw=0.6)
    for r in range(128, rows, 128):
        ax.axhline(r - 0.5, color="black", lw=1.5)
    for c in range(4, scale_cols, 4):
        ax.axvline(c - 0.5, color="black", lw=1.5)
    ax.set_xlabel("scale column k (one per 16 or 32 elements of K)")
    ax.set_ylabel("row m")
    ax.set_title(
        "128x4 swizzle: colour = 512-byte tile, label = byte offset (every 8th row)\n"
        "offset = tile*512 + (m%32)*16 + ((m%128)//32)*4 + k%4",
        fontsize=8,
    )
    fig.tight_layout()
    return fig


def plot_quantize_throughput(rows: list[dict]) -> object:
    """Quantize GB/s per kernel and shape against the copy line measured in the same run (nvfp4_bench rows)."""
    import matplotlib.pyplot as plt

    frame = pd.DataFrame(rows)
    frame["shape"] = (
        frame["M"].astype(str)
        + "x"
        + frame["K"].astype(str)
        + " bs"
        + frame["block_size"].astype(str)
    )
    shapes = list(dict.fromkeys(frame["shape"]))
    fig, ax = plt.subplots(figsize=(7.5, 3.6))
    for kernel, group in frame.groupby("kernel", sort=False):
        ax.plot([shapes.index(s) for s in group["shape"]], group["gbps"], marker="o", label=kernel)
    copy = frame.drop_duplicates("shape")
    ax.plot(
        [shapes.index(s) for s in copy["shape"]],
        copy["copy_gbps"],
        "k--",
        label="copy (same bytes)",
    )
    ax.set_xticks(range(len(shapes)), shapes, fontsize=8)
    ax.set_yscale("log")
    ax.set_ylabel("GB/s of input")
    ax.set_title(
        f"FP4 quantize vs memory copy on {frame['device'].iloc[0]} ({frame['dtype'].iloc[0]} input)",
        fontsize=10,
    )
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig
