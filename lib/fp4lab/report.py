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

from fp4lab import paths, probe, records


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
                "builtin": r["skipped_builtin"] or "",
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
    git = prov.get("git", {})
    commit = (git.get("commit") or "no-commit")[:10] + ("-dirty" if git.get("dirty") else "")
    return (
        f"fp4lab {commit} · torch {pk.get('torch')} · flashinfer {pk.get('flashinfer-python')} · "
        f"{prov.get('device')} · {target} · {prov.get('time_utc')}"
    )


def annotate_provenance(fig: object, prov: dict) -> None:
    """Write the provenance line along the bottom edge of a figure."""
    fig.text(0.01, -0.02, provenance_line(prov), fontsize=6, color="0.35", ha="left", va="top")


def save_figure(fig: object, name: str, prov: dict, source: str) -> Path:
    """Write ``figures/<name>.png`` with a provenance footer, and ``<name>.json`` beside it."""
    folder = paths.figures_dir()
    folder.mkdir(parents=True, exist_ok=True)
    annotate_provenance(fig, prov)
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


# -- the decision report ----------------------------------------------------------------

STORY_STEPS = (
    ("msg 988", "01_nvcc_subprocess_crash", "attempt"),
    ("msg 992", "02_file_io_trace", "verdict"),
    ("msgs 1002/1009", "03_compiler_disable_fullgraph", "attempt"),
)
"""The story's three crashes: its message, the notebook that replays it, the record kind that holds the verdict."""

ALTERNATIVES = (
    ("FP4 quantize kernels", "06_nvfp4_kernels", "not in the story's list; the kernels every FP4 layer runs"),
    ("MSCCLPP allreduce", "07_mscclpp_allreduce", "Tier 1, tested next"),
    ("Single Batch Overlap", "08_single_batch_overlap", "Tier 1, tested next"),
)


def _of_kind(rows: list[dict], kind: str) -> list[dict]:
    return [r for r in rows if r["kind"] == kind]


def story_table() -> pd.DataFrame:
    """Each crash of the story: what it said, what this run observed, and whether they agree."""
    table = []
    for message, notebook, kind in STORY_STEPS:
        found = _of_kind(records.latest(notebook), kind)
        if not found:
            table.append({"story": message, "notebook": notebook, "reproduced": "no record: the notebook did not run"})
            continue
        r = found[0]
        v = r["values"]
        table.append(
            {
                "story": message,
                "notebook": notebook,
                "expected": v["expected_signature"],
                "observed": v["signature"],
                "reproduced": "yes" if v["signature"] == v["expected_signature"] else "NO: upstream behaviour changed",
                "dynamo says": v.get("message"),
                "blocked in": v.get("blocker_frame"),
                "seconds": round(v["seconds"], 2),
                "target": f"SM{r['provenance']['target_sm']} ({'simulated' if r['provenance']['simulated'] else 'real'})",
            }
        )
    return pd.DataFrame(table).set_index("story")


def _reproduce_status() -> dict[str, dict]:
    return {r["values"]["notebook"]: r["values"] for r in records.latest("reproduce")}


def _not_run(notebook: str, status: dict[str, dict]) -> str:
    s = status.get(notebook)
    if s is None:
        return "not run: no record"
    return f"not run here: {s['reason']}" if s["status"] == "skipped" else f"{s['status']}: {s['reason']}"


