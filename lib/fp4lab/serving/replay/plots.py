"""Notebook 11's figures: SGLang release down, simulated SM across, each cell what
compiling the release's own GLM-5 through its piecewise runner gave, the blockers met, the patch
that removes them and the MoE's path; each row labelled with the option a GLM-5 user passes.
Notebook 14's: one model x release grid per SM (``plot_matrix``). Their tables: ``tables``."""

from __future__ import annotations

import textwrap
from pathlib import Path

from fp4lab.core import figures, glm5, records
from fp4lab.serving.replay import decide, timeline, versions
from fp4lab.serving.replay.shared import breakable_outcome, flags
from fp4lab.serving.replay.tables import patch_text

COLOURS = dict(
    zip(
        decide.OUTCOMES,
        ("#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#9edae5", "#eeeeee"),
        strict=True,
    )
)
"""blocked, compiles, wrong output, kernel unavailable, not applicable, not measured."""


def cell_text(row: dict) -> str:
    """What a cell of the figure says: its state (``timeline.state``) and, where a patch was
    tried, what it gave; two short lines at most."""
    said = textwrap.shorten(timeline.state(row), 58, placeholder="...")
    return said + (f"\npatch {patch_text(row)}" if row["patch"] else "")


def plot_decision(rows: list[dict]) -> object:
    """Releases down (release order), SMs across; each cell coloured by outcome and naming its
    blocker, flag or reason; each row labelled with the option a GLM-5 user passes."""
    import matplotlib.pyplot as plt

    version_list = sorted(dict.fromkeys(r["sglang_version"] for r in rows), key=versions.order)
    sm_list = sorted({r["sm"] for r in rows}, key=lambda s: float(s))
    fig, ax = plt.subplots(figsize=(3.9 * len(sm_list) + 3.2, 0.5 * len(version_list) + 1.6))
    for r in rows:
        x, y = sm_list.index(r["sm"]), version_list.index(r["sglang_version"])
        ax.add_patch(plt.Rectangle((x, y), 0.98, 0.92, color=COLOURS.get(r["outcome"], "#cccccc")))
        ax.text(x + 0.49, y + 0.46, cell_text(r), ha="center", va="center", fontsize=6)
    flags = {r["sglang_version"]: textwrap.shorten(r["flag"], 44, placeholder="...") for r in rows}
    ax.set_xlim(0, len(sm_list))
    ax.set_ylim(len(version_list), 0)
    ax.set_xticks([i + 0.49 for i in range(len(sm_list))], [f"SM{s}" for s in sm_list])
    ax.set_yticks([i + 0.46 for i in range(len(version_list))],
                  [f"{v}  ({flags[v]})" for v in version_list], fontsize=6.5)  # fmt: skip
    ax.legend(handles=[plt.Rectangle((0, 0), 1, 1, color=c, label=o) for o, c in COLOURS.items()],
              loc="upper center", bbox_to_anchor=(0.5, -0.02), ncol=4, fontsize=7, frameon=False)  # fmt: skip
    ax.set_title(f"SGLang's own {glm5.ARCHITECTURE} through each release's piecewise runner "
                 "(fullgraph=True)", fontsize=9)  # fmt: skip
    fig.tight_layout()
    return fig


def save_decision_figure(rows: list[dict], notebook: str) -> Path:
    """``plot_decision`` saved as figures/11_sglang_piecewise_replay.png with the provenance of
    the notebook's last record."""
    return figures.save_figure(
        plot_decision(rows),
        "11_sglang_piecewise_replay",
        records.latest(notebook)[-1]["provenance"],
        source=f"data/{notebook}.jsonl run {records.RUN_ID}",
        evidence=breakable_outcome.evidence_of(rows),
    )


GRAPH_SHORT = {"tc_piecewise": "tc", "breakable": "brk", "full": "full", "disabled": "off"}
"""The default prefill graph as a cell of the grid says it."""

MARKS = {"compiles": "ok", "wrong output": "W", "kernel unavailable": "K", "not applicable": "-",
         "not measured": "?"}  # fmt: skip
"""What a grid cell of each outcome but "blocked" says (a blocked cell names its blocker)."""


CAPTURED_AS = {"works": "compiles"}
"""A captured graph's outcome as the colours and marks name it (works: the compiles colour)."""


