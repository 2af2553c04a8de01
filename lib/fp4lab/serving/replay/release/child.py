"""Inside one SGLang environment: the release's own models through its piecewise runner, on one SM.

    python -m fp4lab.serving.replay.release.child OUT.json replay SM CUDA_HOMES MODES CHECKPOINT...

The release is imported once for a simulated GPU of SM (``model.imported``; its model registry
too where that changes nothing, and the modules dynamo imports at its first trace: ``registry``);
then, in a fork per tiny CHECKPOINT folder (``models.write_tiny``; GLM-5's ``GlmMoeDsaForCausalLM``
in the story) and its walk (``MODES``), the release's class is built (``model.build``) and its
piecewise runner is driven on it (``runner.drive``), as the server's ``ModelRunner`` does:

* **eager** (every walk but ``breakable``, first): the runner without ``install_torch_compiled``;
* **chain** (MODE ``chain`` or ``story``): the story's blocker chain through the runner, each
  blocker removed by its staged remedy (``compile.stages``), stopping at the JIT's file I/O, a
  compiled model or a blocker with none; with ``story``, the story's ``torch.compiler.disable``
  patch on top, and the first blocker once per CUDA_HOME in CUDA_HOMES (``unset`` or a path);
* **fix** (MODE ``patch``): the user's patch (``patch.PARTS``), written as the plugin file and
  imported, one part added for each blocker it removes, until the model compiles or a blocker
  has no part; then the same runner eagerly with the same patch, and the logits of both compared;
* **captured** (MODE ``breakable`` or ``full``): the release's capture and replays (``prefill_walk``).

Each walk has a fork of its own: walks in one process change each other (memos of the release
and its kernels, attributes its layers set at their first forward, dynamo's caches).

CUDA_HOMES and MODES (one per CHECKPOINT) are comma-separated; OUT holds ``replays`` in order."""

from __future__ import annotations

import contextlib
import json
import os
import platform
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from fp4lab.compile import fix, frames, stages, target
from fp4lab.core import evidence, forks, paths, probe
from fp4lab.serving.replay.release import (
    availability,
    facts,
    forward,
    kernels,
    model,
    plugin,
    prefill_walk,
    reached,
    registry,
    runner,
)
from fp4lab.serving.replay.release.failed import build_failed, failure
from fp4lab.serving.replay.shared import flags, models, patch

KEEP = ("signature", "message", "skipped_builtin", "blocker_frame", "frames", "sglang_frames",
        "sglang_counter", "split_ops", "sglang_contexts", "entry", "backend", "seconds",
        "exception", "status", "graph_count", "cause", "graph_custom_ops", "split_op_calls",
        "expected_pieces", "cut_pieces", "split_ops_used", "eager")  # fmt: skip

INDEXER_FILES = ("nsa_indexer.py", "dsa_indexer.py")
"""The DSA indexer's file in each layout (``layout.DSA_HOMES``)."""


def _row(run: runner.Run, kernel: str | None, simulated: bool, **extra: object) -> dict:
    data = run.as_record()
    if data["status"] == "declined":
        data["signature"] = "declined"
    return {
        **{k: data[k] for k in KEEP},
        "graph_break": frames.graph_break_code(data["message"]),
        "kernel": kernel,
        "evidence": evidence.of_run(
            traced=not run.eager and data["status"] != "declined",
            simulated=simulated,
            kernel=kernel,
        ),
        **extra,
    }


def part_for(row: dict) -> str | None:
    """The patch part that removes the blocker ``row`` shows, or None: a trace blocker in the FP4
    quantize, the DSA indexer or SGLang's MUSA probe, or DSA attention's ``topk_indices`` refused by the release's
    attention split op (traced or run: the release's piecewise path fails there eagerly too)."""
    stack = row.get("frames", [])
    words = " ".join(str(row.get(k) or "") for k in ("message", "cause"))
    if "unified_attention_with_output" in words and "topk_indices" in words:
        return "dsa_attention_split_op"
    if row["status"] != "unsupported":  # compiled, or failed while running: no trace blocker
        return None
    if any(f.endswith(":is_musa") for f in stack):
        return "musa_probe_constant"
    if any("modelopt_quant.py" in f for f in stack) and any(
        f.startswith("flashinfer/") for f in stack
    ):
        return "fp4_quantize_op"
    if any(f"/{name}:" in f or name in words for name in INDEXER_FILES for f in [*stack, ""]):
        return "dsa_indexer_split_op"
    return None


def _attempt(built: model.Built, sm: tuple[int, int], **extra: object) -> tuple[dict, runner.Run]:
    with fix.observing() as ran:
        run = runner.drive(built, sm)
    return _row(run, ran.kernel, probe.target()["simulated"], **extra), run


