"""The plugin's text, part by part, as ``patch.render`` fills it in: its header (the meta-path
hook that applies a part when the SGLang module it patches is imported), each part of
``patch.PARTS`` and the helper that makes SGLang's backend split at the ops the parts add.
Standard library only, as ``patch``.
"""

HEADER = '''"""{title}

Written by fp4lab (``python -m fp4lab.serving.replay --sglang {version} --sm {sm} --write-patch
DIR``) from what its replay of SGLang {version}'s own GLM-5 model met on SM{sm}. Parts:
{parts}

Apply: copy this file and ``{name}.pth`` into the site-packages folder of SGLang's environment;
every Python process there then imports this module, which patches SGLang's modules as they are
imported. Remove both files to undo.
"""

import importlib.abc
import importlib.util
import sys

import torch

_PENDING = {{}}


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs the patches of a module right after it is imported."""

    def find_spec(self, fullname, path, target=None):
        if fullname not in _PENDING:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec
        load = spec.loader.exec_module

        def exec_module(module):
            load(module)
            for patch in _PENDING.pop(fullname, []):
                patch(module)

        spec.loader.exec_module = exec_module
        return spec


def _after_import(name, patch):
    if name in sys.modules:
        patch(sys.modules[name])
    else:
        _PENDING.setdefault(name, []).append(patch)


sys.meta_path.insert(0, _AfterImport())
'''

FP4_QUANTIZE_OP = """

# fp4_quantize_op: FlashInfer's fp4_quantize as a custom op with a fake, rebound in {module}.
_ORIGINAL = {{}}


@torch.library.custom_op("fp4lab_patch::fp4_quantize", mutates_args=())
def fp4_quantize(
    input: torch.Tensor,
    global_scale: torch.Tensor | None = None,
    sf_vec_size: int = 16,
    sf_use_ue8m0: bool = False,
    is_sf_swizzled_layout: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    return _ORIGINAL["fp4_quantize"](
        input, global_scale, sf_vec_size, sf_use_ue8m0, is_sf_swizzled_layout
    )


@fp4_quantize.register_fake
def _(input, global_scale=None, sf_vec_size=16, sf_use_ue8m0=False, is_sf_swizzled_layout=True):
    m, k = input.shape
    columns = k // sf_vec_size
    count = -(-m // 128) * 128 * (-(-columns // 4) * 4) if is_sf_swizzled_layout else m * columns
    return (
        input.new_empty((m, k // 2), dtype=torch.uint8),
        input.new_empty((count // columns, columns), dtype=torch.uint8),
    )


def _through_op(input, global_scale=None, sf_vec_size=16, sf_use_ue8m0=False,
                is_sf_swizzled_layout=True, **ignored):
    return torch.ops.fp4lab_patch.fp4_quantize(
        input, global_scale, sf_vec_size, sf_use_ue8m0, is_sf_swizzled_layout
    )


def _rebind_fp4_quantize(module):
    _ORIGINAL.setdefault("fp4_quantize", getattr(module, "{name}"))
    setattr(module, "{name}", _through_op)


_after_import("{module}", _rebind_fp4_quantize)
"""

