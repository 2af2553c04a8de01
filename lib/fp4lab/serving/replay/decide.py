"""The decision re-decided per SGLang release and SM, from what each replay of GLM-5 recorded.

For each (release, SM): the option a GLM-5 user passes (the release's own parser and auto-disable
rule), the model class the release built, the quantize its NVFP4 linear method took, what
compiling the model through the release's piecewise runner gave (compiles as released; blocked at
which blockers; not applicable, also where the release's ModelRunner builds no runner for it; not
measured), the patch that removes the blockers and whether the patched model then compiles and
equals eager, and the MoE's path under the trace.
"""

from __future__ import annotations

from fp4lab.core import evidence, glm5
from fp4lab.serving.replay import versions
from fp4lab.serving.replay.shared import blame, patch
from fp4lab.serving.replay.shared import flags as flags_module

STORY_SIGNATURES = ("subprocess", "file_io", "compiler_disable_under_fullgraph")
"""The story's three blockers (nvcc query, the JIT's file I/O, the compiler.disable patch)."""

OUTCOMES = ("blocked", "compiles", "wrong output", "kernel unavailable", "not applicable",
            "not measured")  # fmt: skip

MEASURED = ("blocked", "compiles", "wrong output", "kernel unavailable")
"""The outcomes of a cell whose model was traced and run: the ones a verdict counts."""

BLOCKERS = {
    "fp4_quantize_op": "FlashInfer's FP4 quantize JIT",
    "dsa_indexer_split_op": "the DSA indexer's data-dependent branch",
    "dsa_attention_split_op": "DSA attention's topk_indices at the attention split op",
    "musa_probe_constant": "SGLang's is_musa() import probe inside the traced forward",
}
"""What the blocker each patch part removes is, in words."""


def blocker_frames(replay: dict) -> list[dict]:
    """Each trace blocker the patch walk met: its frame, dynamo's graph-break code, its message."""
    return [{"frame": s.get("blocker_frame"), "graph_break": s.get("graph_break"),
             "message": s.get("message")}
            for s in replay.get("fix", {}).get("steps", []) if s.get("status") == "unsupported"]  # fmt: skip


def blocker_text(blocker: dict) -> str:
    """A blocker of ``blocker_frames`` as its frame and dynamo's graph-break code."""
    code = blocker["graph_break"]
    return f"{blocker['frame']}" + (f" [{code}]" if code else "")


def blockers(chain: list[dict]) -> list[str]:
    """The story's signatures met in a chain, in order."""
    return [r["signature"] for r in chain if r["signature"] in STORY_SIGNATURES]


def moe_path(replay: dict, calls: list[dict]) -> tuple[str, str | None]:
    """Where the FP4 MoE's quantize is under the trace: hidden behind the custom op the traced
    graph holds (named), or not reached; and that op."""
    fixed = replay.get("fix", {})
    methods = replay.get("facts", {}).get("quant_methods", {})
    moe = next((m for m in methods if "MoE" in m.split(":")[0]), None)
    if not fixed.get("compiles"):
        return f"{moe or 'the MoE layer'}: not reached by the trace", None
    ops = [op for op in fixed.get("graph_custom_ops", {})
           if "moe" in op and op.endswith("cuda_graph_impl")]  # fmt: skip
    if not ops:
        return f"{moe}: traced inline (no MoE op in the graph)", None
    cls = (moe or "").split(":")[0]
    direct = [c for c in calls if not c["wrapped"] and c["file"].endswith("fused_moe_triton/layer.py")
              and c["entry_point"].endswith("fp4_quantize") and cls == "FlashInferFP4MoE"]  # fmt: skip
    where = (f"; it calls {direct[0]['call']} at {direct[0]['file']}:{direct[0]['line']}"
             if direct else "")  # fmt: skip
    op = ops[0].replace(".", "::", 1)
    return f"{moe} inside {op}: its quantize is not traced{where}", op


def short(note: str) -> str:
    """A note's first clause (before the first parenthesis, colon list or semicolon)."""
    cut = min((note.find(c) for c in (" (", ";") if c in note), default=len(note))
    return note[:cut][:110]


def declined_note(step: dict, architecture: str = glm5.ARCHITECTURE) -> str:
    """Why a release's ModelRunner built no piecewise runner: its entry and the line it logged."""
    where = (step.get("entry") or "ModelRunner").split(".model_runner.")[-1]
    said = f'logged "{step["message"]}"' if step.get("message") else "logged no reason"
    return (
        f"the release's ModelRunner builds no piecewise runner for {architecture} ({where} {said})"
    )


