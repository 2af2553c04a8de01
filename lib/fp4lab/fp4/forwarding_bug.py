"""FlashInfer's custom-op argument-forwarding bug (0.6.12 to 0.7.0, as the matrix measured), detected two ways.

``torch.ops.flashinfer.fp4_quantize`` forwarded its ``enable_pdl`` positionally into
``fp4_quantize``'s ``is_global_scale_inversed``. ``capture_forwarded_arguments`` records what the
op's Python body passes on (runs anywhere, CPU included: a spy stops the call before any
kernel); ``compare_op_with_direct_call`` compares the op with the direct call at a global
scale != 1 on an FP4 GPU. ``detect`` runs both; each says ``not testable here`` and why where
it cannot run (no FP4 GPU, no FlashInfer), and the numerical check says ``error`` with the
message where it raised.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
from packaging.version import Version

from fp4lab.core import probe
from fp4lab.fp4 import flashinfer_kernel, nvfp4

BUGGY_RELEASES = (Version("0.6.12"), Version("0.7.1"))
"""The FlashInfer releases with the bug: from the first (included) to the fix (excluded)."""


def present_in_release(version: str) -> bool:
    """Whether FlashInfer ``version`` is one of the releases that forward enable_pdl wrongly."""
    first, fixed = BUGGY_RELEASES
    return first <= Version(version) < fixed


class _Captured(Exception):
    """Raised by the spy to stop a call once its arguments are recorded."""


def capture_forwarded_arguments(opdef: Any) -> dict:
    """Call the custom op's Python body with enable_pdl=True on a CPU tensor; the spy records what it forwards."""
    body = opdef._init_fn
    public = body.__globals__.get("fp4_quantize")
    if public is None:
        return {
            "status": "not testable here",
            "reason": "the custom op's body does not call a module-level fp4_quantize",
        }
    signature = inspect.signature(public)
    seen: dict = {}

    def spy(*args: Any, **kwargs: Any) -> Any:
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        seen.update(bound.arguments)
        raise _Captured

    body.__globals__["fp4_quantize"] = spy
    try:
        body(torch.zeros(128, 64, dtype=torch.bfloat16), torch.tensor([2.0]), enable_pdl=True)
    except _Captured:
        pass
    finally:
        body.__globals__["fp4_quantize"] = public
    if not seen:
        return {
            "status": "not testable here",
            "reason": "the custom op's body never reached fp4_quantize",
        }
    inversed = seen.get("is_global_scale_inversed")
    return {
        "status": "present" if inversed else "absent",
        "forwarded_is_global_scale_inversed": repr(inversed),
        "forwarded_enable_pdl": repr(seen.get("enable_pdl")),
    }


def _same_bytes(a: tuple[torch.Tensor, ...], b: tuple[torch.Tensor, ...]) -> bool:
    return all(
        torch.equal(p.view(torch.uint8), q.view(torch.uint8)) for p, q in zip(a, b, strict=True)
    )


def compare_op_with_direct_call(device: torch.device) -> dict:
    """On an FP4 GPU: the custom op against the direct call, and against the direct call with the
    global scale inverted."""
    if device.type != "cuda" or torch.cuda.get_device_capability(device) < probe.FP4_MIN_SM:
        return {
            "status": "not testable here",
            "reason": probe.machine().missing("fp4-gpu") or "needs an SM100+ GPU",
        }
    x = torch.randn(256, 512, device=device, dtype=torch.bfloat16)
    gs = nvfp4.global_scale_for(x).reshape(1)
    fp4_quantize = flashinfer_kernel.public_fp4_quantize()
    direct = fp4_quantize(x, gs, 16, False, True, enable_pdl=True)
    through_op = torch.ops.flashinfer.fp4_quantize(x, gs, 16, False, True, False, True)
    inverted = fp4_quantize(x, gs, 16, False, True, is_global_scale_inversed=True, enable_pdl=True)
    same, like_inverted = _same_bytes(direct, through_op), _same_bytes(inverted, through_op)
    status = (
        "absent"
        if same
        else "present"
        if like_inverted
        else "op and direct call disagree otherwise"
    )
    return {"status": status, "op_equals_direct": same, "op_equals_inverted_direct": like_inverted}


def detect(device: torch.device | str | None = None) -> dict:
    """Whether the installed FlashInfer's custom op inverts the global scale: capture and numerical."""
    version = probe.package_version("flashinfer-python")
    record: dict[str, Any] = {"flashinfer": version}
    opdef = flashinfer_kernel.custom_op_definition()
    if opdef is None:
        reason = (
            "flashinfer is not installed"
            if version is None
            else "this FlashInfer has no torch.ops.flashinfer.fp4_quantize (added in 0.6.12)"
        )
        return {
            **record,
            "capture": {"status": "not testable here", "reason": reason},
            "numerical": {"status": "not testable here", "reason": reason},
        }
    record["capture"] = capture_forwarded_arguments(opdef)
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    try:
        record["numerical"] = compare_op_with_direct_call(device)
    except Exception as e:  # a failure, never "not testable": notebook 06 records it as an error
        record["numerical"] = {"status": "error", "error": f"{type(e).__name__}: {e}"[:500]}
    return record
