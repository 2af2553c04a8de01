"""The replay's answer as a timeline per SM: runs of consecutive releases with one outcome, the
first release in which the model (GLM-5 in notebook 11) compiles, any in which it stops again,
the prefill graph each release gives with no flag (its own resolution), and what a user should
run.

Releases are in release order (``versions.order``).
"""

from __future__ import annotations

from fp4lab.serving.replay import decide, versions
from fp4lab.serving.replay.shared import flags

STORY_WORDS = {
    "subprocess": "FlashInfer's FP4 quantize JIT (the story's nvcc subprocess)",
    "file_io": "FlashInfer's FP4 quantize JIT (the story's file I/O)",
    "compiler_disable_under_fullgraph": "the story's torch.compiler.disable under fullgraph",
}
"""The story's blocker signatures, in words."""


def state(row: dict) -> str:
    """One cell in a few words: the outcome and what decided it (the first blocker, the flag,
    the reason it is not applicable, the harness frame that failed)."""
    if row["outcome"] == "blocked":
        return f"blocked at {STORY_WORDS.get(row['blocked_at'], row['blocked_at'])}"
    if row["outcome"] == "compiles":
        return f"compiles with {row['flag']}" if row["flag"] != "none needed" else "compiles"
    if row["outcome"] == "wrong output":
        return "compiles, does NOT equal eager"
    if row["outcome"] == "kernel unavailable":
        return f"kernel unavailable: {', '.join(row['kernels_missing'])}"
    if row["outcome"] == "not measured":
        return f"not measured (harness: {row.get('harness_frame') or 'see note'})"
    return f"not applicable ({row['why_short']})"


def runs(rows: list[dict], sm: str) -> list[dict]:
    """The releases of ``sm`` in release order, grouped into runs of one state."""
    mine = sorted(
        (r for r in rows if r["sm"] == sm), key=lambda r: versions.order(r["sglang_version"])
    )
    grouped: list[dict] = []
    for row in mine:
        said = state(row)
        if grouped and grouped[-1]["state"] == said:
            grouped[-1]["to"] = row["sglang_version"]
            grouped[-1]["releases"].append(row["sglang_version"])
        else:
            grouped.append({"sm": sm, "from": row["sglang_version"], "to": row["sglang_version"],
                            "releases": [row["sglang_version"]], "outcome": row["outcome"],
                            "state": said})  # fmt: skip
    return grouped


def captured_runs(rows: list[dict], sm: str, graph: str) -> list[dict]:
    """The releases of ``sm`` with the captured prefill graph ``graph`` (``flags.CAPTURED``), in
    release order, in runs of one outcome (``breakable_outcome.fields``)."""
    grouped: list[dict] = []
    for row in sorted((r for r in rows if r["sm"] == sm and r.get(graph) not in
                       (None, "not applicable")), key=lambda r: versions.order(r["sglang_version"])):  # fmt: skip
        if grouped and grouped[-1]["outcome"] == row[graph]:
            grouped[-1]["to"] = row["sglang_version"]
        else:
            grouped.append({"from": row["sglang_version"], "to": row["sglang_version"],
                            "outcome": row[graph]})  # fmt: skip
    return grouped


def defaults(rows: list[dict], sm: str) -> list[dict]:
    """The releases of ``sm`` in release order, grouped into runs of one default prefill graph
    (what the release resolves with no flag; None where its resolution was not recorded)."""
    mine = sorted(
        (r for r in rows if r["sm"] == sm), key=lambda r: versions.order(r["sglang_version"])
    )
    grouped: list[dict] = []
    for row in mine:
        graph = row.get("default_prefill")
        if grouped and grouped[-1]["default_prefill"] == graph:
            grouped[-1]["to"] = row["sglang_version"]
        else:
            grouped.append({"sm": sm, "from": row["sglang_version"], "to": row["sglang_version"],
                            "default_prefill": graph, "rule": row.get("default_rule")})  # fmt: skip
    return grouped


