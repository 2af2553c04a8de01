"""The story's three crashes replayed, recorded and checked (notebooks 01, 02 and 03).

* msg 988 (01): the segment under fullgraph=True stops at FlashInfer's nvcc subprocess.
* msg 992 (02): with the CUDA-version patch (and the CPU-only stages, and the JIT registry's
  first-registration bookkeeping bypassed), at the JIT's file I/O.
* msgs 1002/1009 (03): with ``fp4_quantize`` behind ``torch.compiler.disable``, at the
  decoration itself, which fullgraph=True forbids; a plain function without FlashInfer is
  rejected the same way (measured, ``plain_disabled_attempt``).

Every verdict-supporting record names the stages applied before its blocker was reached
(``stages_applied``: each with its origin and whether it is one of the story's patches) and
its ``evidence``. Each verdict raises AssertionError ("upstream behaviour changed: ...") when
the installed versions no longer crash the story's way.
"""

from __future__ import annotations

import os
from unittest import mock

import torch

from fp4lab.compile import stages, trace
from fp4lab.compile.story import Story
from fp4lab.core import evidence, probe

NVCC = "subprocess"
FILE_IO = "file_io"
COMPILER_DISABLE = "compiler_disable_under_fullgraph"


def _trace_evidence(seen: dict) -> list[str]:
    return evidence.of_run(traced=True, simulated=seen["simulated"], kernel=None)


def _cuda_home_stage(cuda_home: str) -> stages.Stage:
    return stages.Stage(
        "cuda_home", "environment", "", lambda: mock.patch.dict(os.environ, CUDA_HOME=cuda_home)
    )


def nvcc_attempt(run: Story, *, with_cuda_home: bool = False) -> trace.TraceOutcome:
    """The segment under fullgraph=True on the target; records kind "attempt".

    ``with_cuda_home`` sets CUDA_HOME to the ``cuda_home`` parameter, so the trace reaches the
    ``nvcc --version`` call itself rather than ``which nvcc`` (the path need not exist).
    """
    cuda_home = run.params["cuda_home"] if with_cuda_home else None
    chosen = stages.target_stages(run.sm) + ([_cuda_home_stage(cuda_home)] if cuda_home else [])
    with stages.applied(chosen) as applied:
        seen = probe.target()
        outcome = trace.attempt(run.model, run.x, fullgraph=True, backend=run.params["backend"])
        run.rec.add(
            "attempt",
            {
                **outcome.as_record(),
                "expected_signature": NVCC,
                "cuda_home": cuda_home,
                "stages_applied": applied,
                "evidence": _trace_evidence(seen),
            },
        )
    print(f"target: SM{seen['sm']} ({'simulated' if seen['simulated'] else 'real'})")
    return outcome


def cache_warnings(outcome: trace.TraceOutcome, limit: int = 3) -> list[str]:
    """Dynamo's warnings about the ``functools.cache`` wrappers it traced through."""
    return [w for w in outcome.warnings if "cache" in w][:limit]


def nvcc_verdict(run: Story, outcome: trace.TraceOutcome, with_home: trace.TraceOutcome) -> str:
    """Both attempts stopped at the nvcc query as a subprocess (recorded as the run's summary),
    or AssertionError."""
    for attempt in (outcome, with_home):
        evidence.guard(
            attempt.signature == NVCC and attempt.shows_nvcc_query,
            f"upstream behaviour changed: expected the {NVCC} blocker in the nvcc query, "
            f"observed {attempt.signature} at {attempt.blocker_frame}",
        )
    return run.rec.summary(
        f"reproduced: {outcome.exception}: {outcome.message!r} at {outcome.blocker_frame}, "
        f"in {outcome.seconds:.1f} s\n"
        f"with CUDA_HOME: blocked at {with_home.blocker_frame}: {with_home.blocker_frame.source}",
        verdict="BLOCKED",
        number=f"crash 1 of 3 reproduced in {outcome.seconds:.1f} s",
        why="dynamo cannot trace the subprocess FlashInfer's JIT runs to find nvcc, with or "
        "without CUDA_HOME",
        needs="cpu",
    )["values"]["headline"]


def file_io_chain(run: Story) -> list[dict]:
    """Walk the blocker chain to the JIT's file I/O; records one "chain_step" per attempt."""
    print("flashinfer-python", probe.package_version("flashinfer-python"))
    rows = stages.walk_blocker_chain(
        run.model, run.x, sm=run.sm, backend=run.params["backend"], until=FILE_IO
    )
    for row in rows:
        run.rec.add("chain_step", row, target=row["target"])
    return rows


