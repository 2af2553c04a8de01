"""Inside one SGLang environment: the user's patch as written (``patch``), imported into the
running release, and the compiled runner's logits compared with the eager runner's.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import torch

from fp4lab.compile import fix
from fp4lab.serving.replay.release import model
from fp4lab.serving.replay.shared import patch

FP4_REFERENCE = "fp4lab reference (CPU kernel lent to fp4lab_patch::fp4_quantize)"


def load(path: Path, built: model.Built) -> Any:
    """The written plugin imported from its file (SGLang's modules are imported already, so each
    part applies at once); the model was built before it, so its indexers are registered with
    the patch as the patched ``__init__`` would have."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    plugin = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = plugin
    spec.loader.exec_module(plugin)
    indexers = getattr(plugin, "_INDEXERS", None)
    if indexers is not None:
        cls = sys.modules[built.facts["layout"]["dsa_indexer"]].Indexer
        indexers.update({m.layer_id: m for m in built.model.modules() if isinstance(m, cls)})
    if hasattr(torch.ops.fp4lab_patch, "fp4_quantize"):
        reference = fix.reporting(FP4_REFERENCE, fix.reference_fp4_quantize)

        def cpu(x, global_scale=None, sf_vec_size=16, *args: Any) -> Any:
            codes, scales = reference(x, global_scale)
            return codes, scales.reshape(-1, x.shape[1] // sf_vec_size)

        torch.library.register_kernel("fp4lab_patch::fp4_quantize", "cpu", cpu)
    return plugin


def apply_part(
    built: model.Built, sm: tuple[int, int], version: str, part: str, folder: Path
) -> None:
    """The patch holding ``part`` alone, written into ``folder/part`` and imported into this
    process (the parts applied before it stay applied)."""
    label = f"{sm[0]}.{sm[1]}"
    text = patch.render(version, label, [part], quantize_binding(built))
    load(patch.write(folder / part, version, label, text)[0], built)


def quantize_binding(built: model.Built) -> dict:
    chosen = built.facts["quantize"]
    return {"module": "sglang.srt.layers.quantization.modelopt_quant",
            "name": (chosen.get("called_as") or "fp4_quantize").split(".")[0],
            "indexer": built.facts["layout"]["dsa_indexer"] or patch.WHERE["indexer"]}  # fmt: skip


def compared(got: tuple, want: tuple) -> dict:
    """The compiled runner's logits against the eager runner's, on the same fixed inputs."""
    (logits, kernel, error), (eager_logits, eager_kernel, eager_error) = got, want
    both = logits is not None and eager_logits is not None
    return {"equals_eager": both and torch.equal(logits, eager_logits),
            "max_abs_diff": float((logits.float() - eager_logits.float()).abs().max()) if both else None,
            "finite": bool(logits is not None and torch.isfinite(logits).all()),
            "kernel": kernel, "eager_kernel": eager_kernel, "error": error or eager_error}  # fmt: skip
