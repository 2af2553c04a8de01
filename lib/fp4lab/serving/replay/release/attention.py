"""Inside one SGLang environment: the attention backend, DSA indexer metadata and KV pool that
stand in for ``NativeSparseAttnBackend`` (or a dense model's backend: GQA, sliding window, sinks)
at SGLang's attention split op.

Dense causal MLA attention equals DSA's sparse attention while every sequence is at most
``index_topk`` tokens long (DSA then selects every earlier token); one extend batch from an
empty cache reads nothing back from the KV cache.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch

from fp4lab.compile import target
from fp4lab.serving.replay.release.kernels import attribute, record
from fp4lab.serving.replay.release.reached import REACHED


class IndexerMetadata:
    """What the DSA indexer asks its backend's metadata (``get_seqlens_expanded``,
    ``topk_transform``) for one extend batch starting from an empty cache: token i sees i + 1
    tokens; top-k of at most ``index_topk`` tokens keeps them all (the kernel's fast path)."""

    def __init__(self, tokens: int) -> None:
        self.tokens = tokens

    def get_seqlens_expanded(self) -> torch.Tensor:
        return torch.arange(1, self.tokens + 1, dtype=torch.int32)

    def topk_transform(self, logits: torch.Tensor, topk: int) -> torch.Tensor:
        index = torch.arange(topk, dtype=torch.int32).expand(logits.shape[0], topk)
        return torch.where(index < self.get_seqlens_expanded()[:, None], index, -1)


class AttentionBackend:
    """In place of ``NativeSparseAttnBackend`` (or a GQA model's backend): causal attention in
    float32 for one extend batch from an empty cache, MLA's single key head or GQA's groups, the
    layer's sliding window and sinks where it has them (the KV cache is not written: nothing
    reads it back)."""

    prefill_attention_backend_str = decode_attention_backend_str = None
    """Read by DeepSeek's attention dispatch from 0.5.2x on: None selects the server's choice."""

    def __init__(self) -> None:
        self.calls = 0

    def init_forward_metadata(self, forward_batch: Any) -> None:
        self.tokens = int(forward_batch.input_ids.shape[0])

    def get_indexer_metadata(self, layer_id: int, forward_batch: Any) -> IndexerMetadata:
        return IndexerMetadata(int(forward_batch.input_ids.shape[0]))

    def forward(self, q, k, v, layer, forward_batch, save_kv_cache=True, **kwargs) -> torch.Tensor:
        REACHED["attention_backend.forward"] += 1  # run in SGLang's attention split op
        self.calls += 1
        n, heads = q.shape[0], layer.tp_q_head_num
        query = q.reshape(n, heads, -1).float()
        key = k.reshape(n, -1, k.shape[-1]).float()
        if kwargs.get("q_rope") is not None:
            query = torch.cat([query, kwargs["q_rope"].reshape(n, heads, -1).float()], -1)
            key = torch.cat(
                [key, kwargs["k_rope"].reshape(n, -1, kwargs["k_rope"].shape[-1]).float()], -1
            )
        value = v.reshape(n, -1, v.shape[-1]).float()[..., : layer.v_head_dim]
        group = heads // key.shape[1]  # 1 key head for MLA, heads / KV heads for GQA
        key, value = key.repeat_interleave(group, 1), value.repeat_interleave(group, 1)
        scores = torch.einsum("qhd,khd->hqk", query, key) * layer.scaling
        seen = torch.ones(n, n, dtype=torch.bool).tril()
        window = getattr(layer, "sliding_window_size", None) or -1
        if window > -1:  # SGLang's window: a token sees itself and the `window` before it
            seen &= torch.ones(n, n, dtype=torch.bool).triu(-window)
        scores = scores.masked_fill(~seen, float("-inf"))
        sinks = kwargs.get("sinks")
        if sinks is not None:  # one more logit per head that takes weight and gives no value
            scores = torch.cat([scores, sinks.float().reshape(heads, 1, 1).expand(-1, n, 1)], -1)
        weights = scores.softmax(-1)[..., :n]
        return torch.einsum("hqk,khd->qhd", weights, value).reshape(n, -1).to(q.dtype)


CAPABILITIES = ("supports_full_cuda_graph_chunked_prefix",)
"""What a release's prefill runner asks its attention backend before capturing (0.5.2x's full
graphs with chunked prefix), answered by the stand-in as the class the release builds answers it:
a value that class holds, read, never assumed."""


class _Built(Exception):
    """The class the release's attention factory went to build (its construction stopped)."""


def prefill_backend_name(args: Any) -> str | None:
    """The prefill attention backend the release resolved, asked of the release as it asks:
    ``runtime_context.attention_backends()`` (0.5.2x), ``ServerArgs.get_attention_backends()``,
    else its fields."""
    pair = attribute("sglang.srt.runtime_context", "attention_backends")
    if pair is None:
        pair = getattr(args, "get_attention_backends", None)
    if pair is not None:
        return pair()[0]
    return getattr(args, "prefill_attention_backend", None) or args.attention_backend


def release_backend(host: Any) -> dict:
    """The class the release's own registry builds for the runner's prefill attention backend
    (``ATTENTION_BACKENDS[name](runner)``, stopped at the construction, which needs a GPU) and
    its answers to ``CAPABILITIES`` where it holds a value (not a property); ``unread`` says why
    where the factory stopped before (empty where the release has no such registry)."""
    registry = attribute("sglang.srt.layers.attention.attention_registry", "ATTENTION_BACKENDS")
    base = attribute("sglang.srt.layers.attention.base_attn_backend", "AttentionBackend")
    name = prefill_backend_name(host.server_args)
    if not registry or base is None or name not in registry:
        return {}

    def stopped(cls: type, *args: Any, **kwargs: Any) -> Any:
        if isinstance(cls, type) and issubclass(cls, base):
            raise _Built(cls)
        return type.__call__(cls, *args, **kwargs)

    if not hasattr(host, "init_new_workspace"):  # what the release's caller sets first (False)
        host.init_new_workspace = False
    try:
        with target.attribute_replaced(type(base), "__call__", stopped):
            registry[name](host)
    except _Built as built:
        cls = built.args[0]
        held = {c: inspect.getattr_static(cls, c, None) for c in CAPABILITIES}
        return {"name": name, "class": f"{cls.__module__}.{cls.__qualname__}",
                "capabilities": {c: v for c, v in held.items() if isinstance(v, bool)}}  # fmt: skip
    except Exception as exc:  # the factory asked the host for what it lacks: the class is unread
        return {"name": name, "unread": f"{type(exc).__name__}: {exc}"}
    return {"name": name, "unread": "the factory built no attention backend"}


class KVPool:
    """In place of the release's KV pools, for one extend batch from an empty cache: the DSA
    indexer's key cache write is accepted, the K and V buffers a fused RoPE + KV-cache write fills
    (Qwen3 and gpt-oss, where the pool's dtype is bf16) are CPU tensors of the KV cache's dtype,
    made per layer when first asked for, and MLA's latent cache is kept as written and read back
    (DeepSeek's one-shot MHA prefill reads its batch's own keys)."""

    ROWS = 256
    """Cache slots per layer: more than the runner's largest warm-up batch."""

    def __init__(self, page_size: int, dtype: torch.dtype, kv_heads: int, head_dim: int) -> None:
        self.page_size, self.dtype = page_size, dtype
        self.index_page_size = page_size  # the DSA indexer's key cache pages
        self.shape = (self.ROWS, kv_heads, head_dim)
        self.buffers: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self.latents: dict[int, torch.Tensor] = {}  # MLA's latent cache per layer, as written
        self.rope_width = 0

    def set_index_k_scale_buffer(self, layer_id, loc, index_k, index_k_scale) -> None:
        return None

    def set_mla_kv_buffer(self, layer: Any, loc: Any, cache_k_nope: torch.Tensor,
                          cache_k_rope: torch.Tensor) -> None:  # fmt: skip
        """MLA's latent cache write (DeepSeek's MHA prefill): the latent and its RoPE part kept
        per layer, in the cache's dtype, for ``get_mla_kv_buffer``; ``loc`` a tensor or, from
        0.5.2x, what the release's own ``unwrap_write_loc`` unwraps."""
        unwrap = attribute("sglang.srt.mem_cache.memory_pool", "unwrap_write_loc")
        loc = loc if unwrap is None else unwrap(loc)[0]
        latent = torch.cat([cache_k_nope, cache_k_rope], -1).reshape(loc.shape[0], 1, -1)
        if layer.layer_id not in self.latents:
            self.latents[layer.layer_id] = torch.zeros(
                self.ROWS, 1, latent.shape[-1], dtype=self.dtype
            )
        self.latents[layer.layer_id][loc.long()] = latent.to(self.dtype)
        self.rope_width = cache_k_rope.shape[-1]

    def get_mla_kv_buffer(self, layer: Any, loc: torch.Tensor, dst_dtype: Any = None) -> tuple:
        """The latent cache at ``loc`` read back as (latent, RoPE part), each ``(n, 1, width)``
        (DeepSeek's one-shot MHA prefill reads its batch's own keys back)."""
        found = self.latents[layer.layer_id][loc.long()].to(dst_dtype or self.dtype)
        return found[..., : -self.rope_width], found[..., -self.rope_width :]

    def _layer(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        if layer_id not in self.buffers:
            self.buffers[layer_id] = tuple(torch.zeros(self.shape, dtype=self.dtype) for _ in "kv")
        return self.buffers[layer_id]

    def get_key_buffer(self, layer_id: int) -> torch.Tensor:
        return self._layer(layer_id)[0]

    def get_value_buffer(self, layer_id: int) -> torch.Tensor:
        return self._layer(layer_id)[1]


ATTENTION = record(
    "attention_backend", "sglang::unified_attention_with_output (the split op) -> attn_backend.forward",
    "NativeSparseAttnBackend runs FlashMLA / DeepGEMM kernels; dense causal MLA attention in "
    "torch equals DSA's top-k sparse attention here (every sequence <= index_topk tokens), and "
    "the indexer metadata answers as the backend's does for one extend batch from an empty cache",
    ["attention_backend.forward"],
)  # fmt: skip


KV_POOL = record("dsa_kv_pool", "forward_batch.token_to_kv_pool",
                  "the KV pools need GPU memory pools; the DSA indexer's key write is accepted "
                  "and dropped, a fused RoPE + KV write fills CPU buffers (one extend batch from "
                  "an empty cache reads nothing back)")  # fmt: skip