def lane_graphs(rows: list[dict]) -> tuple[str, ...]:
    """The lanes per SM or model: tc_piecewise, then each captured graph (``flags.CAPTURED``)
    that some release has (a row with an outcome of its own)."""
    return ("tc_piecewise", *(g for g in flags.CAPTURED
                              if any(r.get(g) not in (None, "not applicable") for r in rows)))  # fmt: skip


def draw_captured(ax: object, row: dict, graph: str, x: int, y: int, fontsize: float) -> None:
    """A captured graph's lane cell at (x, y): its outcome's colour and mark ("b" where
    blocked)."""
    import matplotlib.pyplot as plt

    said = CAPTURED_AS.get(row.get(graph) or "", row.get(graph) or "not measured")
    ax.add_patch(plt.Rectangle((x, y), 0.94, 0.9, color=COLOURS.get(said, "#cccccc")))
    mark = "b" if said == "blocked" else MARKS.get(said, "?")
    ax.text(x + 0.47, y + 0.45, mark, ha="center", va="center", fontsize=fontsize, weight="bold")


def blocker_codes(rows: list[dict]) -> dict[str, str]:
    """Each first blocker of the blocked cells, in release order, with a letter."""
    found = sorted((r for r in rows if r["outcome"] == "blocked"),
                   key=lambda r: versions.order(r["sglang_version"]))  # fmt: skip
    firsts = dict.fromkeys(timeline.state(r).removeprefix("blocked at ") for r in found)
    return {name: chr(ord("A") + i) for i, name in enumerate(firsts)}


LANE_INCHES, TITLE_INCHES, BELOW_INCHES = 0.45, 0.6, 1.7
"""The grid's height: per lane, the title above, the release names and the legend below."""
OUTCOME_LABEL = {"compiles": "compiles (tc), works (brk, full)"}
"""An outcome as the grid's legend names it where its colour stands for more than one."""


def plot_grid(rows: list[dict], model: str = "GLM-5") -> object:
    """The answer at a glance: SMs down, releases across (release order); per SM a lane coloured
    by the tc_piecewise outcome, a blocked cell lettered by its first blocker (the legend names
    each), and under it the prefill graph the release gives with no flag; under it a lane per
    captured graph some release has (``lane_graphs``) with its outcome."""
    import matplotlib.pyplot as plt

    version_list = sorted(dict.fromkeys(r["sglang_version"] for r in rows), key=versions.order)
    sm_list = sorted({r["sm"] for r in rows}, key=lambda s: float(s))
    graphs = lane_graphs(rows)
    lanes = [(sm, graph) for sm in sm_list for graph in graphs]
    codes = blocker_codes(rows)
    height = LANE_INCHES * len(lanes) + TITLE_INCHES + BELOW_INCHES
    fig, ax = plt.subplots(figsize=(0.55 * len(version_list) + 1.4, height))
    for r in rows:
        x, y = version_list.index(r["sglang_version"]), lanes.index((r["sm"], "tc_piecewise"))
        ax.add_patch(plt.Rectangle((x, y), 0.94, 0.9, color=COLOURS.get(r["outcome"], "#cccccc")))
        mark = (codes[timeline.state(r).removeprefix("blocked at ")] if r["outcome"] == "blocked"
                else MARKS.get(r["outcome"], "?"))  # fmt: skip
        ax.text(x + 0.47, y + 0.34, mark, ha="center", va="center", fontsize=8, weight="bold")
        given = GRAPH_SHORT.get(r.get("default_prefill") or "", "")
        ax.text(x + 0.47, y + 0.72, given, ha="center", va="center", fontsize=5.5)
        for i, graph in enumerate(graphs[1:], 1):
            draw_captured(ax, r, graph, x, y + i, 8)
    ax.set_xlim(0, len(version_list))
    ax.set_ylim(len(lanes), 0)
    ax.set_xticks([i + 0.47 for i in range(len(version_list))], version_list, rotation=90,
                  fontsize=7)  # fmt: skip
    ax.set_yticks([i + 0.45 for i in range(len(lanes))],
                  [f"SM{sm} {GRAPH_SHORT[graph]}" for sm, graph in lanes], fontsize=8)  # fmt: skip
    ax.tick_params(length=0)
    for side in ax.spines.values():
        side.set_visible(False)
    outcomes = [plt.Rectangle((0, 0), 1, 1, color=c, label=OUTCOME_LABEL.get(o, o))
                for o, c in COLOURS.items()]  # fmt: skip
    letters = [plt.Rectangle((0, 0), 1, 1, color="white", label=f"{c}: {name}")
               for name, c in codes.items()]  # fmt: skip
    fig.legend(handles=outcomes + letters, loc="lower left", bbox_to_anchor=(0.02, 0.0),
               ncol=2, fontsize=6.5, frameon=False)  # fmt: skip
    ax.set_title(f"{model} through tc_piecewise (tc: traced), breakable and full (brk, full: "
                 "capture simulated, b: blocked) prefill graphs, per release and SM (CPU replay); "
                 "small text: the "
                 "prefill graph the release gives with no flag "
                 f"({', '.join(f'{v} = {k}' for k, v in GRAPH_SHORT.items())})", fontsize=7.5,
                 wrap=True)  # fmt: skip
    fig.subplots_adjust(left=0.1, right=0.99, top=1 - TITLE_INCHES / height,
                        bottom=BELOW_INCHES / height)  # fmt: skip
    return fig


