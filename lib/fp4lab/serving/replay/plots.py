"""Notebook 11's figure and tables: SGLang release down, simulated SM across, each cell what
compiling the release's own GLM-5 through its piecewise runner gave, the blockers met, the patch
that removes them and the MoE's path; each row labelled with the option a GLM-5 user passes.
Notebook 14's: one model x release grid per SM (``plot_matrix``), and its table."""

from __future__ import annotations

import textwrap
from pathlib import Path

from fp4lab.core import evidence, figures, glm5, page, records
from fp4lab.serving.replay import decide, timeline, upstream, versions

COLOURS = dict(
    zip(
        decide.OUTCOMES,
        ("#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#9edae5", "#eeeeee"),
        strict=True,
    )
)
"""blocked, compiles, wrong output, kernel unavailable, not applicable, not measured."""
PART_SHORT = {"fp4_quantize_op": "fp4 op", "dsa_indexer_split_op": "indexer split",
              "dsa_attention_split_op": "DSA attn split", "musa_probe_constant": "musa const"}  # fmt: skip


def patch_text(row: dict) -> str:
    """What fp4lab's patch gave a blocked cell, in a few words ('' where none was tried)."""
    if not row["patch"]:
        return ""
    done = "compiles" if row["compiles_with_patch"] else "still blocked"
    done += ", = eager" if row["compiles_with_patch"] and row["equals_eager"] else ""
    return f"{' + '.join(PART_SHORT.get(p, p) for p in row['patch'])}: {done}"


def table(rows: list[dict]) -> object:
    """The decision per release and SM, eight short columns, every row, no index: what the
    release gives with no flag, the flag that reaches tc_piecewise, the outcome, its first
    blocker, what the patch gave, and why in a few words."""
    import pandas as pd

    return page.table(pd.DataFrame([
        {"release": r["sglang_version"], "SM": r["sm"], "with no flag": r.get("default_prefill") or "",
         "flag for tc_piecewise": r["flag"], "outcome": r["outcome"],
         "first blocker": timeline.state(r).removeprefix("blocked at ") if r["outcome"] == "blocked" else "",
         "patch": patch_text(r), "why": r["why_short"] if r["outcome"] != "blocked" else ""}
        for r in rows
    ]))  # fmt: skip


def timeline_table(rows: list[dict]) -> object:
    """The timeline per SM: each run of consecutive releases with one outcome."""
    import pandas as pd

    return page.table(pd.DataFrame([
        {"SM": g["sm"], "releases": versions.span(g["from"], g["to"]), "outcome": g["state"]}
        for sm in dict.fromkeys(r["sm"] for r in rows) for g in timeline.runs(rows, sm)
    ]))  # fmt: skip


def defaults_table(rows: list[dict]) -> object:
    """Per SM, runs of releases with one default prefill graph and the rule that decided it."""
    import pandas as pd

    return page.table(pd.DataFrame([
        {"SM": g["sm"], "releases": versions.span(g["from"], g["to"]),
         "prefill graph with no flag": g["default_prefill"] or "", "decided at": g["rule"] or ""}
        for sm in dict.fromkeys(r["sm"] for r in rows) for g in timeline.defaults(rows, sm)
    ]))  # fmt: skip


def kernels_table(rows: list[dict]) -> object:
    """Per model (where rows hold several), SM and kernel whose arch evidence was read: runs of
    consecutive releases with one availability and one choice behind it, with the newest
    release's evidence; then a row per model and SM naming the reached kernels with none read."""
    import pandas as pd

    found: list[dict] = []
    for model in dict.fromkeys(r.get("model") for r in rows):
        for sm in sorted({r["sm"] for r in rows}, key=float):
            found += _kernel_runs([r for r in rows if r.get("model") == model and r["sm"] == sm])
    several = len({f["model"] for f in found}) > 1
    return page.table(pd.DataFrame([
        {**({"model": f["model"]} if several else {}), "SM": f["SM"], "kernel": f["kernel"],
         "releases": versions.span(f["from"], f["to"]) if f["from"] else "",
         "available": f["said"][0], "chosen by": f["said"][1], "evidence": f["evidence"]}
        for f in found
    ]))  # fmt: skip


