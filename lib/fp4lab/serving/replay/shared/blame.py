"""Whom a replay's stop is blamed on: the compiler only where the release's code ran eagerly, and
never where the stop is this CPU machine's (no CUDA driver) or a kernel fp4lab has no CPU stand-in
for; those cells are "not measured", with the frame."""

from __future__ import annotations

MACHINE_ONLY = ("triton/backends/nvidia/driver.py:",)
"""Frames where a stop is this CPU machine's, not the release's: Triton's NVIDIA driver looking
for libcuda (inductor compiling one of the release's ``torch.compile``'d helpers, or a Triton
launch); on a GPU it finds it."""


def machine_only(step: dict) -> bool:
    """Whether a stop passed through ``MACHINE_ONLY``: fp4lab's machine, never a blocker."""
    return any(f.startswith(MACHINE_ONLY) for f in [*(step.get("frames") or []),
                                                      str(step.get("blocker_frame") or "")])  # fmt: skip


KERNEL_BOUNDARIES = ("torch/_ops.py:", "sgl_kernel/")
"""Frames where an eager call meets a compiled kernel."""

MISSING_KERNEL_WORDS = ("'_OpNamespace'", "Could not run", "not implemented for")
"""What torch says where an op has no kernel here (an op namespace without the op, no CPU
kernel); any other failure at the boundary (an op's schema refusing an argument, the release's
own Python body of a custom op failing) is the release's own."""


def kernel_absent(stack: list[str], said: str) -> bool:
    """Whether a failure at these frames, with this message, stopped at a kernel boundary for want
    of a kernel here (``MISSING_KERNEL_WORDS``)."""
    return any(f.startswith(KERNEL_BOUNDARIES) for f in stack[-2:]) and any(
        w in said for w in MISSING_KERNEL_WORDS
    )


CUDA_API = "torch/cuda/__init__.py:"
"""torch's CUDA API, which this CPU build refuses ("Torch not compiled with CUDA enabled"): a
kernel's wrapper asking it for the current stream has one on a GPU."""


def missing_kernel(eager: dict) -> str | None:
    """The eager pass's failure where it stopped at a kernel boundary for want of a kernel, or in
    torch's CUDA API (``CUDA_API``): its last frame and message, or None (it ran, or failed in
    the release's own code)."""
    stack = eager.get("frames") or []
    said = str(eager.get("message") or "")
    if eager.get("status") != "runtime_error" or not stack:
        return None
    if stack[-1].startswith(CUDA_API):
        asked = next((f for f in reversed(stack) if not f.startswith(CUDA_API)), stack[-1])
        return f"{asked}: {said} (torch's CUDA API)"
    return (
        f"{stack[-2] if len(stack) > 1 else stack[-1]}: {said}"
        if kernel_absent(stack, said)
        else None
    )


def releases_own(eager: dict, stop: dict) -> str | None:
    """Where the release's code failed uncompiled with the message a compiled run stopped with
    (``stop``): the release's last frame the stop passed (a custom op's body is past torch's
    dispatcher, which the eager frames end at); None where eager ran, or stopped otherwise, or at
    this machine's edge. The same failure both ways clears the compiler, not fp4lab's set-up."""
    if (eager.get("status") != "runtime_error" or machine_only(eager)
            or eager.get("message") != stop.get("message")):  # fmt: skip
        return None
    own = [f for f in stop.get("frames") or [] if f.startswith("sglang/")]
    return f"{(own or eager.get('frames') or ['?'])[-1]}: {eager['message']}"


def unlisted_moe(eager: dict, own: str | None) -> str | None:
    """Why a model failed the same way compiled and uncompiled (``own``, from ``releases_own``)
    where the release's own prefill-graph set-up left its MoE layers out of the layer table its
    MoE split op reads (``moe_unlisted``, the layers listed as None): the release's, not the
    compiler's nor fp4lab's; None where the table listed every MoE."""
    layers = eager.get("moe_unlisted")
    if not own or not layers:
        return None
    return (f"the release's prefill-graph set-up lists no MoE for layers {layers} in its layer "
            f"table (ModelRunner.moe_layers), though they hold one; its MoE split op fails at "
            f"{own}, uncompiled too: the release's, not the compiler's")  # fmt: skip


REFUSING_CODE = "sglang/srt/layers/quantization/"
"""Where the release says in its own words that it does not support the path it resolved for a
model (a ``NotImplementedError`` in its quantization methods)."""


def refused_both_ways(eager: dict, own: str | None) -> str | None:
    """Why a model failed the same way compiled and uncompiled (``own``) where the release raised
    ``NotImplementedError`` in its quantization code (``REFUSING_CODE``): the release refusing
    the kernel path it resolved itself, not the compiler nor fp4lab; else None."""
    if not own or eager.get("exception") != "builtins.NotImplementedError":
        return None
    if not own.startswith(REFUSING_CODE):
        return None
    return (f"the release refuses the path it resolved for this model, in its own words, at "
            f"{own}, uncompiled too: the release's, not the compiler's")  # fmt: skip
