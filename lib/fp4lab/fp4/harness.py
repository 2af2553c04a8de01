"""Notebook 06, the FP4 kernel harness: its parameter checks and one call per section.

Each section appends its records through the run's Recorder, draws and saves its figure, and
returns what its cell shows. ``verdict`` records the run's summary for the decision report
(``fp4lab.fp4.summary``), then raises AssertionError where a check raised or upstream behaviour
changed (``fp4lab.fp4.verdict``).
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
import torch

from fp4lab.core import evidence, figures, params, records
from fp4lab.fp4 import (
    accuracy,
    crosscheck,
    edge_cases,
    nvfp4,
    plots,
    reciprocals,
    summary,
    swizzle,
    throughput,
)
from fp4lab.fp4 import gpu_checks as gpu
from fp4lab.fp4 import verdict as verdict_checks

NOTEBOOK = "06_nvfp4_kernels"
REFERENCE = {"kernel": "reference", "evidence": evidence.check(["reference_kernel"])}
"""What the reference's records say ran: fp4lab's spec-exact reference, in place of an FP4 kernel."""
CROSSCHECK_COLUMNS = [
    "input",
    "peer",
    "elements",
    "codes_differing",
    "scales_differing",
    "code_differences",
    "scale_differences",
    "unexplained",
]
SENSITIVITY_COLUMNS = [
    "input",
    "block_size",
    "elements",
    "codes_that_could_move",
    "code_fraction",
    "scales_that_could_move",
]
SPEED_COLUMNS = [
    "M",
    "K",
    "kernel",
    "ran",
    "median_ms",
    "gbps",
    "copy_gbps",
    "ratio_to_copy",
    "peak_bytes",
    "meets_goal",
]


def check_shapes(
    name: str, shapes: object, k_multiple: int = nvfp4.MXFP4_BLOCK
) -> list[tuple[int, int]]:
    """``shapes`` must be a non-empty list of [M, K] pairs (2-D), K a multiple of ``k_multiple``."""
    if not isinstance(shapes, (list, tuple)) or not shapes:
        raise ValueError(f"{name}={shapes!r} must be a non-empty list of [M, K] pairs")
    checked = []
    for shape in shapes:
        if not isinstance(shape, (list, tuple)) or len(shape) != 2:
            dims = len(shape) if isinstance(shape, (list, tuple)) else "not a list"
            raise ValueError(
                f"{name} contains {shape!r}: each shape must be 2-D [M, K] (got {dims} dimensions);"
                " 3-D inputs are not allowed"
            )
        m, k = shape
        params.positive(f"{name} M", m)
        params.multiple_of(f"{name} K", k, k_multiple)
        checked.append((m, k))
    return checked


@dataclass
class Run:
    """One run of notebook 06: its checked parameters, the device, and the records it wrote."""

    shapes: list[tuple[int, int]]
    distributions: list[str]
    seed: int
    device: torch.device
    throughput_shapes: list[tuple[int, int]]
    throughput_iters: int
    recorder: records.Recorder


def validate(
    *,
    shapes: object,
    distributions: object,
    seed: object,
    device: str,
    throughput_shapes: object,
    throughput_iters: object,
) -> Run:
    """Check every parameter of notebook 06 (ValueError naming the parameter) and start its run."""
    error_shapes = check_shapes("shapes", shapes)
    params.choices("distributions", distributions, accuracy.DISTRIBUTIONS)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"seed={seed!r} must be an integer")
    run_device = params.device("device", device)
    speed_shapes = check_shapes("throughput_shapes", throughput_shapes)
    params.positive("throughput_iters", throughput_iters)
    run_params = dict(
        shapes=shapes,
        distributions=distributions,
        seed=seed,
        device=device,
        throughput_shapes=throughput_shapes,
        throughput_iters=throughput_iters,
    )
    return Run(
        error_shapes,
        list(distributions),
        seed,
        run_device,
        speed_shapes,
        throughput_iters,
        records.Recorder(NOTEBOOK, run_params),
    )


def _save(fig: object, name: str, rows: list[dict]) -> None:
    figures.save_figure(
        fig, name, records.provenance(), NOTEBOOK, evidence=evidence.of_values(rows)
    )


def error_analysis(run: Run) -> pd.DataFrame:
    """Round-trip error of each format on each distribution: records, figure 06_fp4_error, table."""
    rows = accuracy.error_rows(run.shapes, run.distributions, seed=run.seed, device=run.device)
    run.recorder.add_all(
        "quantization_error", [{**r, "evidence": REFERENCE["evidence"]} for r in rows]
    )
    _save(plots.plot_fp4_errors(rows), "06_fp4_error", [REFERENCE])
    table = pd.DataFrame(rows).pivot_table(
        index=["distribution", "format"], values=["snr_db", "mse", "max_abs_error"]
    )
    return table.round(4)


def swizzle_layout(run: Run) -> dict:
    """Figure 06_swizzle_128x4, and the swizzle checked against its formula and torch's to_blocked."""
    _save(plots.plot_swizzle_128x4(256, 8), "06_swizzle_128x4", [REFERENCE])
    check = {**swizzle.check_against_peers(300, 13, seed=run.seed), **REFERENCE}
    run.recorder.add("swizzle", check)
    return check


