"""On the notebook's side: a captured prefill graph's outcome (``breakable.drive``'s record)."""

from __future__ import annotations

from fp4lab.core import evidence
from fp4lab.serving.replay.shared import blame, flags

NO_CPU_KERNEL = ("requires CUDA tensors", "no CUDA module is built on this machine",
                 "Failed to get checksums.txt")  # fmt: skip
"""What a kernel with no CPU stand-in says here: a CUDA-only kernel refusing CPU tensors, a JIT
build fp4lab's ninja refused (on a GPU it builds), FlashInfer's cubins fetched when first used
(this machine reaches no cubin repository; a GPU machine has them or fetches them)."""
COMPILING = ("torch._dynamo.exc.", "torch/_dynamo/", "torch/_inductor/")
"""torch.compile's exceptions, then its frames: a release function it compiles inside a simulated
capture runs under fp4lab's torch-function and dispatch modes, which a real capture does not
have (asked after every more precise reason)."""
STAND_IN = "StandInAttentionBackend"
"""The class name ``breakable`` gives the stand-in attention backend inside the release's
environment, as the release's own messages name it."""


def capture_outcome(found: dict) -> tuple[str, str]:
    """The breakable cell's outcome and why: ``blocked`` (the capture raised, other than at this
    machine's edge, ``blame.MACHINE_ONLY``, or at a question to fp4lab's attention stand-in; or a
    flag a real capture refuses), ``wrong output``
    (a replay differs from eager or left its output as captured), ``works``; ``not applicable``
    where the release built no prefill graph runner (its logged reason); ``not measured`` where
    nothing was captured or compared."""
    stop = found.get("blocked")
    if stop is not None:
        where = f"{stop['error']} [at {stop.get('release_frame') or stop['frames'][-1]}]"
        if blame.machine_only(stop):
            return "not measured", f"this machine has no CUDA driver for a Triton launch: {where}"
        if stop["frames"] and stop["frames"][-1].startswith("fp4lab/"):
            return (
                "not measured",
                f"fp4lab's own stand-in stopped it: {stop['error']} [at {stop['frames'][-1]}]",
            )
        if borrowed_stop(found):
            real = found["attention"]["class"].rsplit(".", 1)[-1]
            return "blocked", (f"{where.replace(STAND_IN, real)} (the release's own rule on "
                               f"{real}'s answer: " + ", ".join(
                                   f"{k} = {v}" for k, v in found["attention"]["asked"].items())
                               + ")")  # fmt: skip
        if STAND_IN in stop["error"] or stop.get("harness_object"):
            return "not measured", f"the release asked fp4lab's stand-in for what it lacks: {where}"
        if any(w in stop["error"] for w in NO_CPU_KERNEL) or blame.kernel_absent(
            stop["frames"], stop["error"]
        ):
            return "not measured", f"a kernel with no CPU stand-in here: {where}"
        if stop["error"].startswith(COMPILING[0]) or any(
            f.startswith(COMPILING[1:]) for f in stop["frames"]
        ):
            return "not measured", (f"torch.compile of a release function stopped under fp4lab's "
                                    f"capture modes (not run eagerly to blame it): {where}")  # fmt: skip
        return "blocked", where
    if found.get("flags"):
        first = found["flags"][0]
        return "blocked", (f"{first['what']} inside captured segment {first['segment']} of "
                           f"bucket {first['bucket']} at {first['frame']}")  # fmt: skip
    if found.get("declined"):
        return "not applicable", f"the release builds no prefill graph runner: {found['declined']}"
    replays = found.get("replays") or []
    if not replays:
        return "not measured", "no bucket was captured and replayed"
    wrong = [r for r in replays if not (r["equals_eager"] and r["output_changed_by_replay"])]
    if wrong:
        return "wrong output", ", ".join(f"bucket {r['bucket']}: max |diff| {r['max_abs_diff']:.3g}"
                                         for r in wrong)  # fmt: skip
    variants = sum(bool(b.get("variant")) for b in found["buckets"])
    reads = [r["frame"] for r in found.get("host_reads") or []]
    forks = (found.get("streams") or {}).get("forks", 0)
    return "works", (
        f"{len(found['buckets']) - variants} buckets captured"
        + (f" (and {variants} variant graphs, not compared)" if variants else "")
        + f"; {', '.join(str(r['bucket']) for r in replays)} replayed equal to eager"
        + (f"; {forks} side-stream forks inside segments, each joined back" if forks else "")
        + (f"; host values read inside segments are frozen into the graph at {', '.join(reads)} "
           "(replayed with the captured lengths only)" if reads else "")
        + weak_refs_said(found)
    )  # fmt: skip


def weak_refs_said(found: dict) -> str:
    """The break inputs a capture holds by weak reference only, in words ('' where none is at
    risk): on a GPU their memory goes back to the graph pool for a later bucket's capture."""
    held = found.get("weak_refs") or {}
    if not held.get("at_risk"):
        return ""
    return (f"; {held['at_risk']} of {held['held']} tensors the breaks hold by weak reference are "
            f"held by nothing else once their bucket is captured, and a bucket is captured after "
            f"it (on a GPU the graph pool gives that memory to the later bucket: "
            f"{held['upstream']}, wrong output or an illegal memory access; a CPU keeps it)")  # fmt: skip


