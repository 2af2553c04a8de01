"""Notebook 11's figure and tables: SGLang release down, simulated SM across, each cell what
compiling the release's own GLM-5 through its piecewise runner gave, the blockers met, the patch
that removes them and the MoE's path; each row labelled with the option a GLM-5 user passes.
Notebook 14's: one model x release grid per SM (``plot_matrix``), and its table."""

from __future__ import annotations

import textwrap
from pathlib import Path

from fp4lab.core import evidence, figures, glm5, records
from fp4lab.serving.replay import decide, timeline, upstream, versions

COLOURS = dict(
    zip(decide.OUTCOMES, ("#d62728", "#2ca02c", "#ff7f0e", "#9edae5", "#eeeeee"), strict=True)
)
"""blocked, compiles, wrong output, not applicable, not measured."""
PART_SHORT = {"fp4_quantize_op": "fp4 op", "dsa_indexer_split_op": "indexer split",
              "dsa_attention_split_op": "DSA attn split", "musa_probe_constant": "musa const"}  # fmt: skip


def table(rows: list[dict]) -> object:
    """The decision table as a DataFrame: version x SM, outcome, op, counts, flag; a cell with
    nothing to say is empty (not NaN, not None)."""
    import pandas as pd

    keep = ["sglang_version", "sm", "default_prefill", "flag", "outcome", "evidence", "blocked_at",
            "blockers", "patch",
            "compiles_with_patch", "equals_eager", "pieces", "expected_pieces", "moe", "quantize",
            "model_class", "note"]  # fmt: skip
    return pd.DataFrame([{k: r.get(k) for k in keep} for r in rows]).fillna("")


def timeline_table(rows: list[dict]) -> object:
    """The timeline per SM: each run of consecutive releases with one outcome."""
    import pandas as pd

    return pd.DataFrame([
        {"SM": g["sm"], "releases": timeline.span(g["from"], g["to"]), "outcome": g["state"]}
        for sm in dict.fromkeys(r["sm"] for r in rows) for g in timeline.runs(rows, sm)
    ])  # fmt: skip


def defaults_table(rows: list[dict]) -> object:
    """Per SM, runs of releases with one default prefill graph and the rule that decided it."""
    import pandas as pd

    return pd.DataFrame([
        {"SM": g["sm"], "releases": timeline.span(g["from"], g["to"]),
         "prefill graph with no flag": g["default_prefill"] or "", "decided at": g["rule"] or ""}
        for sm in dict.fromkeys(r["sm"] for r in rows) for g in timeline.defaults(rows, sm)
    ]).style.hide(axis="index")  # fmt: skip


def upstream_table(notebook: str) -> object:
    """What upstream saw next to the replay's cells (the latest run), consecutive releases with
    one verdict as one row."""
    import pandas as pd

    found = [r["values"] for r in records.latest(notebook) if r["kind"] == "upstream"]
    keep = ("source", "release", "SM", "replay", "verdict", "why")
    return pd.DataFrame([{k: r[k] for k in keep} for r in upstream.grouped(found)]).style.hide(
        axis="index"
    )


def standins_table(notebook: str) -> object:
    """Every stand-in the latest run's replays list: what stood in, at which boundary, why."""
    import pandas as pd

    found = [r["values"] for r in records.latest(notebook) if r["kind"] == "replay"]
    seen = {(s["name"], s.get("boundary", s.get("module", ""))): s for f in found
            for s in f.get("standins", [])}  # fmt: skip
    return pd.DataFrame([{"name": s["name"], "boundary": s.get("boundary", s.get("module", "")),
                          "why": s["why"]} for s in seen.values()])  # fmt: skip


def calls_table(notebook: str) -> object:
    """Every FlashInfer FP4 call of each version's source (latest run), file:line, direct or wrapped."""
    import pandas as pd

    found = [r["values"] for r in records.latest(notebook) if r["kind"] == "flashinfer_fp4_calls"]
    return pd.DataFrame([
        {"sglang_version": f["sglang_version"], "where": f"{c['file']}:{c['line']}",
         "call": c["call"], "entry_point": c["entry_point"], "function": c["function"],
         "wrapped": c["wrapped"], "also_bound_from": ", ".join(c["also_bound_from"])}
        for f in found for c in f["calls"]
    ])  # fmt: skip