def cell(version: str, sm: str, replay: dict, calls: list[dict] | None = None) -> dict:
    """One (release, SM) row of the decision table, with its note's first clause, the harness
    frame where fp4lab's harness failed, and each kernel it reached with its availability on
    the SM; a traced cell that reached a kernel its SM lacks is "kernel unavailable", whatever
    the trace gave (the trace's outcome is kept as ``traced``)."""
    row = unavailable(_cell(version, sm, replay, calls), replay)
    return {"harness_frame": None, **row, "why_short": short(row["note"])}


def unavailable(row: dict, replay: dict) -> dict:
    """``row`` with the kernels its replay reached and their availability; "kernel unavailable"
    where a traced cell reached one its SM lacks (the installed package's evidence named)."""
    found = replay.get("kernel_availability")
    row = {**row, "kernels": found, "kernels_missing": [
        k["kernel"] for k in found or [] if k["available"] == "no"], "traced": row["outcome"]}  # fmt: skip
    if replay.get("kernel_availability_error"):
        row["kernels_note"] = (f"fp4lab failed to read the kernels' availability: "
                               f"{replay['kernel_availability_error']['error']}")  # fmt: skip
    if not row["kernels_missing"] or row["outcome"] not in MEASURED:
        return row
    first = next(k for k in found if k["available"] == "no")
    note = (f"{first['kernel']} does not exist for SM{row['sm']} ({first['library']}: "
            f"{first['evidence']}; {first['chosen']}); the trace: {row['note']}")  # fmt: skip
    return {**row, "outcome": "kernel unavailable", "note": note}