def _reference_inputs(run: Run) -> dict[str, torch.Tensor]:
    """The cross-checks' inputs: each distribution at the first shape, the adversarial rows, the ties."""
    m, k = run.shapes[0]
    inputs = {d: accuracy.activations(d, m, k, seed=run.seed) for d in run.distributions}
    return {
        **inputs,
        "adversarial": edge_cases.adversarial_input(),
        "e2m1_ties": edge_cases.tie_input(),
    }


def peer_crosschecks(run: Run) -> pd.DataFrame:
    """The reference against torchao's NVFP4 and torch's MXFP4 on every input, differences by cause."""
    rows = [
        {"input": name, **comparison.as_record(), **REFERENCE}
        for name, x in _reference_inputs(run).items()
        for comparison in (crosscheck.compare_torchao_nvfp4(x), crosscheck.compare_torch_mxfp4(x))
    ]
    return pd.DataFrame(run.recorder.add_all("crosscheck", rows))[CROSSCHECK_COLUMNS]


def reciprocal_sensitivity(run: Run) -> pd.DataFrame:
    """How many codes and scales the kernel's rcp.approx could move, per input and block size."""
    rows = [
        {"input": name, **reciprocals.reciprocal_sensitivity(x, block_size=block_size), **REFERENCE}
        for name, x in _reference_inputs(run).items()
        for block_size in (nvfp4.NVFP4_BLOCK, nvfp4.MXFP4_BLOCK)
    ]
    return pd.DataFrame(run.recorder.add_all("reciprocal_sensitivity", rows))[SENSITIVITY_COLUMNS]


def gpu_checks(run: Run) -> dict | None:
    """The GPU checks where a GPU is (each skipped with the reason elsewhere, an error where it
    raised; see ``fp4lab.fp4.gpu_checks``) and the forwarding bug; returns the bug's record."""
    if run.device.type == "cuda":
        gpu.run_on_cuda(run.recorder, run.device, run.seed)
    else:
        gpu.skip_without_cuda(run.recorder)
    return gpu.forwarding(run.recorder, run.device)


def quantize_throughput(run: Run) -> pd.DataFrame:
    """Each quantize kernel against the copy line: records, skips, figure 06_quantize_throughput."""
    rows, skipped = throughput.quantize_vs_copy(
        run.throughput_shapes, device=run.device, iters=run.throughput_iters, seed=run.seed
    )
    run.recorder.add_all("throughput", rows)
    for name, reason in skipped.items():
        run.recorder.skip(f"throughput_{name}", reason)
    _save(plots.plot_quantize_throughput(rows), "06_quantize_throughput", rows)
    goal = throughput.goal_for(run.device)  # None on a CPU: the column says so
    speed = pd.DataFrame(rows)
    speed["meets_goal"] = (
        (speed["kernel"] == goal[0]) & (speed["ratio_to_copy"] >= goal[1]) if goal else None
    )
    return speed[SPEED_COLUMNS].round(3)


def verdict(run: Run) -> str:
    """Record the run's summary for the decision report, then check the run's records
    (``fp4lab.fp4.verdict``); returns the lines to print."""
    run.recorder.summary(**summary.summarize(run.recorder.written))
    return verdict_checks.check_records(run.recorder.written, run.device)
