"""Inside one SGLang environment: a child's walk of a captured prefill graph (breakable or
full): the model built with the flags that reach the graph, captured and replayed by the
release's own runner (``breakable``), and what the capture reached."""

from __future__ import annotations

from pathlib import Path

from fp4lab.serving.replay.release import availability, breakable, kernels, model, reached
from fp4lab.serving.replay.release.failed import build_failed, failure
from fp4lab.serving.replay.shared import models


def walk(release: model.Release, checkpoint: Path, found: dict, refused: Path,
         graph: str) -> dict:  # fmt: skip
    """The model built with the flags that reach ``graph`` (breakable or full; none reach it: not
    driven), its capture and replays (``breakable.drive``, recorded under ``graph``) with the
    kernels and stand-ins they reached; fp4lab's own failure is ``harness_error``."""
    flags = found["resolution"]["graphs"][graph]["flags"]
    if flags is None:
        return found | {"not_driven": f"no option reaches {graph}"}
    given = models.read(checkpoint)
    try:
        built = model.build(release, checkpoint, model.command_line(given, flags))
    except Exception as exc:  # recorded: the exact obstacle on this machine
        return found | build_failed(exc, given.architecture)
    found |= {"facts": built.facts, "build_seconds": round(built.seconds, 1)}
    try:
        found[graph] = breakable.drive(built.host, release.sm)
    except Exception as exc:  # fp4lab's drive failed: not measured, never a verdict
        found["harness_error"] = failure(exc)
    found["standins"] = [*built.standins, *breakable.CAPTURE_STANDINS]
    found["jit_builds_refused"] = kernels.refused_builds(refused)
    found["kernels_reached"] = dict(sorted(reached.REACHED.items()))
    found["standins_reached"] = reached.names(found["standins"])
    try:
        found["kernel_availability"] = availability.check(
            reached.REACHED, vars(built.server_args), release.sm
        )
    except Exception as exc:  # fp4lab's reading failed: the kernels' availability is unknown
        found["kernel_availability_error"] = failure(exc)
    return found
