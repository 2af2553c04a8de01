"""Any FP4 model before launch: its config through one release's prefill graph runner on one SM.

    python -m fp4lab.serving.replay check --config PATH --sglang 0.5.21 --sm 12.0 \
        [--backend default|breakable|full|tc_piecewise] [--trace-dir DIR]

``--backend default`` (the default) answers for the prefill graph the release resolves for the
model with no flag where the release has breakable graphs (0.5.15 on, read from its files): a
breakable or full graph is captured by the release's own runner and replayed (``breakable``);
any other default is answered through tc_piecewise (below), as ``--backend tc_piecewise`` is.

The config (``config.json`` or its folder, with ``hf_quant_config.json`` where the checkpoint has
one) is read and checked before anything is built (``models.read``); the release's own model
class is built from its tiny form and replayed (``pool.replay_one``); the answer says the outcome, the
blocker frames with dynamo's graph-break code, the flag a user passes and whether fp4lab's patch
fixes it. ``--trace-dir`` keeps dynamo's structured trace (TORCH_TRACE) for tlparse.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

from fp4lab.core import params
from fp4lab.serving.replay import decide, env, pool, versions
from fp4lab.serving.replay.shared import breakable_outcome, flags, models


def blocker_lines(replay: dict) -> list[str]:
    """One line per trace blocker (``decide.blocker_frames``)."""
    return [f"  blocker at {decide.blocker_text(b)}: {b['message']}"
            for b in decide.blocker_frames(replay)]  # fmt: skip


def answer(model: models.Model, version: str, sm: str, replay: dict) -> tuple[dict, list[str]]:
    """The decision row of this model x release x SM and the lines that say it."""
    row = decide.cell(version, sm, replay)
    default = row["default_prefill"] or "an unknown prefill graph (its resolution not recorded)"
    lines = [
        f"SGLang {version} gives {model.name} on SM{sm} {default} by default "
        f"({row['default_rule'] or 'no rule recorded'})",
        f"{model.name} ({model.architecture}, {model.quantization.upper()}) through tc_piecewise "
        f"in SGLang {version} on SM{sm} (simulated on a CPU): {row['outcome'].upper()}",
        f"  note: {row['note']}",
    ]
    if row["outcome"] == "not measured":  # fp4lab's harness failed: nothing more is known
        return row, lines
    lines[2:2] = [
        f"  how: {', '.join(row['evidence']) or 'nothing traced'}; built: {row['model_class']}",
        f"  torch: {row['torch_note'] or 'decided by the torch the release pins'}",
        f"  flag: {row['flag']} ({row['flag_why']})",
        "  flags per prefill graph: "
        + "; ".join(f"{g}: {f}" for g, f in row["graph_flags"].items()),
        "  kernel backends: "
        + ", ".join(f"{k}={v}" for k, v in row["kernel_backends"].items() if v != "auto"),
        *blocker_lines(replay),
    ]
    if row["patch"]:
        fixed = "fixes it" if row["compiles_with_patch"] else "does not fix it"
        lines.append(f"  fp4lab's patch ({', '.join(row['patch'])}) {fixed}; write it with "
                     f"--write-patch DIR")  # fmt: skip
    ran = replay.get("standins_reached", [])
    kernels = [s["name"] for s in replay.get("standins", []) if "kernels" in s]
    unused = sorted(set(kernels) - set(ran))
    setup = sorted({s["name"] for s in replay.get("standins", []) if "kernels" not in s})
    lines += dict.fromkeys(f"  kernel {k['kernel']} on SM{sm}: {k['available']} ({k['evidence']})"
                           for k in row["kernels"] or [] if k["library"])  # fmt: skip
    unread = [k["kernel"] for k in row["kernels"] or [] if not k["library"]]
    lines += [f"  kernels reached with no arch evidence read ({len(unread)}): "
              f"{', '.join(unread) or 'none'}"] if row["kernels"] is not None else [
              "  kernels' availability: not recorded"]  # fmt: skip
    lines += [f"  stand-in kernels reached ({len(ran)}): {', '.join(ran) or 'none'}",
              f"  stand-in kernels installed, not reached ({len(unused)}): {', '.join(unused) or 'none'}",
              f"  set-up stand-ins ({len(setup)}): {', '.join(setup)}"]  # fmt: skip
    return row, lines


BACKENDS = ("default", *flags.CAPTURED, "tc_piecewise")
"""What ``--backend`` accepts: the release's own default, or one prefill graph."""


