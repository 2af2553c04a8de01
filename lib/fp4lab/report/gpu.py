"""Results measured on real GPUs: the offline bundle's runs, committed under data/gpu/<machine>/.

A machine folder holds the records one ``run.sh OUT`` wrote (OUT/data), and figures/gpu/<machine>/
its figures. Each line quotes the newest run of a notebook there at its evidence level, with the
machine, the commit the bundle was built from and the time; nothing is re-run or recomputed
beyond ratios of recorded numbers.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from fp4lab.core import evidence, paths
from fp4lab.core.figures import annotate_provenance

GPU_DATA = paths.COMMITTED_DATA / "gpu"
NOTEBOOKS = (
    "04_fullgraph_false_tradeoff",
    "06_nvfp4_kernels",
    "07_mscclpp_allreduce",
    "08_single_batch_overlap",
)


def machines() -> list[Path]:
    """The machine folders under data/gpu/, by name."""
    return sorted(p for p in GPU_DATA.glob("*") if p.is_dir())


def newest(folder: Path, notebook: str) -> list[dict]:
    """The records of the newest run of ``notebook`` in a machine folder; [] when none."""
    path = folder / f"{notebook}.jsonl"
    if not path.exists():
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in rows if r["run_id"] == rows[-1]["run_id"]]


def _of(rows: list[dict], kind: str) -> list[dict]:
    return [r["values"] for r in rows if r["kind"] == kind]


def _tradeoff(rows: list[dict]) -> str:
    """Notebook 04 on a GPU: per token count under piecewise capture (records with a
    ``capture_mode``), or, in runs made before it was measured that way, whole-step replay."""
    variants = _of(rows, "variant")
    if "capture_mode" in variants[0]:
        return _piecewise(variants)
    names = {
        "eager": "eager",
        "compiled_with_breaks": "fullgraph=False with breaks",
        "compiled_fullgraph_custom_op": "one graph with the custom op",
    }
    steps = ", ".join(f"{names[v['variant']]} {v['step_median_ms']:.2f} ms" for v in variants)
    text = f"{variants[0]['layers']} FP4 layers, step without CUDA graphs: {steps}"
    replayed = [v for v in variants if v["cuda_graph_capture"] == "ok"]
    if replayed:
        text += (
            "; replayed as one whole-step CUDA graph (decode-style, not piecewise): "
            + ", ".join(
                f"{names[v['variant']]} {v['cuda_graph_median_ms']:.2f} ms "
                f"({v['launch_overhead_share']:.0%} of its step was launch overhead)"
                for v in replayed
            )
        )
    failed = [v["variant"] for v in variants if v["cuda_graph_capture"] != "ok"]
    text += f"; capture failed or skipped: {', '.join(failed)}" if failed else ""
    return f"{text}; quantize kernel: {variants[0]['kernel']}"


def _break_costs(rows: list[dict]) -> str:
    """Notebook 04's breakable releases on a GPU: each one's recorded cost of a break."""
    fits = _of(rows, "breakable_break_cost_fit")
    if not fits:
        return ""
    first = fits[0]
    costs = ", ".join(f"{f['sglang_version']} {f['us_per_break']:.1f}" for f in fits)
    wrong = [f["sglang_version"] for f in fits if not f["replays_equal_eager"]]
    return (
        f"; each release's own breakable capture on a {first['layers']}-layer stack "
        f"({first['tokens']} tokens, hidden {first['hidden']}), µs per break: {costs}; replays "
        f"differing from eager in: {', '.join(wrong) or 'none'}"
    )


def _piecewise(variants: list[dict]) -> str:
    parts = []
    for tokens in sorted({v["tokens"] for v in variants}):
        mine = [v for v in variants if v["tokens"] == tokens]
        parts.append(f"{tokens} tokens: " + ", ".join(
            f"{v['label']} {v['ms_median']:.2f} ms" if v.get("ms_median") else f"{v['label']} {v['capture']}"
            for v in mine
        ))  # fmt: skip
    wrong = [
        f"{v['label']} at {v['tokens']}" for v in variants if v.get("matches_uncaptured") is False
    ]
    return (
        f"{variants[0]['layers']} FP4 layers, ms per step: {'; '.join(parts)}; full replays "
        f"differing from the uncaptured run: {', '.join(wrong) or 'none'}; quantize kernel: "
        f"{variants[0]['kernel']}"
    )


def _kernels(rows: list[dict]) -> str:
    parts = []
    for r in _of(rows, "triton_bit_exact"):
        exact = r["triton"]["codes_equal"] and r["triton"]["scales_equal"]
        parts.append(
            f"Triton kernel (block {r['block_size']}) {'equals' if exact else 'DIFFERS FROM'} "
            "the reference bit for bit"
        )
    for r in _of(rows, "capture_replay"):
        equal = r["reference"]["equal"] and r["public"]["equal"]
        parts.append(f"CUDA-graph replay of the quantize {'equal' if equal else 'DIFFERS'}")
    speeds = _of(rows, "throughput")
    for kernel in dict.fromkeys(t["kernel"] for t in speeds):
        ratios = sorted(
            (t["ratio_to_copy"], f"{t['M']}x{t['K']}") for t in speeds if t["kernel"] == kernel
        )
        (low, low_shape), (high, high_shape) = ratios[0], ratios[-1]
        parts.append(
            f"{kernel} at {low:.0%} ({low_shape}) to {high:.0%} ({high_shape}) of device-to-device copy"
        )
    skipped = [s["check"] for s in _of(rows, "skipped")]
    return "; ".join(parts) + (f"; skipped: {', '.join(skipped)}" if skipped else "")


def _headline(rows: list[dict]) -> str:
    summaries = _of(rows, "summary")
    return summaries[-1]["headline"] if summaries else "no summary record"


RESULTS = {
    "04_fullgraph_false_tradeoff": lambda rows: _tradeoff(rows) + _break_costs(rows),
    "06_nvfp4_kernels": _kernels,
    "07_mscclpp_allreduce": _headline,
    "08_single_batch_overlap": _headline,
}


def _levels(rows: list[dict]) -> list[str]:
    return evidence.of_values([r["values"] for r in rows])


WIDTHS = {
    "machine": "11%",
    "notebook": "11%",
    "result": "48%",
    "evidence": "16%",
    "commit": "6%",
    "time_utc": "8%",
}
"""The GPU table's column widths on the report's page: the result has room to be read."""


def gpu_table() -> pd.DataFrame:
    """One row per (machine, notebook) measured on a GPU machine: result, evidence, provenance."""
    lines = []
    for folder in machines():
        for notebook in NOTEBOOKS:
            rows = newest(folder, notebook)
            if not rows:
                continue
            prov = rows[-1]["provenance"]
            lines.append(
                {
                    "machine": f"{prov['device']} (SM{prov['sm']}, {prov['gpu_count']} GPU)",
                    "notebook": notebook,
                    "result": RESULTS[notebook](rows),
                    "evidence": (
                        evidence.describe(
                            _levels(rows), prov["device"], prov["target_sm"], prov["simulated"]
                        )
                        if _levels(rows)
                        else "none of the levels: measured on that machine's CPU"
                    ),
                    "commit": (prov["git"]["commit"] or "")[:10],
                    "time_utc": prov["time_utc"],
                }
            )
    return pd.DataFrame(lines)


def gpu_findings() -> str:
    """README's bullets: each GPU result with its evidence, machine, commit and time."""
    table = gpu_table()
    if table.empty:
        return "- No GPU run is committed at this commit (data/gpu/ is empty).\n"
    return "".join(
        f"- {row.notebook} on {row.machine}: {row.result}. Evidence: {row.evidence}. "
        f"Commit {row.commit}, {row.time_utc}.\n"
        for row in table.itertuples()
    )


