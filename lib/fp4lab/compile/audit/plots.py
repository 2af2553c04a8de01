"""Notebook 12's heat map: FP4 entry points down, FlashInfer versions across, one panel per SM."""

from __future__ import annotations

from pathlib import Path

from packaging.version import Version

from fp4lab.compile.audit.run import VERDICTS
from fp4lab.core import evidence, figures, records

COLOURS = dict(
    zip(
        [*VERDICTS, "no input spec", "error", "absent"],
        ["#2ca02c", "#ff7f0e", "#d62728", "#9e9ac8", "#dddddd", "#8c564b", "#ffffff"],
        strict=True,
    )
)
"""A colour per verdict; "absent": the version has no such entry point."""


def plot_heatmap(rows: list[dict]) -> object:
    """Entry point x version, each cell coloured by the verdict on the target (CPU artefacts removed)."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    sms = sorted({r["sm"] for r in rows}, key=Version, reverse=True)
    versions = sorted({r["version"] for r in rows}, key=Version)
    names = sorted({r["entry_point"] for r in rows if r["status"] != "unknown entry point"})
    cell = {(r["sm"], r["version"], r["entry_point"]): r["verdict"] for r in rows}
    fig, axes = plt.subplots(
        1,
        len(sms),
        figsize=(0.9 * len(versions) * len(sms) + 4, 0.26 * len(names) + 2.2),
        squeeze=False,
        sharey=True,
    )
    for ax, sm in zip(axes[0], sms, strict=True):
        for x, version in enumerate(versions):
            for y, name in enumerate(names):
                colour = COLOURS.get(cell.get((sm, version, name), "absent"), "#cccccc")
                ax.add_patch(plt.Rectangle((x, y), 0.95, 0.9, color=colour, ec="0.85", lw=0.3))
        ax.set_xlim(0, len(versions))
        ax.set_ylim(len(names), 0)
        ax.set_xticks([x + 0.47 for x in range(len(versions))], versions, rotation=60, fontsize=7)
        ax.set_yticks([y + 0.45 for y in range(len(names))], names, fontsize=7)
        ax.tick_params(length=0)
        ax.set_title(f"SM{sm} (simulated)", fontsize=9)
    handles = [Patch(color=c, label=v) for v, c in COLOURS.items()]
    fig.legend(handles=handles, loc="lower center", ncol=len(handles), fontsize=7, frameon=False)
    fig.suptitle("FlashInfer FP4 entry points under torch.compile(fullgraph=True)", fontsize=10)
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    return fig


def save_heatmap(rows: list[dict], notebook: str) -> Path | None:
    """``plot_heatmap`` saved as figures/12_fp4_api_audit.png with the notebook's last provenance;
    None, said, when no entry point was audited (every version failed: see its record)."""
    if not rows:
        print("no figure: no entry point was audited in any version")
        return None
    return figures.save_figure(
        plot_heatmap(rows),
        "12_fp4_api_audit",
        records.latest(notebook)[-1]["provenance"],
        source=f"data/{notebook}.jsonl run {records.RUN_ID}",
        evidence=evidence.check(["trace", "simulated_target"]),  # every cell: a staged trace
    )
