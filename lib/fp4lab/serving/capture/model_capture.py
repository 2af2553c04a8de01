"""Inside one SGLang environment: the release's own GLM-5 through its own piecewise runner, its
CUDA graphs captured and replayed, with ``fullgraph=False`` and with fp4lab's patch.

    python -m fp4lab.serving.capture.model_capture OUT.json SM CHECKPOINT

The release is imported for a simulated GPU of SM and the checkpoint's model built as the replay
builds it (``replay.model``); ``replay.runner`` drives the release's ``PiecewiseCudaGraphRunner``
on it, with FlashInfer seeing the target (``compile.stages.target_stages``):

* **eager**: the runner without ``install_torch_compiled``; one forward's logits;
* per variant of ``VARIANTS``, the release's runner three times, each a compile of its own:
  **uncaptured** (its compile pass, its capture left out, then one forward in the compile pass's
  contexts), **captured** (its compile pass and its own ``capture``, then one forward outside
  the compile marker, as its ``replay`` runs: every captured piece replays) and **debug** (the
  captured run with ``--enable-torch-compile-debug-mode``: where its input-address assertion
  fired). Every piece call of the captured run is observed (``sglang_backend.Observed``): which
  layer's weights it got, and for a replay, which layer its capture was made for.

Without a GPU ``recorder.simulated`` stands in for ``torch.cuda.graph``. Every forward reads the
same fixed token ids, written into the runner's static buffers.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import traceback
from pathlib import Path
from typing import Any

import torch

from fp4lab.compile import frames, stages
from fp4lab.core import paths, probe
from fp4lab.serving.capture import recorder, sglang_backend
from fp4lab.serving.replay.release import child, forward, model, plugin, runner
from fp4lab.serving.replay.shared import models

VARIANTS = ("fullgraph_false", "custom_op")
"""``fullgraph_false``: the release as released, ``install_torch_compiled`` given
``fullgraph=False`` as a user's edit would; ``custom_op``: ``fullgraph=True`` with fp4lab's patch
(its parts found as the replay's fix walk finds them: the FP4 quantize as a custom op, the DSA
parts as split ops)."""


def layer_of(built: model.Built) -> dict[int, int]:
    """Each weight's and buffer's address in the decoder layers, and its layer's index."""
    language = getattr(built.model, "language_model", built.model)
    return {
        t.data_ptr(): i
        for i, layer in enumerate(language.model.layers)
        for t in [*layer.parameters(), *layer.buffers()]
    }


DUMMY_SEED, DUMMY_RANGE = 1234, (0.5, 1.5)
"""SGLang's dummy loader's seed, and the range each layer's floating-point values are drawn from
here (its own default, -1e-3 to 1e-3, leaves a layer's share of the bf16 residual stream below
its resolution)."""

DISTINCT_LAYERS = {
    "name": "per_layer_dummy_weights",
    "module": "sglang.srt.model_loader.weight_utils.initialize_dummy_weights",
    "why": "SGLang's dummy loader seeds every parameter alike, in -1e-3 to 1e-3: layers of one "
    "shape get the same weights and add nothing the bf16 residual stream can hold, so a replay of "
    "another layer's capture could not show; each decoder layer's floating-point values are drawn "
    f"again by the release's own function, in {DUMMY_RANGE[0]} to {DUMMY_RANGE[1]}, with seed "
    f"{DUMMY_SEED} + its index, and its packed FP4 bytes (which the loader leaves as allocated, "
    "so they differ run to run) drawn with the same seed",
}
"""The one change to the built model, as a record lists it."""


def distinct_layers(built: model.Built) -> dict:
    """Each decoder layer's dummy weights drawn again (``DISTINCT_LAYERS``)."""
    from sglang.srt.model_loader.weight_utils import initialize_dummy_weights

    language = getattr(built.model, "language_model", built.model)
    for i, layer in enumerate(language.model.layers):
        initialize_dummy_weights(layer, *DUMMY_RANGE, seed=DUMMY_SEED + i)
        generator = torch.Generator().manual_seed(DUMMY_SEED + i)
        for packed in (t for t in layer.state_dict().values() if t.dtype == torch.uint8):
            packed.copy_(
                torch.randint(0, 256, packed.shape, generator=generator, dtype=torch.uint8)
            )
    return DISTINCT_LAYERS


