"""Notebook 12's heat map: one row per FP4 entry point and registered op, grouped by the package
it is exported from; FlashInfer versions across; one panel per SM; the legend above the panels
(the provenance footer stays alone at the bottom)."""

from __future__ import annotations

from pathlib import Path

from packaging.version import Version

from fp4lab.compile.audit.run import VERDICTS
from fp4lab.core import evidence, figures, records

COLOURS = dict(
    zip(
        [*VERDICTS, "no input spec", "error", "absent"],
        ["#2ca02c", "#ff7f0e", "#d62728", "#9e9ac8", "#6baed6", "#dddddd", "#f2f2f2", "#8c564b",
         "#ffffff"],
        strict=True,
    )
)  # fmt: skip
"""A colour per verdict; "absent": the version has no such entry point."""
ROW_INCH = 0.2


def rows_by_group(rows: list[dict]) -> list[tuple[str, list[str]]]:
    """(group, entry point names) in the heat map's order: the top-level package first, then
    the subpackages, the registered ops last; names sorted within a group."""
    groups: dict[str, set[str]] = {}
    for r in rows:
        if r["status"] != "unknown entry point":
            groups.setdefault(r.get("group") or "flashinfer", set()).add(r["entry_point"])

    def order(group: str) -> tuple[int, str]:
        return (2 if group.startswith("torch.ops") else 0 if group == "flashinfer" else 1, group)

    return [(g, sorted(groups[g])) for g in sorted(groups, key=order)]


def plot_heatmap(rows: list[dict]) -> object:
    """Entry point x version, each cell coloured by its verdict on the simulated target."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    sms = sorted({r["sm"] for r in rows}, key=Version, reverse=True)
    versions = sorted({r["version"] for r in rows}, key=Version)
    grouped = rows_by_group(rows)
    labels, separators = [], []
    for group, names in grouped:
        separators.append((len(labels), group))
        labels += names
    cell = {(r["sm"], r["version"], r["entry_point"]): r["verdict"] for r in rows}
    height = ROW_INCH * len(labels) + 2.4
    fig, axes = plt.subplots(1, len(sms), figsize=(0.7 * len(versions) * len(sms) + 6, height),
                             squeeze=False, sharey=True)  # fmt: skip
    for ax, sm in zip(axes[0], sms, strict=True):
        for x, version in enumerate(versions):
            for y, name in enumerate(labels):
                colour = COLOURS.get(cell.get((sm, version, name), "absent"), "#cccccc")
                ax.add_patch(plt.Rectangle((x, y), 0.95, 0.9, color=colour, ec="0.85", lw=0.3))
        for y, group in separators:
            ax.axhline(y - 0.05, color="0.3", lw=0.6)
            if ax is axes[0][-1]:
                ax.text(len(versions) + 0.1, y + 0.5, group, fontsize=6, va="top", color="0.3")
        ax.set_xlim(0, len(versions))
        ax.set_ylim(len(labels), 0)
        ax.set_xticks([x + 0.47 for x in range(len(versions))], versions, rotation=60, fontsize=7)
        ax.xaxis.tick_top()
        ax.set_yticks([y + 0.45 for y in range(len(labels))], labels, fontsize=6)
        ax.tick_params(length=0)
        ax.set_title(f"SM{sm} (simulated)", fontsize=9, pad=28)
    handles = [Patch(color=c, label=v) for v, c in COLOURS.items()]
    top = 1 - 0.55 / height
    fig.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, top), ncol=5,
               fontsize=7, frameon=False)  # fmt: skip
    fig.suptitle("FlashInfer FP4 entry points and ops under torch.compile(fullgraph=True), "
                 "eager first", fontsize=10, y=1 - 0.1 / height)  # fmt: skip
    fig.tight_layout(rect=(0, 0, 0.93, 1 - 1.3 / height))
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
        evidence=evidence.check(["trace", "simulated_target"]),  # every cell: a simulated call
    )
