"""Notebook 11's figure and tables: SGLang release down, simulated SM across, each cell what
compiling the release's own GLM-5 through its piecewise runner gave, the blockers met, the patch
that removes them and the MoE's path; each row labelled with the option a GLM-5 user passes."""

from __future__ import annotations

import textwrap
from pathlib import Path

from fp4lab.core import evidence, figures, glm5, records
from fp4lab.serving.replay import decide

COLOURS = dict(zip(decide.OUTCOMES, ("#d62728", "#2ca02c", "#9edae5", "#eeeeee"), strict=True))
"""blocked, compiles, not applicable, not measured."""
PART_SHORT = {"fp4_quantize_op": "fp4 op", "dsa_indexer_split_op": "indexer split",
              "dsa_attention_split_op": "DSA attn split"}  # fmt: skip
SHORT = {"flashinfer_direct": "flashinfer.fp4_quantize", "sglang_op": "sglang op",
         "sglang_jit_op": "sglang JIT op", "sgl_kernel_op": "sgl_kernel op", "none": "none",
         "other": "other"}  # fmt: skip


def table(rows: list[dict]) -> object:
    """The decision table as a DataFrame: version x SM, outcome, op, counts, flag."""
    import pandas as pd

    keep = ["sglang_version", "sm", "flag", "outcome", "evidence", "blocked_at", "blockers", "patch",
            "compiles_with_patch", "equals_eager", "pieces", "expected_pieces", "moe", "quantize",
            "model_class", "note"]  # fmt: skip
    return pd.DataFrame([{k: r.get(k) for k in keep} for r in rows])


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


def plot_decision(rows: list[dict]) -> object:
    """Versions down, SMs across; a cell says the quantize taken and blocked-at / compiles."""
    import matplotlib.pyplot as plt

    version_list = list(dict.fromkeys(r["sglang_version"] for r in rows))
    sm_list = sorted({r["sm"] for r in rows}, key=lambda s: float(s))
    fig, ax = plt.subplots(figsize=(3.6 * len(sm_list) + 2.8, 1.3 * len(version_list) + 1.4))
    for r in rows:
        x, y = sm_list.index(r["sm"]), version_list.index(r["sglang_version"])
        colour = COLOURS.get(r["outcome"], "#cccccc")
        ax.add_patch(plt.Rectangle((x, y), 0.96, 0.9, color=colour))
        detail = f"blocked at {r['blocked_at']}" if r["outcome"] == "blocked" else r["outcome"]
        if r["patch"]:
            done = "compiles" if r["compiles_with_patch"] else "still blocked"
            done += ", = eager" if r["equals_eager"] else ""
            short = " + ".join(PART_SHORT.get(p, p) for p in r["patch"])
            detail += f"\npatch: {short}\n-> {done}"
        if r["outcome"] in ("not applicable", "not measured"):
            detail += "\n" + textwrap.fill(decide.short(r["note"]), 44)
        if r["moe_op"]:
            detail += f"\nMoE in {r['moe_op'].split('::')[-1][:34]}"
        ax.text(x + 0.48, y + 0.45, f"{SHORT.get(r['quantize'], r['quantize'])}\n{detail}",
                ha="center", va="center", fontsize=6.5)  # fmt: skip
    flags = {r["sglang_version"]: f"GLM-5: {r['flag']}" for r in rows}
    ax.set_xlim(0, len(sm_list))
    ax.set_ylim(len(version_list), 0)
    ax.set_xticks([i + 0.48 for i in range(len(sm_list))], [f"SM{s}" for s in sm_list])
    ax.set_yticks([i + 0.45 for i in range(len(version_list))],
                  [f"{v}\n{flags[v]}" for v in version_list], fontsize=7)  # fmt: skip
    ax.set_title(f"SGLang's own {glm5.ARCHITECTURE} through its piecewise runner (fullgraph=True)")
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