def cell_text(row: dict) -> str:
    """What a cell of the figure says: its state (``timeline.state``) and, where a patch was
    tried, what it gave; two short lines at most."""
    said = textwrap.shorten(timeline.state(row), 58, placeholder="...")
    if row["patch"]:
        done = "compiles" if row["compiles_with_patch"] else "still blocked"
        done += ", = eager" if row["equals_eager"] else ""
        said += f"\npatch {' + '.join(PART_SHORT.get(p, p) for p in row['patch'])} -> {done}"
    return said


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
        evidence=evidence.of_values(rows),
    )


def matrix_table(rows: list[dict]) -> object:
    """Notebook 14's cells: model, release, SM, outcome, blockers with graph-break codes."""
    import pandas as pd

    return pd.DataFrame([
        {"model": r["model"], "sglang_version": r["sglang_version"], "sm": r["sm"],
         "outcome": r["outcome"], "flag": r["flag"],
         "blockers": "; ".join(map(decide.blocker_text, r["blocker_frames"])) or "-",
         "patch": ", ".join(r["patch"]) or "-", "compiles_with_patch": r["compiles_with_patch"],
         "why": r["why_short"]} for r in rows
    ]).fillna("-")  # fmt: skip


def plot_matrix(rows: list[dict]) -> object:
    """One panel per SM: models down, releases across (release order), each cell coloured by
    outcome; "p" where fp4lab's patch makes a blocked cell compile."""
    import matplotlib.pyplot as plt

    names = list(dict.fromkeys(r["model"] for r in rows))
    version_list = sorted(dict.fromkeys(r["sglang_version"] for r in rows), key=versions.order)
    sm_list = sorted({r["sm"] for r in rows}, key=lambda s: float(s))
    fig, axes = plt.subplots(len(sm_list), 1, squeeze=False,
                             figsize=(0.5 * len(version_list) + 3, 0.45 * len(names) * len(sm_list) + 2))  # fmt: skip
    for ax, sm in zip(axes[:, 0], sm_list, strict=True):
        for r in (r for r in rows if r["sm"] == sm):
            x, y = version_list.index(r["sglang_version"]), names.index(r["model"])
            ax.add_patch(plt.Rectangle((x, y), 0.95, 0.9, color=COLOURS.get(r["outcome"], "#ccc")))
            if r["outcome"] == "blocked" and r["compiles_with_patch"]:
                ax.text(x + 0.47, y + 0.45, "p", ha="center", va="center", fontsize=7)
        ax.set_xlim(0, len(version_list))
        ax.set_ylim(len(names), 0)
        ax.set_xticks([i + 0.47 for i in range(len(version_list))], version_list, rotation=90,
                      fontsize=6)  # fmt: skip
        ax.set_yticks([i + 0.45 for i in range(len(names))], names, fontsize=7)
        ax.set_title(f"SM{sm} (simulated)", fontsize=8)
    axes[-1, 0].legend(
        handles=[plt.Rectangle((0, 0), 1, 1, color=c, label=o) for o, c in COLOURS.items()],
        loc="upper center", bbox_to_anchor=(0.5, -0.35), ncol=4, fontsize=7, frameon=False)  # fmt: skip
    fig.suptitle("Each FP4 model's own SGLang class through each release's piecewise runner "
                 "(p: fp4lab's patch makes it compile)", fontsize=9)  # fmt: skip
    fig.tight_layout()
    return fig


def save_matrix_figure(rows: list[dict], notebook: str) -> Path:
    """``plot_matrix`` saved as figures/<notebook>.png with the run's provenance."""
    return figures.save_figure(
        plot_matrix(rows),
        notebook,
        records.latest(notebook)[-1]["provenance"],
        source=f"data/{notebook}.jsonl run {records.RUN_ID}",
        evidence=evidence.of_values(rows),
    )
