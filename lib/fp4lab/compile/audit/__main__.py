"""``python -m fp4lab.compile.audit module:function --sm 12.0 --inputs "bf16[128,64] f32[1]"``

Traces any callable under torch.compile(fullgraph=True) with the target SM simulated and prints
its blocker chain: each blocker met, the stage that removed it, and the verdict on this machine
and on the target (CPU artefacts removed). With ``--versions`` it runs in each FlashInfer
version's environment (build/matrix/). Without ``--inputs``, a FlashInfer entry point's inputs
are built from its signature.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import warnings

from fp4lab.compile.audit import inputs, run, study
from fp4lab.compile.matrix.versions import check_versions
from fp4lab.compile.trace import SIGNATURES
from fp4lab.core import params


def _epilog() -> str:
    stages = "\n".join(f"  {name}: {note}" for name, note in run.STAGE_NOTES.items())
    return (
        f"stages (applied in turn, each for the blocker it removes):\n{stages}\n"
        f"signatures (how a blocker is named): {', '.join(SIGNATURES)}\n"
        f"verdicts: {', '.join(run.VERDICTS)}\n"
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


def print_audit(target: str, sm: str, found: dict) -> None:
    print(f"{target} on SM{sm} (simulated: {found['simulated']}), {found['tensors']} tensors")
    if found["fake_because"]:
        print(f"  fake tensors because the call cannot run here ({found['fake_because']})")
    for row in found["chain"]:
        where = f" at {row['blocker_frame']}" if row["blocker_frame"] else ""
        message = f": {row['message']}" if row["message"] else ""
        print(
            f"  step {row['step']} [{row['stage']}, {row['origin']}] {row['signature']}{where}{message}"
        )
    cpu, tgt = found["cpu"], found["target"]
    print(f"  this machine: {cpu['verdict']} ({cpu['signature']})")
    stages = ", ".join(found["target_stages"]) or "none"
    print(f"  target (stages: {stages}): {tgt['verdict']} ({tgt['signature']})")
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
    parser.add_argument("--tensors", default="auto", choices=run.TENSOR_MODES)
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
    try:
        fn = resolve(args.target)
        module, _, name = args.target.partition(":")
        if args.inputs is None:
            from fp4lab.compile.audit import surface

            spec = inputs.for_signature(fn, name, surface.kind_of(name))
        else:
            spec = inputs.parse(args.inputs)
        build = inputs.bind(fn, *spec)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    op = f"{module.split('.')[0]}::{name.split('.')[-1]}"
    for sm in sms:
        found = run.audit(
            fn, build, tuple(int(p) for p in sm.split(".")), tensors=args.tensors, op=op
        )
        print_audit(args.target, sm, found)
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
        cmd = [python, "-m", "fp4lab.compile.audit", args.target, "--tensors", args.tensors]
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
