"""FlashInfer's FP4 quantize kernel checked against fp4lab's reference: bit-exactness and Hopper.

* ``bit_exact``: on an FP4 GPU (SM100+), ``flashinfer.fp4_quantize`` and
  ``torch.ops.flashinfer.fp4_quantize`` against ``fp4lab.fp4.nvfp4`` byte for byte. Differing
  codes are split into those the kernel's ``rcp.approx`` could move (see
  ``reciprocals.reciprocal_sensitive``) and the rest.
* ``hopper_probe``: on a GPU below SM100 the e2m1 conversion is compiled out (the whole kernel
  body sits under ``__CUDA_ARCH__ >= 1000``); recent FlashInfer refuses the call, older
  versions return buffers the kernel never wrote. The probe fills the caching allocator with a
  poison byte first, so "unwritten" is told apart from "all zero"; it never raises.

Every check returns a record; anything that cannot run says ``not testable here`` and why.
The custom op's argument-forwarding bug is ``fp4lab.fp4.forwarding_bug``.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch

from fp4lab.core import probe
from fp4lab.fp4 import encodings, kernels, nvfp4, reciprocals
from fp4lab.fp4.swizzle import swizzle_128x4, swizzled_shape

POISON = 0xA5
"""Byte the allocator's free blocks hold before a probed call: surviving it means "never written"."""


def public_fp4_quantize() -> Any:
    """``flashinfer.fp4_quantize`` (imported on use: FlashInfer is optional)."""
    import flashinfer

    return flashinfer.fp4_quantize


def custom_op_definition() -> Any | None:
    """The torch.library definition of ``flashinfer::fp4_quantize`` (0.6.12+), or None."""
    try:
        import flashinfer  # noqa: F401  (registers the op)
    except ImportError:
        return None
    return torch._library.custom_ops._maybe_get_opdef("flashinfer::fp4_quantize")


def _recipe_kwargs(fn: Any) -> dict:
    """Pin FlashInfer's NVFP4 "4over6" recipe off where the version has one (else it reads the environment)."""
    return {"nvfp4_4over6": None} if "nvfp4_4over6" in inspect.signature(fn).parameters else {}


def flashinfer_quantize(
    x: torch.Tensor,
    global_scale: torch.Tensor | None,
    *,
    block_size: int = 16,
    swizzle: bool = True,
    via: str = "direct",
) -> tuple[torch.Tensor, torch.Tensor]:
    """FlashInfer's quantize: (codes uint8 [M, K/2], scale bytes uint8, flattened). ``via``: direct | custom_op."""
    nvfp4.check_block_size(block_size)
    mx = block_size == nvfp4.MXFP4_BLOCK
    gs = (
        None
        if mx or global_scale is None
        else torch.as_tensor(global_scale, dtype=torch.float32, device=x.device).reshape(1)
    )
    if via == "direct":
        fn = public_fp4_quantize()
        codes, sf = fn(x, gs, block_size, mx, swizzle, **_recipe_kwargs(fn))
    elif via == "custom_op":
        codes, sf = torch.ops.flashinfer.fp4_quantize(x, gs, block_size, mx, swizzle)
    else:
        raise ValueError(f"via={via!r} is not allowed; allowed values: direct, custom_op")
    return codes.view(torch.uint8), sf.view(torch.uint8).reshape(-1)


