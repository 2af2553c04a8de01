"""Inside one SGLang environment: the story through SGLang's compile path, or its quantize choice.

    python -m fp4lab.serving.replay.child OUT.json replay SM
    python -m fp4lab.serving.replay.child OUT.json select SM

``replay``: a GLM-5-shaped NVFP4 layer calling ``flashinfer.fp4_quantize`` (the SM120 branch of
0.5.9) compiled through SGLang's ``install_torch_compiled`` and ``SGLangBackend``; the story's
blocker chain walked with ``compile.stages`` (FlashInfer sees the target SM through them), the
story's ``torch.compiler.disable`` patch on top, then the same layer through fp4lab's custom op
and through SGLang's own ``torch.ops.sglang.flashinfer_fp4_quantize`` where the release has it.
``select``: SGLang made to see a GPU of SM before it is imported, its ``modelopt_quant`` imported,
the quantize its NVFP4 linear method calls identified, and that path compiled the same way.
"""

from __future__ import annotations

import contextlib
import json
import platform
import sys
import warnings
from collections.abc import Callable
from pathlib import Path

import torch

from fp4lab.compile import fix, segment, stages, target
from fp4lab.core import evidence, glm5, probe
from fp4lab.serving import read_parser
from fp4lab.serving.replay import inside, quantize

SHAPE = segment.LayerShape(hidden=64, heads=2, ffn=128)
TOKENS = 16
KEEP = ("signature", "message", "skipped_builtin", "blocker_frame", "frames", "sglang_frames",
        "sglang_counter", "split_ops", "sglang_contexts", "entry", "backend", "seconds",
        "exception", "status", "graph_count", "cause")  # fmt: skip


def _stack(quantize_fn: Callable) -> segment.Stack:
    return segment.Stack(SHAPE, 1, quantize_fn)


def _row(compiled: inside.Compiled, kernel: str | None, simulated: bool, **extra: object) -> dict:
    data = compiled.as_record()
    return {
        **{k: data[k] for k in KEEP},
        "kernel": kernel,
        "evidence": evidence.of_run(traced=True, simulated=simulated, kernel=kernel),
        **extra,
    }


def walk(
    quantize_fn: Callable, x: torch.Tensor, sm: tuple[int, int], story_patch: bool = True
) -> list[dict]:
    """The blocker chain through SGLang's compile: each blocker removed by its staged remedy
    (``stages.stage_for``), stopping at the JIT's file I/O, a compiled trace or a blocker with
    none; then (``story_patch``) the story's ``torch.compiler.disable`` patch on top."""
    rows, applied = [], []
    stage: stages.Stage | None = stages.Stage("none", "baseline", "", contextlib.nullcontext)
    with contextlib.ExitStack() as stack:
        while stage is not None and len(rows) < 8:
            stack.enter_context(stage.enter())
            applied += [stage] if rows else []
            with fix.observing() as ran:
                compiled = inside.compile_through_sglang(_stack(quantize_fn), x)
            seen = probe.target()
            rows.append(_row(compiled, ran.kernel, seen["simulated"], step=len(rows),
                             stage=stage.name, origin=stage.origin, story=stage.story))  # fmt: skip
            signature = compiled.outcome.signature
            if signature in ("file_io", "ok"):
                break
            stage = stages.stage_for(compiled.outcome, {s.name for s in applied}, sm)
        if story_patch and rows[-1]["signature"] == "file_io":
            with stages.COMPILER_DISABLED.enter(), fix.observing() as ran:
                compiled = inside.compile_through_sglang(_stack(quantize_fn), x)
            rows.append(_row(compiled, ran.kernel, probe.target()["simulated"], step=len(rows),
                             stage=stages.COMPILER_DISABLED.name, origin="story",
                             story=stages.COMPILER_DISABLED.story))  # fmt: skip
    return rows


def through_op(name: str, quantize_fn: Callable, x: torch.Tensor, sm: tuple[int, int]) -> dict:
    """The layer compiled through SGLang with ``quantize_fn`` (an op), its counts, and its output
    against the same layer run eagerly on fp4lab's reference quantize."""
    expected = _stack(fix.reference_fp4_quantize)(x)
    with target.simulated_target(sm) as seen, fix.observing() as ran:
        compiled = inside.compile_through_sglang(_stack(quantize_fn), x)
    out = compiled.outcome.output
    equal = out is not None and torch.equal(out, expected)
    return _row(compiled, ran.kernel, seen["simulated"], op=name, equals_eager=equal,
                max_abs_diff=None if out is None else float((out - expected).abs().max()))  # fmt: skip