def _cell(version: str, sm: str, replay: dict, calls: list[dict] | None) -> dict:
    said = flags_module.read(replay)
    flags, how = said.pop("flags"), said["flag_why"]
    architecture = replay.get("architecture") or glm5.ARCHITECTURE
    facts = replay.get("facts", {})
    quantize = facts.get("quantize", {})
    fixed = replay.get("fix", {})
    chain = replay.get("chain", [])
    rows = [*chain, *fixed.get("steps", [])]
    moe, moe_op = moe_path(replay, calls or [])
    row = {"sglang_version": version, "sm": sm, "model_class": facts.get("model_class"),
           "quantize": quantize.get("implementation", "none"), "quantize_object": quantize.get("object"),
           "fake_registered": quantize.get("fake_registered"),
           **said, "blocked_at": None, "blockers": [],
           "patch": fixed.get("parts", []), "compiles_with_patch": None, "equals_eager": None,
           "graphs": fixed.get("graphs"), "pieces": fixed.get("pieces"),
           "expected_pieces": fixed.get("expected_pieces"), "moe": moe, "moe_op": moe_op,
           "first_frames": {c["cuda_home"]: c["blocker_frame"] for c in replay.get("cuda_home", [])},
           "evidence": evidence.of_values(rows), **torch_row(replay)}  # fmt: skip
    if replay.get("error") or replay.get("harness_error"):  # the child or fp4lab's drive failed
        failed = replay.get("harness_error") or {"error": replay["error"]}
        return harness(row, failed["error"], failed.get("harness_frame"))
    if "build_error" in replay:
        obstacle = replay["build_error"]
        if replay.get("model_absent"):
            return {**row, "outcome": "not applicable", "note": replay["model_absent"]}
        least = replay.get("min_capability")
        major, minor = (int(p) for p in sm.split("."))
        if least and major * 10 + minor < least and "minimum capability" in obstacle.lower():
            note = (f"the release's NVFP4 config needs SM{least // 10}.{least % 10}+ "
                    f"(ModelOptFp4Config.get_min_capability; {obstacle})")  # fmt: skip
            return {**row, "outcome": "not applicable", "note": note}
        if replay.get("refused_by_release"):
            note = (f"the release refuses {architecture} "
                    f"on SM{sm} while building it ({obstacle})")  # fmt: skip
            return {**row, "outcome": "not applicable", "note": note}
        if replay.get("call_refused"):
            return {**row, "outcome": "blocked", "blocked_at": replay.get("build_release_frame"),
                    "note": f"the release's own call fails while building {architecture} with "
                    f"the flags that reach the graph ({obstacle}, called at "
                    f"{replay.get('build_release_frame')})"}  # fmt: skip
        if flags is None and "resolution" in replay:
            return {**row, "outcome": "not applicable",
                    "note": f"{how} (model not built here: {obstacle})"}  # fmt: skip
        frames = replay.get("build_frames") or []
        ours = [f for f in frames if f.startswith("fp4lab/")]
        if replay.get("harness_choice_refused"):
            obstacle = f"{replay['harness_choice_refused']} ({obstacle})"
        return harness(row, obstacle, ours[-1] if ours else (frames[-1] if frames else None))
    if replay.get("not_driven"):
        built = (facts.get("model_class") or "the model").split(".")[-1]
        return {**row, "outcome": "not applicable",
                "note": f"{how} ({built} built; its runner not driven: no option reaches it)"}  # fmt: skip
    steps = fixed.get("steps", [])
    met = [BLOCKERS[p] for p in fixed.get("parts", [])]
    last = steps[-1] if steps else {}
    if last.get("status") == "declined":
        return {**row, "outcome": "not applicable", "note": declined_note(last, architecture)}
    failed_when_run = fixed.get("compiles") is False and (
        last.get("status") == "runtime_error" or blame.machine_only(last)
    )
    stopped = f"{last.get('blocker_frame')}: {last.get('message')}"
    eager = replay.get("eager_release") or {}
    missing = blame.missing_kernel(eager)
    if failed_when_run and not met:  # it traced, then failed when run: no compiler to blame
        said = "this machine has no CUDA driver for Triton" if blame.machine_only(last) else (
            "the traced model failed when run")  # fmt: skip
        own = blame.releases_own(eager, last) if not missing else None
        if unlisted := blame.unlisted_moe(eager, own) or blame.refused_both_ways(eager, own):
            frame = own.split(": ")[0]
            return {**row, "outcome": "blocked", "blocked_at": frame, "blockers": [frame],
                    "note": unlisted}  # fmt: skip
        also = (f"; uncompiled it fails the same way, at {own}: not the compiler's, and whether "
                "the release's or this replay's set-up is not decided here" if own else "")  # fmt: skip
        return harness(row, f"{said} at {stopped}{also}", last.get("blocker_frame"))
    if fixed.get("compiles") is False and not failed_when_run and missing:
        return harness(row, f"the release's code fails eagerly too, at a kernel with no CPU "
                       f"stand-in ({missing}); the trace's stop at {stopped} is not blamed on "
                       f"the compiler", missing)  # fmt: skip
    if fixed.get("compiles") is False and not failed_when_run:
        met.append(stopped)
    row |= {"blockers": met, "compiles_with_patch": None if failed_when_run else fixed.get("compiles"),
            "equals_eager": fixed.get("equals_eager")}  # fmt: skip
    story = blockers(chain)
    first = story[0] if story else (met[0] if met else None)
    if flags is None:
        traced = "compiles as released" if not met else f"blocked at {first}"
        return {**row, "outcome": "not applicable", "blocked_at": first if met else None,
                "note": f"{how} (traced anyway: {traced})"}  # fmt: skip
    if not met:
        return {**row, **unblocked(fixed)}
    note = f"blockers: {' -> '.join(met)}"
    if eager.get("status") == "runtime_error" and not blame.machine_only(eager):
        note += (f"; the release's own code fails eagerly too, at {(eager.get('frames') or ['?'])[-1]}: "
                 f"{eager.get('message')}")  # fmt: skip
    if failed_when_run:
        note += (f"; with the patch ({', '.join(fixed['parts'])}) the model traced, then failed "
                 f"when run at {stopped} (not measured)")  # fmt: skip
    if fixed.get("compiles"):
        note += (f"; with the patch ({', '.join(fixed['parts'])}) it compiles "
                 f"({fixed.get('pieces')} pieces, expected {fixed.get('expected_pieces')}) and "
                 f"{'equals' if fixed.get('equals_eager') else 'does NOT equal'} eager")  # fmt: skip
    return {**row, "outcome": "blocked", "blocked_at": first, "note": note}


def torch_row(replay: dict) -> dict:
    """Which torch's dynamo decided a cell, next to the torch the release pins; where they
    differ, a note says so (only torch 2.13.0's CPU build is at hand here)."""
    used, pinned = replay.get("torch"), replay.get("release_torch")
    differs = bool(used and pinned and pinned.startswith("==") and pinned[2:] != used.split("+")[0])
    note = (f"decided by torch {used}'s dynamo; the release pins torch{pinned}, whose dynamo was "
            f"not at hand" if differs else None)  # fmt: skip
    return {"torch": used, "release_torch": pinned, "torch_note": note}