DSA_INDEXER_SPLIT_OP = """

# dsa_indexer_split_op: the DSA indexer runs as a split op between the pieces.
_INDEXERS = {{}}
_INDEXER_FORWARD = {{}}


@torch.library.custom_op("fp4lab_patch::dsa_indexer", mutates_args=())
def dsa_indexer(
    x: torch.Tensor, q_lora: torch.Tensor, positions: torch.Tensor, layer_id: int, index_topk: int
) -> torch.Tensor:
    from {context} import get_forward_context

    batch = get_forward_context().forward_batch
    indexer = _INDEXERS[layer_id]
    return _INDEXER_FORWARD["forward"](
        indexer, x=x, q_lora=q_lora, positions=positions, forward_batch=batch, layer_id=layer_id
    )


@dsa_indexer.register_fake
def _(x, q_lora, positions, layer_id, index_topk):
    return x.new_empty((x.shape[0], index_topk), dtype=torch.int32)


def _patch_indexer(module):
    from {context} import get_forward_context, {in_pcg}

    cls = module.Indexer
    _INDEXER_FORWARD["forward"] = cls.forward
    init = cls.__init__

    def __init__(self, *args, **kwargs):
        init(self, *args, **kwargs)
        _INDEXERS[self.layer_id] = self

    def forward(self, x, q_lora, positions, forward_batch, layer_id, *args, **kwargs):
        if {in_pcg}() and get_forward_context() is not None and not args and not kwargs:
            return torch.ops.fp4lab_patch.dsa_indexer(x, q_lora, positions, layer_id, self.index_topk)
        return _INDEXER_FORWARD["forward"](self, x, q_lora, positions, forward_batch, layer_id,
                                           *args, **kwargs)

    cls.__init__, cls.forward = __init__, forward


_ADDED_SPLIT_OPS.append("fp4lab_patch.dsa_indexer")
_after_import("{indexer}", _patch_indexer)
"""

DSA_ATTENTION_SPLIT_OP = """

# dsa_attention_split_op: DSA attention, with its topk_indices, through a split op.
_ATTENTION = {{}}


@torch.library.custom_op("fp4lab_patch::dsa_attention_with_output", mutates_args=["output"])
def dsa_attention_with_output(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    output: torch.Tensor,
    save_kv_cache: bool,
    layer_id: int,
    q_rope: torch.Tensor | None,
    k_rope: torch.Tensor | None,
    topk_indices: torch.Tensor,
) -> None:
    from {context} import get_forward_context

    context = get_forward_context()
    batch = context.forward_batch
    found = batch.attn_backend.forward(
        query, key, value, context.attention_layers[layer_id], batch, save_kv_cache,
        q_rope=q_rope, k_rope=k_rope, topk_indices=topk_indices,
    )
    output.view(found.shape).copy_(found)


def _route_dsa_attention(module):
    _ATTENTION["unified"] = module.unified_attention_with_output

    def unified_attention_with_output(query, key, value, output, save_kv_cache, layer_id, **kw):
        if "topk_indices" in kw:
            return torch.ops.fp4lab_patch.dsa_attention_with_output(
                query, key, value, output, save_kv_cache, layer_id,
                kw.get("q_rope"), kw.get("k_rope"), kw["topk_indices"],
            )
        return _ATTENTION["unified"](query, key, value, output, save_kv_cache, layer_id, **kw)

    module.unified_attention_with_output = unified_attention_with_output


_ADDED_SPLIT_OPS.append("fp4lab_patch.dsa_attention_with_output")
_after_import("{attention}", _route_dsa_attention)
"""

MUSA_PROBE_CONSTANT = """

# musa_probe_constant: SGLang's is_musa() as a constant dynamo takes without tracing its import.
_IS_MUSA = {{}}


@torch._dynamo.assume_constant_result
def _is_musa():
    return _IS_MUSA["value"]


def _constant_is_musa(module):
    probe = module.is_musa
    _IS_MUSA["value"] = bool(probe())
    for loaded in list(sys.modules.values()):
        if getattr(loaded, "is_musa", None) is probe:
            loaded.is_musa = _is_musa


_after_import("{common}", _constant_is_musa)
"""

SPLIT_HELPER = """

# The split ops the parts below add: SGLang's backend cuts each dynamo graph at them too.
_ADDED_SPLIT_OPS = []


def _split_also_at_added_ops(module):
    split = module.split_graph

    def split_graph(graph, ops):
        return split(graph, [*ops, *[op for op in _ADDED_SPLIT_OPS if op not in ops]])

    module.split_graph = split_graph


_after_import("{backend}", _split_also_at_added_ops)
"""