def captured_lines(model: models.Model, version: str, sm: str, replay: dict,
                   graph: str) -> tuple[str, list[str]]:  # fmt: skip
    """The outcome of a captured walk (breakable or full) and the lines that say it."""
    result, why = breakable_outcome.outcome(replay, graph)
    lines = [f"{model.name} ({model.architecture}, {model.quantization.upper()}) through {graph} "
             f"in SGLang {version} on SM{sm} (capture simulated on a CPU): {result.upper()}",
             f"  note: {why}", f"  flag: {flags.read(replay, graph)['flag_why']}"]  # fmt: skip
    found = replay.get(graph)
    if found is None:
        return result, lines
    lines.append(f"  how: simulated_capture (the release's PrefillCudaGraphRunner and "
                 f"{found.get('backend')}; segments recorded where CUDA would capture)")  # fmt: skip
    for b in found.get("buckets", []):
        breaks = ", ".join(dict.fromkeys(b["breaks"])) or "none"
        variant = f" ({b['variant']})" if b.get("variant") else ""
        lines.append(f"  bucket {b['bucket']}{variant}: {b['segments']} segments, "
                     f"{len(b['breaks'])} breaks ({breaks})")  # fmt: skip
    lines += [f"  flagged: {f['what']} in segment {f['segment']} of bucket {f['bucket']} at "
              f"{f['frame']}" for f in found.get("flags", [])]  # fmt: skip
    lines += [f"  host value read in a segment (frozen into the graph, allowed): {r['frame']} "
              f"({r['times']} times)" for r in found.get("host_reads", [])]  # fmt: skip
    lines += [f"  replay of bucket {r['bucket']}: max |diff| vs eager {r['max_abs_diff']:.3g}"
              for r in found.get("replays", [])]  # fmt: skip
    held = found.get("weak_refs") or {}
    lines += [f"  held by weak reference at {frame}: {n['held']}, of which {n['released']} held by "
              f"nothing else after the capture, {n['at_risk']} with a bucket captured after theirs "
              f"({held['upstream']})" for frame, n in held.get("frames", {}).items()]  # fmt: skip
    lines += [f"  kernel {k['kernel']} on SM{sm}: {k['available']} ({k['evidence']})"
              for k in replay.get("kernel_availability") or [] if k["library"]]  # fmt: skip
    chosen = {k: v for k, v in flags.read(replay)["kernel_backends"].items()
              if ("attention" in k or "prefill" in k) and v not in ("auto", None)}  # fmt: skip
    if "attention_backend" in replay.get("standins_reached", []):
        lines.append(f"  attention: fp4lab's stand-in ran in place of the backend the release "
                     f"resolved ({', '.join(f'{k}={v}' for k, v in chosen.items()) or 'unknown'}); "
                     f"that backend's kernels were not run or checked")  # fmt: skip
    real = found.get("attention") or {}
    if real.get("class"):
        asked = ", ".join(f"{k} = {v}" for k, v in real.get("asked", {}).items())
        lines.append(f"  attention class the release builds: {real['class']}"
                     + (f"; the runner asked it {asked} (the class's own answer)" if asked else ""))  # fmt: skip
    lines.append(f"  stand-ins reached: {', '.join(replay.get('standins_reached', [])) or 'none'}")
    return result, lines


def check(model: models.Model, version: str, sm: str, trace_dir: Path | None,
          progress: Callable[[str], object] = print, backend: str = "default") -> int:  # fmt: skip
    """Replay ``model`` on one release and SM through ``backend`` and print the answer; 0 when
    measured."""
    built = env.ensure_env(version)
    if not built.ok:
        progress(f"error: sglang=={version}: {built.error}")
        return 1
    if backend in flags.CAPTURED and not env.has_backend(version, backend):
        progress(f"SGLang {version} has no {backend} prefill graph backend (none in its files)")
        return 1
    if backend != "tc_piecewise" and env.has_backend(version, "breakable"):
        found = pool.replay_one(version, sm, model, walk="breakable")
        default = flags.read(found)
        graph = default["default_prefill"] if backend == "default" else backend
        if graph in flags.CAPTURED:
            progress(f"SGLang {version} gives {model.name} on SM{sm} "
                     f"{default['default_prefill'] or 'an unknown prefill graph'} by default "
                     f"({default['default_rule'] or 'its resolution not recorded'})")  # fmt: skip
            if graph != "breakable":
                found = pool.replay_one(version, sm, model, walk=graph)
            result, lines = captured_lines(model, version, sm, found, graph)
            for line in lines:
                progress(line)
            return 0 if result != "not measured" else 1
    extra = (("TORCH_TRACE", str(trace_dir.resolve())),) if trace_dir else ()
    found = pool.replay_one(version, sm, model, env_vars=extra)
    row, lines = answer(model, version, sm, found)
    for line in lines:
        progress(line)
    if trace_dir:
        progress(f"  dynamo's structured trace: {trace_dir} (open it with tlparse)")
    return 0 if row["outcome"] != "not measured" else 1


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m fp4lab.serving.replay check",
                                     description="will SGLang's prefill CUDA graphs work for "
                                     "this FP4 model? (a CPU replay, no weights)")  # fmt: skip
    parser.add_argument("--config", required=True, help="a config.json or its folder")
    parser.add_argument("--sglang", required=True, help=f"one of {', '.join(versions.VERSIONS)}")
    parser.add_argument("--sm", required=True, help=f"one of {', '.join(versions.SMS)}")
    parser.add_argument("--backend", default="default", help=f"one of {', '.join(BACKENDS)}")
    parser.add_argument("--trace-dir", metavar="DIR", help="keep dynamo's structured trace here")
    args = parser.parse_args(argv)
    try:
        params.choice("--sglang", args.sglang, versions.VERSIONS)
        params.choice("--sm", args.sm, tuple(versions.SMS))
        params.choice("--backend", args.backend, BACKENDS)
        model = models.read(args.config)
        trace = params.folder("--trace-dir", args.trace_dir) if args.trace_dir else None
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return check(model, args.sglang, args.sm, trace, backend=args.backend)
