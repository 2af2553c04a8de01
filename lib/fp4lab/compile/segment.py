"""The transformer pieces under test: a GLM-5-shaped layer whose MLP quantizes its activations to FP4.

One layer is what a piecewise CUDA graph runner compiles between two attention split
points: RMSNorm, attention projections, the dense MLP, with the MLP's activations
quantized through an injected ``quantize(x, global_scale) -> (codes, scales)`` (FlashInfer's
call, the story's patched variants, or the custom-op fix) and multiplied through a
dequantize-then-matmul stand-in for the FP4 GEMM. Attention is plain multi-head SDPA, not
GLM-5's MLA/DSA: the blocker lives in the MLP's quantize call, not in attention. With
``split_attention`` it runs as ``fp4lab::attention``, a custom op that writes into an output
buffer the layer allocates and takes the layer's ``layer_id``, as SGLang's
``unified_attention_with_output`` does: the op a piecewise runner splits the graph at
(``compile.piecewise``). Dynamo specializes on that integer, so under graph breaks the graph
holding attention is compiled once per layer, as under SGLang's attention.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from fp4lab.core import glm5, params
from fp4lab.fp4 import kernels, nvfp4

Quantize = Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


@dataclass(frozen=True)
class LayerShape:
    hidden: int
    heads: int
    ffn: int

    @classmethod
    def glm5(cls, scale: int) -> LayerShape:
        """GLM-5's dense-layer widths divided by ``scale`` (one of ``glm5.SCALES``)."""
        params.choice("scale", scale, glm5.SCALES)
        return cls(glm5.HIDDEN // scale, max(1, glm5.HEADS // scale), glm5.DENSE_FFN // scale)


class RMSNorm(nn.Module):
    def __init__(self, width: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight).to(
            x.dtype
        )


def _fp4_weight(
    out_features: int, in_features: int, generator: torch.Generator, dtype: torch.dtype
) -> torch.Tensor:
    """A random weight carried through an NVFP4 round trip, so it holds FP4 error like a checkpoint's."""
    w = torch.randn(out_features, in_features, generator=generator) / in_features**0.5
    codes, scales, gs = kernels.quantize(w)
    return nvfp4.dequantize(codes, scales, gs, dtype=dtype)


class FP4MLP(nn.Module):
    """Gate/up projection, SiLU, FP4-quantized activations, down projection."""

    def __init__(
        self, shape: LayerShape, quantize: Quantize, generator: torch.Generator, dtype: torch.dtype
    ) -> None:
        super().__init__()
        self.quantize = quantize
        self.gate_up = nn.Parameter(
            _fp4_weight(2 * shape.ffn, shape.hidden, generator, dtype), requires_grad=False
        )
        self.down = nn.Parameter(
            _fp4_weight(shape.hidden, shape.ffn, generator, dtype), requires_grad=False
        )
        # A calibrated activation amax of 8, as a checkpoint's input_scale would give.
        self.register_buffer(
            "act_global_scale", torch.tensor([nvfp4.E4M3_MAX * nvfp4.E2M1_MAX / 8.0])
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = (x @ self.gate_up.t()).chunk(2, dim=-1)
        h = nn.functional.silu(gate) * up
        codes, scales = self.quantize(h, self.act_global_scale)
        h_fp4 = nvfp4.dequantize(
            codes,
            scales.view(torch.float8_e4m3fn).reshape(-1),
            self.act_global_scale,
            swizzle=True,
            dtype=x.dtype,
        )
        return h_fp4 @ self.down.t()


def _causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """[tokens, heads, dim] in, [tokens, heads * dim] out: causal multi-head SDPA."""
    out = nn.functional.scaled_dot_product_attention(
        q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), is_causal=True
    )
    return out.transpose(0, 1).reshape(q.shape[0], -1)


@torch.library.custom_op("fp4lab::attention", mutates_args=("output",))
def attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, output: torch.Tensor, layer_id: int
) -> None:
    """Causal attention written into ``output`` (the split op: its fake writes nothing);
    ``layer_id`` is where SGLang's op finds the layer's KV cache, unused here."""
    output.copy_(_causal_attention(q, k, v))


@attention.register_fake
def _(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, output: torch.Tensor, layer_id: int
) -> None:
    return None


class Layer(nn.Module):
    """One decoder layer: the segment a piecewise runner compiles as one graph."""

    def __init__(
        self,
        shape: LayerShape,
        quantize: Quantize,
        generator: torch.Generator,
        dtype: torch.dtype,
        split_attention: bool = False,
        layer_id: int = 0,
    ) -> None:
        super().__init__()
        self.split_attention, self.layer_id = split_attention, layer_id
        self.heads = shape.heads
        self.attn_norm, self.mlp_norm = RMSNorm(shape.hidden), RMSNorm(shape.hidden)
        self.qkv = nn.Parameter(
            _fp4_weight(3 * shape.hidden, shape.hidden, generator, dtype), requires_grad=False
        )
        self.o = nn.Parameter(
            _fp4_weight(shape.hidden, shape.hidden, generator, dtype), requires_grad=False
        )
        self.mlp = FP4MLP(shape, quantize, generator, dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens, hidden = x.shape
        q, k, v = (
            (self.attn_norm(x) @ self.qkv.t())
            .view(tokens, 3, self.heads, hidden // self.heads)
            .unbind(1)
        )
        if self.split_attention:
            attn = torch.empty_like(x)
            torch.ops.fp4lab.attention(q, k, v, attn, self.layer_id)
        else:
            attn = _causal_attention(q, k, v)
        x = x + attn @ self.o.t()
        return x + self.mlp(self.mlp_norm(x))


class Stack(nn.Module):
    """``layers`` GLM-5-shaped layers in sequence."""

    def __init__(
        self,
        shape: LayerShape,
        layers: int,
        quantize: Quantize,
        *,
        seed: int = 0,
        dtype: torch.dtype = torch.bfloat16,
        split_attention: bool = False,
    ) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(seed)
        self.layers = nn.ModuleList(
            Layer(shape, quantize, generator, dtype, split_attention, layer_id)
            for layer_id in range(layers)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


def tokens_input(
    shape: LayerShape,
    tokens: int,
    *,
    seed: int = 0,
    dtype: torch.dtype = torch.bfloat16,
    device: str = "cpu",
) -> torch.Tensor:
    """A [tokens, hidden] activation batch."""
    return torch.randn(tokens, shape.hidden, generator=torch.Generator().manual_seed(seed + 1)).to(
        dtype=dtype, device=device
    )