def turning_points(rows: list[dict], sm: str) -> dict:
    """The first release in which GLM-5 compiles on ``sm``, and the first after it in which it
    is measured again and does not (None where there is none)."""
    measured = [r for r in sorted(rows, key=lambda r: versions.order(r["sglang_version"]))
                if r["sm"] == sm and r["outcome"] in decide.MEASURED]  # fmt: skip
    first = next((r for r in measured if r["outcome"] == "compiles"), None)
    after = measured[measured.index(first) + 1 :] if first else []
    stops = next((r for r in after if r["outcome"] != "compiles"), None)
    return {"first_compiles": first and first["sglang_version"],
            "stops_again": stops and stops["sglang_version"],
            "stops_at": stops and state(stops)}  # fmt: skip


def recommended(rows: list[dict], sm: str) -> dict | None:
    """The cell ``recommendation`` names for ``sm``: the newest release that compiles as released,
    else the newest whose blockers fp4lab's patch removes (compiles, equals eager); None."""
    mine = sorted(
        (r for r in rows if r["sm"] == sm), key=lambda r: versions.order(r["sglang_version"])
    )
    compiles = [r for r in mine if r["outcome"] == "compiles"]
    patched = [r for r in mine if r["outcome"] == "blocked" and r["compiles_with_patch"]
               and r["equals_eager"]]  # fmt: skip
    return (compiles or patched or [None])[-1]


def newest_measured(rows: list[dict], sm: str) -> dict | None:
    """The newest release's cell of ``sm`` whose model was traced and run (None: none was)."""
    measured = [r for r in rows if r["sm"] == sm and r["outcome"] in decide.MEASURED]
    return max(measured, key=lambda r: versions.order(r["sglang_version"]), default=None)


KERNEL_CHOICES = ("attention_backend", "dsa_prefill_backend", "dsa_decode_backend",
                  "nsa_prefill_backend", "nsa_decode_backend", "moe_runner_backend",
                  "fp4_gemm_runner_backend", "kv_cache_dtype")  # fmt: skip
"""The kernel choices of a release's resolution a recommendation names."""


def kernels(row: dict | None) -> str:
    """A cell's resolved kernel backends and KV cache dtype, the reached kernels its SM lacks or
    may lack by name, the others counted, in a few words; '' where none was recorded."""
    chosen = (row or {}).get("kernel_backends") or {}
    said = ", ".join(f"{k.removesuffix('_backend')}={chosen[k]}" for k in KERNEL_CHOICES
                     if chosen.get(k) not in (None, "auto"))  # fmt: skip
    found = (row or {}).get("kernels")
    if found is None:
        return said + ("; availability not recorded" if said else "")
    read = [k for k in found if k["library"]]
    named = {answer: ", ".join(dict.fromkeys(k["kernel"].removeprefix("FlashInfer ") for k in read
                                             if k["available"] == answer))
             for answer in ("no", "unknown")}  # fmt: skip
    has = len({k["kernel"] for k in read if k["available"] == "yes"})
    parts = (said, named["no"] and f"lacks {named['no']}",
             named["unknown"] and f"unknown: {named['unknown']}", has and f"{has} available",
             len(found) > len(read) and f"{len(found) - len(read)} more with no arch evidence read")  # fmt: skip
    return "; ".join(p for p in parts if p)


def _flag_words(flag: str | None) -> str:
    """A cell's flag as a recommendation says it: "no flag" where none is needed, else quoted."""
    return "no flag" if flag in (flags.NEEDED, None) else f"`{flag}`"


def _captured_pick(rows: list[dict], sm: str) -> tuple[dict, str, str] | None:
    """The newest release whose captured prefill graphs work for the model on ``sm``, the
    release's default graph first where both work: its cell, the graph and its flag in words."""
    works = [(r, g) for r in rows if r["sm"] == sm for g in flags.CAPTURED if r.get(g) == "works"]
    if not works:
        return None
    r, graph = max(works, key=lambda w: (versions.order(w[0]["sglang_version"]),
                                         w[0].get("default_prefill") == w[1]))  # fmt: skip
    return r, graph, _flag_words(r[f"{graph}_flag"])