def replay(sm: tuple[int, int]) -> dict:
    """The story's chain, fp4lab's op and SGLang's op, each through SGLang's compile path."""
    standins = inside.runtime_standins()
    x = segment.tokens_input(SHAPE, TOKENS)
    with torch.no_grad():
        chain = walk(target.fp4_quantize, x, sm)
        with fix.custom_op_fp4_quantize():
            ours = through_op(fix.OP_NAME, target.fp4_quantize, x, sm)
        with quantize.sglang_op_on_reference() as op:
            theirs = through_op(*op, x, sm) if op else {"present": False}
    return {"chain": chain, "fp4lab_op": ours, "sglang_op": theirs, "runtime_standins": standins}


def piecewise_options() -> list[dict]:
    """The piecewise / prefill CUDA-graph options of the release's own ``ServerArgs`` parser."""
    import argparse

    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    wanted = ("piecewise-cuda-graph", "cuda-graph-backend")
    return [
        o for o in read_parser.describe(parser) if any(w in " ".join(o["options"]) for w in wanted)
    ]


AUTO_DISABLE = (
    ("sglang.srt.configs.model_config", "is_piecewise_cuda_graph_disabled_model"),
    ("sglang.srt.configs.model_config", "piecewise_cuda_graph_disabled_model_archs"),
)
"""Where a release decides that a model architecture gets no piecewise CUDA graphs unless
enforced: its function, else its list (releases before 0.5.1x have neither)."""


def glm5_auto_disabled() -> dict:
    """Whether the release's own auto-disable rule turns piecewise graphs off for GLM-5's
    architecture, and which of its names said so (``None``: the release has no such rule)."""
    import importlib

    for module, name in AUTO_DISABLE:
        try:
            found = getattr(importlib.import_module(module), name, None)
        except ImportError:
            continue
        if callable(found):
            return {"disabled": bool(found([glm5.ARCHITECTURE])), "from": f"{module}.{name}"}
        if found is not None:
            return {"disabled": glm5.ARCHITECTURE in found, "from": f"{module}.{name}"}
    return {"disabled": False, "from": None}


def select(sm: tuple[int, int]) -> dict:
    """SGLang's NVFP4 linear quantize as imported on a simulated GPU of ``sm``, and that path
    compiled through SGLang (torch claims the GPU during the import only: SGLang reads the SM
    there; FlashInfer then sees the target through the story's stages, as in ``replay``)."""
    probe.machine()  # probed before torch is made to claim a GPU
    with inside.simulated_gpu(sm) as patched, inside.absent_kernel_fakes_skipped() as skipped:
        standins = inside.runtime_standins()
        chosen = quantize.chosen()
    standins.append({"name": "absent_sgl_kernel_fakes_skipped", "module": "torch.library",
                     "ops": sorted(set(skipped)), "why": "SGLang registers fakes for sgl_kernel "
                     "ops at import on CUDA; their CUDA-only library is not loaded here"})  # fmt: skip
    x = segment.tokens_input(SHAPE, TOKENS)
    chain: list[dict] = []
    traceable = chosen["implementation"] in ("flashinfer_direct", "sglang_op")
    if chosen["callable"] is not None and (traceable or chosen["op_exists"]):
        with torch.no_grad(), quantize.kernel_on_reference(chosen) as fn:
            chain = walk(fn, x, sm, story_patch=False)
    chosen.pop("callable")
    try:
        chosen["piecewise_options"] = piecewise_options()
        chosen["glm5_auto_disabled"] = glm5_auto_disabled()
    except Exception as exc:  # recorded: the parser could not be built here
        chosen["piecewise_options_error"] = f"{type(exc).__name__}: {exc}"
    return {
        **chosen,
        "chain": chain,
        "patched": patched,
        "patched_during": "import",
        "runtime_standins": standins,
    }


def main(argv: list[str]) -> int:
    if len(argv) != 3 or argv[1] not in ("replay", "select"):
        print(
            "usage: python -m fp4lab.serving.replay.child OUT.json replay|select SM",
            file=sys.stderr,
        )
        return 2
    out, mode, sm = argv
    warnings.simplefilter("ignore")
    major, minor = (int(p) for p in sm.split("."))
    found = (replay if mode == "replay" else select)((major, minor))
    found.update(python=platform.python_version(), torch=torch.__version__,
                 flashinfer=getattr(target.flashinfer, "__version__", None),
                 import_staging=target.IMPORT_STAGING)  # fmt: skip
    Path(out).write_text(json.dumps(found, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
