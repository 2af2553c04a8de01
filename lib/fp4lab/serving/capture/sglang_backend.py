"""Inside one SGLang environment: notebook 04's stack through the release's own
``install_torch_compiled``, ``SGLangBackend`` and ``CUDAPiecewiseBackend``, in the order its
piecewise runner drives them.

    python -m fp4lab.serving.capture.sglang_backend OUT.json SCALE LAYERS TOKENS[,TOKENS...]

The runner's order: install, a compile pass (one forward per capture size, largest first, in
the release's warm-up context: pieces run, nothing is captured), a capture pass (two forwards
per size: the first warms each piece up, the second captures it) and a replay step, its batch
copied into the static input buffer the capture read. Each variant of ``VARIANTS`` is run three
times, each after ``torch._dynamo.reset()`` on a fresh stack of the same weights: uncaptured (the
compile pass only, then the step in the warm-up context), captured, and captured in SGLang's
debug mode (its input-address check). Every piece call is observed without being changed: which
layer's weights it got, whether it ran, captured or replayed, and for a replay, the layers and
input addresses of its capture. Capture is real on a CUDA device and imitated by
``recorder.simulated`` elsewhere.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from fp4lab.compile import fix, frames, segment
from fp4lab.core import paths
from fp4lab.serving.capture import recorder
from fp4lab.serving.capture.release import Release, Unsplittable

VARIANTS = {
    "fullgraph_false": (False, "compiled_with_breaks"),
    "custom_op": (True, "compiled_fullgraph_custom_op"),
}
"""Each variant: the ``fullgraph`` passed to ``install_torch_compiled`` and notebook 04's
quantize of it (``torch.compiler.disable``'d for graph breaks, the custom op for the fix)."""

CAPTURE_SEED, STEP_SEED = 7, 11
"""The static input buffer's data at the capture, and the replayed step's batch."""


@dataclass
class Observed:
    """One piece of one dynamo graph, called through unchanged: what each call did."""

    piece: Any
    graph: int
    name: str
    layer_of: dict[int, int]
    log: list[dict]
    captures: dict[Any, dict] = field(default_factory=dict)

    def _seen(self, args: tuple) -> tuple[list[int], list[int]]:
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        layers = sorted(
            {self.layer_of[t.data_ptr()] for t in tensors if t.data_ptr() in self.layer_of}
        )
        return layers, [t.data_ptr() for t in tensors]

    def __call__(self, *args: Any) -> Any:
        indices = self.piece.sym_shape_indices
        tokens = args[indices[0]] if indices else None
        entry = self.piece.concrete_size_entries.get(tokens) if tokens is not None else None
        before = entry.cudagraph if entry is not None else None
        layers, addresses = self._seen(args)
        output = self.piece(*args)
        after = entry.cudagraph if entry is not None else None
        event = {"graph": self.graph, "piece": self.name, "tokens": tokens, "layers": layers}
        if before is None and after is not None:
            self.captures[tokens] = {"layers": layers, "addresses": addresses}
            event["did"] = "captured"
        elif before is not None:
            capture = self.captures[tokens]
            event.update(did="replayed", captured_for=capture["layers"],
                         moved=addresses != capture["addresses"])  # fmt: skip
        else:
            event["did"] = "ran"
        self.log.append(event)
        return output


def observe(backends: list[Any], layer_of: dict[int, int], log: list[dict]) -> None:
    """Every piece of the release's ``backends`` (``SGLangBackend``s, in the order dynamo made
    their graphs) wrapped in ``Observed``, logging into ``log``."""
    for index, backend in enumerate(backends):
        for item in backend.piecewise_graphs:
            piece = backend.split_gm.__dict__.get(item.submod_name)
            if item.is_splitting_graph or isinstance(piece, Observed):
                continue
            backend.split_gm.__dict__[item.submod_name] = Observed(
                piece, index, item.submod_name, layer_of, log
            )


def pieces(backends: list[Any]) -> int:
    """The pieces (not the split ops between them) of every graph of ``backends``."""
    return sum(not i.is_splitting_graph for b in backends for i in b.piecewise_graphs)


@dataclass
class Drive:
    """One variant's stack under the release's backend, every piece observed."""

    release: Release
    variant: str
    shape: segment.LayerShape
    layers: int
    sizes: list[int]
    debug: bool = False
    log: list[dict] = field(default_factory=list)
    backends: list[Any] = field(default_factory=list)

    def __post_init__(self) -> None:
        torch._dynamo.reset()
        fullgraph, quantize = VARIANTS[self.variant]
        self.stack = segment.Stack(self.shape, self.layers,
                                   fix.quantize_for(quantize, torch.device("cpu")),
                                   split_attention=True)  # fmt: skip
        self.layer_of = {
            t.data_ptr(): i
            for i, layer in enumerate(self.stack.layers)
            for t in [*layer.parameters(), *layer.buffers()]
        }
        config = self.release.compile_config(list(self.sizes), self.debug)
        pool = torch.cuda.graph_pool_handle() if self.release.cuda else object()

        def backend_factory(graph: Any, example_inputs: list) -> Any:
            backend = self.release.backend(config, pool)
            self.backends.append(backend)
            return backend(graph, example_inputs)

        self.release.install(self.stack, fullgraph=fullgraph, backend_factory=backend_factory,
                             compile_config=config, graph_pool=pool)  # fmt: skip
        self.static = segment.tokens_input(self.shape, max(self.sizes), seed=CAPTURE_SEED)

    def _observe(self) -> None:
        observe(self.backends, self.layer_of, self.log)

    def compile_pass(self) -> None:
        with torch.no_grad(), self.release.phase("warmup"):
            for tokens in sorted(self.sizes, reverse=True):
                self.stack(self.static[:tokens])
        self._observe()

    def capture_pass(self) -> None:
        stream = torch.cuda.Stream() if self.release.cuda else object()
        with torch.no_grad(), self.release.phase("capture_stream", stream=stream):
            for tokens in sorted(self.sizes, reverse=True):
                for _ in range(2):
                    self.stack(self.static[:tokens])

    def step(self, batch: torch.Tensor, *, uncaptured: bool = False) -> torch.Tensor:
        """One step on ``batch``, copied into the static buffer as the runner copies its inputs."""
        tokens = batch.shape[0]
        self.static[:tokens].copy_(batch)
        with torch.no_grad(), self.release.phase(*(["warmup"] if uncaptured else [])):
            return self.stack(self.static[:tokens]).clone()

    def pieces(self) -> int:
        return pieces(self.backends)


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    """The largest absolute elementwise difference of two tensors, in float32."""
    return float((a.float() - b.float()).abs().max())


def compared(step: list[dict], output: torch.Tensor, uncaptured: torch.Tensor,
             eager: torch.Tensor) -> dict:  # fmt: skip
    """What one replayed step's piece calls (``Observed``'s log) did, and how far its ``output``
    is from the uncaptured step's and from eager's."""
    replays = [e for e in step if e["did"] == "replayed"]
    to_uncaptured = max_diff(output, uncaptured)
    return {
        "piece_runs": len(step), "replays": len(replays),
        "ran_uncaptured": sum(e["did"] == "ran" for e in step),
        "replays_of_another_layer": [
            {"graph": e["graph"], "piece": e["piece"], "layers": e["layers"],
             "captured_for": e["captured_for"]}
            for e in replays if e["captured_for"] != e["layers"]],
        "moved_inputs": sum(e["moved"] for e in replays),
        "max_abs_vs_uncaptured": to_uncaptured, "matches_uncaptured": to_uncaptured == 0.0,
        "max_abs_vs_eager": max_diff(output, eager),
        "max_abs_eager": float(eager.float().abs().max()),
        "uncaptured_vs_eager": max_diff(uncaptured, eager),
    }  # fmt: skip


def measure(release: Release, variant: str, shape: segment.LayerShape, layers: int,
            sizes: list[int]) -> list[dict]:  # fmt: skip
    """One record per token count: the captured step against the uncaptured one and eager."""
    batches = {n: segment.tokens_input(shape, n, seed=STEP_SEED) for n in sizes}
    uncaptured_drive = Drive(release, variant, shape, layers, sizes)
    uncaptured_drive.compile_pass()
    uncaptured = {n: uncaptured_drive.step(batches[n], uncaptured=True) for n in sizes}
    with torch.no_grad():
        eager = {n: uncaptured_drive.stack.__class__.forward(uncaptured_drive.stack, batches[n])
                 for n in sizes}  # fmt: skip
    drive = Drive(release, variant, shape, layers, sizes)
    drive.compile_pass()
    drive.capture_pass()
    in_capture = list(drive.log)
    rows = []
    for n in sizes:
        drive.log.clear()
        output = drive.step(batches[n])
        rows.append({
            "variant": variant, "fullgraph": VARIANTS[variant][0], "tokens": n, "layers": layers,
            "dynamo_graphs": len(drive.backends), "pieces": drive.pieces(),
            **compared(drive.log, output, uncaptured[n], eager[n]),
            "replays_during_capture_pass": sum(
                e["did"] == "replayed" and e["tokens"] == n for e in in_capture),
        })  # fmt: skip
    rows[0]["debug_mode"] = debug_mode(release, variant, shape, layers, sizes, batches)
    return rows


def debug_mode(release: Release, variant: str, shape: segment.LayerShape, layers: int,
               sizes: list[int], batches: dict[int, torch.Tensor]) -> dict:  # fmt: skip
    """The same run with SGLang's debug mode on: where its input-address assertion fired, if."""
    drive = Drive(release, variant, shape, layers, sizes, debug=True)
    where = "compile pass"
    try:
        drive.compile_pass()
        where = "capture pass"
        drive.capture_pass()
        where = "replay"
        for n in sizes:
            drive.step(batches[n])
    except AssertionError as exc:  # its text up to the addresses, which differ by machine
        return {"assertion": frames.said(exc).split(" Expected [")[0], "during": where}
    return {"assertion": None, "during": None}


def main(out: Path, scale: str, layers: str, tokens: str) -> int:
    from fp4lab.serving.replay.release import inside

    os.environ.setdefault("SGLANG_CACHE_DIR", str(paths.build_dir() / "cache" / "sglang"))
    shape = segment.LayerShape.glm5(int(scale))
    sizes = [int(t) for t in tokens.split(",")]
    found: dict = {"scale": int(scale), "shape": vars(shape), "sizes": sizes}
    try:
        cuda = torch.cuda.is_available()
        with contextlib.ExitStack() as stack:
            found["capture"] = "cuda" if cuda else "simulated"
            found["standins"] = [] if cuda else [stack.enter_context(recorder.simulated())]
            with inside.simulated_gpu((10, 0)) if not cuda else contextlib.nullcontext() as patched:
                found["patched_while_importing"] = patched or []
                found["standins"] += inside.runtime_standins()
                import sglang

                release = Release.load(cuda)
            found.update(sglang_version=sglang.__version__, contexts=release.where)
            found["rows"] = [row for variant in VARIANTS
                             for row in measure(release, variant, shape, int(layers), sizes)]  # fmt: skip
    except Unsplittable as exc:
        found["unsplittable"] = str(exc)
    except Exception as exc:  # the parent records it as not measured, with its frames
        found["error"] = frames.said(exc)
        found["traceback"] = traceback.format_exc()[-4000:]
    Path(out).write_text(json.dumps(found) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]), *sys.argv[2:5]))
