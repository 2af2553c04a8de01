"""Turning records into tables and figures: the decision table, the blocker chain, plots.

Nothing here runs an experiment; every number shown comes from a record or an outcome
passed in. Figures carry a provenance footer and a JSON sidecar naming the run they
were drawn from.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

import pandas as pd

from fp4lab import paths, probe


def _as_record(outcome: object) -> dict:
    return outcome.as_record() if hasattr(outcome, "as_record") else dict(outcome)


def outcome_table(outcome: object) -> pd.DataFrame:
    """One trace outcome as a two-column table, in dynamo's own words."""
    r = _as_record(outcome)
    rows = [
        ("signature", r["signature"]),
        ("status", r["status"]),
        ("exception", r["exception"]),
        ("dynamo says", r["message"]),
        *(("explanation", line) for line in r["explanation"]),
        *(("hint", line) for line in r["hints"]),
        ("skipped builtin", r["skipped_builtin"]),
        ("blocked in", r["blocker_frame"]),
        ("frames show the nvcc query", r["shows_nvcc_query"]),
        ("graphs / breaks", f"{r['graph_count']} / {r['graph_break_count']}"),
        ("seconds", round(r["seconds"], 2)),
    ]
    return pd.DataFrame(rows, columns=["field", "value"]).set_index("field")


def frames_table(outcome: object) -> pd.DataFrame:
    """The user-code frames dynamo reported, outermost first."""
    frames = _as_record(outcome)["frames"]
    return pd.DataFrame([f.rsplit(":", 2) for f in frames], columns=["file", "line", "function"])


def chain_table(rows: Iterable[dict]) -> pd.DataFrame:
    """The blocker chain: one row per attempt, the stage applied before it and what stopped it."""
    return pd.DataFrame(
        [
            {
                "step": r["step"],
                "stage applied": r["stage"],
                "origin": r["origin"],
                "story": r["story"],
                "blocker": r["signature"],
                "dynamo says": r["message"],
                "builtin": r["skipped_builtin"],
                "blocked in": r["blocker_frame"],
                "seconds": round(r["seconds"], 2),
            }
            for r in rows
        ]
    ).set_index("step")


def machine_table(machine: probe.Machine) -> pd.DataFrame:
    """What this machine has, one row per fact."""
    m = machine.as_dict()
    rows = [(f"package {k}", v or "not installed") for k, v in m.pop("packages").items()]
    rows += [(k, v) for k, v in m.items()]
    rows.append(("meets needs", ", ".join(n for n in probe.NEEDS if n in machine.capabilities())))
    return pd.DataFrame(rows, columns=["fact", "value"]).set_index("fact")


def provenance_line(prov: dict) -> str:
    """A one-line summary of a record's provenance, for figure footers and captions."""
    pk = prov.get("packages", {})
    target = f"target SM{prov['target_sm']} ({'simulated' if prov['simulated'] else 'real'})" if prov.get("target_sm") else "no target SM"
    commit = (prov.get("git", {}).get("commit") or "uncommitted")[:10]
    return (
        f"fp4lab {commit} · torch {pk.get('torch')} · flashinfer {pk.get('flashinfer-python')} · "
        f"{prov.get('device')} · {target} · {prov.get('time_utc')}"
    )


def save_figure(fig: object, name: str, prov: dict, source: str) -> Path:
    """Write ``figures/<name>.png`` with a provenance footer, and ``<name>.json`` beside it."""
    folder = paths.figures_dir()
    folder.mkdir(parents=True, exist_ok=True)
    fig.text(0.01, 0.005, provenance_line(prov), fontsize=6, color="0.35", ha="left", va="bottom")
    path = folder / f"{name}.png"
    fig.savefig(path, dpi=120, bbox_inches="tight", metadata={"Description": json.dumps(prov, sort_keys=True)})
    (folder / f"{name}.json").write_text(json.dumps({"figure": path.name, "source": source, "provenance": prov}, indent=2, sort_keys=True) + "\n")
    return path


def plan_table(steps: Iterable[tuple]) -> pd.DataFrame:
    """The reproduce plan: each notebook, what it needs, and whether it runs here or why not."""
    return pd.DataFrame(
        [
            {"notebook": nb.name, "title": nb.title, "needs": nb.needs, "about_s": nb.duration_s, "runs here": skip is None, "skipped because": skip or ""}
            for nb, skip in steps
        ]
    ).set_index("notebook")


def plot_tradeoff(rows: list[dict]) -> object:
    """Median step time per variant (error bars p10-p90), compiled-graph runs per step on each bar."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.6))
    names = [r["variant"] for r in rows]
    medians = [r["step_median_ms"] for r in rows]
    errors = [[m - r["step_p10_ms"] for m, r in zip(medians, rows)], [r["step_p90_ms"] - m for m, r in zip(medians, rows)]]
    bars = ax.bar(names, medians, yerr=errors, capsize=4, color=["0.6", "tab:red", "tab:green"][: len(rows)])
    for bar, r in zip(bars, rows):
        label = "no graphs" if r["variant"] == "eager" else f"{r['graph_calls']} graph runs/step"
        ax.annotate(label, (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center", va="bottom", fontsize=8, xytext=(0, 3), textcoords="offset points")
    first = rows[0]
    ax.set_ylabel("ms per step (median)")
    ax.set_title(f"{first['layers']} FP4 layers, {first['kernel']} quantize kernel", fontsize=10)
    ax.margins(y=0.2)
    fig.tight_layout()
    return fig