def _kernel_runs(cells: list[dict]) -> list[dict]:
    """``kernels_table``'s rows for one model and SM (a release without a record ends a run)."""
    mine = sorted(cells, key=lambda r: versions.order(r["sglang_version"]))
    found: list[dict] = []
    for kernel in dict.fromkeys(
        k["kernel"] for r in mine for k in r.get("kernels") or [] if k["library"]
    ):
        last = None  # the run the previous release extends, if any
        for r in mine:
            k = next((k for k in r.get("kernels") or [] if k["kernel"] == kernel), None)
            said = k and (k["available"], k["chosen"].removeprefix("reached as "))
            if not said:
                last = None
            elif last and last["said"] == said:
                last |= {"to": r["sglang_version"], "evidence": k["evidence"]}
            else:
                last = {"model": r.get("model"), "SM": r["sm"], "kernel": kernel,
                        "from": r["sglang_version"], "to": r["sglang_version"], "said": said,
                        "evidence": k["evidence"]}  # fmt: skip
                found.append(last)
    unread = sorted({k["kernel"] for r in mine for k in r.get("kernels") or [] if not k["library"]})
    if unread:
        found.append({"model": mine[0].get("model"), "SM": mine[0]["sm"],
                      "kernel": f"{len(unread)} more, no arch evidence read", "from": "", "to": "",
                      "said": ("unknown", "reached"), "evidence": ", ".join(unread)})  # fmt: skip
    return found


def upstream_table(notebook: str) -> object:
    """What upstream saw next to the replay's cells (the latest run), consecutive releases with
    one verdict as one row."""
    import pandas as pd

    found = [r["values"] for r in records.latest(notebook) if r["kind"] == "upstream"]
    keep = ("source", "release", "SM", "replay", "verdict", "why")
    return page.table(pd.DataFrame([{k: r[k] for k in keep} for r in upstream.grouped(found)]))


def standins_table(notebook: str) -> object:
    """Every stand-in the latest run's replays list: what stood in, at which boundary, why."""
    import pandas as pd

    found = [r["values"] for r in records.latest(notebook) if r["kind"] == "replay"]
    seen = {(s["name"], s.get("boundary", s.get("module", ""))): s for f in found
            for s in f.get("standins", [])}  # fmt: skip
    return page.table(pd.DataFrame([
        {"name": s["name"], "boundary": s.get("boundary", s.get("module", "")), "why": s["why"]}
        for s in seen.values()
    ]))  # fmt: skip


def calls_table(notebook: str) -> object:
    """Every FlashInfer FP4 call of each version's source (latest run), file:line, direct or wrapped."""
    import pandas as pd

    found = [r["values"] for r in records.latest(notebook) if r["kind"] == "flashinfer_fp4_calls"]
    return page.table(pd.DataFrame([
        {"sglang_version": f["sglang_version"], "where": f"{c['file']}:{c['line']}",
         "call": c["call"], "entry_point": c["entry_point"], "function": c["function"],
         "wrapped": c["wrapped"], "also_bound_from": ", ".join(c["also_bound_from"])}
        for f in found for c in f["calls"]
    ]))  # fmt: skip


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
        evidence=evidence.of_values(rows),
    )


GRAPH_SHORT = {"tc_piecewise": "tc", "breakable": "brk", "full": "full", "disabled": "off"}
"""The default prefill graph as a cell of the grid says it."""

MARKS = {"compiles": "ok", "wrong output": "W", "kernel unavailable": "K", "not applicable": "-",
         "not measured": "?"}  # fmt: skip
"""What a grid cell of each outcome but "blocked" says (a blocked cell names its blocker)."""


def blocker_codes(rows: list[dict]) -> dict[str, str]:
    """Each first blocker of the blocked cells, in release order, with a letter."""
    found = sorted((r for r in rows if r["outcome"] == "blocked"),
                   key=lambda r: versions.order(r["sglang_version"]))  # fmt: skip
    firsts = dict.fromkeys(timeline.state(r).removeprefix("blocked at ") for r in found)
    return {name: chr(ord("A") + i) for i, name in enumerate(firsts)}