def _pcg_row(status: dict[str, dict]) -> dict:
    fixes = _of_kind(records.latest("05_custom_op_fix"), "fix")
    upstream = _of_kind(records.latest("05_custom_op_fix"), "upstream_op")
    story = story_table()
    reproduced = (story["reproduced"] == "yes").sum() if "reproduced" in story else 0
    evidence = [f"{reproduced}/3 story crashes reproduced from FlashInfer's code (notebooks 01-03)"]
    if fixes and all(f["values"]["signature"] == "ok" and f["values"]["graph_count"] == 1 for f in fixes):
        backends = ", ".join(f["values"]["backend"] for f in fixes)
        state = "UNBLOCKED with a custom op: fullgraph=True, 1 graph, 0 breaks"
        evidence.append(f"fp4lab::fp4_quantize compiles to 1 graph / 0 breaks ({backends}); opcheck passes")
    elif fixes:
        state = "BLOCKED: the custom-op fix did not compile (see notebook 05)"
    else:
        state = "UNDECIDED: " + _not_run("05_custom_op_fix", status)
    if upstream:
        u = upstream[0]["values"]
        fi = upstream[0]["provenance"]["packages"].get("flashinfer-python")
        evidence.append(
            f"torch.ops.flashinfer.fp4_quantize in flashinfer {fi}: {u['signature']}, {u.get('graph_count')} graph"
            if u.get("present")
            else f"flashinfer {fi} ships no torch.ops.flashinfer.fp4_quantize"
        )
    matrix = _of_kind(records.latest("09_version_matrix"), "version")
    if matrix:
        evidence.append("version matrix: " + "; ".join(f"{m['values']['version']}: {m['values']['verdict']}" for m in matrix))
    variants = {r["values"]["variant"]: r for r in _of_kind(records.latest("04_fullgraph_false_tradeoff"), "variant")}
    if len(variants) == 3:
        eager, breaks, fixed = (variants[k]["values"] for k in ("eager", "compiled_with_breaks", "compiled_fullgraph_custom_op"))
        device = variants["eager"]["provenance"]["device"]
        measured = (
            f"fullgraph=False: {breaks['graph_calls']} graph runs/step for {breaks['layers']} layers vs 1 with the fix; "
            f"step time on {device}: fix {fixed['step_median_ms']:.2f} ms, with breaks {breaks['step_median_ms']:.2f} ms, "
            f"eager {eager['step_median_ms']:.2f} ms"
        )
        graphs = fixed.get("cuda_graph_capture", "")
        measured += "" if str(graphs).startswith("ok") else f"; CUDA graph replay: {graphs or 'not measured'}"
    else:
        measured = _not_run("04_fullgraph_false_tradeoff", status)
    return {
        "optimization": "Piecewise CUDA graphs (torch.compile fullgraph=True)",
        "story said": "BLOCKED (torch.compile incompatible with FP4 JIT)",
        "status here": state,
        "evidence": "; ".join(evidence),
        "measured effect": measured,
        "needs": "cpu for the crashes and the fix; an SM100+ GPU for CUDA-graph replay timings",
    }


def _alternative_row(name: str, notebook: str, story: str, status: dict[str, dict]) -> dict:
    rows = records.latest(notebook)
    summaries = _of_kind(rows, "summary")
    if summaries:
        v = summaries[-1]["values"]
        state, measured = v.get("status", "measured"), v.get("headline", "")
        needs = v.get("needs", "")
    elif rows:
        state, measured, needs = "measured (no summary record)", f"{len(rows)} records", ""
    else:
        state, measured, needs = _not_run(notebook, status), "", ""
    device = rows[-1]["provenance"]["device"] if rows else ""
    return {
        "optimization": name,
        "story said": story,
        "status here": state,
        "evidence": f"notebook {notebook}" + (f", on {device}" if device else ""),
        "measured effect": measured,
        "needs": needs,
    }


def decision_table() -> pd.DataFrame:
    """The story's todo list, re-decided from this repository's records."""
    status = _reproduce_status()
    rows = [_pcg_row(status)] + [_alternative_row(name, nb, story, status) for name, nb, story in ALTERNATIVES]
    return pd.DataFrame(rows).set_index("optimization")


def provenance_table() -> pd.DataFrame:
    """Each notebook with records: where its newest run's numbers came from."""
    names = sorted(p.stem for p in paths.data_dir().glob("*.jsonl"))
    rows = [(name, provenance_line(records.latest(name)[-1]["provenance"])) for name in names if records.latest(name)]
    return pd.DataFrame(rows, columns=["notebook", "provenance"]).set_index("notebook")


def skipped_table() -> pd.DataFrame:
    """What the last `make reproduce` ran, failed or skipped, and why."""
    rows = records.latest("reproduce")
    if not rows:
        return pd.DataFrame(columns=["notebook", "status", "reason", "seconds"]).set_index("notebook")
    return pd.DataFrame([r["values"] for r in rows])[["notebook", "status", "reason", "seconds"]].drop_duplicates("notebook", keep="last").set_index("notebook")


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