def walk(built: model.Built, sm: tuple[int, int], story: bool) -> list[dict]:
    """The blocker chain through the release's runner (see the module docstring)."""
    rows, applied = [], []
    stage: stages.Stage | None = stages.Stage("none", "baseline", "", contextlib.nullcontext)
    with contextlib.ExitStack() as stack:
        while stage is not None and len(rows) < 8:
            stack.enter_context(stage.enter())
            applied += [stage] if rows else []
            row, run = _attempt(built, sm, step=len(rows), stage=stage.name,
                                origin=stage.origin, story=stage.story)  # fmt: skip
            rows.append(row)
            if row["signature"] in ("file_io", "ok"):
                break
            stage = stages.stage_for(run.compiled.outcome, {s.name for s in applied}, sm)
        if story and rows[-1]["signature"] == "file_io":
            with stages.COMPILER_DISABLED.enter(), _quantize_rebound_to_flashinfer():
                rows.append(_attempt(built, sm, step=len(rows), stage=stages.COMPILER_DISABLED.name,
                                     origin="story", story=stages.COMPILER_DISABLED.story)[0])  # fmt: skip
    return rows


@contextlib.contextmanager
def _quantize_rebound_to_flashinfer() -> Iterator[None]:
    """The story's decorated ``fp4_quantize`` where SGLang bound FlashInfer's by name (its
    module kept the undecorated function object)."""
    module = sys.modules.get("sglang.srt.layers.quantization.modelopt_quant")
    bound = getattr(module, "fp4_quantize", None)
    if getattr(bound, "__wrapped__", bound) is not target.FLASHINFER_FP4_QUANTIZE:
        yield
        return
    with target.attribute_replaced(module, "fp4_quantize", target.flashinfer.fp4_quantize):
        yield


def cuda_home_cases(built: model.Built, sm: tuple[int, int], cases: list[str]) -> list[dict]:
    """The first blocker on the simulated target for each CUDA_HOME (``unset``: neither CUDA_HOME
    nor CUDA_PATH; FlashInfer's ``get_cuda_path`` then runs ``which nvcc``)."""
    rows = []
    for case in cases:
        saved = {k: os.environ.pop(k, None) for k in ("CUDA_HOME", "CUDA_PATH")}
        if case != "unset":
            os.environ["CUDA_HOME"] = case
        try:
            with stages.applied(stages.target_stages(sm)):
                rows.append(_attempt(built, sm, cuda_home=case)[0])
        finally:
            os.environ.pop("CUDA_HOME", None)
            os.environ.update({k: v for k, v in saved.items() if v is not None})
    return [{k: r[k] for k in ("cuda_home", "signature", "blocker_frame", "frames", "message",
                                "evidence")} for r in rows]  # fmt: skip


def fix_walk(built: model.Built, sm: tuple[int, int], version: str, out: Path) -> dict:
    """The user's patch, part by part (see the module docstring)."""
    parts: list[str] = []
    steps: list[dict] = []
    label, binding = f"{sm[0]}.{sm[1]}", plugin.quantize_binding(built)
    with stages.applied(stages.target_stages(sm)):
        while True:
            row, compiled = _attempt(built, sm, parts=list(parts))
            steps.append(row)
            needed = part_for(row)
            if needed is None or needed in parts:
                break
            parts.append(needed)  # this step's part alone is imported: earlier ones are applied
            plugin.apply_part(built, sm, version, needed, out.parent / "patch")
        result = {"steps": steps, "parts": parts, "compiles": steps[-1]["status"] == "compiled",
                  "plugin": patch.render(version, label, parts, binding) if parts else None}  # fmt: skip
        if result["compiles"]:
            got = forward.output(compiled, sm)  # before the eager pass takes the trampoline off
            record = compiled.as_record()
            result |= {"graphs": compiled.compiled.counts.get("num_graphs_seen"),
                       "pieces": compiled.compiled.counts.get("num_piecewise_capturable_graphs_seen"),
                       **{k: record[k] for k in ("expected_pieces", "cut_pieces", "split_ops_used",
                                                 "graph_custom_ops")}}  # fmt: skip
            result |= plugin.compared(got, forward.output(runner.drive(built, sm, eager=True), sm))
            result["evidence"] = evidence.of_run(traced=True, simulated=probe.target()["simulated"],
                                                 kernel=result["kernel"])  # fmt: skip
    return result


def eager_release(built: model.Built, sm: tuple[int, int]) -> dict:
    """The runner eagerly on the release's own code (FlashInfer seeing the target)."""
    with stages.applied(stages.target_stages(sm)), fix.observing() as ran:
        run = runner.drive(built, sm, eager=True)
    data, unlisted = run.as_record(), runner.unlisted_moe(built)
    return {"status": data["status"], "exception": data["exception"], "message": data["message"],
            "frames": data["frames"][-6:], "kernel": ran.kernel, "moe_unlisted": unlisted}  # fmt: skip


MODES = ("story", "chain", "patch", *flags.CAPTURED)
"""What a replay walks (the module docstring): ``patch``, ``chain``, ``story`` or a captured graph."""

MODEL_TIMEOUT_S = 480
"""The longest one model's replay (its fork) may take."""