def _logits(run: runner.Run, sm: tuple[int, int]) -> torch.Tensor:
    """The logits of one forward after the runner's uncaptured pass; RuntimeError naming why not."""
    status = run.compiled.outcome.status
    if status != "compiled":
        record = run.as_record()
        raise RuntimeError(f"the runner's pass ended {status}: {record['message']} (frames: "
                           f"{record['frames'][-4:]}; SGLang's: {record['sglang_frames'][-4:]})")  # fmt: skip
    logits, _, why = forward.output(run, sm)
    if logits is None:
        raise RuntimeError(f"the forward after the pass failed: {why}")
    return logits.clone()


def captured(built: model.Built, sm: tuple[int, int], fullgraph: bool) -> dict:
    """The runner with its own capture (``drive(capture=...)``), then the replayed forward; the
    logits and every piece call of the capture and of the replay."""
    log: list[dict] = []
    layers = layer_of(built)
    compiled_before: list[int] = []

    def before_capture(graphs: Any) -> None:
        compiled_before.append(len(graphs.backends))
        sglang_backend.observe(graphs.backends, layers, log)

    with recorder.simulated() if not torch.cuda.is_available() else contextlib.nullcontext():
        run = runner.drive(built, sm, capture=before_capture, fullgraph=fullgraph)
        in_capture = list(log)
        log.clear()
        record = run.as_record()
        logits, said, why = (
            None,
            record["message"] or "",
            f"the captured run ended {record['status']}",
        )
        if record["status"] == "compiled":
            logits, _, said = forward.output(run, sm, replay=True)
            why = "the replayed forward failed"
    return {"run": run, "logits": logits, "why": f"{why}: {said}", "said": said,
            "in_capture": in_capture, "step": log, "pieces": sglang_backend.pieces(run.graphs.backends),
            "graphs_first_compiled_in_capture": len(run.graphs.backends) - sum(compiled_before)}  # fmt: skip


def debug_mode(built: model.Built, sm: tuple[int, int], fullgraph: bool) -> dict:
    """The captured run with SGLang's debug mode on: where its input-address assertion fired."""
    args = built.server_args
    saved = args.enable_torch_compile_debug_mode
    args.enable_torch_compile_debug_mode = True
    try:
        found = captured(built, sm, fullgraph)
    finally:
        args.enable_torch_compile_debug_mode = saved
    if found["logits"] is None and "Input addresses" in found["said"]:
        during = "capture pass" if found["run"].compiled.outcome.status != "compiled" else "replay"
        return {"assertion": found["said"].split(" Expected [")[0], "during": during}
    return {"assertion": None, "during": None}


def variant_row(built: model.Built, sm: tuple[int, int], variant: str, eager: torch.Tensor,
                **extra: Any) -> dict:  # fmt: skip
    """One variant: the captured step against the uncaptured one and eager, the pieces; or the
    error SGLang's own code raised in the replayed forward (``replay_error``, with its frame)."""
    fullgraph = variant != "fullgraph_false"
    head = {"variant": variant, "fullgraph": fullgraph, **extra}
    uncaptured = _logits(runner.drive(built, sm, fullgraph=fullgraph), sm)
    found = captured(built, sm, fullgraph)
    run = found["run"]
    common = {**head, "tokens": model.TOKENS, "dynamo_graphs": run.compiled.counts.get(
              "num_graphs_seen"), "pieces": found["pieces"],
              "captures": sum(e["did"] == "captured" for e in found["in_capture"]),
              "graphs_first_compiled_in_capture": found["graphs_first_compiled_in_capture"]}  # fmt: skip
    if found["logits"] is None:
        if run.compiled.outcome.status == "compiled" and "[at sglang/" in found["said"]:
            # SGLang's own code refused the replay
            return {**common, "replay_error": found["said"],
                    "debug_mode": debug_mode(built, sm, fullgraph)}  # fmt: skip
        record = run.as_record()
        return {**head, "not_measured": found["why"], "frames": record["frames"][-6:],
                "sglang_frames": record["sglang_frames"][-6:]}  # fmt: skip
    if not common["captures"]:
        return {**head, "not_measured": "the runner's capture captured no piece"}
    return {**common, **sglang_backend.compared(found["step"], found["logits"], uncaptured, eager),
            "debug_mode": debug_mode(built, sm, fullgraph)}  # fmt: skip


