"""How a result was obtained: a small fixed vocabulary that every verdict and its records carry.

A record that supports a verdict stores ``values["evidence"]``: the levels its run reached,
weakest first. A verdict claims no more than its records' levels: "compiles" from a trace on a
simulated target is not "runs on Blackwell".
"""

from __future__ import annotations

LEVELS = {
    "trace": "dynamo traced the code; nothing ran",
    "simulated_target": "the target GPU was simulated (FlashInfer saw a made-up SM)",
    "reference_kernel": "fp4lab's spec-exact reference ran in place of the FP4 kernel",
    "simulated_capture": "CUDA-graph capture imitated on a CPU: a capture recorded the operators "
    "and their tensors, a replay re-ran them on those tensors",
    "real_fp4_kernel": "a real FP4 kernel ran on an FP4-capable GPU",
    "cuda_graph_replay": "the step was captured into a CUDA graph and replayed",
    "serving": "a live server answered requests",
}
"""Each level and what it means, from the weakest claim to the strongest."""


VERDICTS = {
    "BLOCKED": "cannot be used the way the story tried it",
    "PARTLY BLOCKED": "some of it can be used; the number says how much",
    "UNBLOCKED": "can be used, in the way the why says",
    "WORKS": "ran and gave correct results",
    "WRONG OUTPUT": "ran without an error and gave wrong results; the number says how wrong",
    "MEASURED": "measured here; the number is the result",
    "NOT APPLICABLE": "no release or machine offers a way to use it",
    "UNMEASURED": "not measured on the machines that ran it; the why says what it needs",
    "FAILED": "a check failed; the number says which",
}
"""The words a decision may use, each with what it claims; its evidence levels say how it was obtained."""


class GuardFailed(AssertionError):
    """A check a verdict rests on failed: upstream behaviour changed, or the measured result is not
    the one the verdict claims. Raised explicitly, so ``python -O`` keeps it."""


def guard(holds: bool, message: str) -> None:
    """GuardFailed with ``message`` unless ``holds``: a verdict's guard, never an ``assert``."""
    if not holds:
        raise GuardFailed(message)


def check_verdict(verdict: str) -> str:
    """``verdict`` when it is one of VERDICTS; ValueError naming the allowed values otherwise."""
    if verdict not in VERDICTS:
        raise ValueError(
            f"verdict={verdict!r} is not allowed; allowed values: {', '.join(VERDICTS)}"
        )
    return verdict


def check(levels: list[str]) -> list[str]:
    """The levels in vocabulary order; an unknown one is an error naming the allowed values."""
    unknown = [level for level in levels if level not in LEVELS]
    if unknown:
        raise ValueError(f"evidence {unknown} is not allowed; allowed values: {', '.join(LEVELS)}")
    return [level for level in LEVELS if level in levels]


def of_values(values: list[dict]) -> list[str]:
    """Every level any of ``values`` (record values, or rows) reached, in vocabulary order."""
    return check(sorted({level for v in values for level in v.get("evidence", [])}))


def of_run(
    *, traced: bool, simulated: bool, kernel: str | None, replayed: bool = False
) -> list[str]:
    """The levels one run reached: traced or not, target simulated or real, which kernel ran."""
    levels = ["trace"] if traced else []
    levels += ["simulated_target"] if simulated else []
    if kernel is not None:
        levels.append("real_fp4_kernel" if kernel == "flashinfer" else "reference_kernel")
    levels += ["cuda_graph_replay"] if replayed else []
    return check(levels)


def describe(levels: list[str], device: str, target_sm: str | None, simulated: bool) -> str:
    """``trace, simulated_target on CPU, SM12.0 simulated; not run on the target GPU``."""
    target = (
        f"SM{target_sm} {'simulated' if simulated else 'real'}" if target_sm else "no target SM"
    )
    text = f"{', '.join(check(levels)) or 'no evidence'} on {device}, {target}"
    if simulated or "real_fp4_kernel" not in levels:
        text += "; not run on the target GPU"
    return text
