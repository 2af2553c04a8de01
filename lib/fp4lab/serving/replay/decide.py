"""The decision re-decided per SGLang version and SM, from what each version's records say.

For each (version, SM): the quantize SGLang's NVFP4 linear method took there, what compiling
that path through SGLang's own backend gave (blocked at which of the story's signatures, or
compiled through which op, with SGLang's graph and piecewise counts), and the piecewise flag
the release's own ``server_args.py`` offers.
"""

from __future__ import annotations

from fp4lab.core import evidence, glm5

STORY_SIGNATURES = ("subprocess", "file_io", "compiler_disable_under_fullgraph")
"""The story's three blockers (nvcc query, the JIT's file I/O, the compiler.disable patch)."""

OUTCOMES = ("blocked", "compiles", "not applicable", "not traceable here", "not measured")


def glm5_flags(options: list[dict], auto_disabled: bool) -> tuple[list[str] | None, str]:
    """The options a GLM-5 user passes to this release's server to get torch.compile piecewise
    graphs, read from its own parser (help texts, choices, defaults) and its auto-disable rule;
    None with the reason where no option reaches them."""
    spelled = {name: o for o in options for name in o["options"]}

    def live(flag: str) -> bool:
        return flag in spelled and not spelled[flag]["help"].lower().startswith("deprecated")

    prefill = spelled.get("--cuda-graph-backend-prefill")
    if prefill:
        choices = prefill.get("choices") or []
        if "tc_piecewise" not in choices:
            return None, (f"the release removed torch.compile piecewise graphs: "
                          f"--cuda-graph-backend-prefill takes {'|'.join(choices)}")  # fmt: skip
        flags = [] if prefill.get("default") == "tc_piecewise" else [
            "--cuda-graph-backend-prefill", "tc_piecewise"
        ]  # fmt: skip
        how = (
            f"the parser's default prefill backend is {prefill['default']}"
            if prefill.get("default")
            else "the parser leaves the prefill backend unset: tc_piecewise is asked for"
        )
    elif live("--enable-piecewise-cuda-graph"):
        flags, how = ["--enable-piecewise-cuda-graph"], "off unless enabled"
    elif "--enable-piecewise-cuda-graph" in spelled or "--disable-piecewise-cuda-graph" in spelled:
        flags, how = [], "on by default (the enable option is deprecated)"
    else:
        return None, "the release's parser has no piecewise CUDA graph option"
    if auto_disabled:
        if not live("--enforce-piecewise-cuda-graph"):
            return (
                None,
                f"{glm5.ARCHITECTURE} is on the release's auto-disable list, and no option overrides it",
            )
        flags.append("--enforce-piecewise-cuda-graph")
        how += f"; {glm5.ARCHITECTURE} is on the release's auto-disable list"
    return flags, how


def blockers(chain: list[dict]) -> list[str]:
    """The story's signatures met in a chain, in order."""
    return [r["signature"] for r in chain if r["signature"] in STORY_SIGNATURES]


def cell(version: str, sm: str, selection: dict, replay: dict) -> dict:
    """One (version, SM) row of the decision table."""
    kind = selection.get("implementation", "none")
    chain = selection.get("chain", [])
    final = chain[-1] if chain else {}
    levels = evidence.of_values(chain)
    disabled = selection.get("glm5_auto_disabled") or {}
    flags, how = glm5_flags(selection.get("piecewise_options", []), bool(disabled.get("disabled")))
    row = {"sglang_version": version, "sm": sm, "quantize": kind,
           "quantize_object": selection.get("object"), "fake_registered": selection.get("fake_registered"),
           "flag": " ".join(flags) if flags else ("none needed" if flags == [] else "none reaches it"),
           "flag_why": how, "glm5_auto_disabled": disabled, "blocked_at": None, "compiles_through": None,
           "graphs": None, "piecewise_graphs": None, "evidence": levels}  # fmt: skip
    if selection.get("error") or selection.get("import_error"):
        why = selection.get("error") or selection.get("import_error")
        return {**row, "outcome": "not measured", "note": why}
    if flags is None:
        return {**row, "outcome": "not applicable", "note": how}
    if kind == "sgl_kernel_op" and not selection.get("op_exists"):
        return {**row, "outcome": "not traceable here",
                "note": "sgl_kernel's op library is a CUDA-only binary: its op does not exist on CPU"}  # fmt: skip
    if not chain:
        return {**row, "outcome": "not traceable here",
                "note": f"{selection.get('object')} ({kind}) was not traced: fp4lab traces FlashInfer's "
                "function and registered ops"}  # fmt: skip
    if final.get("signature") == "ok":
        counter = final.get("sglang_counter", {})
        return {**row, "outcome": "compiles", "compiles_through": selection.get("object"),
                "graphs": counter.get("num_graphs_seen"),
                "piecewise_graphs": counter.get("num_piecewise_graphs_seen"), "note": ""}  # fmt: skip
    met = blockers(chain) or [final.get("signature")]
    op = (
        replay.get("sglang_op", {})
        if replay.get("sglang_op", {}).get("signature") == "ok"
        else replay.get("fp4lab_op", {})
    )
    fix = op.get("op") if op.get("signature") == "ok" else None
    return {**row, "outcome": "blocked", "blocked_at": met[0], "compiles_through": fix,
            "graphs": op.get("sglang_counter", {}).get("num_graphs_seen") if fix else None,
            "piecewise_graphs": op.get("sglang_counter", {}).get("num_piecewise_graphs_seen") if fix else None,
            "note": f"chain: {' -> '.join(r['signature'] for r in chain)}" + (
                "" if fix else f"; with a wrapped op: {op.get('cause') or op.get('message')}")}  # fmt: skip