def runnable(built: model.Built, sm: tuple[int, int], version: str, out: Path) -> list[str]:
    """The patch parts the release's runner needs to run the model at all, eagerly (a split op
    whose schema lacks an argument fails eagerly too), applied in this process; RuntimeError
    where it fails eagerly for another reason."""
    parts: list[str] = []
    while True:
        run = runner.drive(built, sm, eager=True)
        if run.compiled.outcome.status == "compiled":
            return parts
        record = run.as_record()
        needed = child.part_for({**record, "status": "unsupported"})
        if needed is None or needed in parts:
            raise RuntimeError(f"the release's runner fails eagerly: {record['message']}")
        parts.append(needed)
        plugin.apply_part(built, sm, version, needed, out.parent / "patch")


def measure(built: model.Built, sm: tuple[int, int], version: str, out: Path) -> list[dict]:
    """Both variants' rows; the patch parts each needed stay applied in this process."""
    if built.reworked:
        why = ("the release's reworked prefill runner (PrefillCudaGraphRunner) is driven without "
               "its capture here")  # fmt: skip
        return [{"variant": v, "not_measured": why} for v in VARIANTS]
    with stages.applied(stages.target_stages(sm)), torch.no_grad():
        parts = runnable(built, sm, version, out)
        eager = _logits(runner.drive(built, sm, eager=True), sm)
        rows = [variant_row(built, sm, "fullgraph_false", eager, parts=parts)]
        fixed = child.fix_walk(built, sm, version, out)
        if not fixed["compiles"]:
            rows.append({"variant": "custom_op", "not_measured": "fp4lab's patch does not make "
                         f"the model compile here: {fixed['steps'][-1].get('message')}"})  # fmt: skip
            return rows
        eager = _logits(runner.drive(built, sm, eager=True), sm)
        rows.append(variant_row(built, sm, "custom_op", eager, parts=[*parts, *fixed["parts"]]))
    return rows


def main(out: Path, sm_text: str, checkpoint: str) -> int:
    os.environ.setdefault("SGLANG_CACHE_DIR", str(paths.build_dir() / "cache" / "sglang"))
    os.environ.setdefault(
        "SGLANG_JIT_CACHE_DIR", str(paths.build_dir() / "cache" / "sglang" / "jit")
    )
    probe.machine()  # probed before torch is made to claim a GPU
    sm = tuple(int(p) for p in sm_text.split("."))
    found: dict[str, Any] = {"sm": sm_text, "capture": "cuda" if torch.cuda.is_available()
                             else "simulated"}  # fmt: skip
    try:
        with model.imported(sm) as release:
            import sglang

            _, flags = model.resolved(release, Path(checkpoint))  # its runner is tc_piecewise's
            given = models.read(Path(checkpoint))
            built = model.build(release, Path(checkpoint), model.command_line(given, flags or []))
            found |= {"sglang_version": sglang.__version__, "standins": [
                *built.standins, *runner.standins(built), recorder.LISTED, distinct_layers(built)]}  # fmt: skip
            found["rows"] = measure(built, sm, sglang.__version__, out)
    except Exception as exc:  # the parent records it as not measured, with its frames
        found["error"] = frames.said(exc)
        found["traceback"] = traceback.format_exc()[-4000:]
    out.write_text(json.dumps(found, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]), *sys.argv[2:4]))
