"""The decision table: the story's todo list re-decided from the records in data/.

Nothing here runs an experiment; every number shown comes from a record."""

from __future__ import annotations

import pandas as pd

from fp4lab.core import evidence, paths, records
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
    (
        "FlashInfer FP4 API under fullgraph=True",
        "12_fp4_api_audit",
        "not in the story's list; every FP4 call a piecewise runner meets",
    ),
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


def _fix_state(fixes: list[dict], variants: dict[str, dict], status: dict[str, dict]) -> str:
    """The piecewise-CUDA-graph status, at the evidence level its records reached."""
    if not fixes:
        return "UNDECIDED: " + _not_run("05_custom_op_fix", status)
    if not all(f["values"]["signature"] == "ok" and f["values"]["graph_count"] == 1 for f in fixes):
        return "BLOCKED: the custom-op fix did not compile (see notebook 05)"
    levels = sorted(
        {lv for r in fixes + list(variants.values()) for lv in r["values"].get("evidence") or []}
    )
    prov = fixes[0]["provenance"]
    how = evidence.describe(levels, prov["device"], prov["target_sm"], prov["simulated"])
    replayed = "cuda_graph_replay" in levels and "real_fp4_kernel" in levels
    level = "in a CUDA graph with the real FP4 kernel" if replayed else "at compile level"
    return f"UNBLOCKED {level} with a custom op: fullgraph=True, 1 graph, 0 breaks ({how})"


def _story_evidence() -> str:
    story = story_table()
    reproduced = (story["reproduced"] == "yes").sum() if "reproduced" in story else 0
    text = f"{reproduced}/3 story crashes reproduced at trace time (notebooks 01-03)"
    verdict = of_kind(records.latest("02_file_io_trace"), "verdict")
    others = verdict[-1]["values"].get("other_patches") if verdict else None
    if others:
        text += f"; the file-I/O crash was reached only after {', '.join(others)} (not the story's)"
    disable = of_kind(records.latest("03_compiler_disable_fullgraph"), "attempt")
    if disable and disable[-1]["values"].get("depends_on_flashinfer") is False:
        text += (
            "; the compiler.disable rejection needs no FlashInfer (a plain function fails alike)"
        )
    return text


def _opcheck_evidence() -> str:
    rows = of_kind(records.latest("05_custom_op_fix"), "opcheck")
    if not rows:
        return "opcheck: no record"
    v = rows[-1]["values"]
    run, failed = v.get("tests_run") or [], v.get("failed") or []
    return f"opcheck: {len(run) - len(failed)}/{len(run)} tests pass" + (
        f" (failed: {', '.join(failed)})" if failed else ""
    )


def _sglang_state() -> str | None:
    """Notebook 11's decision per SGLang release and SM, or None without its records."""
    rows = of_kind(records.latest("11_sglang_piecewise_replay"), "summary")
    if not rows:
        return None
    v = rows[-1]["values"]
    text = (
        "per SGLang release x SM (notebook 11, SGLang's own install_torch_compiled; trace on "
        "CPU, SM simulated): " + " | ".join(v.get("by_version") or [])
    )
    if v.get("sm120_specific_0_5_9"):
        text += (
            "; in 0.5.9 only SM120 took flashinfer.fp4_quantize directly: the story's crash "
            "path was SM120-specific"
        )
    return text


def _pcg_row(status: dict[str, dict]) -> dict:
    fixes = of_kind(records.latest("05_custom_op_fix"), "fix")
    upstream = of_kind(records.latest("05_custom_op_fix"), "upstream_op")
    variants = {
        r["values"]["variant"]: r
        for r in of_kind(records.latest("04_fullgraph_false_tradeoff"), "variant")
    }
    state = _fix_state(fixes, variants, status)
    notes = [_story_evidence(), _opcheck_evidence()]
    sglang = _sglang_state()
    if sglang:  # SGLang's own answer is the status; fp4lab's custom-op result becomes evidence
        notes.insert(0, state)
        state = sglang
    if fixes:
        f = fixes[0]["values"]
        same = " (both sides ran the same kernel)" if f.get("compared_with_itself") else ""
        notes.append(f"the op ran {f.get('kernel', 'an unrecorded kernel')}{same}")
    if upstream:
        u = upstream[0]["values"]
        fi = upstream[0]["provenance"]["packages"].get("flashinfer-python")
        notes.append(
            f"torch.ops.flashinfer.fp4_quantize in flashinfer {fi}: {u['signature']}, "
            f"{u.get('graph_count')} graph"
            + (", compared with itself on this machine" if u.get("compared_with_itself") else "")
            if u.get("present")
            else f"flashinfer {fi} ships no torch.ops.flashinfer.fp4_quantize"
        )
    matrix = of_kind(records.latest("09_version_matrix"), "summary")
    if matrix:
        ranges = matrix[-1]["values"].get("verdict_ranges") or {}
        notes.append(
            "version matrix: "
            + "; ".join(f"{verdict}: {', '.join(vs)}" for verdict, vs in ranges.items() if vs)
        )
    evidence_text = "; ".join(notes)
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
        "evidence": evidence_text,
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


def passed_over_table() -> pd.DataFrame:
    """Runs newer than the one each notebook's numbers come from (``records.latest``): when they
    ran, how many records they wrote, why they were passed over, and what `make reproduce` said
    of the notebook last."""
    status = _reproduce_status()
    rows = [
        {
            "notebook": name,
            "started (UTC)": run["time_utc"],
            "records": run["records"],
            "passed over because": run["why"],
            "make reproduce said": ": ".join(
                str(status[name][k]) for k in ("status", "reason") if status[name][k]
            )
            if name in status
            else "",
        }
        for name in sorted(paths.record_files())
        for run in records.newer_runs(name)
    ]
    columns = ["notebook", "started (UTC)", "records", "passed over because", "make reproduce said"]
    return pd.DataFrame(rows, columns=columns).set_index("notebook")


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
