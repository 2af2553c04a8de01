"""Inside one SGLang environment: what the release resolves for a model on the simulated SM.

A user's command line goes through the release's own parser and ``ServerArgs`` (its
``__post_init__``, or in a reworked release the resolution pipeline ``publish`` runs), on a GPU
of the simulated SM, with the model's tiny checkpoint. Per command line it records the prefill
graph the release resolved (``tc_piecewise``, ``breakable``, ``full`` or ``disabled``), the rule
that decided it (the release's line that last set it, and what it logged meanwhile), the kernel
backends it chose and the token buckets (``resolve``). ``reach`` asks the parser's own options
for each prefill graph and keeps the first command line that resolves to it: the flags a user
needs come from the release's resolution, never from its parser's defaults.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import logging
import os
from pathlib import Path
from typing import Any

from fp4lab.serving import read_parser
from fp4lab.serving.replay.release import deciding, reworked, setup_standins

GRAPHS = ("tc_piecewise", "breakable", "full")
"""The prefill graphs a user can ask a release for (``disabled`` is none)."""

PREFILL_OPTION = "--cuda-graph-backend-prefill"
ENABLE_OPTION = "--enable-piecewise-cuda-graph"
ENFORCE_OPTION = "--enforce-piecewise-cuda-graph"

KERNEL_WORDS = ("attention", "attn", "moe", "gemm", "dsa", "nsa", "mla", "fp4", "quant", "sampling")
"""The ``*_backend`` fields that choose kernels (not tokenizers, transfers or caches)."""

KEPT_FIELDS = ("quantization", "kv_cache_dtype", "page_size", "device", "disable_cuda_graph",
               "piecewise_cuda_graph_tokens", "piecewise_cuda_graph_max_tokens",
               "piecewise_cuda_graph_compiler", "enforce_piecewise_cuda_graph")  # fmt: skip
"""Resolved fields recorded besides every ``*_backend`` field."""


def options() -> list[dict]:
    """The prefill / piecewise CUDA-graph options of the release's own ``ServerArgs`` parser."""
    wanted = ("piecewise-cuda-graph", "cuda-graph-backend")
    return [o for o in read_parser.describe(parser())
            if any(w in " ".join(o["options"]) for w in wanted)]  # fmt: skip


class Refused(ValueError):
    """The release's parser refused a command line (its words)."""


@functools.cache
def parser() -> argparse.ArgumentParser:
    """The release's own ``ServerArgs`` parser, built once a process (its options hold no
    state a parse changes); a refusal raises ``Refused`` with its words instead of exiting."""
    from sglang.srt.server_args import ServerArgs

    built = argparse.ArgumentParser(prog="sglang serve")
    ServerArgs.add_cli_args(built)

    def error(message: str) -> None:
        raise Refused(message)

    built.error = error  # type: ignore[method-assign]
    return built


def _live(spelled: dict[str, dict], flag: str) -> bool:
    return flag in spelled and not spelled[flag]["help"].lower().startswith("deprecated")


def candidates(found: list[dict], graph: str) -> list[list[str]]:
    """The command lines that may ask this release for ``graph``, shortest first, from its
    parser's own options (``options``): none, then the prefill option or the enable option,
    then each with the enforce option."""
    spelled = {name: o for o in found for name in o["options"]}
    asked: list[list[str]] = [[]]
    prefill = spelled.get(PREFILL_OPTION)
    if prefill:  # a graph not among its choices too: the refusal is recorded in its words
        asked.append([PREFILL_OPTION, graph])
    if graph == "tc_piecewise" and ENABLE_OPTION in spelled:
        asked.append([ENABLE_OPTION])
    if graph == "tc_piecewise" and _live(spelled, ENFORCE_OPTION):
        asked += [[*flags, ENFORCE_OPTION] for flags in asked]
    return asked


def graph_config(args: Any, rework: bool) -> Any:
    """The resolved ``CudaGraphConfig`` (0.5.14 on): in a reworked release the one its config
    bags hold after ``publish``, else the ``ServerArgs`` field; None before 0.5.14."""
    if rework:
        from sglang.srt import runtime_context as context

        with contextlib.suppress(Exception):  # a reworked release keeping it on ServerArgs
            return context.get_exec().graph.cuda_graph_config
    return getattr(args, "cuda_graph_config", None)


def buckets(args: Any, config: Any) -> list[int] | None:
    """The token buckets the resolution fixed (None: the runner decides them later)."""
    if config is not None:
        return config.prefill.bs
    return getattr(args, "piecewise_cuda_graph_tokens", None)


