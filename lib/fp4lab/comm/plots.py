"""Plots of the comm concern: allreduce sweeps and the overlap microbenchmark."""

from __future__ import annotations


def plot_allreduce(rows: list[dict], crossover: dict | None = None) -> object:
    """Allreduce latency (median, p10-p90 band) and bus bandwidth against message size, per backend and mode.

    A dashed line marks ``crossover["crossover_bytes"]`` when given: where the candidate stops being faster.
    """
    import matplotlib.pyplot as plt

    fig, (lat, bw) = plt.subplots(1, 2, figsize=(10, 3.8))
    measured = [r for r in rows if r["status"] == "ok"]
    for key in sorted({(r["backend"], r["mode"]) for r in measured}):
        series = sorted(
            (r for r in measured if (r["backend"], r["mode"]) == key), key=lambda r: r["bytes"]
        )
        x = [r["bytes"] for r in series]
        label = f"{key[0]} {key[1]} ({series[0]['world_size']} ranks)"
        line = lat.plot(x, [r["median_us"] for r in series], marker="o", ms=3, label=label)[0]
        lat.fill_between(
            x,
            [r["p10_us"] for r in series],
            [r["p90_us"] for r in series],
            color=line.get_color(),
            alpha=0.15,
        )
        bw.plot(
            x,
            [r["busbw_GBps"] for r in series],
            marker="o",
            ms=3,
            color=line.get_color(),
            label=label,
        )
    for ax, ylabel in ((lat, "latency, µs (median; band p10-p90)"), (bw, "bus bandwidth, GB/s")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("message size, bytes")
        ax.set_ylabel(ylabel)
        ax.grid(True, which="both", alpha=0.3)
        if crossover and crossover.get("crossover_bytes"):
            ax.axvline(crossover["crossover_bytes"], color="k", ls="--", lw=1)
    if crossover and crossover.get("crossover_bytes"):
        lat.annotate(
            f"crossover ({crossover['mode']}): {crossover['summary']}",
            (crossover["crossover_bytes"], lat.get_ylim()[1]),
            fontsize=7,
            ha="right",
            va="top",
            rotation=90,
            xytext=(-3, -3),
            textcoords="offset points",
        )
    lat.legend(fontsize=7)
    lat.set_title("allreduce latency", fontsize=10)
    bw.set_title("busbw = algbw · 2(n−1)/n (nccl-tests)", fontsize=10)
    fig.tight_layout()
    return fig


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