def captured_recommendation(rows: list[dict], sm: str) -> str | None:
    """``_captured_pick`` in words (captured and replayed equal to eager, simulated); None where
    no captured graph works."""
    picked = _captured_pick(rows, sm)
    if picked is None:
        return None
    r, graph, flag = picked
    risk = r.get(f"{graph}_weak_refs_at_risk")
    return (f"SGLang {r['sglang_version']} with {flag} ({graph} graphs: captured and replayed "
            f"equal to eager in a simulated capture"
            + (f"; but its breaks hold {risk} tensors by weak reference only, memory a GPU's "
               f"graph pool gives to a later bucket: sglang#37606" if risk else "") + ")")  # fmt: skip


def to_run(rows: list[dict], sm: str) -> str:
    """``recommendation`` in a few words, for a table cell: the release, its flag and the prefill
    graph."""
    picked = _captured_pick(rows, sm)
    if picked is not None:
        r, graph, flag = picked
        risk = "; weak-referenced break inputs, sglang#37606" if r.get(
            f"{graph}_weak_refs_at_risk") else ""  # fmt: skip
        return f"SGLang {r['sglang_version']}, {flag} ({graph}{risk})"
    r = recommended(rows, sm)
    if r is None:
        return "none measured here works"
    patched = "" if r["outcome"] == "compiles" else " + fp4lab's patch"
    return f"SGLang {r['sglang_version']}, {_flag_words(r['flag'])}{patched} (tc_piecewise)"


def recommendation(rows: list[dict], sm: str, model: str = "GLM-5") -> str:
    """What the model's user on ``sm`` should run: the newest release whose captured graphs
    (breakable or full) work, where one does; then for torch.compile piecewise graphs the newest
    release in which it compiles as released, with its flag; else the newest release whose
    blockers fp4lab's patch removes (compiles, equals eager); else that none is known."""
    captured = captured_recommendation(rows, sm)
    traced = _traced_recommendation(rows, sm, model)
    return f"{captured}; tc_piecewise: {traced}" if captured else traced


def _traced_recommendation(rows: list[dict], sm: str, model: str) -> str:
    r = recommended(rows, sm)
    if r is not None and r["outcome"] == "compiles":
        flag = _flag_words(r["flag"])
        given = (
            f"; with no flag it gives {r['default_prefill']}"
            if r.get("default_prefill") and r["default_prefill"] != "tc_piecewise"
            else ""
        )
        return (f"SGLang {r['sglang_version']} with {flag} (tc_piecewise compiles as released, "
                f"equals eager{given})")  # fmt: skip
    if r is not None:
        config = f" --config models/{r['model']}" if r.get("model") else ""
        return (f"SGLang {r['sglang_version']} with `{r['flag']}` and fp4lab's patch "
                f"({'+'.join(r['patch'])}: `python -m fp4lab.serving.replay --sglang "
                f"{r['sglang_version']} --sm {sm} --write-patch DIR{config}`)")  # fmt: skip
    lacking = [r for r in rows if r["sm"] == sm and r["outcome"] == "kernel unavailable"]
    if lacking:
        newest = max(lacking, key=lambda r: versions.order(r["sglang_version"]))
        return (f"no release measured here lets {model} through torch.compile piecewise graphs "
                f"on SM{sm}; SGLang {newest['sglang_version']} traces through but reaches "
                f"{', '.join(newest['kernels_missing'])}, which does not exist for SM{sm} "
                f"(no backend flag that avoids it was measured)")  # fmt: skip
    return f"no release measured here lets {model} through torch.compile piecewise graphs"