def backends(args: Any, rework: bool) -> dict:
    """Every resolved kernel-choosing ``*_backend`` field and ``KEPT_FIELDS``; in a reworked
    release, what its config bags hold for them (they hold the resolved values)."""
    names = [n for n in reworked.fields(type(args)) if _chooses_kernels(n) or n in KEPT_FIELDS]
    found = {
        n: _plain(getattr(args, n)) for n in sorted(names) if getattr(args, n, None) is not None
    }
    if rework:
        from sglang.srt import runtime_context as context

        for getter in ("get_exec", "get_model"):
            with contextlib.suppress(Exception):  # a release without the bag
                found |= _bag_values(getattr(context, getter)(), depth=2)
    return found


def _chooses_kernels(name: str) -> bool:
    return name.endswith("_backend") and any(w in name for w in KERNEL_WORDS)


def _bag_values(bag: Any, depth: int) -> dict:
    """The kernel-choosing fields of a config bag and of the bags it holds."""
    found: dict = {}
    for name in dir(bag):
        if name.startswith("_"):
            continue
        try:
            value = getattr(bag, name)
        except Exception:  # a field the bag refuses to read for this role
            continue
        if _chooses_kernels(name) or name in KEPT_FIELDS:
            found[name] = _plain(value) if value is not None else None
        elif depth and type(value).__name__ == "_ConfigBag":
            found |= _bag_values(value, depth - 1)
    return {k: v for k, v in found.items() if v is not None}


def _plain(value: Any) -> Any:
    return value if isinstance(value, (str, int, float, bool, list)) else str(value)


def server_args(checkpoint: Path, sm: tuple[int, int], rework: bool, flags: list[str],
                fields: dict | None = None) -> tuple[Any, dict]:  # fmt: skip
    """The release's ``ServerArgs`` for ``flags`` (a user's command line after the model path),
    parsed by its own parser and resolved by the release on the simulated GPU, ``fields`` set
    over the parsed values (fp4lab's own choices); and what it resolved (see the module
    docstring)."""
    argv = ["--model-path", str(checkpoint), *flags]
    logged, root = deciding.Logged(), logging.getLogger()
    level = root.level
    root.addHandler(logged)
    root.setLevel(min(level, logging.INFO) if level else logging.INFO)
    try:
        with setup_standins.gpu_memory_answered(sm), deciding.recorded() as decisions:
            parsed = vars(parser().parse_args(argv))
            cls = deciding.server_args_class()
            given = {k: v for k, v in {**parsed, **(fields or {})}.items()
                     if k in reworked.fields(cls)}  # fmt: skip
            args = cls(**given)
            if rework:
                reworked.publish(args)
    finally:
        root.removeHandler(logged)
        root.setLevel(level)
    config = graph_config(args, rework)
    graph = deciding.prefill_graph(args, config)
    return args, {"flags": flags, "prefill_graph": graph, "rule": deciding.rule(decisions, graph),
                  "logged": logged.lines[-8:],
                  "buckets": buckets(args, config), "backends": backends(args, rework)}  # fmt: skip


def resolve(checkpoint: Path, sm: tuple[int, int], rework: bool, flags: list[str]) -> dict:
    """What the release resolves for ``flags``; a refusal (the parser's or the release's) is
    recorded with its words."""
    saved = dict(os.environ)  # a release's resolution may set variables for what it chose
    try:
        return server_args(checkpoint, sm, rework, flags)[1]
    except Refused as exc:  # the parser refused the command line
        return {"flags": flags, "prefill_graph": None, "refused": f"the parser: {exc}"[:400]}
    except Exception as exc:  # the release's resolution refused it: its own words
        return {"flags": flags, "prefill_graph": None, "refused": f"{type(exc).__name__}: {exc}"[:400],
                "rule": [f for f in _traceback_frames(exc) if f.startswith("sglang/")][-3:]}  # fmt: skip
    finally:
        os.environ.clear()
        os.environ.update(saved)


def _traceback_frames(exc: BaseException) -> list[str]:
    found, tb = [], exc.__traceback__
    while tb is not None:
        name = tb.tb_frame.f_code.co_filename.split("site-packages/")[-1]
        found.append(f"{name}:{tb.tb_lineno}:{tb.tb_frame.f_code.co_name}")
        tb = tb.tb_next
    return found


def reach(checkpoint: Path, sm: tuple[int, int], rework: bool, base: list[str]) -> dict:
    """The release's resolution of the user's command line ``base`` (``default``) and, per
    prefill graph a user can ask for, the first command line that resolves to it: its ``flags``
    beyond ``base`` (None where none does; ``resolved`` is then the most explicit one tried)."""
    found = options()
    default = resolve(checkpoint, sm, rework, base)
    graphs = {}
    for graph in GRAPHS:
        asked = candidates(found, graph)
        tried = [default] + [resolve(checkpoint, sm, rework, [*base, *f]) for f in asked[1:]]
        hit = next((i for i, r in enumerate(tried) if r["prefill_graph"] == graph), None)
        graphs[graph] = {"flags": None if hit is None else asked[hit],
                         "resolved": tried[-1 if hit is None else hit], "asked": asked}  # fmt: skip
    return {"base": base, "default": default, "graphs": graphs, "options": found}
