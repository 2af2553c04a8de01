"""The allreduce sweep figure: latency and bus bandwidth by message size."""

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
