"""The allreduces a sweep measures: ``torch.distributed``'s (gloo or NCCL) and SGLang's
MSCCLPP communicator. Each runs in place, says when it would not route a tensor itself, and
gives the stream a CUDA graph must capture it on."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
import torch.distributed as dist

from fp4lab.comm import ranks
from fp4lab.comm.allreduce import mscclpp_api


class TorchAllreduce:
    """``torch.distributed.all_reduce`` on the default group (gloo or NCCL)."""

    def __init__(self, backend: str) -> None:
        self.backend = backend

    def __call__(self, x: torch.Tensor) -> None:
        dist.all_reduce(x)

    def state(self) -> dict:
        """What proves which allreduce ran (nothing beyond the backend's name here)."""
        return {}

    def not_routed(self, x: torch.Tensor) -> str | None:
        return None

    @contextlib.contextmanager
    def capturing(self) -> Iterator[torch.cuda.Stream | None]:
        yield None


class SGLangMscclpp:
    """SGLang's MSCCL++ communicator, set up through the API the installed SGLang exposes
    (``mscclpp_api``); refuses to start unless the communicator is really usable."""

    backend = "mscclpp"

    def __init__(self, env: ranks.RankEnv) -> None:
        from sglang.srt.distributed import parallel_state

        api = mscclpp_api.describe()
        reason = mscclpp_api.unsupported(api, env.world_size)
        if reason:
            raise RuntimeError(reason)
        getattr(parallel_state, api["set_mscclpp"])(True)
        parallel_state.init_distributed_environment(
            world_size=env.world_size,
            rank=env.rank,
            local_rank=env.local_rank,
            distributed_init_method="env://",
            backend="nccl",
        )
        if api["tp_keyword"]:
            parallel_state.initialize_model_parallel(tensor_model_parallel_size=env.world_size)
        else:  # widths come from SGLang's runtime context: publish them with SGLang's own helper
            from sglang.test.test_utils import publish_build_topology

            publish_build_topology(
                world_rank=env.rank, tp_size=env.world_size, ep_size=1, pp_size=1
            )
            parallel_state.initialize_model_parallel()
        self._state = parallel_state
        self.comm = parallel_state.get_tensor_model_parallel_group().pymscclpp_comm
        if self.comm is None or not getattr(self.comm, "available", False):
            raise RuntimeError(
                "SGLang created no usable MSCCL++ communicator (see its warning in the log)"
            )
        tuned = getattr(self.comm, api["best_configs"])
        self.tuned = {k: len(v) for k, v in tuned.items()} if isinstance(tuned, dict) else tuned
        if not (tuned.get("allreduce") if isinstance(tuned, dict) else tuned):
            raise RuntimeError(
                f"SGLang's MSCCL++ communicator tuned no allreduce for world size {env.world_size}"
            )

    def __call__(self, x: torch.Tensor) -> None:
        self.comm.all_reduce(x)

    def state(self) -> dict:
        """The communicator's own state, which proves MSCCL++ (not NCCL) runs the allreduce."""
        return {"mscclpp_available": bool(self.comm.available), "mscclpp_tuned": self.tuned}

    def not_routed(self, x: torch.Tensor) -> str | None:
        with self.comm.change_state(enable=True):
            routed = self.comm.should_mscclpp_allreduce(x)
        return (
            None
            if routed
            else "SGLang would not route this size to MSCCL++ (it falls back to NCCL)"
        )

    @contextlib.contextmanager
    def capturing(self) -> Iterator[torch.cuda.Stream | None]:
        with self._state.graph_capture() as context:
            yield context.stream


Allreduce = TorchAllreduce | SGLangMscclpp
