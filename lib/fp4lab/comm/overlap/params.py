"""What an overlap microbenchmark may run: GLM-5's MoE scaled down, backends, combines and
dtypes, their checks, and why a backend cannot run here. The rank side and the driver
both check with these."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from fp4lab.core import glm5, params, probe

BACKENDS = ("gloo", "nccl")
COLLECTIVES = ("all_to_all", "all_reduce")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
_CHUNKS_HELP = "positive integers, e.g. 1,2,4,8"


@dataclass(frozen=True)
class MoeShape:
    hidden: int
    moe_ffn: int
    topk: int
    experts: int

    @classmethod
    def glm5(cls, scale: int) -> MoeShape:
        """GLM-5's routed-expert widths divided by ``scale`` (one of ``glm5.SCALES``); top-k and experts kept."""
        params.choice("scale", scale, glm5.SCALES)
        return cls(glm5.HIDDEN // scale, glm5.MOE_FFN // scale, glm5.TOPK, glm5.EXPERTS)


def validate(
    shape: MoeShape,
    tokens: int,
    chunks: list[int],
    world_size: int,
    backend: str,
    collective: str,
    iters: int,
    warmup: int,
) -> None:
    """Raise ValueError, naming the parameter and what is allowed, before anything starts."""
    params.choice("backend", backend, BACKENDS)
    params.choice("collective", collective, COLLECTIVES)
    params.positive("tokens", tokens)
    params.positive("iters", iters)
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise ValueError(f"warmup={warmup!r} must be an integer >= 0")
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 2:
        raise ValueError(
            f"world size {world_size!r} is too small; a combine needs at least 2 ranks (nproc >= 2)"
        )
    if shape.experts % world_size:
        raise ValueError(f"world size {world_size} must divide the {shape.experts} experts")
    if not isinstance(chunks, (list, tuple)):
        raise ValueError(f"chunks={chunks!r} is not a list; allowed values: {_CHUNKS_HELP}")
    if not chunks:
        raise ValueError(f"chunks is empty; allowed values: {_CHUNKS_HELP}")
    local_experts = shape.experts // world_size
    rows = tokens * shape.topk
    if rows % local_experts:
        raise ValueError(
            f"tokens={tokens}: tokens x top-{shape.topk} = {rows} rows must split evenly "
            f"over {local_experts} local experts"
        )
    per_expert = rows // local_experts
    for c in chunks:
        params.positive("chunks", c)
        if local_experts % c or (local_experts // c * per_expert * shape.hidden) % world_size:
            raise ValueError(
                f"chunks contains {c}, which does not divide the {local_experts} local experts "
                f"into blocks the combine can split; allowed values: divisors of {local_experts}"
            )


def backend_for(machine: probe.Machine, world_size: int) -> str:
    """nccl where there are enough GPUs for one per rank, gloo otherwise."""
    enough_gpus = machine.cuda_available and machine.gpu_count >= max(2, world_size)
    return "nccl" if enough_gpus and dist.is_nccl_available() else "gloo"


def unavailable(backend: str, world_size: int, machine: probe.Machine | None = None) -> str | None:
    """Why ``backend`` cannot run ``world_size`` ranks here, or None."""
    machine = machine or probe.machine()
    if backend == "nccl" and backend_for(machine, world_size) != "nccl":
        return (
            f"nccl needs a CUDA GPU per rank ({world_size}); this machine has {machine.gpu_count}"
        )
    return None


def parse_chunks(spec: str) -> list[int]:
    """``"1,2,4"`` -> [1, 2, 4]."""
    try:
        return [int(c) for c in params.items("chunks", str(spec))]
    except ValueError:
        raise ValueError(
            f"chunks={spec!r} is not a comma list of integers; allowed values: {_CHUNKS_HELP}"
        ) from None


def resolve_dtype(spec: str, backend: str) -> str:
    """``auto`` -> bfloat16 on nccl, float32 on gloo; otherwise one of DTYPES."""
    if spec == "auto":
        return "bfloat16" if backend == "nccl" else "float32"
    params.choice("dtype", spec, (*DTYPES, "auto"))
    return spec
