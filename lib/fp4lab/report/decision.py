"""The decision table: the story's todo list re-decided from the records in data/.

Nothing here runs an experiment; every number shown comes from a record."""

from __future__ import annotations

import pandas as pd

from fp4lab.core import paths, records
from fp4lab.report.figures import provenance_line
from fp4lab.report.story import of_kind, story_table

ALTERNATIVES = (
    (
        "FP4 quantize kernels",
        "06_nvfp4_kernels",
        "not in the story's list; the kernels every FP4 layer runs",
    ),
    ("MSCCLPP allreduce", "07_mscclpp_allreduce", "Tier 1, tested next"),
    ("Single Batch Overlap", "08_single_batch_overlap", "Tier 1, tested next"),
)


def _reproduce_status() -> dict[str, dict]:
    return {r["values"]["notebook"]: r["values"] for r in records.latest("reproduce")}


def _not_run(notebook: str, status: dict[str, dict]) -> str:
    s = status.get(notebook)
    if s is None:
        return "not run: no record"
    return (
        f"not run here: {s['reason']}"
        if s["status"] == "skipped"
        else f"{s['status']}: {s['reason']}"
    )


def _pcg_row(status: dict[str, dict]) -> dict:
    fixes = of_kind(records.latest("05_custom_op_fix"), "fix")
    upstream = of_kind(records.latest("05_custom_op_fix"), "upstream_op")
    story = story_table()
    reproduced = (story["reproduced"] == "yes").sum() if "reproduced" in story else 0
    evidence = [f"{reproduced}/3 story crashes reproduced from FlashInfer's code (notebooks 01-03)"]
    if fixes and all(
        f["values"]["signature"] == "ok" and f["values"]["graph_count"] == 1 for f in fixes
    ):
        backends = ", ".join(f["values"]["backend"] for f in fixes)
        state = "UNBLOCKED with a custom op: fullgraph=True, 1 graph, 0 breaks"
        evidence.append(
            f"fp4lab::fp4_quantize compiles to 1 graph / 0 breaks ({backends}); opcheck passes"
        )
    elif fixes:
        state = "BLOCKED: the custom-op fix did not compile (see notebook 05)"
    else:
        state = "UNDECIDED: " + _not_run("05_custom_op_fix", status)
    if upstream:
        u = upstream[0]["values"]
        fi = upstream[0]["provenance"]["packages"].get("flashinfer-python")
        evidence.append(
            f"torch.ops.flashinfer.fp4_quantize in flashinfer {fi}: {u['signature']}, "
            f"{u.get('graph_count')} graph"
            if u.get("present")
            else f"flashinfer {fi} ships no torch.ops.flashinfer.fp4_quantize"
        )
    matrix = of_kind(records.latest("09_version_matrix"), "summary")
    if matrix:
        m = matrix[-1]["values"]
        evidence.append(
            f"version matrix ({', '.join(m['versions_measured'])}): the story's decision holds "
            f"up to {m['story_decision_holds_up_to'] or 'none of them'}; the upstream op removes "
            f"the blocker from {m['upstream_op_unblocks_from'] or 'none of them'}"
        )
    variants = {
        r["values"]["variant"]: r
        for r in of_kind(records.latest("04_fullgraph_false_tradeoff"), "variant")
    }
    if len(variants) == 3:
        eager, breaks, fixed = (
            variants[k]["values"]
            for k in ("eager", "compiled_with_breaks", "compiled_fullgraph_custom_op")
        )
        device = variants["eager"]["provenance"]["device"]
        measured = (
            f"fullgraph=False: {breaks['graph_calls']} graph runs/step for {breaks['layers']} "
            f"layers vs 1 with the fix; step time on {device}: fix {fixed['step_median_ms']:.2f} ms, "
            f"with breaks {breaks['step_median_ms']:.2f} ms, eager {eager['step_median_ms']:.2f} ms"
        )
        graphs = fixed.get("cuda_graph_capture", "")
        measured += (
            ""
            if str(graphs).startswith("ok")
            else f"; CUDA graph replay: {graphs or 'not measured'}"
        )
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
    summary = next((r["values"] for r in reversed(rows) if r["kind"] == "summary"), None)
    if summary:
        state, measured, needs = (
            summary.get("status", "measured"),
            summary.get("headline", ""),
            summary.get("needs", ""),
        )
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
    rows = [_pcg_row(status)] + [
        _alternative_row(name, nb, story, status) for name, nb, story in ALTERNATIVES
    ]
    return pd.DataFrame(rows).set_index("optimization")


def provenance_table() -> pd.DataFrame:
    """Each notebook with records: where its newest run's numbers came from."""
    names = sorted(paths.record_files())
    rows = [
        (name, provenance_line(records.latest(name)[-1]["provenance"]))
        for name in names
        if records.latest(name)
    ]
    return pd.DataFrame(rows, columns=["notebook", "provenance"]).set_index("notebook")


def skipped_table() -> pd.DataFrame:
    """What the last `make reproduce` ran, failed or skipped, and why."""
    rows = records.latest("reproduce")
    if not rows:
        return pd.DataFrame(columns=["notebook", "status", "reason", "seconds"]).set_index(
            "notebook"
        )
    return (
        pd.DataFrame([r["values"] for r in rows])[["notebook", "status", "reason", "seconds"]]
        .drop_duplicates("notebook", keep="last")
        .set_index("notebook")
    )
