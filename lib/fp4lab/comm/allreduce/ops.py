"""The allreduces a sweep measures: ``torch.distributed``'s (gloo or NCCL) and SGLang's
MSCCLPP communicator. Each runs in place, says when it would not route a tensor itself, and
gives the stream a CUDA graph must capture it on."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
import torch.distributed as dist

from fp4lab.comm import ranks


class TorchAllreduce:
    """``torch.distributed.all_reduce`` on the default group (gloo or NCCL)."""

    def __init__(self, backend: str) -> None:
        self.backend = backend

    def __call__(self, x: torch.Tensor) -> None:
        dist.all_reduce(x)

    def not_routed(self, x: torch.Tensor) -> str | None:
        return None

    @contextlib.contextmanager
    def capturing(self) -> Iterator[torch.cuda.Stream | None]:
        yield None


class SGLangMscclpp:
    """SGLang's MSCCLPP communicator, set up the way SGLang's own benchmark sets it up."""

    backend = "mscclpp"

    def __init__(self, env: ranks.RankEnv) -> None:
        from sglang.srt.distributed import parallel_state

        parallel_state.set_mscclpp_all_reduce(True)
        parallel_state.init_distributed_environment(
            world_size=env.world_size,
            rank=env.rank,
            local_rank=env.local_rank,
            distributed_init_method="env://",
            backend="nccl",
        )
        parallel_state.initialize_model_parallel(tensor_model_parallel_size=env.world_size)
        self._state = parallel_state
        self.comm = parallel_state.get_tensor_model_parallel_group().pymscclpp_comm
        if self.comm is None or not getattr(self.comm, "available", False):
            raise RuntimeError(
                "SGLang created no usable MSCCLPP communicator (is the mscclpp package importable?)"
            )
        if not getattr(self.comm, "best_configs", None):
            raise RuntimeError(
                f"SGLang's MSCCLPP communicator tuned no algorithm for world size {env.world_size}"
            )

    def __call__(self, x: torch.Tensor) -> None:
        self.comm.all_reduce(x)

    def not_routed(self, x: torch.Tensor) -> str | None:
        with self.comm.change_state(enable=True):
            routed = self.comm.should_mscclpp_allreduce(x)
        return (
            None
            if routed
            else "SGLang would not route this size to MSCCLPP (it falls back to NCCL)"
        )

    @contextlib.contextmanager
    def capturing(self) -> Iterator[torch.cuda.Stream | None]:
        with self._state.graph_capture() as context:
            yield context.stream


Allreduce = TorchAllreduce | SGLangMscclpp
