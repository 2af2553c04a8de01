"""A model the release's code did not build here, as a record: the exception's line and frames,
and whose refusal it was: the release's (of the model on the SM), or of what fp4lab's harness
chose (``HARNESS_CHOICES``), or the release lacking the model's class.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import re
import sysconfig
import traceback
from pathlib import Path

from fp4lab.compile import frames
from fp4lab.core import paths
from fp4lab.serving.replay.release import cpu_moe_kernels, facts, layout, model, quantize
from fp4lab.serving.replay.shared import blame

REFUSING_FILES = (blame.REFUSING_CODE, "sglang/srt/model_loader/", "sglang/srt/server_args.py")
"""Where the release's own refusal of a model on an SM is raised: a ``ValueError`` there, a
``NotImplementedError`` (a quantization format the release has no scheme for) or an
``AssertionError`` (its arguments' checks, e.g. the attention backends a model takes)."""
REFUSALS = (ValueError, NotImplementedError, AssertionError)
"""The exceptions a refusal raises."""

HARNESS_CHOICES = {
    "get_model_architecture": "the release's model registry, as imported on this machine, lacks "
    "the class its own model files define (one of its model modules failed to import here)",
    "_prepare_weights": "the release's loader for this quantization takes no dummy weights, "
    "which fp4lab's harness builds with",
    "_load_modelopt_base_model": "the release counts this checkpoint as unquantized (it has no "
    "hf_quant_config.json) and loads its weights for ModelOpt's quantize workflow; fp4lab's "
    "harness has dummy weights only",
}
"""Functions of the release's loader whose refusal is of what fp4lab's harness chose or set up,
not of the model on the SM: the model class is only asked for when the release's source defines
it (``model._architecture``), and a user loads real weights."""


def refusal(frames: list[str], refusing: bool = True) -> tuple[bool, str | None]:
    """Whether an exception raised at these frames is the release refusing the model (only one
    of ``REFUSALS``, ``refusing``, raised by the release's code can be), and otherwise which of
    the harness's choices it refused (``HARNESS_CHOICES``), if any."""
    release = [f for f in frames if f.startswith("sglang/")]
    choice = next((why for f in release for name, why in HARNESS_CHOICES.items()
                   if f.endswith(f":{name}")), None)  # fmt: skip
    refused = (refusing and bool(frames) and not frames[-1].startswith("fp4lab/")
               and any(f.startswith(REFUSING_FILES) for f in frames[-2:]))  # fmt: skip
    return choice is None and refused, choice


MACHINE_WORDS = (".so", "libcuda", "CUDA", "No module named")
"""What an import failure says where it is this machine's (a CUDA binary, its driver) or a
package the environment lacks, not the environment's own packages disagreeing."""


def distribution(top: str) -> str | None:
    """The installed distribution (``name version``) that holds the top-level module ``top``,
    found by its name, else by the folder its file is in (a package put on the path by a
    ``.pth`` file, as nvidia-cutlass-dsl puts ``cutlass``)."""
    owners = importlib.metadata.packages_distributions()
    spec = importlib.util.find_spec(top) if not owners.get(top) else None
    if spec is not None and spec.origin:
        purelib = Path(sysconfig.get_paths()["purelib"])
        top = (
            Path(spec.origin).relative_to(purelib).parts[0]
            if spec.origin.startswith(str(purelib))
            else top
        )
    name = (owners.get(top) or [None])[0]
    return f"{name} {importlib.metadata.version(name)}" if name else None


def module_fails(architecture: str) -> str | None:
    """Where the release's loader built another class than ``architecture`` (its registry left
    the module defining it out): that module's import failure, where it is of the environment's
    own packages as resolved from the release's pins (not ``MACHINE_WORDS``), with the installed
    versions of the packages its last frames are in; None where it imports or fails for this
    machine."""
    module = layout.module_defining(architecture)
    try:
        importlib.import_module(module or "")
        return None
    except Exception as exc:  # the module's own import failure is what is recorded
        failed = failure(exc)
    if any(w in failed["error"] for w in MACHINE_WORDS):
        return None
    named = re.findall(r"module '(\w+)", failed["error"])  # a module the message names
    tops = [*(f.split("/")[0] for f in failed["frames"][-2:]), *named]
    held = ", ".join(dict.fromkeys(d for t in tops if t.isidentifier() and (d := distribution(t))))
    return (f"the release's {module} does not import in its environment as resolved from its "
            f"pins ({held}): {failed['error']} [at {failed['frames'][-1]}]; its loader builds "
            f"another class in place of {architecture}")  # fmt: skip


def build_failed(exc: Exception, architecture: str) -> dict:
    """A model the release's code did not build (or import) here: the obstacle, whether the
    release itself refused it, refused one of the harness's choices, or lacks its class, and the
    release's rules."""
    failed = failure(exc)
    refused, choice = refusal(failed["frames"], isinstance(exc, REFUSALS))
    chosen = quantize.chosen()  # the release's modules were imported on the simulated GPU
    return {"build_error": failed["error"], "build_frames": failed["frames"],
            "build_release_frame": failed["release_frame"],
            "facts": {"quantize": {k: v for k, v in chosen.items() if k != "callable"}},
            "refused_by_release": refused, "harness_choice_refused": choice,
            "call_refused": isinstance(exc, cpu_moe_kernels.CallRefused),
            "model_absent": str(exc) if isinstance(exc, model.ModelAbsent) else (
                module_fails(architecture) if isinstance(exc, model.NotTheReleasesModel) else None),
            } | facts.release_rules()  # fmt: skip


def failure(exc: BaseException) -> dict:
    """An exception as a record: its last line, its frames (``file:line:function``, relative to
    their package root, the last 8) and the deepest frame in fp4lab's own code and in SGLang's,
    if any."""
    where = [f"{frames.relative_path(f.filename)}:{f.lineno}:{f.name}"
             for f in traceback.extract_tb(exc.__traceback__)]  # fmt: skip
    ours = [f for f in where if f.startswith("fp4lab/")]
    release = [f for f in where if f.startswith("sglang/")]
    line = paths.unrooted(traceback.format_exception_only(exc)[-1].strip())
    return {"error": line[:800], "frames": where[-8:], "harness_frame": ours[-1] if ours else None,
            "release_frame": release[-1] if release else None}  # fmt: skip