VARIANT_LABELS = {
    "eager": "eager",
    "compiled_with_breaks": "fullgraph=False",
    "compiled_fullgraph_custom_op": "custom op, 1 graph",
}


def tradeoff_figure() -> object | None:
    """Notebook 04's step times on the newest GPU machine that ran it, without CUDA graphs and
    replayed as one whole-step graph (decode-style), with their p10-p90 spread; None, said, when
    no GPU run of notebook 04 is committed."""
    import matplotlib.pyplot as plt

    found = [(m, newest(m, "04_fullgraph_false_tradeoff")) for m in machines()]
    found = [(m, rows) for m, rows in found if _of(rows, "variant")]
    if not found:
        print("no GPU run of notebook 04 is committed: no timing figure (CPU step times are noise)")
        return None
    _, rows = found[-1]
    variants = _of(rows, "variant")
    fig, ax = plt.subplots(figsize=(8, 3.2))
    prov = rows[-1]["provenance"]
    annotate_provenance(fig, prov, evidence.of_values(variants))
    if "capture_mode" in variants[0]:
        for label in dict.fromkeys(v["label"] for v in variants):
            mine = sorted((v for v in variants if v["label"] == label and v.get("ms_median")),
                          key=lambda v: v["tokens"])  # fmt: skip
            ax.plot(
                [v["tokens"] for v in mine], [v["ms_median"] for v in mine], marker="o", label=label
            )
        ax.set_xscale("log", base=2)
        ax.set_xlabel("tokens per step")
        ax.set_ylabel(f"ms per step, {variants[0]['layers']} FP4 layers")
        ax.set_title(
            f"fullgraph=False under piecewise capture on {prov['device']} (SM{prov['sm']})",
            fontsize=10,
        )
        ax.legend(fontsize=7)
        fig.tight_layout()
        return fig
    for offset, (key, label) in enumerate(
        (("step", "no CUDA graph"), ("cuda_graph", "one whole-step CUDA graph (decode-style)"))
    ):
        medians = [v[f"{key}_median_ms"] for v in variants]
        spread = [
            [m - v[f"{key}_p10_ms"] for m, v in zip(medians, variants, strict=True)],
            [v[f"{key}_p90_ms"] - m for m, v in zip(medians, variants, strict=True)],
        ]
        positions = [i + 0.38 * offset for i in range(len(variants))]
        ax.barh(positions, medians, height=0.36, xerr=spread, label=label, capsize=3)
    ax.set_yticks([i + 0.19 for i in range(len(variants))])
    ax.set_yticklabels(VARIANT_LABELS.get(v["variant"], v["variant"]) for v in variants)
    ax.invert_yaxis()
    ax.set_xlabel(f"ms per step, {variants[0]['layers']} FP4 layers (median, p10-p90)")
    ax.set_title(f"What fullgraph=False costs on {prov['device']} (SM{prov['sm']})", fontsize=10)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    return fig