def sm120_specific(rows: list[dict], version: str) -> bool | None:
    """Whether, in ``version``, only SM120 takes FlashInfer's quantize directly (None: unknown)."""
    mine = {r["sm"]: r["quantize"] for r in rows if r["sglang_version"] == version}
    if "12.0" not in mine or len(mine) < 2 or "none" in mine.values():
        return None
    others = [kind for sm, kind in mine.items() if sm != "12.0"]
    return mine["12.0"] == "flashinfer_direct" and "flashinfer_direct" not in others


def compact(rows: list[dict]) -> list[str]:
    """One line per version, SMs with the same outcome grouped: the decision report's quote."""
    lines = []
    for version in dict.fromkeys(r["sglang_version"] for r in rows):
        groups: dict[str, list[str]] = {}
        for r in (r for r in rows if r["sglang_version"] == version):
            if r["outcome"] == "blocked":
                what = f"blocked at {r['blocked_at']} ({r['quantize']})"
            elif r["outcome"] == "compiles":
                what = f"compiles through {r['compiles_through']}"
            elif r["outcome"] == "not applicable":
                what = f"not applicable ({r['note']})"
            else:
                what = f"{r['quantize']}: {r['outcome']}"
            groups.setdefault(what, []).append(f"SM{r['sm']}")
        said = "; ".join(f"{'/'.join(sms)} {what}" for what, sms in groups.items())
        first = rows[[r["sglang_version"] for r in rows].index(version)]
        lines.append(f"SGLang {version}: {said}; GLM-5 flag: {first['flag']} ({first['flag_why']})")
    return lines


def decision(rows: list[dict]) -> dict:
    """The decision report's verdict, number and why over every (release, SM) traced where a
    GLM-5 user can reach torch.compile piecewise graphs."""
    traced = [r for r in rows if r["outcome"] in ("blocked", "compiles")]
    blocked = [f"{r['sglang_version']} SM{r['sm']}" for r in rows if r["outcome"] == "blocked"]
    through = sorted({str(r["compiles_through"]) for r in rows if r["outcome"] == "compiles"})
    unreachable = sorted({r["sglang_version"] for r in rows if r["outcome"] == "not applicable"})
    if not traced:
        return {"verdict": "NOT APPLICABLE" if unreachable else "UNMEASURED",
                "number": "no release x SM traced here",
                "why": "no release's quantize could be traced on this machine"}  # fmt: skip
    verdict = (
        "UNBLOCKED"
        if not blocked
        else "BLOCKED"
        if len(blocked) == len(traced)
        else "PARTLY BLOCKED"
    )
    why = (f"traced through each release's own install_torch_compiled on fp4lab's stand-in layer; "
           f"blocked where FlashInfer's quantize is called directly ({', '.join(blocked) or 'nowhere'}), "
           f"compiles through {', '.join(through) or 'nothing'}")  # fmt: skip
    if unreachable:
        why += (
            f"; no GLM-5 option reaches torch.compile piecewise graphs in {', '.join(unreachable)}"
        )
    number = f"blocked in {len(blocked)} of {len(traced)} reachable release x SM traced"
    return {"verdict": verdict, "number": number, "why": why}
