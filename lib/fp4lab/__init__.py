"""fp4lab: re-runnable evidence on serving optimizations for FP4-quantized models.

Subpackages, one concern each (docs/architecture.md has the map):
core (paths, records, parameters, timing, child processes, machine probe, notebook catalog),
compile (torch.compile outcomes, the story staged on FlashInfer, the fix, version matrix),
fp4 (FP4 numerics, kernels, cross-checks, error and speed), comm (torchrun, allreduce,
overlap), serving (SGLang launch, logs, benchmarks) and report (figures, decision table).

Importing fp4lab changes nothing; ``fp4lab.setup()`` points every cache into build/ and ties
the calling process's life to its parent's (a notebook kernel dies with its runner).
"""

__version__ = "0.1.0"


def setup() -> None:
    """Refuse a parameter papermill injected that the notebook does not declare
    (``core.injected``), point every dependency's cache into the repository's build/cache (call
    before importing torch), and have this process stopped when its parent dies
    (``core.process``); in a notebook, its tables wrapped to the page (``core.page``)."""
    from fp4lab.core.injected import refuse_undeclared
    from fp4lab.core.page import in_notebook
    from fp4lab.core.paths import use_build_caches
    from fp4lab.core.process import exit_with_parent

    refuse_undeclared()
    use_build_caches()
    exit_with_parent()
    in_notebook()
