"""``python -m fp4lab.compile.audit module:function --sm 12.0 --inputs "bf16[128,64] f32[1]"``

Calls any callable eagerly and traces it under torch.compile(fullgraph=True) with the same inputs
on a simulated GPU of the target SM, and prints the verdict with how it was reached: the eager
outcome, dynamo's first blocker, the chain of blockers behind it, and each install mode. With
``--versions`` it runs in each FlashInfer version's environment (build/matrix/). Without
``--inputs``, a FlashInfer entry point's inputs are built from its signature and the table.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import warnings

from fp4lab.compile.audit import eager, inputs, run, simulation, study, toolkit
from fp4lab.compile.audit.surface import kind_of
from fp4lab.compile.matrix.versions import check_versions
from fp4lab.compile.trace import SIGNATURES
from fp4lab.core import params


def _epilog() -> str:
    def listed(notes: dict[str, str]) -> str:
        return "\n".join(f"  {name}: {note}" for name, note in notes.items())

    standins = {s["name"]: f"{s['replaces']} ({s['why']})" for s in simulation.STANDINS}
    return (
        f"verdicts (the eager call first, then the trace):\n{listed(run.VERDICT_NOTES)}\n"
        f"eager outcomes:\n{listed(eager.OUTCOMES)}\n"
        f"install modes (which a verdict covers: jit is run for every call, jit_cuda_home where "
        f"the first blocker is FlashInfer's toolkit query, prebuilt read from the frames):\n"
        f"{listed(toolkit.INSTALL_MODES)}\n"
        f"remedies the chain applies in turn:\n{listed(run.STAGE_NOTES)}\n"
        f"what is simulated:\n{listed(standins)}\n"
        f"signatures (how a blocker is named): {', '.join(SIGNATURES)}\n"
        f"input spec: dtype[dims] (dtypes {', '.join(inputs.DTYPES)}; dims may use "
        f"{', '.join(inputs.SIZES)}), dtype:NAME, or a Python literal; name=value for keywords"
    )


def resolve(target: str) -> object:
    """``module:function`` (dotted attributes allowed) imported; ValueError naming it otherwise."""
    module_name, colon, attr = target.partition(":")
    if not colon or not module_name or not attr:
        raise ValueError(f"target={target!r} must be module:function, e.g. flashinfer:fp4_quantize")
    try:
        obj = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"target={target!r}: cannot import {module_name!r}: {exc}") from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ValueError(f"target={target!r}: {module_name} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise ValueError(f"target={target!r} is not callable")
    return obj


def print_audit(target: str, found: dict) -> None:
    print(
        f"{target} on SM{found['sm']} (simulated: {found['simulated']}), {found['tensors']} tensors"
    )
    first = found["eager"] or {}
    where = f" at {first['frame']}" if first.get("frame") else ""
    said = first.get("kernel") or first.get("message") or ""
    print(f"  eager: {first.get('outcome')}{where}{f': {said}' if said else ''}")
    for row in found["chain"]:
        where = f" at {row['blocker_frame']}" if row["blocker_frame"] else ""
        message = f": {row['message']}" if row["message"] else ""
        print(
            f"  step {row['step']} [{row['stage']}, {row['origin']}] {row['signature']}{where}{message}"
        )
    print(f"  verdict: {found['verdict']} ({found['why']})")
    for mode, about in found["install"].items():
        said = about.get("why") or f"{about.get('verdict')} at {about.get('blocker_frame')}"
        holds = f"holds={about['holds']}: " if "holds" in about else ""
        print(f"  install {mode}: {holds}{said}")
    if found["custom_op"]:
        op = found["custom_op"]
        print(
            f"  custom op {op['qualname']}: present={op['present']} fake/meta={op['fake_or_meta']}"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m fp4lab.compile.audit",
        description=__doc__.splitlines()[0].strip("`"),
        epilog=_epilog(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("target", help="module:function, e.g. flashinfer:mm_fp4 or mypkg.mod:f")
    parser.add_argument("--sm", action="append", default=[], help="target SM, e.g. 12.0 (repeat)")
    parser.add_argument("--inputs", default=None, help="input spec (see below)")
    parser.add_argument("--versions", default=None, help="comma list of FlashInfer versions")
    args = parser.parse_args(argv)
    warnings.simplefilter("ignore")
    try:
        sms = params.sms("sms", args.sm or ["12.0"])
        versions = check_versions(args.versions) if args.versions else []
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if versions:
        return _in_versions(args, versions, sms)
    module, _, name = args.target.partition(":")
    try:
        fn = resolve(args.target)
        spec = inputs.parse(args.inputs) if args.inputs is not None else None
        build = inputs.bind(fn, *spec) if spec else None
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    targets = [tuple(int(p) for p in sm.split(".")) for sm in sms]
    try:  # every SM's inputs before anything is traced (a backend may depend on the SM)
        builds = [build or inputs.for_function(fn, name, kind_of(name), at).build for at in targets]
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    op = f"{module.split('.')[0]}::{name.split('.')[-1]}"
    for at, one in zip(targets, builds, strict=True):
        print_audit(args.target, run.audit(fn, one, at, op=op, package=module.split(".")[0]))
    return 0


def _in_versions(args: argparse.Namespace, versions: list[str], sms: list[str]) -> int:
    """This command, without --versions, in each version's environment."""
    from fp4lab.compile.matrix.env import env_dir
    from fp4lab.core import paths, process

    worst = 0
    for version in versions:
        python = env_dir(version) / "bin" / "python"
        if not python.exists():
            print(f"flashinfer {version}: no environment (notebook 09 or 12 builds it)")
            worst = 2
            continue
        cmd = [python, "-m", "fp4lab.compile.audit", args.target]
        cmd += [f"--sm={sm}" for sm in sms] + ([f"--inputs={args.inputs}"] if args.inputs else [])
        log = paths.build_dir() / "audit" / "logs" / f"cli-{version}.log"
        log.unlink(missing_ok=True)
        env = dict(os.environ, PYTHONPATH=str(paths.REPO_ROOT / "lib"))
        finished = process.run(cmd, log, study.TIMEOUT_S, env=env)
        print(f"== flashinfer {version} ==\n{process.tail(log, 200)}")
        worst = max(worst, finished.returncode or 0)
    return worst


if __name__ == "__main__":
    sys.exit(main())