def replay_all(sm: tuple[int, int], cuda_homes: list[str], modes: list[str], out: Path,
               checkpoints: list[Path]) -> dict:  # fmt: skip
    """Each checkpoint's replay (``replay``) in its mode, the release (and its registry where it
    may: ``registry``) imported once, each model built and driven in a fork of its own."""
    os.environ.setdefault("SGLANG_CACHE_DIR", str(paths.build_dir() / "cache" / "sglang"))
    os.environ.setdefault(
        "SGLANG_JIT_CACHE_DIR", str(paths.build_dir() / "cache" / "sglang" / "jit")
    )
    probe.machine()  # probed before torch is made to claim a GPU
    try:
        with model.imported(sm) as release:
            once = registry.imported_once(sm, out.with_name(f"{out.stem}-registry.json"))
            return {"registry": once, "replays": [
                forks.forked(lambda c=c, m=m: replay(release, cuda_homes, m, out, c),
                             out.with_name(f"{out.stem}-{i}.json"), MODEL_TIMEOUT_S)
                for i, (c, m) in enumerate(zip(checkpoints, modes, strict=True))]}  # fmt: skip
    except Exception as exc:  # recorded per model: the release failed to import here
        return {"replays": [build_failed(exc, models.read(c).architecture) for c in checkpoints]}


def replay(release: model.Release, cuda_homes: list[str], mode: str, out: Path,
           checkpoint: Path) -> dict:  # fmt: skip
    """Everything ``mode`` asks for, measured for the release's model of ``checkpoint`` (see the
    module docstring); in a process of its own."""
    torch.set_num_threads(1)  # the importing process's thread pool is not in its fork
    reached.REACHED.clear()  # counted afresh in each fork
    refused = out.with_name(f"{out.stem}-{os.getpid()}.refused")  # ``kernels.ninja_refused``
    os.environ["FP4LAB_REFUSED_BUILDS"] = str(refused)
    sm = release.sm
    found: dict[str, Any] = {}
    given = models.read(checkpoint)
    found["architecture"] = given.architecture
    found["resolution"], reaching = model.resolved(release, checkpoint)
    if mode in flags.CAPTURED:
        return prefill_walk.walk(release, checkpoint, found, refused, mode) | facts.release_rules()
    try:
        built = model.build(release, checkpoint, model.command_line(given, reaching or []))
    except Exception as exc:  # recorded: the exact obstacle on this machine
        return found | build_failed(exc, given.architecture)
    found |= {"facts": built.facts, "standins": built.standins,
              "build_seconds": round(built.seconds, 1)}  # fmt: skip
    if reaching is None:  # no option reaches torch.compile piecewise graphs: nothing to drive
        return found | {"not_driven": "no option reaches tc_piecewise"} | facts.release_rules()
    found["standins"] = [*built.standins, *runner.standins(built)]
    try:
        with torch.no_grad():
            found["eager_release"] = eager_release(built, sm)
            if mode == "patch":
                found["fix"] = fix_walk(built, sm, facts.version(), out)
            else:
                found["chain"] = walk(built, sm, mode == "story")
            if mode == "story":
                found["cuda_home"] = cuda_home_cases(built, sm, cuda_homes)
    except Exception as exc:  # fp4lab's drive failed: not measured, never a verdict
        found["harness_error"] = failure(exc)
    found["jit_builds_refused"] = kernels.refused_builds(refused)  # their fallbacks were traced
    found["kernels_reached"] = dict(sorted(reached.REACHED.items()))
    found["standins_reached"] = reached.names(found["standins"])
    try:
        found["kernel_availability"] = availability.check(
            reached.REACHED, vars(built.server_args), sm
        )
    except Exception as exc:  # fp4lab's reading failed: the kernels' availability is unknown
        found["kernel_availability_error"] = failure(exc)
    return found | facts.release_rules()


def main(argv: list[str]) -> int:
    modes = argv[4].split(",") if len(argv) > 4 else []
    if (
        len(argv) < 6
        or argv[1] != "replay"
        or len(modes) != len(argv) - 5
        or any(m not in MODES for m in modes)
    ):
        print(f"usage: python -m fp4lab.serving.replay.release.child OUT.json replay SM CUDA_HOMES "
              f"MODES CHECKPOINT... (MODES: one of {', '.join(MODES)} per CHECKPOINT, "
              f"comma-separated)", file=sys.stderr)  # fmt: skip
        return 2
    out, _, sm, cuda_homes, _, *checkpoints = argv
    warnings.simplefilter("ignore")
    major, minor = (int(p) for p in sm.split("."))
    found = {**replay_all((major, minor), cuda_homes.split(","), modes, Path(out),
                          [Path(c) for c in checkpoints]),
             "python": platform.python_version(), "torch": torch.__version__,
             "release_torch": facts.pinned("torch"),
             "flashinfer": getattr(target.flashinfer, "__version__", None),
             "import_staging": target.IMPORT_STAGING}  # fmt: skip
    Path(out).write_text(json.dumps(found, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
