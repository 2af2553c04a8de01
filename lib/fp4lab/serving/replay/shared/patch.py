"""The fix as something a user applies: a plugin module for one SGLang release, written as text.

Each part removes one blocker the replay met on the way to a compiled GLM-5 (``PARTS``):

* ``fp4_quantize_op``: FlashInfer's ``fp4_quantize``, bound by name in SGLang's module (0.5.9's
  ``modelopt_quant`` on SM120), becomes a custom op with a fake (``fp4lab_patch::fp4_quantize``)
  and the module's name is rebound to it: dynamo sees one node; the op runs FlashInfer's own
  function, JIT and all, outside the trace;
* ``dsa_indexer_split_op``: the DSA indexer (``Indexer.forward``) runs as a split op between the
  pieces, as attention does (its data-dependent top-k shortcut cannot be traced); SGLang's backend
  is made to cut each graph at the split ops the parts add (its ``split_graph``);
* ``dsa_attention_split_op``: DSA attention with its ``topk_indices`` goes through a split op
  whose schema carries them (the release's ``unified_attention_with_output`` has no such
  argument);
* ``musa_probe_constant``: SGLang's ``is_musa()`` (0.5.2x calls it inside the traced forward; it
  tries ``import torchada``, a failing import dynamo cannot trace) answers its value as a constant
  (``torch._dynamo.assume_constant_result``), rebound wherever SGLang's modules bind it.

The module applies each part when the SGLang module it patches is imported (a meta-path hook),
or at once where it is imported already; a ``.pth`` line makes every Python process of the
environment import it (SGLang starts its scheduler processes fresh). Only the standard library
is imported here: the text is rendered inside a release's environment as well as in the main one.
"""

from __future__ import annotations

from pathlib import Path

from fp4lab.serving.replay.shared import patch_text

PARTS = ("fp4_quantize_op", "dsa_indexer_split_op", "dsa_attention_split_op", "musa_probe_constant")
"""Every part a patch can hold, in the order the replay meets their blockers."""

TEMPLATES = {
    "fp4_quantize_op": patch_text.FP4_QUANTIZE_OP,
    "dsa_indexer_split_op": patch_text.DSA_INDEXER_SPLIT_OP,
    "dsa_attention_split_op": patch_text.DSA_ATTENTION_SPLIT_OP,
    "musa_probe_constant": patch_text.MUSA_PROBE_CONSTANT,
}

SPLIT_OPS = {"dsa_indexer_split_op": "fp4lab_patch.dsa_indexer",
             "dsa_attention_split_op": "fp4lab_patch.dsa_attention_with_output"}  # fmt: skip
"""The split ops a part adds (the pieces the compiled model is cut into follow from them)."""

DESCRIBE = {
    "fp4_quantize_op": "FlashInfer's fp4_quantize as the custom op fp4lab_patch::fp4_quantize "
    "(with a fake), rebound in {module}.{name}",
    "dsa_indexer_split_op": "the DSA indexer as the split op fp4lab_patch.dsa_indexer",
    "dsa_attention_split_op": "DSA attention with topk_indices as the split op "
    "fp4lab_patch.dsa_attention_with_output",
    "musa_probe_constant": "SGLang's is_musa() as a constant for dynamo, rebound in every "
    "module that binds {common}.is_musa",
}

WHERE = {
    "context": "sglang.srt.compilation.piecewise_context_manager",
    "in_pcg": "is_in_piecewise_cuda_graph",
    "backend": "sglang.srt.compilation.backend",
    "indexer": "sglang.srt.layers.attention.nsa.nsa_indexer",
    "attention": "sglang.srt.layers.radix_attention",
    "common": "sglang.srt.utils.common",
}
"""The SGLang modules the DSA parts patch (0.5.3 to 0.5.12; the indexer's home from 0.5.13 is
read from the release by ``layout`` and passed to ``render``)."""


def module_name(version: str, sm: str) -> str:
    """``fp4lab_sglang_0_5_9_sm120_glm5_pcg``: the plugin's module name."""
    return f"fp4lab_sglang_{version.replace('.', '_')}_sm{sm.replace('.', '')}_glm5_pcg"


def render(version: str, sm: str, parts: list[str], quantize: dict | None = None) -> str:
    """The plugin module's source for ``parts`` (a subset of PARTS, in that order);
    ``quantize`` names the module and name FlashInfer's fp4_quantize is bound to."""
    unknown = [p for p in parts if p not in PARTS]
    if unknown:
        raise ValueError(f"parts contains {unknown[0]!r}; allowed values: {', '.join(PARTS)}")
    values = {**WHERE, **(quantize or {})}
    name = module_name(version, sm)
    listed = "\n".join(f"  * {p}: {DESCRIBE[p].format(**values)}" for p in parts)
    title = f"Torch.compile piecewise CUDA graphs for GLM-5 on SGLang {version}, SM{sm}."
    text = patch_text.HEADER.format(title=title, version=version, sm=sm, parts=listed, name=name)
    if any(p in SPLIT_OPS for p in parts):
        text += patch_text.SPLIT_HELPER.format(**values)
    return text + "".join(TEMPLATES[p].format(**values) for p in parts)


def write(folder: Path, version: str, sm: str, text: str) -> list[Path]:
    """The plugin module and its ``.pth`` line written into ``folder``; the paths."""
    folder.mkdir(parents=True, exist_ok=True)
    name = module_name(version, sm)
    module, pth = folder / f"{name}.py", folder / f"{name}.pth"
    module.write_text(text)
    pth.write_text(f"import {name}\n")
    return [module, pth]