def borrowed_stop(found: dict) -> bool:
    """Whether the capture stopped at the release's own assertion on an answer the stand-in
    attention backend gave as the class the release builds gives it (``attention.CAPABILITIES``):
    then the real backend stops it the same way."""
    stop, asked = found.get("blocked") or {}, (found.get("attention") or {}).get("asked")
    said, deepest = stop.get("error", ""), (stop.get("frames") or [""])[-1]
    return bool(asked) and said.startswith("AssertionError") and STAND_IN in said and (
        deepest.startswith("sglang/") and not stop.get("harness_object"))  # fmt: skip


MEASURED = ("works", "blocked", "wrong output")


def outcome(replay: dict, graph: str = "breakable") -> tuple[str, str]:
    """A captured walk's outcome (``capture_outcome`` of its ``graph`` record: breakable or full),
    "kernel unavailable" ahead of any measured one where it reached a kernel its SM lacks (the
    installed package's evidence, ``availability``); where the model was not built, "not
    applicable" if the release refused it, else "not measured"; "not applicable" where no option
    of the release reaches the graph; "not measured" where the walk did not run."""
    found = replay.get(graph)
    if found is None and replay.get("build_error"):
        said = f"{replay['build_error']} [at {(replay.get('build_frames') or ['?'])[-1]}"
        launched = replay.get("build_release_frame")
        said += f", from {launched}]" if launched and launched not in said else "]"
        if replay.get("model_absent"):
            return "not applicable", replay["model_absent"]
        if replay.get("refused_by_release"):
            return "not applicable", f"the release refuses the model here: {said}"
        if replay.get("call_refused"):
            return "blocked", f"the release's own call fails while building the model: {said}"
        return "not measured", f"the model was not built here: {said}"
    if found is None and replay.get("not_driven"):  # the release's options reach no such graph
        return (
            "not applicable",
            f"the release's options reach no {graph} graph: {replay['not_driven']}",
        )
    if found is None:  # fp4lab's walk failed (a record), or its child did (a line)
        failed = replay.get("harness_error") or replay.get("error") or {}
        return "not measured", failed if isinstance(failed, str) else (
            f"{failed.get('error')} [at {(failed.get('frames') or ['?'])[-1]}]"
        )
    result, why = capture_outcome(found)
    missing = [k for k in replay.get("kernel_availability") or [] if k["available"] == "no"]
    if missing and result in MEASURED:
        first = missing[0]
        return "kernel unavailable", (f"{first['kernel']} does not exist for this SM "
                                      f"({first['library']}: {first['evidence']}); the capture: "
                                      f"{result}, {why}")  # fmt: skip
    return result, why


def fields(replay: dict, graph: str = "breakable") -> dict:
    """A decision row's columns of the captured prefill graph ``graph`` (``flags.CAPTURED``) from
    a replay's ``<graph>_walk``, each named ``<graph>...``: the outcome ("not applicable" where
    the release has no such backend), why, the flag a user passes, the segments and breaks of the
    largest bucket, its breaks per forward and per decoder layer, the evidence, and the tensors its
    breaks hold by weak reference only with a bucket captured after theirs (``weak_refs_said``)."""
    walk = replay.get(f"{graph}_walk")
    if walk is None:
        return {graph: "not applicable", f"{graph}_note": f"the release has no {graph} prefill "
                "graph backend", f"{graph}_flag": None, f"{graph}_segments": None,
                f"{graph}_breaks": [], f"{graph}_break_count": None,
                f"{graph}_breaks_per_layer": None,
                f"{graph}_evidence": [], f"{graph}_weak_refs_at_risk": None}  # fmt: skip
    result, why = outcome(walk, graph)
    buckets = [b for b in (walk.get(graph) or {}).get("buckets") or [] if not b.get("variant")]
    largest = max(buckets, key=lambda b: b["bucket"], default=None)
    layers = (walk.get("facts") or {}).get("layers")
    return {graph: result, f"{graph}_note": why, f"{graph}_flag": flags.read(walk, graph)["flag"],
            f"{graph}_segments": largest["segments"] if largest else None,
            f"{graph}_breaks": sorted(set(largest["breaks"])) if largest else [],
            f"{graph}_break_count": len(largest["breaks"]) if largest else None,
            f"{graph}_breaks_per_layer": round(len(largest["breaks"]) / layers, 2)
            if largest and layers else None,
            f"{graph}_evidence": ["simulated_capture"] if largest else [],
            f"{graph}_weak_refs_at_risk": ((walk.get(graph) or {}).get("weak_refs") or {}).get(
                "at_risk")}  # fmt: skip


def captured_fields(replay: dict) -> dict:
    """A decision row's columns of every captured prefill graph (``fields`` of each)."""
    return {k: v for graph in flags.CAPTURED for k, v in fields(replay, graph).items()}


def evidence_of(rows: list[dict]) -> list[str]:
    """Every level the rows reached: their tc_piecewise cells' and their captures'."""
    return evidence.of_values(
        [*rows, *({"evidence": r.get(f"{g}_evidence") or []} for r in rows for g in flags.CAPTURED)]
    )
