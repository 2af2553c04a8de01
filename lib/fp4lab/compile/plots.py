"""Plots of the compile concern: the fullgraph trade-off and the FlashInfer version matrix."""

from __future__ import annotations

from pathlib import Path

from fp4lab.compile.matrix.result import VersionResult
from fp4lab.core import evidence, figures, records


def plot_tradeoff(rows: list[dict]) -> object:
    """With GPU timings: ms per step against token count, one line per variant. Without: the
    piece structure of each compiled variant at the largest token count (per step: dynamo graph
    runs, piece runs, eager islands, piece runs that met other weights than at their capture)."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 3.6))
    first = rows[0]
    if any(r.get("ms_median") for r in rows):
        for variant in dict.fromkeys(r["variant"] for r in rows):
            mine = sorted((r for r in rows if r["variant"] == variant), key=lambda r: r["tokens"])
            ax.errorbar(
                [r["tokens"] for r in mine], [r["ms_median"] for r in mine],
                yerr=[[r["ms_median"] - r["ms_p10"] for r in mine], [r["ms_p90"] - r["ms_median"] for r in mine]],
                label=mine[0]["label"], marker="o", capsize=3,
            )  # fmt: skip
        ax.set_xscale("log", base=2)
        ax.set_xlabel("tokens per step (SGLang's prefill capture sizes)")
        ax.set_ylabel("ms per step (median, p10-p90)")
        ax.legend(fontsize=7)
    else:
        largest = max(r["tokens"] for r in rows)
        compiled = [r for r in rows if r["tokens"] == largest and r["capture_mode"] == "piecewise"]
        measures = (
            ("graph_runs_per_step", "dynamo graph runs"), ("piece_runs_per_step", "piece runs"),
            ("eager_islands_per_step", "eager islands"), ("moved_weights", "weights moved since capture"),
        )  # fmt: skip
        width = 0.8 / len(compiled)
        for i, r in enumerate(compiled):
            positions = [j + i * width for j in range(len(measures))]
            bars = ax.bar(positions, [r[key] for key, _ in measures], width, label=r["label"])
            ax.bar_label(bars, fontsize=7)
        ax.set_xticks([j + width * (len(compiled) - 1) / 2 for j in range(len(measures))])
        ax.set_xticklabels([label for _, label in measures], fontsize=8)
        ax.set_ylabel(f"per step, {largest} tokens")
        ax.legend(fontsize=7)
        ax.margins(y=0.2)
    ax.set_title(f"{first['layers']} FP4 layers; quantize kernel: {first['kernel']}", fontsize=9)
    fig.tight_layout()
    return fig


def save_tradeoff_figure(rows: list[dict], notebook: str) -> Path:
    """``plot_tradeoff`` saved as figures/04_fullgraph_tradeoff.png with this run's provenance."""
    return figures.save_figure(
        plot_tradeoff(rows),
        "04_fullgraph_tradeoff",
        records.provenance(),
        source=f"data/{notebook}.jsonl run {records.RUN_ID}",
        evidence=evidence.of_values(rows),
    )


def save_version_matrix_figure(results: list[VersionResult], notebook: str) -> Path:
    """``plot_version_matrix`` saved as figures/09_version_matrix.png, with the provenance of the
    notebook's last record."""
    return figures.save_figure(
        plot_version_matrix([r.as_record() for r in results]),
        "09_version_matrix",
        records.latest(notebook)[-1]["provenance"],
        source=f"data/{notebook}.jsonl run {records.RUN_ID}",
        evidence=evidence.of_values([r.as_record() for r in results]),
    )


def plot_version_matrix(rows: list[dict]) -> object:
    """Versions down, blocker-chain steps across, each cell named by the blocker met; the op column last."""
    import matplotlib.pyplot as plt

    signatures = [
        "device_check",
        "subprocess",
        "non_tensor_torch_op",
        "unsupported_other",
        "file_io",
        "ok",
        "runtime_error",
    ]
    colours = dict(
        zip(
            signatures,
            ["#bbbbbb", "#d62728", "#9467bd", "#8c564b", "#ff7f0e", "#2ca02c", "#e377c2"],
            strict=True,
        )
    )
    steps = max((len(r["chain"]) for r in rows), default=1)
    fig, ax = plt.subplots(figsize=(1.9 * (steps + 1) + 1.5, 0.55 * len(rows) + 1.2))
    for y, r in enumerate(rows):
        for x, c in enumerate(r["chain"]):
            ax.add_patch(
                plt.Rectangle((x, y), 0.95, 0.9, color=colours.get(c["signature"], "#cccccc"))
            )
            ax.text(
                x + 0.47,
                y + 0.45,
                c["signature"].replace("_", " "),
                ha="center",
                va="center",
                fontsize=7,
            )
        compiles = r["upstream_op"].get("present") and r["upstream_op"].get("signature") == "ok"
        wrong = compiles and r.get("upstream_op_forwarding") == "present"
        colour = "#f2c94c" if wrong else "#2ca02c" if compiles else "#eeeeee"
        label = (
            "1 graph, wrong args"
            if wrong
            else "upstream op: 1 graph"
            if compiles
            else ("absent" if r["env"] != "failed" else "not measured")
        )
        ax.add_patch(plt.Rectangle((steps, y), 0.95, 0.9, color=colour))
        ax.text(steps + 0.47, y + 0.45, label, ha="center", va="center", fontsize=7)
    ax.set_xlim(0, steps + 1)
    ax.set_ylim(len(rows), 0)
    ax.set_yticks([y + 0.45 for y in range(len(rows))], [r["version"] for r in rows])
    ax.set_xticks(
        [x + 0.47 for x in range(steps + 1)], [f"step {x}" for x in range(steps)] + ["fix shipped?"]
    )
    ax.tick_params(length=0)
    for side in ax.spines.values():
        side.set_visible(False)
    ax.set_title(
        "public flashinfer.fp4_quantize under fullgraph=True: blocker met at each step", fontsize=10
    )
    fig.tight_layout()
    return fig
