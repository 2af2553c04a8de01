"""Notebook 11's and 14's tables: the decision per release and SM, its timeline, the prefill
graph each release gives with no flag, the kernels reached and their availability, upstream's
facts next to the replay, the stand-ins and FlashInfer's FP4 calls; every row, no index."""

from __future__ import annotations

import html

from fp4lab.core import page, records
from fp4lab.serving.replay import decide, timeline, upstream, versions
from fp4lab.serving.replay.shared import flags

PART_SHORT = {"fp4_quantize_op": "fp4 op", "dsa_indexer_split_op": "indexer split",
              "dsa_attention_split_op": "DSA attn split", "musa_probe_constant": "musa const"}  # fmt: skip


def patch_text(row: dict) -> str:
    """What fp4lab's patch gave a blocked cell, in a few words ('' where none was tried)."""
    if not row["patch"]:
        return ""
    done = "compiles" if row["compiles_with_patch"] else "still blocked"
    done += ", = eager" if row["compiles_with_patch"] and row["equals_eager"] else ""
    return f"{' + '.join(PART_SHORT.get(p, p) for p in row['patch'])}: {done}"


def captured_text(row: dict) -> str:
    """The captured graphs' outcomes of a row in a few words: "breakable / full" outcomes ('' where
    the release has neither)."""
    said = [row.get(g) or "" for g in flags.CAPTURED]
    return "" if all(s in ("", "not applicable") for s in said) else " / ".join(said)


def table(rows: list[dict]) -> object:
    """The decision per release and SM, nine short columns, every row, no index: what the
    release gives with no flag, the flag that reaches tc_piecewise, its outcome, breakable's and
    full's (captured and replayed), tc_piecewise's first blocker, what the patch gave, and
    why."""
    import pandas as pd

    return page.table(pd.DataFrame([
        {"release": r["sglang_version"], "SM": r["sm"], "with no flag": r.get("default_prefill") or "",
         "flag for tc_piecewise": r["flag"], "tc_piecewise": r["outcome"],
         "breakable / full": captured_text(r),
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
    release's evidence; then a row per model and SM naming, folded, the reached kernels with
    none read."""
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
    ]), raw=("evidence",))  # fmt: skip


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
                last |= {"to": r["sglang_version"], "evidence": html.escape(k["evidence"])}
            else:
                last = {"model": r.get("model"), "SM": r["sm"], "kernel": kernel,
                        "from": r["sglang_version"], "to": r["sglang_version"], "said": said,
                        "evidence": html.escape(k["evidence"])}  # fmt: skip
                found.append(last)
    unread = sorted({k["kernel"] for r in mine for k in r.get("kernels") or [] if not k["library"]})
    if unread:
        found.append({"model": mine[0].get("model"), "SM": mine[0]["sm"],
                      "kernel": f"{len(unread)} more, no arch evidence read", "from": "", "to": "",
                      "said": ("unknown", "reached"),
                      "evidence": page.details(f"which {len(unread)}", ", ".join(unread))})  # fmt: skip
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


def matrix_table(rows: list[dict]) -> object:
    """Notebook 14's cells, every row, no index: model, release, SM, the flag for tc_piecewise,
    its outcome, the breakable and full outcomes (captured and replayed), the blockers with dynamo's
    graph-break codes, what the patch gave, why."""
    import pandas as pd

    return page.table(pd.DataFrame([
        {"model": r["model"], "release": r["sglang_version"], "SM": r["sm"],
         "flag for tc_piecewise": r["flag"], "tc_piecewise": r["outcome"],
         "breakable / full": captured_text(r),
         "blockers": "; ".join(map(decide.blocker_text, r["blocker_frames"])),
         "patch": patch_text(r), "why": r["why_short"] if r["outcome"] != "blocked" else ""}
        for r in rows
    ]))  # fmt: skip


def _break_name(frame: str) -> str:
    """A break's function in a few words: ``file.py:name`` of its ``file:line:name``, or an op."""
    parts = frame.split(":")
    return f"{parts[0].rsplit('/', 1)[-1]}:{parts[-1]}" if len(parts) == 3 else frame


def breaks_table(rows: list[dict]) -> object:
    """Per model (where the rows have several), SM and captured graph, each run of releases with
    one capture shape: the segments and breaks of the largest plain bucket, per forward and per
    decoder layer, and the functions the breaks run; every row, no index."""
    import pandas as pd

    found: dict[tuple, list[str]] = {}
    for r in sorted(rows, key=lambda r: versions.order(r["sglang_version"])):
        for graph in flags.CAPTURED:
            if r.get(f"{graph}_segments") is None:
                continue
            shape = (r.get("model", ""), r["sm"], graph, r[f"{graph}_segments"],
                     r.get(f"{graph}_break_count"), r.get(f"{graph}_breaks_per_layer"),
                     ", ".join(map(_break_name, r[f"{graph}_breaks"])))  # fmt: skip
            found.setdefault(shape, []).append(r["sglang_version"])
    named = len({r.get("model") for r in rows}) > 1
    return page.table(pd.DataFrame([
        {**({"model": s[0]} if named else {}), "SM": s[1], "graph": s[2],
         "releases": versions.ranges(found[s]), "segments": s[3],
         "breaks": "" if s[4] is None else s[4], "per layer": "" if s[5] is None else s[5],
         "the breaks run": s[6]}
        for s in sorted(found, key=lambda s: (s[0], float(s[1]), s[2]))
    ]))  # fmt: skip