def unblocked(fixed: dict) -> dict:
    """The outcome and note of a model that met no blocker: "compiles" only where its piecewise
    graphs ran and its logits equal eager's; "wrong output" where they ran and differ; not
    measured where no piece ran (nothing compiled was compared)."""
    pieces, diff = fixed.get("pieces"), fixed.get("max_abs_diff")
    if not pieces:
        return {"outcome": "not measured", "harness_frame": None,
                "note": f"traced without a blocker, but no piecewise graph ran (pieces: {pieces}): "
                        f"nothing compiled was compared with eager"}  # fmt: skip
    if fixed.get("equals_eager") is not True:
        by = f" (max |compiled - eager| {diff:.3g})" if diff is not None else " (no logits)"
        return {"outcome": "wrong output",
                "note": f"compiles as released ({pieces} pieces) but does NOT equal eager{by}"}  # fmt: skip
    return {
        "outcome": "compiles",
        "note": f"compiles as released ({pieces} pieces) and equals eager",
    }


def harness(row: dict, error: str, frame: str | None) -> dict:
    """A cell fp4lab's harness failed to measure: never a verdict about SGLang."""
    where = f" at {frame}" if frame else ""
    return {**row, "outcome": "not measured", "harness_frame": frame,
            "note": f"fp4lab's harness failed{where}: {error}"}  # fmt: skip


def decision(rows: list[dict]) -> dict:
    """The decision report's verdict, number and why over every (release, SM) where a GLM-5
    user can reach torch.compile piecewise graphs and the model was traced; cells fp4lab's
    harness failed to measure are counted apart."""
    traced = [r for r in rows if r["outcome"] in MEASURED]
    blocked = [(r["sglang_version"], r["sm"]) for r in traced if r["outcome"] == "blocked"]
    missing = [(r["sglang_version"], r["sm"]) for r in traced
               if r["outcome"] == "kernel unavailable"]  # fmt: skip
    wrong = [(r["sglang_version"], r["sm"]) for r in traced if r["outcome"] == "wrong output"]
    compiles = [(r["sglang_version"], r["sm"]) for r in traced if r["outcome"] == "compiles"]
    patched = [r for r in traced if r["outcome"] == "blocked" and r["equals_eager"]]
    unmeasured = [(r["sglang_version"], r["sm"]) for r in rows if r["outcome"] == "not measured"]
    unreachable = sorted({r["sglang_version"] for r in rows if r["outcome"] == "not applicable"
                          and r["flag"] == "none reaches it"}, key=versions.order)  # fmt: skip
    apart = f"; {len(unmeasured)} not measured (fp4lab's harness failed)" if unmeasured else ""
    if not traced:
        return {"verdict": "NOT APPLICABLE" if unreachable and not unmeasured else "UNMEASURED",
                "number": f"no release x SM traced here{apart}",
                "why": "no release's GLM-5 could be built and traced on this machine"}  # fmt: skip
    verdict = ("UNBLOCKED" if not blocked and not wrong and not missing
               else "PARTLY BLOCKED" if compiles else "BLOCKED" if blocked or missing
               else "WRONG OUTPUT")  # fmt: skip
    parts = sorted({p for r in traced for p in r["patch"]}, key=patch.PARTS.index)
    why = (f"SGLang's own {glm5.ARCHITECTURE} (tiny config, NVFP4, dummy weights) traced through "
           f"each release's piecewise runner; compiles as released in "
           f"{versions.by_sm(compiles) or 'none'}; blocked in {versions.by_sm(blocked) or 'none'}"
           + (f"; compiles but does NOT equal eager in {versions.by_sm(wrong)}" if wrong else "")
           + (f"; a kernel it reaches does not exist for the SM in {versions.by_sm(missing)}"
              if missing else "")
           + (f"; fp4lab's patch ({', '.join(parts)}) makes {len(patched)} of the blocked "
              f"compile and equal eager" if parts else ""))  # fmt: skip
    if unreachable:
        why += f"; no GLM-5 option reaches torch.compile piecewise graphs in {versions.ranges(unreachable)}"
    if unmeasured:
        why += f"; not measured (harness): {versions.by_sm(unmeasured)}"
    differs = (f", wrong output in {len(wrong)}" if wrong else "") + (
        f", kernel unavailable in {len(missing)}" if missing else ""
    )
    number = (f"compiles in {len(compiles)}, blocked in {len(blocked)}{differs} of {len(traced)} "
              f"reachable release x SM traced{apart}")  # fmt: skip
    return {"verdict": verdict, "number": number, "why": why}
