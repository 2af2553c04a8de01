"""One set-up for the story notebooks (01-05): their parameters checked, the segment built.

``prepare`` checks every parameter a notebook passes, each failure naming the parameter and
what is allowed, before any heavy work; then builds the layer shape, the activation batch,
the segment calling ``flashinfer.fp4_quantize`` as SGLang's FP4 layers do, and the
notebook's ``Recorder``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from fp4lab.compile import segment, target
from fp4lab.core import params, records

PARAMETERS = (
    "target_sm",
    "scale",
    "backend",
    "backends",
    "tokens",
    "token_counts",
    "heads",
    "hidden",
    "ffn",
    "layers",
    "warmup",
    "iters",
    "device",
    "cuda_home",
    "sglang_versions",
    "model_sm",
    "break_releases",
    "break_shape",
    "break_counts",
)
"""The story notebooks' parameters, in the order ``prepare`` checks them (``sglang_versions`` and
``model_sm`` come checked by ``serving.capture.study``, the three ``break_`` ones by
``serving.capture.break_study``: compile knows nothing of SGLang)."""


@dataclass
class Story:
    """A checked story notebook run: its target, segment, input and recorder."""

    rec: records.Recorder
    sm: tuple[int, int] | None
    shape: segment.LayerShape
    layers: int
    x: torch.Tensor

    @property
    def params(self) -> dict:
        """The parameters as recorded (``device`` resolved)."""
        return self.rec.params

    @functools.cached_property
    def model(self) -> segment.Stack:
        """The segment, calling ``flashinfer.fp4_quantize`` looked up at call time."""
        return segment.Stack(self.shape, self.layers, quantize=target.fp4_quantize)

    def describe(self) -> str:
        """``4 layers of LayerShape(...), 64 tokens, on cpu`` (every token count where several)."""
        tokens = self.params.get("token_counts") or [self.x.shape[0]]
        return (
            f"{self.layers} layers of {self.shape}, {', '.join(map(str, tokens))} tokens, "
            f"on {self.x.device}"
        )


def _nonempty_text(name: str, value: object) -> None:
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{name}={value!r} must be a non-empty string (a folder path)")


def check(**parameters: object) -> dict:
    """Check the parameters given (names from PARAMETERS); returns them as recorded.

    The layer shape comes from ``scale`` (GLM-5's widths divided) or from ``hidden``,
    ``heads`` and ``ffn``; ``device`` (auto | cpu | cuda) is recorded resolved.
    """
    unknown = sorted(set(parameters) - set(PARAMETERS))
    if unknown:
        raise TypeError(f"unknown story parameters {unknown}; known: {', '.join(PARAMETERS)}")
    p = dict(parameters)
    if "target_sm" in p:
        params.sm("target_sm", p["target_sm"])
    if "scale" in p:
        segment.LayerShape.glm5(p["scale"])
    if "backend" in p:
        params.choice("backend", p["backend"], params.BACKENDS)
    if "backends" in p:
        params.choices("backends", p["backends"], params.BACKENDS)
    for name in ("tokens", "heads"):
        if name in p:
            params.positive(name, p[name])
    if "token_counts" in p:
        params.positive_list("token_counts", p["token_counts"])
    if "hidden" in p:
        params.multiple_of("hidden", p["hidden"], 16 * p["heads"])
    if "ffn" in p:
        params.multiple_of("ffn", p["ffn"], 16)
    for name in ("layers", "warmup", "iters"):
        if name in p:
            params.positive(name, p[name])
    if "device" in p:
        p["device"] = str(params.device("device", p["device"]))
    if "cuda_home" in p:
        _nonempty_text("cuda_home", p["cuda_home"])
    return p


def prepare(notebook: str, **parameters: object) -> Story:
    """A story notebook's validation and set-up in one call: ``check``, then the run's pieces."""
    recorded = check(**parameters)
    sm = params.sm("target_sm", recorded["target_sm"]) if "target_sm" in recorded else None
    if "scale" in recorded:
        shape = segment.LayerShape.glm5(recorded["scale"])
    else:
        shape = segment.LayerShape(recorded["hidden"], recorded["heads"], recorded["ffn"])
    tokens = recorded["tokens"] if "tokens" in recorded else recorded["token_counts"][0]
    x = segment.tokens_input(shape, tokens, device=recorded.get("device", "cpu"))
    return Story(records.Recorder(notebook, recorded), sm, shape, recorded.get("layers", 1), x)
