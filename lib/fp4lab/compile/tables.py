"""Tables of trace outcomes, blocker chains, the fix, the trade-off and the version matrix."""

from __future__ import annotations

from collections.abc import Iterable

import pandas as pd

from fp4lab.compile.matrix.result import summarize_versions
from fp4lab.core import page


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


def _chain_text(chain: list[dict], stages: dict[str, dict]) -> str:
    """``a [cpu_artefact; every version measured] → b [story; ...] → c``: each blocker with the
    origin of the stage that removed it and the versions that stage was needed on."""
    removed_by = [
        f" [{after['origin']}; {stages[after['stage']]['scope']}]" for after in chain[1:]
    ] + [""]
    return " → ".join(here["signature"] + tag for here, tag in zip(chain, removed_by, strict=False))


FIX_COLUMNS = (
    "backend",
    "signature",
    "graph_count",
    "graph_break_count",
    "kernel",
    "compared_with_itself",
    "bit_equal_to_eager",
    "max_abs_diff_vs_eager",
    "fp4_codes_differing_fraction",
    "output_rms",
    "seconds",
)
TRADEOFF_COLUMNS = (
    "tokens",
    "label",
    "capture_mode",
    "capture",
    "dynamo_graphs",
    "graph_runs_per_step",
    "pieces",
    "piece_runs_per_step",
    "eager_islands_per_step",
    "moved_inputs",
    "moved_weights",
    "matches_eager",
    "ms_median",
    "cpu_step_ms_median",
    "kernel",
)


def fix_table(rows: list[dict]) -> pd.DataFrame:
    """The fix compiled on each backend: graphs, breaks and the output against eager."""
    return pd.DataFrame(rows)[list(FIX_COLUMNS)]


def tradeoff_table(rows: list[dict]) -> pd.DataFrame:
    """Each variant at each token count: capture mode, graphs, pieces and eager islands per step,
    inputs moved since capture, the output check, GPU ms per step (CPU timings apart)."""
    table = pd.DataFrame(rows)
    table = table[[c for c in TRADEOFF_COLUMNS if c in table]]
    return table.astype(object).where(table.notna(), "")  # a variant without the measure


def sglang_backend_table(rows: list[dict]) -> pd.DataFrame:
    """Each release, variant and token count under SGLang's own backend: graphs and pieces, the
    replayed step's distance from the uncaptured one and from eager (or the error SGLang raised in
    it), the pieces that replayed a capture made for another layer, and debug mode's check."""

    def shared(r: dict) -> str:
        return "; ".join(f"graph {e['graph']} {e['piece']}: layer {e['layers']} replays layer "
                         f"{e['captured_for']}'s" for e in r.get("replays_of_another_layer", [])) or "none"  # fmt: skip

    def debug(r: dict) -> str:
        found = r.get("debug_mode")
        if found is None:
            return "(first token count only)"
        return (
            f"{found['assertion'][:60]}... ({found['during']})" if found["assertion"] else "passes"
        )

    def number(r: dict, key: str) -> str:
        return f"{r[key]:.3g}" if key in r else "-"

    return pd.DataFrame([{
        "SGLang": r["sglang_version"], "variant": r["variant"], "tokens": r["tokens"],
        "capture": r["capture"], "dynamo graphs": r["dynamo_graphs"], "pieces": r["pieces"],
        "replayed step": f"failed: {r['replay_error']}" if "replay_error" in r else "ran",
        "replays per step": r.get("replays", "-"), "pieces run uncaptured": r.get("ran_uncaptured", "-"),
        "max |replay - uncaptured|": number(r, "max_abs_vs_uncaptured"),
        "max |replay - eager|": number(r, "max_abs_vs_eager"), "max |eager|": number(r, "max_abs_eager"),
        "inputs moved since capture": r.get("moved_inputs", "-"),
        "replays of another layer's capture": shared(r), "debug mode": debug(r),
    } for r in rows])  # fmt: skip


def version_table(results: list[object]) -> object:
    """The version matrix, eight short columns, one row per FlashInfer version: its environment,
    the story patches it needed, the upstream op and fp4lab's, what the upstream op forwards, the
    verdict; the blockers in order are ``version_chains_table``'s."""
    rows = [_as_record(r) for r in results]

    def op(found: dict) -> str:
        if not found.get("present", True):
            return "absent"
        return (
            f"{found.get('signature')}, {found.get('graph_count')} graph"
            if found
            else "not measured"
        )

    return page.table(pd.DataFrame([{
        "version": r["version"],
        "environment": f"{r['env']} ({r['install_seconds']:.0f} s)" + (f": {r['error']}" if r["error"] else ""),
        "story patches needed": ", ".join(r["story_patches_needed"]) or "",
        "torch.ops.flashinfer.fp4_quantize": op(r["upstream_op"]) if r["env"] != "failed" else "",
        "it forwards enable_pdl as is_global_scale_inversed": r["upstream_op_forwarding"] or "",
        "fp4lab custom op": op(r["fp4lab_op"]) if r["env"] != "failed" else "",
        "verdict": r["verdict"], "story's decision holds": r["story_decision_holds"],
    } for r in rows]))  # fmt: skip


def version_chains_table(results: list[object]) -> object:
    """Each FlashInfer version's blockers in order, with the origin of the patch that removed each
    and the versions it was needed on; its wheel and environment sizes and how it imported."""
    rows = [_as_record(r) for r in results]
    stages = summarize_versions(results)["stages_across_versions"]
    return page.table(pd.DataFrame([{
        "version": r["version"],
        "blockers in order [origin of the patch that removed it; where needed]": _chain_text(r["chain"], stages),
        "wheel MB": round(r["wheel_bytes"] / 2**20, 1) if r["wheel_bytes"] else "",
        "env GB": round(r["env_bytes"] / 2**30, 2) if r["env_bytes"] else "",
        "import on CPU torch": "needed simulated device properties" if r.get("import_staging") else "plain",
    } for r in rows]))  # fmt: skip
