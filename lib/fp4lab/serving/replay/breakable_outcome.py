"""On the notebook's side: a captured prefill graph's outcome (``breakable.drive``'s record)."""

from __future__ import annotations

from fp4lab.core import evidence
from fp4lab.serving.replay import blame, flags

NO_CPU_KERNEL = ("requires CUDA tensors", "no CUDA module is built on this machine")
"""What a kernel with no CPU stand-in says here: a CUDA-only kernel refusing CPU tensors, a JIT
build fp4lab's ninja refused (on a GPU it builds)."""
STAND_IN = "StandInAttentionBackend"
"""The class name ``breakable`` gives the stand-in attention backend inside the release's
environment, as the release's own messages name it."""


def capture_outcome(found: dict) -> tuple[str, str]:
    """The breakable cell's outcome and why: ``blocked`` (the capture raised, other than at this
    machine's edge, ``blame.MACHINE_ONLY``, or at a question to fp4lab's attention stand-in; or a
    flag a real capture refuses), ``wrong output``
    (a replay differs from eager or left its output as captured), ``works``; ``not measured``
    where nothing was captured or compared."""
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
        if STAND_IN in stop["error"] or stop.get("harness_object"):
            return "not measured", f"the release asked fp4lab's stand-in for what it lacks: {where}"
        if any(w in stop["error"] for w in NO_CPU_KERNEL):
            return "not measured", f"a kernel with no CPU stand-in here: {where}"
        return "blocked", where
    if found.get("flags"):
        first = found["flags"][0]
        return "blocked", (f"{first['what']} inside captured segment {first['segment']} of "
                           f"bucket {first['bucket']} at {first['frame']}")  # fmt: skip
    replays = found.get("replays") or []
    if not replays:
        return "not measured", "no bucket was captured and replayed"
    wrong = [r for r in replays if not (r["equals_eager"] and r["output_changed_by_replay"])]
    if wrong:
        return "wrong output", ", ".join(f"bucket {r['bucket']}: max |diff| {r['max_abs_diff']:.3g}"
                                         for r in wrong)  # fmt: skip
    return "works", (
        f"{len(found['buckets'])} buckets captured; "
        f"{', '.join(str(r['bucket']) for r in replays)} replayed equal to eager"
    )


MEASURED = ("works", "blocked", "wrong output")


def outcome(replay: dict, graph: str = "breakable") -> tuple[str, str]:
    """A captured walk's outcome (``capture_outcome`` of its ``graph`` record: breakable or full),
    "kernel unavailable" ahead of any measured one where it reached a kernel its SM lacks (the
    installed package's evidence, ``availability``); where the model was not built, "not
    applicable" if the release refused it, else "not measured"; "not measured" where the walk did
    not run."""
    found = replay.get(graph)
    if found is None and replay.get("build_error"):
        said = f"{replay['build_error']} [at {(replay.get('build_frames') or ['?'])[-1]}]"
        if replay.get("refused_by_release"):
            return "not applicable", f"the release refuses the model here: {said}"
        return "not measured", f"the model was not built here: {said}"
    if found is None:
        failed = replay.get("harness_error") or replay.get("error") or {}
        return "not measured", replay.get("not_driven") or (
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


def fields(replay: dict) -> dict:
    """A decision row's breakable columns from a replay's ``breakable_walk``: the outcome ("not
    applicable" where the release has no breakable graphs), why, the flag a user passes, the
    segments and breaks of the largest bucket, and the evidence."""
    walk = replay.get("breakable_walk")
    if walk is None:
        return {"breakable": "not applicable", "breakable_note": "the release has no breakable "
                "prefill graph backend", "breakable_flag": None, "breakable_segments": None,
                "breakable_breaks": [], "breakable_evidence": []}  # fmt: skip
    result, why = outcome(walk)
    buckets = (walk.get("breakable") or {}).get("buckets") or []
    largest = max(buckets, key=lambda b: b["bucket"], default=None)
    return {"breakable": result, "breakable_note": why,
            "breakable_flag": flags.read(walk, "breakable")["flag"],
            "breakable_segments": largest["segments"] if largest else None,
            "breakable_breaks": sorted(set(largest["breaks"])) if largest else [],
            "breakable_evidence": ["simulated_capture"] if largest else []}  # fmt: skip


def evidence_of(rows: list[dict]) -> list[str]:
    """Every level the rows reached: their tc_piecewise cells' and their breakable captures'."""
    return evidence.of_values(
        [*rows, *({"evidence": r.get("breakable_evidence") or []} for r in rows)]
    )
