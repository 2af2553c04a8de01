"""Inside one version's environment: the story's trace on the installed FlashInfer, as JSON.

    python -m fp4lab.compile.matrix.child OUT.json

``study.measure_versions`` runs this in each version's environment; it imports nothing that
environment lacks (torch, FlashInfer and fp4lab's lib/ only). It records the public path's
blocker chain, FlashInfer's own op and fp4lab's op compiled under fullgraph=True (with the
kernel that ran inside each), what the upstream op forwards (``forwarding_bug``'s detector)
and the environment's own package versions.
"""

from __future__ import annotations

import importlib.metadata
import json
import platform
import sys
import warnings
from pathlib import Path

import torch
from packaging.requirements import Requirement

from fp4lab.compile import fix, segment, stages, target, trace
from fp4lab.core import evidence, probe
from fp4lab.fp4 import forwarding_bug

CHAIN_KEYS = (
    "step",
    "stage",
    "origin",
    "story",
    "signature",
    "message",
    "skipped_builtin",
    "blocker_frame",
    "evidence",
    "seconds",
)
"""What the parent keeps of each blocker-chain row."""


def installed_packages() -> dict[str, str | None]:
    """This environment's versions of fp4lab's tracked packages and of FlashInfer's requirements
    (None: absent here)."""
    names = list(probe.PACKAGES)
    for text in importlib.metadata.requires("flashinfer-python") or []:
        requirement = Requirement(text)
        if requirement.marker is None or "extra" not in str(requirement.marker):
            names.append(requirement.name)
    return {name: probe.package_version(name) for name in dict.fromkeys(names)}


def _compiled(outcome: trace.TraceOutcome, seen: fix.Observed, simulated: bool) -> dict:
    return {
        "signature": outcome.signature,
        "graph_count": outcome.graph_count,
        "message": outcome.message,
        "kernel": seen.kernel,
        "evidence": evidence.of_run(traced=True, simulated=simulated, kernel=seen.kernel),
    }


def trace_installed_flashinfer() -> dict:
    """The public path's blocker chain, the upstream op (if any) and fp4lab's op, each traced
    under fullgraph=True on the simulated Blackwell target, and the upstream op's forwarded
    arguments; plain data."""
    shape = segment.LayerShape(hidden=64, heads=2, ffn=128)
    x = segment.tokens_input(shape, 16)
    chain = stages.walk_blocker_chain(segment.Stack(shape, 1, target.fp4_quantize), x)
    with torch.no_grad(), target.simulated_target() as seen, fix.upstream_op_cpu_kernel() as op:
        if op is None:
            upstream = {"present": False}
        else:
            with fix.observing() as ran:
                outcome = trace.attempt(segment.Stack(shape, 1, lambda h, gs: op(h, gs)), x)
            upstream = {
                "present": True,
                "schema": str(op._schema),
                **_compiled(outcome, ran, seen["simulated"]),
            }
    with torch.no_grad(), target.simulated_target(), fix.custom_op_fp4_quantize():
        with fix.observing() as ran:
            outcome = trace.attempt(segment.Stack(shape, 1, target.fp4_quantize), x)
        ours = _compiled(outcome, ran, seen["simulated"])
    return {
        "packages": installed_packages(),
        "python": platform.python_version(),
        "target": seen,
        "import_staging": target.IMPORT_STAGING,
        "chain": [{k: row[k] for k in CHAIN_KEYS} for row in chain],
        "upstream_op": upstream,
        "fp4lab_op": ours,
        "forwarding": forwarding_bug.detect(),
    }


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m fp4lab.compile.matrix.child OUT.json", file=sys.stderr)
        return 2
    warnings.simplefilter("ignore")
    Path(argv[0]).write_text(json.dumps(trace_installed_flashinfer()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