def sentence(rows: list[dict], sm: str, model: str = "GLM-5") -> str:
    """One sentence per SM: its runs, the turning points and the recommendation."""
    said = "; ".join(f"{versions.span(g['from'], g['to'])} {g['state']}" for g in runs(rows, sm))
    given = "; ".join(f"{versions.span(g['from'], g['to'])} {g['default_prefill'] or 'unknown'}"
                      for g in defaults(rows, sm))  # fmt: skip
    points = turning_points(rows, sm)
    first = (f"first compiles in {points['first_compiles']}" if points["first_compiles"]
             else "compiles in no measured release")  # fmt: skip
    again = (f", stops again in {points['stops_again']} ({points['stops_at']})"
             if points["stops_again"] else "")  # fmt: skip
    return (f"SM{sm}: {said}. {model} {first}{again}. By default the release gives: {given}. "
            f"Run: {recommendation(rows, sm, model)}.")  # fmt: skip


def text(rows: list[dict]) -> str:
    """Every SM's sentence, one per line."""
    return "\n".join(sentence(rows, sm) for sm in dict.fromkeys(r["sm"] for r in rows))


def timeline(rows: list[dict], model: str = "GLM-5") -> dict:
    """Per SM: its runs, turning points, captured graphs' runs, recommendation and sentence, for the
    records."""
    return {
        sm: {"runs": runs(rows, sm), "defaults": defaults(rows, sm), **turning_points(rows, sm),
             **{f"{g}_runs": captured_runs(rows, sm, g) for g in flags.CAPTURED},
             "kernels": kernels(recommended(rows, sm) or newest_measured(rows, sm)),
             "recommendation": recommendation(rows, sm, model), "run": to_run(rows, sm),
             "sentence": sentence(rows, sm, model)}
        for sm in dict.fromkeys(r["sm"] for r in rows)
    }  # fmt: skip


def what(r: dict) -> str:
    """One cell in a few words: its outcome, blocker and what the patch gave."""
    if r["outcome"] == "blocked":
        if not r["compiles_with_patch"]:
            return f"blocked at {r['blocked_at']}"
        same = "equals" if r["equals_eager"] else "differs from"
        return f"blocked at {r['blocked_at']}; patch {'+'.join(r['patch'])}: compiles, {same} eager"
    if r["outcome"] in ("not applicable", "not measured"):
        return f"{r['outcome']} ({decide.short(r['note'])})"
    if r["outcome"] == "kernel unavailable":
        return f"kernel unavailable: {', '.join(r['kernels_missing'])}"
    return "compiles as released"


def compact(rows: list[dict]) -> list[str]:
    """One line per release, SMs with the same outcome grouped: the decision report's quote."""
    lines = []
    for version in dict.fromkeys(r["sglang_version"] for r in rows):
        groups: dict[str, list[str]] = {}
        mine = [r for r in rows if r["sglang_version"] == version]
        for r in mine:
            said = f"{what(r)} [{', '.join(r['evidence']) or 'no evidence'}]; MoE: {r['moe']}"
            groups.setdefault(said, []).append(f"SM{r['sm']}")
        said = "; ".join(f"{'/'.join(sms)} {cell}" for cell, sms in groups.items())
        model = (
            next((r["model_class"] for r in mine if r["model_class"]), None) or "model not built"
        )
        lines.append(f"SGLang {version} ({model.split('.')[-1]}): GLM-5 flag: {mine[0]['flag']} "
                     f"({mine[0]['flag_why']}); {said}")  # fmt: skip
    return lines


def tally(rows: list[dict]) -> str:
    """The cells in one line: how many of each outcome, and each kind of harness failure (its
    frame) with its count."""
    import collections

    outcomes = collections.Counter(r["outcome"] for r in rows)
    failures = collections.Counter(r.get("harness_frame") or "no frame" for r in rows
                                   if r["outcome"] == "not measured")  # fmt: skip
    said = ", ".join(f"{outcomes[o]} {o}" for o in decide.OUTCOMES if outcomes[o])
    failed = "; ".join(f"{n} at {frame}" for frame, n in failures.most_common())
    return f"{len(rows)} cells: {said}" + (f"; not measured: {failed}" if failed else "")
