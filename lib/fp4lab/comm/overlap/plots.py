"""The overlap microbenchmark figure: compute, combine, overlapped and sequential per chunk count."""

from __future__ import annotations


def plot_overlap(rows: list[dict]) -> object:
    """Per chunk count: compute alone, combine alone, the overlapped pipeline and the unchunked sequential baseline."""
    import matplotlib.pyplot as plt

    parts = (
        ("t_compute_ms", "GEMM chunks alone", "0.7"),
        ("t_comm_ms", "combines alone", "0.45"),
        ("t_overlapped_ms", "overlapped", "tab:green"),
        ("t_sequential_ms", "sequential (no chunks)", "tab:red"),
    )
    fig, ax = plt.subplots(figsize=(7.5, 3.6))
    width = 0.8 / len(parts)
    ordered = sorted(rows, key=lambda r: r["chunks"])
    for i, (key, label, color) in enumerate(parts):
        xs = [k + (i - 1.5) * width for k in range(len(ordered))]
        ax.bar(xs, [r[key] for r in ordered], width, label=label, color=color)
    for k, r in enumerate(ordered):
        top = max(r[key] for key, _, _ in parts)
        ax.annotate(
            f"eff {r['efficiency']:.2f}",
            (k, top),
            ha="center",
            va="bottom",
            fontsize=8,
            xytext=(0, 3),
            textcoords="offset points",
        )
    ax.set_xticks(
        range(len(ordered)),
        [f"{r['chunks']} chunk{'s' if r['chunks'] > 1 else ''}" for r in ordered],
    )
    ax.set_ylabel("ms per batch (median of slowest rank)")
    first = ordered[0]
    ax.set_title(
        f"MoE down GEMM + {first['collective']} combine, hidden {first['hidden']}, "
        f"{first['world_size']} ranks ({first['backend']})",
        fontsize=10,
    )
    ax.legend(fontsize=7, ncol=2)
    ax.margins(y=0.2)
    fig.tight_layout()
    return fig