def plot_grid(rows: list[dict], model: str = "GLM-5") -> object:
    """The answer at a glance: SMs down, releases across (release order); each cell coloured by
    the tc_piecewise outcome, a blocked cell lettered by its first blocker (the legend names
    each), and under it the prefill graph the release gives with no flag."""
    import matplotlib.pyplot as plt

    version_list = sorted(dict.fromkeys(r["sglang_version"] for r in rows), key=versions.order)
    sm_list = sorted({r["sm"] for r in rows}, key=lambda s: float(s))
    codes = blocker_codes(rows)
    fig, ax = plt.subplots(figsize=(0.55 * len(version_list) + 1.4, 0.62 * len(sm_list) + 2.6))
    for r in rows:
        x, y = version_list.index(r["sglang_version"]), sm_list.index(r["sm"])
        ax.add_patch(plt.Rectangle((x, y), 0.94, 0.9, color=COLOURS.get(r["outcome"], "#cccccc")))
        mark = (codes[timeline.state(r).removeprefix("blocked at ")] if r["outcome"] == "blocked"
                else MARKS.get(r["outcome"], "?"))  # fmt: skip
        ax.text(x + 0.47, y + 0.34, mark, ha="center", va="center", fontsize=8, weight="bold")
        given = GRAPH_SHORT.get(r.get("default_prefill") or "", "")
        ax.text(x + 0.47, y + 0.72, given, ha="center", va="center", fontsize=5.5)
    ax.set_xlim(0, len(version_list))
    ax.set_ylim(len(sm_list), 0)
    ax.set_xticks([i + 0.47 for i in range(len(version_list))], version_list, rotation=90,
                  fontsize=7)  # fmt: skip
    ax.set_yticks([i + 0.45 for i in range(len(sm_list))], [f"SM{s}" for s in sm_list], fontsize=8)
    ax.tick_params(length=0)
    for side in ax.spines.values():
        side.set_visible(False)
    outcomes = [plt.Rectangle((0, 0), 1, 1, color=c, label=o) for o, c in COLOURS.items()]
    letters = [plt.Rectangle((0, 0), 1, 1, color="white", label=f"{c}: {name}")
               for name, c in codes.items()]  # fmt: skip
    fig.legend(handles=outcomes + letters, loc="lower left", bbox_to_anchor=(0.02, 0.0),
               ncol=2, fontsize=6.5, frameon=False)  # fmt: skip
    ax.set_title(f"{model} through tc_piecewise prefill graphs, per release and SM (CPU replay); "
                 "small text: the prefill graph the release gives with no flag "
                 f"({', '.join(f'{v} = {k}' for k, v in GRAPH_SHORT.items())})", fontsize=7.5)  # fmt: skip
    fig.subplots_adjust(left=0.06, right=0.99, top=0.88, bottom=0.5)
    return fig


GRID = "11_sglang_grid"
"""The per-SM grid's figure name (the decision report's first screen shows it)."""


def save_grid_figure(rows: list[dict], notebook: str) -> Path:
    """``plot_grid`` saved as figures/11_sglang_grid.png with the notebook's provenance."""
    return figures.save_figure(plot_grid(rows), GRID, records.latest(notebook)[-1]["provenance"],
                               source=f"data/{notebook}.jsonl run {records.RUN_ID}",
                               evidence=evidence.of_values(rows))  # fmt: skip


def matrix_table(rows: list[dict]) -> object:
    """Notebook 14's cells, every row, no index: model, release, SM, the flag for tc_piecewise,
    outcome, the blockers with dynamo's graph-break codes, what the patch gave, why."""
    import pandas as pd

    return page.table(pd.DataFrame([
        {"model": r["model"], "release": r["sglang_version"], "SM": r["sm"],
         "flag for tc_piecewise": r["flag"], "outcome": r["outcome"],
         "blockers": "; ".join(map(decide.blocker_text, r["blocker_frames"])),
         "patch": patch_text(r), "why": r["why_short"] if r["outcome"] != "blocked" else ""}
        for r in rows
    ]))  # fmt: skip


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