def _reference(
    x: torch.Tensor, gs: torch.Tensor | None, block_size: int, swizzle: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    codes, sf, _ = nvfp4.quantize_bytes(
        x.cpu(), None if block_size == 32 else gs.cpu(), block_size=block_size, swizzle=swizzle
    )
    return codes, sf.reshape(-1)


def compare_bytes(
    codes: torch.Tensor,
    sf: torch.Tensor,
    x: torch.Tensor,
    gs: torch.Tensor | None,
    *,
    block_size: int = 16,
    swizzle: bool = True,
) -> dict:
    """A kernel's bytes against the reference: counts of differing codes and scales, and how many
    differing codes lie where an ulp of reciprocal error could move them."""
    ref_codes, ref_sf = _reference(x, gs, block_size, swizzle)
    codes, sf = codes.cpu(), sf.cpu()
    if codes.shape != ref_codes.shape or sf.numel() != ref_sf.numel():
        return {
            "shape_ok": False,
            "codes_shape": list(codes.shape),
            "sf_numel": sf.numel(),
            "expected_sf_numel": ref_sf.numel(),
        }
    code_diff = encodings.unpack_e2m1(codes) != encodings.unpack_e2m1(ref_codes)
    movable, scale_movable = reciprocals.reciprocal_sensitive(
        x.cpu(), None if block_size == 32 else gs.cpu(), block_size=block_size
    )
    if swizzle:  # the mask in the scales' layout (pads can never move)
        scale_movable = swizzle_128x4(scale_movable.to(torch.uint8)).bool()
    scale_diff = sf != ref_sf
    scale_movable = scale_movable.reshape(-1)
    return {
        "shape_ok": True,
        "codes_equal": bool(torch.equal(codes, ref_codes)),
        "scales_equal": bool(torch.equal(sf, ref_sf)),
        "code_mismatches": int(code_diff.sum()),
        "code_mismatches_rcp_movable": int((code_diff & movable).sum()),
        "code_mismatches_unexplained": int((code_diff & ~movable).sum()),
        "scale_mismatches": int(scale_diff.sum()),
        "scale_mismatches_unexplained": int((scale_diff & ~scale_movable).sum()),
        "elements": code_diff.numel(),
    }


def classify_output(
    codes: torch.Tensor,
    sf: torch.Tensor,
    x: torch.Tensor,
    gs: torch.Tensor | None,
    *,
    block_size: int = 16,
) -> str:
    """What a kernel returned: matches reference | unwritten (poison survives) | all zero | other."""
    codes, sf = codes.cpu(), sf.cpu()
    ref_codes, ref_sf = _reference(x, gs, block_size, True)
    if codes.shape == ref_codes.shape and torch.equal(codes, ref_codes) and torch.equal(sf, ref_sf):
        return "matches reference"
    if bool((codes == POISON).all()) and bool((sf == POISON).all()):
        return "unwritten (poison survives)"
    if not codes.any() and not sf.any():
        return "all zero"
    return "other"


def _poison_allocator(device: torch.device, sizes: list[int], rounds: int = 4) -> None:
    """Leave blocks of these byte sizes in the caching allocator's free pool, filled with POISON."""
    blocks = [
        torch.full((n,), POISON, dtype=torch.uint8, device=device)
        for n in sizes
        for _ in range(rounds)
    ]
    torch.cuda.synchronize(device)
    del blocks


def _attempt(call) -> dict:
    try:
        codes, sf = call()
        torch.cuda.synchronize()
        return {"ran": True, "codes": codes, "sf": sf}
    except Exception as e:
        return {
            "ran": False,
            "error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300],
        }


def hopper_probe(x: torch.Tensor, global_scale: torch.Tensor) -> dict:
    """What FlashInfer's FP4 quantize does on a CUDA GPU below SM100: refused, or which bytes come back."""
    if x.device.type != "cuda":
        return {"status": "not testable here", "reason": "needs a CUDA tensor (a GPU below SM100)"}
    if probe.package_version("flashinfer-python") is None:
        return {"status": "not testable here", "reason": "flashinfer-python is not installed"}
    major, minor = torch.cuda.get_device_capability(x.device)
    m, k = x.shape
    rows, cols = swizzled_shape(m, k // 16)
    sizes = [m * k // 2, rows * cols]
    record: dict[str, Any] = {
        "status": "ran",
        "sm": f"{major}.{minor}",
        "flashinfer": probe.package_version("flashinfer-python"),
    }
    calls = {"public": lambda: flashinfer_quantize(x, global_scale)}
    try:
        from flashinfer.quantization.fp4_quantization import get_fp4_quantization_module
    except ImportError:
        try:
            from flashinfer.fp4_quantization import get_fp4_quantization_module
        except ImportError:
            get_fp4_quantization_module = None
    if get_fp4_quantization_module is not None:

        def jit_module_call():
            module = get_fp4_quantization_module(f"{major}{minor}")
            codes, sf = module.fp4_quantize_sm100(
                x, global_scale.reshape(1).to(x.device), 16, False, True
            )
            return codes.view(torch.uint8), sf.view(torch.uint8).reshape(-1)

        calls["jit_module"] = jit_module_call
    for name, call in calls.items():
        _poison_allocator(x.device, sizes)
        outcome = _attempt(call)
        if outcome["ran"]:
            outcome["returned"] = classify_output(
                outcome.pop("codes"), outcome.pop("sf"), x, global_scale
            )
        record[name] = outcome
    return record


def _triton_approx_rcp_bytes(
    x: torch.Tensor, gs: torch.Tensor | None, block_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """fp4lab's Triton kernel with FlashInfer's rcp.approx: (codes, scale bytes flattened)."""
    codes, sf, _ = kernels.triton_quantize(
        x, gs, block_size=block_size, swizzle=True, approx_rcp=True
    )
    return codes, sf.view(torch.uint8).reshape(-1)


def bit_exact(x: torch.Tensor, global_scale: torch.Tensor, *, block_size: int = 16) -> dict:
    """FlashInfer (direct and custom op) and fp4lab's Triton kernel (rcp.approx) against the
    reference, on an FP4 GPU. A kernel that raises says so (``ran`` False, ``error``); Triton
    is left out, with the reason, where it cannot run."""
    if x.device.type != "cuda" or torch.cuda.get_device_capability(x.device) < probe.FP4_MIN_SM:
        return {
            "status": "not testable here",
            "reason": probe.machine().missing("fp4-gpu") or "x is not on an SM100+ GPU",
        }
    version = probe.package_version("flashinfer-python")
    if version is None:
        return {"status": "not testable here", "reason": "flashinfer-python is not installed"}
    gs = None if block_size == 32 else global_scale
    record: dict[str, Any] = {"status": "ran", "block_size": block_size, "flashinfer": version}
    calls = {"flashinfer_direct": lambda: flashinfer_quantize(x, gs, block_size=block_size)}
    triton_missing = kernels.triton_available()
    if triton_missing:
        record["triton_approx_rcp"] = {"ran": False, "skipped": triton_missing}
    else:
        calls["triton_approx_rcp"] = lambda: _triton_approx_rcp_bytes(x, gs, block_size)
    if custom_op_definition() is not None:
        calls["flashinfer_custom_op"] = lambda: flashinfer_quantize(
            x, gs, block_size=block_size, via="custom_op"
        )
    results = {}
    for name, call in calls.items():
        outcome = _attempt(call)
        if outcome["ran"]:
            results[name] = (outcome["codes"], outcome["sf"])
            outcome = {
                "ran": True,
                **compare_bytes(
                    outcome.pop("codes"), outcome.pop("sf"), x, gs, block_size=block_size
                ),
            }
        record[name] = outcome
    if "flashinfer_direct" in results and "triton_approx_rcp" in results:
        (fc, fs), (tc, ts) = results["flashinfer_direct"], results["triton_approx_rcp"]
        record["triton_equals_flashinfer"] = bool(torch.equal(fc, tc) and torch.equal(fs, ts))
    if "flashinfer_direct" in results:
        codes = encodings.unpack_e2m1(results["flashinfer_direct"][0].cpu())
        nan_codes = codes[torch.isnan(x.float().cpu())]
        record["kernel_code_for_nan"] = (
            sorted({int(c) for c in nan_codes.unique()}) if nan_codes.numel() else None
        )
    return record