GRID = "11_sglang_grid"
"""The per-SM grid's figure name (the decision report's first screen shows it)."""


def save_grid_figure(rows: list[dict], notebook: str) -> Path:
    """``plot_grid`` saved as figures/11_sglang_grid.png with the notebook's provenance."""
    return figures.save_figure(plot_grid(rows), GRID, records.latest(notebook)[-1]["provenance"],
                               source=f"data/{notebook}.jsonl run {records.RUN_ID}",
                               evidence=breakable_outcome.evidence_of(rows))  # fmt: skip


def plot_matrix(rows: list[dict]) -> object:
    """One panel per SM: models down (a tc_piecewise lane each and a lane per captured graph some
    release has, ``lane_graphs``), releases across (release order), each cell coloured by
    outcome; "p" where fp4lab's patch makes a blocked cell compile."""
    import matplotlib.pyplot as plt

    names = list(dict.fromkeys(r["model"] for r in rows))
    graphs = lane_graphs(rows)
    lanes = [(n, graph) for n in names for graph in graphs]
    version_list = sorted(dict.fromkeys(r["sglang_version"] for r in rows), key=versions.order)
    sm_list = sorted({r["sm"] for r in rows}, key=lambda s: float(s))
    fig, axes = plt.subplots(len(sm_list), 1, squeeze=False,
                             figsize=(0.5 * len(version_list) + 3, 0.45 * len(lanes) * len(sm_list) + 2))  # fmt: skip
    for ax, sm in zip(axes[:, 0], sm_list, strict=True):
        for r in (r for r in rows if r["sm"] == sm):
            x, y = (
                version_list.index(r["sglang_version"]),
                lanes.index((r["model"], "tc_piecewise")),
            )
            ax.add_patch(plt.Rectangle((x, y), 0.95, 0.9, color=COLOURS.get(r["outcome"], "#ccc")))
            if r["outcome"] == "blocked" and r["compiles_with_patch"]:
                ax.text(x + 0.47, y + 0.45, "p", ha="center", va="center", fontsize=7)
            for i, graph in enumerate(graphs[1:], 1):
                draw_captured(ax, r, graph, x, y + i, 6)
        ax.set_xlim(0, len(version_list))
        ax.set_ylim(len(lanes), 0)
        ax.set_xticks([i + 0.47 for i in range(len(version_list))], version_list, rotation=90,
                      fontsize=6)  # fmt: skip
        ax.set_yticks([i + 0.45 for i in range(len(lanes))],
                      [f"{n} {GRAPH_SHORT[graph]}" for n, graph in lanes], fontsize=7)  # fmt: skip
        ax.set_title(f"SM{sm} (simulated)", fontsize=8)
    axes[-1, 0].legend(
        handles=[plt.Rectangle((0, 0), 1, 1, color=c, label=o) for o, c in COLOURS.items()],
        loc="upper center", bbox_to_anchor=(0.5, -0.35), ncol=4, fontsize=7, frameon=False)  # fmt: skip
    fig.suptitle("Each FP4 model's own SGLang class through each release's prefill graph runner: "
                 "tc_piecewise traced (p: fp4lab's patch makes it compile), breakable and full "
                 "captured (simulated)", fontsize=9)  # fmt: skip
    fig.tight_layout()
    return fig


def save_matrix_figure(rows: list[dict], notebook: str) -> Path:
    """``plot_matrix`` saved as figures/<notebook>.png with the run's provenance."""
    return figures.save_figure(
        plot_matrix(rows),
        notebook,
        records.latest(notebook)[-1]["provenance"],
        source=f"data/{notebook}.jsonl run {records.RUN_ID}",
        evidence=breakable_outcome.evidence_of(rows),
    )