def file_io_verdict(run: Story, rows: list[dict]) -> str:
    """Records the walk's "verdict"; the walk ended at the JIT's file I/O (recorded as the run's
    summary), or AssertionError."""
    last = rows[-1]
    applied = last["stages_applied"]
    seconds = sum(r["seconds"] for r in rows)
    others = [s["stage"] for s in applied if not s["story_patch"]]
    run.rec.add(
        "verdict",
        {
            "signature": last["signature"],
            "expected_signature": FILE_IO,
            "message": last["message"],
            "blocker_frame": last["blocker_frame"],
            "stages": [s["stage"] for s in applied],
            "stages_applied": applied,
            "story_patches": [s["stage"] for s in applied if s["story_patch"]],
            "other_patches": others,
            "evidence": last["evidence"],
            "seconds": seconds,
        },
        target=last["target"],
    )
    evidence.guard(
        last["signature"] == FILE_IO,
        f"upstream behaviour changed: the walk ended at {last['signature']} "
        f"({last.get('note', '')}) at {last['blocker_frame']}, not at the JIT's file I/O",
    )
    named = ", ".join(f"{s['stage']} [{s['origin']}]" for s in applied)
    return run.rec.summary(
        f"reached the JIT's file I/O after {len(applied)} patches ({named}); from the story: "
        f"{', '.join(s['stage'] for s in applied if s['story_patch']) or 'none'}; "
        f"reached only with these too: {', '.join(others) or 'none'}; "
        f"total trace time {seconds:.1f} s",
        verdict="BLOCKED",
        number=f"crash 2 of 3 reached after {len(applied)} patches, {seconds:.1f} s of tracing",
        why="once nvcc is patched away, dynamo cannot trace the file I/O of FlashInfer's JIT "
        "module lookup",
        needs="cpu",
    )["values"]["headline"]


@torch.compiler.disable
def _opaque(x: torch.Tensor) -> torch.Tensor:
    return x * 2


def _plain_step(x: torch.Tensor) -> torch.Tensor:
    """No FlashInfer: a tensor op, a call to a torch.compiler.disable'd function, a tensor op."""
    return _opaque(x + 1) - 1


def plain_disabled_attempt(run: Story) -> trace.TraceOutcome:
    """The control: a plain function calling a ``torch.compiler.disable``'d one, under fullgraph=True."""
    return trace.attempt(_plain_step, run.x, fullgraph=True, backend=run.params["backend"])


def compiler_disabled_attempt(run: Story) -> tuple[trace.TraceOutcome, trace.TraceOutcome]:
    """The story's state plus the msg 1002 decoration under fullgraph=True, and the control
    without FlashInfer; records one "attempt" with both and ``depends_on_flashinfer``."""
    chosen = [*stages.target_stages(run.sm), stages.PATCH_CUDA_VERSION, stages.COMPILER_DISABLED]
    with stages.applied(chosen) as applied:
        seen = probe.target()
        outcome = trace.attempt(run.model, run.x, fullgraph=True, backend=run.params["backend"])
    plain = plain_disabled_attempt(run)
    run.rec.add(
        "attempt",
        {
            **outcome.as_record(),
            "expected_signature": COMPILER_DISABLE,
            "stages_applied": applied,
            "evidence": _trace_evidence(seen),
            "plain_function": {
                "signature": plain.signature,
                "exception": plain.exception,
                "message": plain.message,
                "blocker_frame": str(plain.blocker_frame) if plain.blocker_frame else None,
                "evidence": evidence.of_run(traced=True, simulated=False, kernel=None),
            },
            "depends_on_flashinfer": plain.signature != outcome.signature,
        },
        target=seen,
    )
    return outcome, plain


def compiler_disable_verdict(
    run: Story, outcome: trace.TraceOutcome, plain: trace.TraceOutcome
) -> str:
    """Dynamo rejected the decoration under fullgraph=True, with and without FlashInfer
    (recorded as the run's summary), or AssertionError."""
    evidence.guard(
        outcome.signature == COMPILER_DISABLE,
        f"upstream behaviour changed: observed {outcome.signature}: {outcome.message}",
    )
    evidence.guard(
        plain.signature == COMPILER_DISABLE,
        f"torch behaviour changed: a plain torch.compiler.disable'd call gave {plain.signature}",
    )
    hint = outcome.hints[0] if outcome.hints else None
    return run.rec.summary(
        f"reproduced: {outcome.exception}: {outcome.message!r} in {outcome.seconds:.2f} s; "
        f"hint: {hint}\n"
        f"without FlashInfer (a plain function, {plain.blocker_frame}): {plain.message!r}; "
        "the rejection does not depend on FlashInfer",
        verdict="BLOCKED",
        number=f"crash 3 of 3 reproduced in {outcome.seconds:.2f} s",
        why="fullgraph=True refuses any torch.compiler.disable'd call, FlashInfer or not: the "
        "story's third workaround could never work",
        needs="cpu",
    )["values"]["headline"]
