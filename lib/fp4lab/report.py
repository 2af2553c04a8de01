"""Turning records into tables and figures: the decision table, the blocker chain, plots.

Nothing here runs an experiment; every number shown comes from a record or an outcome
passed in. Figures carry a provenance footer and a JSON sidecar naming the run they
were drawn from.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

import pandas as pd

from fp4lab import paths, probe, records


def _as_record(outcome: object) -> dict:
    return outcome.as_record() if hasattr(outcome, "as_record") else dict(outcome)


def outcome_table(outcome: object) -> pd.DataFrame:
    """One trace outcome as a two-column table, in dynamo's own words."""
    r = _as_record(outcome)
    rows = [
        ("signature", r["signature"]),
        ("status", r["status"]),
        ("exception", r["exception"]),
        ("dynamo says", r["message"]),
        *(("explanation", line) for line in r["explanation"]),
        *(("hint", line) for line in r["hints"]),
        ("skipped builtin", r["skipped_builtin"]),
        ("blocked in", r["blocker_frame"]),
        ("frames show the nvcc query", r["shows_nvcc_query"]),
        ("graphs / breaks", f"{r['graph_count']} / {r['graph_break_count']}"),
        ("seconds", round(r["seconds"], 2)),
    ]
    return pd.DataFrame(rows, columns=["field", "value"]).set_index("field")


def frames_table(outcome: object) -> pd.DataFrame:
    """The user-code frames dynamo reported, outermost first."""
    frames = _as_record(outcome)["frames"]
    return pd.DataFrame([f.rsplit(":", 2) for f in frames], columns=["file", "line", "function"])


def chain_table(rows: Iterable[dict]) -> pd.DataFrame:
    """The blocker chain: one row per attempt, the stage applied before it and what stopped it."""
    return pd.DataFrame(
        [
            {
                "step": r["step"],
                "stage applied": r["stage"],
                "origin": r["origin"],
                "story": r["story"],
                "blocker": r["signature"],
                "dynamo says": r["message"],
                "builtin": r["skipped_builtin"] or "",
                "blocked in": r["blocker_frame"],
                "seconds": round(r["seconds"], 2),
            }
            for r in rows
        ]
    ).set_index("step")


def machine_table(machine: probe.Machine) -> pd.DataFrame:
    """What this machine has, one row per fact."""
    m = machine.as_dict()
    rows = [(f"package {k}", v or "not installed") for k, v in m.pop("packages").items()]
    rows += [(k, v) for k, v in m.items()]
    rows.append(("meets needs", ", ".join(n for n in probe.NEEDS if n in machine.capabilities())))
    return pd.DataFrame(rows, columns=["fact", "value"]).set_index("fact")


def provenance_line(prov: dict) -> str:
    """A one-line summary of a record's provenance, for figure footers and captions."""
    pk = prov.get("packages", {})
    target = f"target SM{prov['target_sm']} ({'simulated' if prov['simulated'] else 'real'})" if prov.get("target_sm") else "no target SM"
    git = prov.get("git", {})
    commit = (git.get("commit") or "no-commit")[:10] + ("-dirty" if git.get("dirty") else "")
    return (
        f"fp4lab {commit} · torch {pk.get('torch')} · flashinfer {pk.get('flashinfer-python')} · "
        f"{prov.get('device')} · {target} · {prov.get('time_utc')}"
    )


def annotate_provenance(fig: object, prov: dict) -> None:
    """Write the provenance line along the bottom edge of a figure."""
    fig.text(0.01, -0.02, provenance_line(prov), fontsize=6, color="0.35", ha="left", va="top")


def save_figure(fig: object, name: str, prov: dict, source: str) -> Path:
    """Write ``figures/<name>.png`` with a provenance footer, and ``<name>.json`` beside it."""
    folder = paths.figures_dir()
    folder.mkdir(parents=True, exist_ok=True)
    annotate_provenance(fig, prov)
    path = folder / f"{name}.png"
    fig.savefig(path, dpi=120, bbox_inches="tight", metadata={"Description": json.dumps(prov, sort_keys=True)})
    (folder / f"{name}.json").write_text(json.dumps({"figure": path.name, "source": source, "provenance": prov}, indent=2, sort_keys=True) + "\n")
    return path


def plan_table(steps: Iterable[tuple]) -> pd.DataFrame:
    """The reproduce plan: each notebook, what it needs, and whether it runs here or why not."""
    return pd.DataFrame(
        [
            {"notebook": nb.name, "title": nb.title, "needs": nb.needs, "about_s": nb.duration_s, "runs here": skip is None, "skipped because": skip or ""}
            for nb, skip in steps
        ]
    ).set_index("notebook")


# -- the decision report ----------------------------------------------------------------

STORY_STEPS = (
    ("msg 988", "01_nvcc_subprocess_crash", "attempt"),
    ("msg 992", "02_file_io_trace", "verdict"),
    ("msgs 1002/1009", "03_compiler_disable_fullgraph", "attempt"),
)
"""The story's three crashes: its message, the notebook that replays it, the record kind that holds the verdict."""

ALTERNATIVES = (
    ("FP4 quantize kernels", "06_nvfp4_kernels", "not in the story's list; the kernels every FP4 layer runs"),
    ("MSCCLPP allreduce", "07_mscclpp_allreduce", "Tier 1, tested next"),
    ("Single Batch Overlap", "08_single_batch_overlap", "Tier 1, tested next"),
)


def _of_kind(rows: list[dict], kind: str) -> list[dict]:
    return [r for r in rows if r["kind"] == kind]


def story_table() -> pd.DataFrame:
    """Each crash of the story: what it said, what this run observed, and whether they agree."""
    table = []
    for message, notebook, kind in STORY_STEPS:
        found = _of_kind(records.latest(notebook), kind)
        if not found:
            table.append({"story": message, "notebook": notebook, "reproduced": "no record: the notebook did not run"})
            continue
        r = found[0]
        v = r["values"]
        table.append(
            {
                "story": message,
                "notebook": notebook,
                "expected": v["expected_signature"],
                "observed": v["signature"],
                "reproduced": "yes" if v["signature"] == v["expected_signature"] else "NO: upstream behaviour changed",
                "dynamo says": v.get("message"),
                "blocked in": v.get("blocker_frame"),
                "seconds": round(v["seconds"], 2),
                "target": f"SM{r['provenance']['target_sm']} ({'simulated' if r['provenance']['simulated'] else 'real'})",
            }
        )
    return pd.DataFrame(table).set_index("story")


def _reproduce_status() -> dict[str, dict]:
    return {r["values"]["notebook"]: r["values"] for r in records.latest("reproduce")}


def _not_run(notebook: str, status: dict[str, dict]) -> str:
    s = status.get(notebook)
    if s is None:
        return "not run: no record"
    return f"not run here: {s['reason']}" if s["status"] == "skipped" else f"{s['status']}: {s['reason']}"


def _pcg_row(status: dict[str, dict]) -> dict:
    fixes = _of_kind(records.latest("05_custom_op_fix"), "fix")
    upstream = _of_kind(records.latest("05_custom_op_fix"), "upstream_op")
    story = story_table()
    reproduced = (story["reproduced"] == "yes").sum() if "reproduced" in story else 0
    evidence = [f"{reproduced}/3 story crashes reproduced from FlashInfer's code (notebooks 01-03)"]
    if fixes and all(f["values"]["signature"] == "ok" and f["values"]["graph_count"] == 1 for f in fixes):
        backends = ", ".join(f["values"]["backend"] for f in fixes)
        state = "UNBLOCKED with a custom op: fullgraph=True, 1 graph, 0 breaks"
        evidence.append(f"fp4lab::fp4_quantize compiles to 1 graph / 0 breaks ({backends}); opcheck passes")
    elif fixes:
        state = "BLOCKED: the custom-op fix did not compile (see notebook 05)"
    else:
        state = "UNDECIDED: " + _not_run("05_custom_op_fix", status)
    if upstream:
        u = upstream[0]["values"]
        fi = upstream[0]["provenance"]["packages"].get("flashinfer-python")
        evidence.append(
            f"torch.ops.flashinfer.fp4_quantize in flashinfer {fi}: {u['signature']}, {u.get('graph_count')} graph"
            if u.get("present")
            else f"flashinfer {fi} ships no torch.ops.flashinfer.fp4_quantize"
        )
    matrix = _of_kind(records.latest("09_version_matrix"), "summary")
    if matrix:
        m = matrix[-1]["values"]
        evidence.append(
            f"version matrix ({', '.join(m['versions_measured'])}): the story's decision holds up to "
            f"{m['story_decision_holds_up_to'] or 'none of them'}; the upstream op removes the blocker from {m['upstream_op_unblocks_from'] or 'none of them'}"
        )
    variants = {r["values"]["variant"]: r for r in _of_kind(records.latest("04_fullgraph_false_tradeoff"), "variant")}
    if len(variants) == 3:
        eager, breaks, fixed = (variants[k]["values"] for k in ("eager", "compiled_with_breaks", "compiled_fullgraph_custom_op"))
        device = variants["eager"]["provenance"]["device"]
        measured = (
            f"fullgraph=False: {breaks['graph_calls']} graph runs/step for {breaks['layers']} layers vs 1 with the fix; "
            f"step time on {device}: fix {fixed['step_median_ms']:.2f} ms, with breaks {breaks['step_median_ms']:.2f} ms, "
            f"eager {eager['step_median_ms']:.2f} ms"
        )
        graphs = fixed.get("cuda_graph_capture", "")
        measured += "" if str(graphs).startswith("ok") else f"; CUDA graph replay: {graphs or 'not measured'}"
    else:
        measured = _not_run("04_fullgraph_false_tradeoff", status)
    return {
        "optimization": "Piecewise CUDA graphs (torch.compile fullgraph=True)",
        "story said": "BLOCKED (torch.compile incompatible with FP4 JIT)",
        "status here": state,
        "evidence": "; ".join(evidence),
        "measured effect": measured,
        "needs": "cpu for the crashes and the fix; an SM100+ GPU for CUDA-graph replay timings",
    }


def _fp4_kernel_summary(rows: list[dict]) -> dict | None:
    """Notebook 06's records in one line each: cross-checks, error by format, speed, GPU checks."""
    if not rows:
        return None
    checks = [r["values"] for r in _of_kind(rows, "crosscheck")]
    unexplained = sum(c["unexplained"] for c in checks)
    errors = {(e["values"]["distribution"], e["values"]["format"]): e["values"]["snr_db"] for e in _of_kind(rows, "error")}
    snr = "; ".join(
        f"{dist}: " + " / ".join(f"{errors[(dist, fmt)]:.1f}" for fmt in ("nvfp4", "mxfp4", "fp8_e4m3_per_tensor") if (dist, fmt) in errors)
        for dist in dict.fromkeys(d for d, _ in errors)
    )
    speed = [t["values"] for t in _of_kind(rows, "throughput") if t["values"]["kernel"] == "compiled"]
    best = max(speed, key=lambda t: t["ratio_to_copy"]) if speed else None
    skipped = [r["values"]["check"] for r in _of_kind(rows, "skipped")]
    bug = _of_kind(rows, "forwarding_bug")
    headline = f"reference vs {len({c['peer'] for c in checks})} independent peers: {unexplained} unexplained differences"
    headline += f"; SNR dB NVFP4 / MXFP4 / FP8 per-tensor: {snr}" if snr else ""
    if best:
        headline += f"; compiled quantize at best {best['ratio_to_copy']:.0%} of copy bandwidth ({best['M']}x{best['K']}, {best['device']})"
    if bug:
        headline += f"; FlashInfer {bug[0]['values']['flashinfer']} argument-forwarding bug: {bug[0]['values']['capture']['status']}"
    return {
        "status": "measured" + (f"; not run here: {', '.join(skipped)}" if skipped else ""),
        "headline": headline,
        "needs": "cpu for the reference and its checks; an SM100+ GPU for FlashInfer's kernel and GPU speed",
    }


def _alternative_row(name: str, notebook: str, story: str, status: dict[str, dict]) -> dict:
    rows = records.latest(notebook)
    summary = next((r["values"] for r in reversed(rows) if r["kind"] == "summary"), None)
    if summary is None and notebook == "06_nvfp4_kernels":
        summary = _fp4_kernel_summary(rows)
    if summary:
        state, measured, needs = summary.get("status", "measured"), summary.get("headline", ""), summary.get("needs", "")
    elif rows:
        state, measured, needs = "measured (no summary record)", f"{len(rows)} records", ""
    else:
        state, measured, needs = _not_run(notebook, status), "", ""
    device = rows[-1]["provenance"]["device"] if rows else ""
    return {
        "optimization": name,
        "story said": story,
        "status here": state,
        "evidence": f"notebook {notebook}" + (f", on {device}" if device else ""),
        "measured effect": measured,
        "needs": needs,
    }


def decision_table() -> pd.DataFrame:
    """The story's todo list, re-decided from this repository's records."""
    status = _reproduce_status()
    rows = [_pcg_row(status)] + [_alternative_row(name, nb, story, status) for name, nb, story in ALTERNATIVES]
    return pd.DataFrame(rows).set_index("optimization")


def provenance_table() -> pd.DataFrame:
    """Each notebook with records: where its newest run's numbers came from."""
    names = sorted(p.stem for p in paths.data_dir().glob("*.jsonl"))
    rows = [(name, provenance_line(records.latest(name)[-1]["provenance"])) for name in names if records.latest(name)]
    return pd.DataFrame(rows, columns=["notebook", "provenance"]).set_index("notebook")


def skipped_table() -> pd.DataFrame:
    """What the last `make reproduce` ran, failed or skipped, and why."""
    rows = records.latest("reproduce")
    if not rows:
        return pd.DataFrame(columns=["notebook", "status", "reason", "seconds"]).set_index("notebook")
    return pd.DataFrame([r["values"] for r in rows])[["notebook", "status", "reason", "seconds"]].drop_duplicates("notebook", keep="last").set_index("notebook")


def plot_tradeoff(rows: list[dict]) -> object:
    """Median step time per variant (error bars p10-p90), compiled-graph runs per step on each bar."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.6))
    names = [r["variant"] for r in rows]
    medians = [r["step_median_ms"] for r in rows]
    errors = [[m - r["step_p10_ms"] for m, r in zip(medians, rows)], [r["step_p90_ms"] - m for m, r in zip(medians, rows)]]
    bars = ax.bar(names, medians, yerr=errors, capsize=4, color=["0.6", "tab:red", "tab:green"][: len(rows)])
    for bar, r in zip(bars, rows):
        label = "no graphs" if r["variant"] == "eager" else f"{r['graph_calls']} graph runs/step"
        ax.annotate(label, (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center", va="bottom", fontsize=8, xytext=(0, 3), textcoords="offset points")
    first = rows[0]
    ax.set_ylabel("ms per step (median)")
    ax.set_title(f"{first['layers']} FP4 layers, {first['kernel']} quantize kernel", fontsize=10)
    ax.margins(y=0.2)
    fig.tight_layout()
    return fig


def _chain_text(chain: list[dict]) -> str:
    """``a [cpu_artefact] → b [story] → c``: each blocker with the origin of the stage that removed it."""
    removed_by = [f" [{after['origin']}]" for after in chain[1:]] + [""]
    return " → ".join(here["signature"] + tag for here, tag in zip(chain, removed_by))


def version_table(rows: list[dict]) -> pd.DataFrame:
    """The version matrix: each FlashInfer version's blockers in order, upstream op, and verdict."""

    def op(found: dict) -> str:
        if not found.get("present", True):
            return "absent"
        return f"{found.get('signature')}, {found.get('graph_count')} graph" if found else "not measured"

    return pd.DataFrame(
        [
            {
                "version": r["version"],
                "environment": f"{r['env']} ({r['install_seconds']:.0f} s)" + (f": {r['error']}" if r["error"] else ""),
                "flashinfer wheel MB": round(r["wheel_bytes"] / 2**20, 1) if r["wheel_bytes"] else None,
                "env GB": round(r["env_bytes"] / 2**30, 2) if r["env_bytes"] else None,
                "blockers in order [origin of the patch that removed it]": _chain_text(r["chain"]),
                "story patches needed": ", ".join(r["story_patches_needed"]) or "-",
                "import on CPU torch": "needed simulated device properties" if r.get("import_staging") else "plain",
                "torch.ops.flashinfer.fp4_quantize": op(r["upstream_op"]) if r["env"] != "failed" else "",
                "fp4lab custom op": op(r["fp4lab_op"]) if r["env"] != "failed" else "",
                "verdict": r["verdict"],
                "story's decision holds": r["story_decision_holds"],
            }
            for r in rows
        ]
    ).set_index("version")


def plot_version_matrix(rows: list[dict]) -> object:
    """Versions down, blocker-chain steps across, each cell named by the blocker met; the op column last."""
    import matplotlib.pyplot as plt

    signatures = ["device_check", "subprocess", "non_tensor_torch_op", "unsupported_other", "file_io", "ok", "runtime_error"]
    colours = dict(zip(signatures, ["#bbbbbb", "#d62728", "#9467bd", "#8c564b", "#ff7f0e", "#2ca02c", "#e377c2"]))
    steps = max((len(r["chain"]) for r in rows), default=1)
    fig, ax = plt.subplots(figsize=(1.9 * (steps + 1) + 1.5, 0.55 * len(rows) + 1.2))
    for y, r in enumerate(rows):
        for x, c in enumerate(r["chain"]):
            ax.add_patch(plt.Rectangle((x, y), 0.95, 0.9, color=colours.get(c["signature"], "#cccccc")))
            ax.text(x + 0.47, y + 0.45, c["signature"].replace("_", " "), ha="center", va="center", fontsize=7)
        present = r["upstream_op"].get("present") and r["upstream_op"].get("signature") == "ok"
        ax.add_patch(plt.Rectangle((steps, y), 0.95, 0.9, color="#2ca02c" if present else "#eeeeee"))
        ax.text(steps + 0.47, y + 0.45, "upstream op: 1 graph" if present else ("absent" if r["env"] != "failed" else "not measured"), ha="center", va="center", fontsize=7)
    ax.set_xlim(0, steps + 1)
    ax.set_ylim(len(rows), 0)
    ax.set_yticks([y + 0.45 for y in range(len(rows))], [r["version"] for r in rows])
    ax.set_xticks([x + 0.47 for x in range(steps + 1)], [f"step {x}" for x in range(steps)] + ["fix shipped?"])
    ax.tick_params(length=0)
    for side in ax.spines.values():
        side.set_visible(False)
    ax.set_title("public flashinfer.fp4_quantize under fullgraph=True: blocker met at each step", fontsize=10)
    fig.tight_layout()
    return fig


# -- collectives and overlap (notebooks 07, 08) -------------------------------------------


def plot_allreduce(rows: list[dict], crossover: dict | None = None) -> object:
    """Allreduce latency (median, p10-p90 band) and bus bandwidth against message size, per backend and mode.

    A dashed line marks ``crossover["crossover_bytes"]`` when given: where the candidate stops being faster.
    """
    import matplotlib.pyplot as plt

    fig, (lat, bw) = plt.subplots(1, 2, figsize=(10, 3.8))
    measured = [r for r in rows if r["status"] == "ok"]
    for key in sorted({(r["backend"], r["mode"]) for r in measured}):
        series = sorted((r for r in measured if (r["backend"], r["mode"]) == key), key=lambda r: r["bytes"])
        x = [r["bytes"] for r in series]
        label = f"{key[0]} {key[1]} ({series[0]['world_size']} ranks)"
        line = lat.plot(x, [r["median_us"] for r in series], marker="o", ms=3, label=label)[0]
        lat.fill_between(x, [r["p10_us"] for r in series], [r["p90_us"] for r in series], color=line.get_color(), alpha=0.15)
        bw.plot(x, [r["busbw_GBps"] for r in series], marker="o", ms=3, color=line.get_color(), label=label)
    for ax, ylabel in ((lat, "latency, µs (median; band p10-p90)"), (bw, "bus bandwidth, GB/s")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("message size, bytes")
        ax.set_ylabel(ylabel)
        ax.grid(True, which="both", alpha=0.3)
        if crossover and crossover.get("crossover_bytes"):
            ax.axvline(crossover["crossover_bytes"], color="k", ls="--", lw=1)
    if crossover and crossover.get("crossover_bytes"):
        lat.annotate(f"crossover ({crossover['mode']}): {crossover['summary']}", (crossover["crossover_bytes"], lat.get_ylim()[1]),
                     fontsize=7, ha="right", va="top", rotation=90, xytext=(-3, -3), textcoords="offset points")  # fmt: skip
    lat.legend(fontsize=7)
    lat.set_title("allreduce latency", fontsize=10)
    bw.set_title("busbw = algbw · 2(n−1)/n (nccl-tests)", fontsize=10)
    fig.tight_layout()
    return fig


def plot_overlap(rows: list[dict]) -> object:
    """Per chunk count: compute alone, combine alone, the overlapped pipeline and the unchunked sequential baseline."""
    import matplotlib.pyplot as plt

    parts = (("t_compute_ms", "GEMM chunks alone", "0.7"), ("t_comm_ms", "combines alone", "0.45"),
             ("t_overlapped_ms", "overlapped", "tab:green"), ("t_sequential_ms", "sequential (no chunks)", "tab:red"))  # fmt: skip
    fig, ax = plt.subplots(figsize=(7.5, 3.6))
    width = 0.8 / len(parts)
    ordered = sorted(rows, key=lambda r: r["chunks"])
    for i, (key, label, color) in enumerate(parts):
        xs = [k + (i - 1.5) * width for k in range(len(ordered))]
        ax.bar(xs, [r[key] for r in ordered], width, label=label, color=color)
    for k, r in enumerate(ordered):
        top = max(r[key] for key, _, _ in parts)
        ax.annotate(f"eff {r['efficiency']:.2f}", (k, top), ha="center", va="bottom", fontsize=8, xytext=(0, 3), textcoords="offset points")
    ax.set_xticks(range(len(ordered)), [f"{r['chunks']} chunk{'s' if r['chunks'] > 1 else ''}" for r in ordered])
    ax.set_ylabel("ms per batch (median of slowest rank)")
    first = ordered[0]
    ax.set_title(f"MoE down GEMM + {first['collective']} combine, hidden {first['hidden']}, {first['world_size']} ranks ({first['backend']})", fontsize=10)
    ax.legend(fontsize=7, ncol=2)
    ax.margins(y=0.2)
    fig.tight_layout()
    return fig


def serving_table(rows: list[dict]) -> pd.DataFrame:
    """bench_serving results per server configuration, with throughput relative to the baseline."""
    table = pd.DataFrame(rows)
    if table.empty:
        return table
    columns = [c for c in ("label", "output_throughput", "median_ttft_ms", "median_itl_ms", "median_tpot_ms", "completed") if c in table]
    table = table[columns].set_index("label")
    if "baseline" in table.index:
        table["throughput_vs_baseline"] = table["output_throughput"] / table.loc["baseline", "output_throughput"]
    return table


def plot_fp4_errors(rows: list[dict]) -> object:
    """SNR (dB), MSE and largest absolute error per distribution, one bar per format (from fp4_error rows)."""
    import matplotlib.pyplot as plt

    frame = pd.DataFrame(rows)
    distributions = list(dict.fromkeys(frame["distribution"]))
    formats = list(dict.fromkeys(frame["format"]))
    panels = (("snr_db", "SNR (dB, higher is better)", False), ("mse", "MSE", True), ("max_abs_error", "largest |error|", True))
    fig, axes = plt.subplots(1, len(panels), figsize=(11, 3.4))
    width = 0.8 / len(formats)
    for ax, (key, label, log) in zip(axes, panels):
        for i, fmt in enumerate(formats):
            values = [frame[(frame["distribution"] == d) & (frame["format"] == fmt)][key].mean() for d in distributions]
            ax.bar([j + (i - (len(formats) - 1) / 2) * width for j in range(len(distributions))], values, width, label=fmt)
        ax.set_xticks(range(len(distributions)), distributions, fontsize=8)
        ax.set_title(label, fontsize=9)
        if log:
            ax.set_yscale("log")
    axes[0].legend(fontsize=7)
    shapes = sorted({(r["M"], r["K"]) for r in rows})
    fig.suptitle("Round-trip error of bfloat16 activations, " + ", ".join(f"{m}x{k}" for m, k in shapes), fontsize=10)
    fig.tight_layout()
    return fig


def plot_swizzle_128x4(rows: int = 256, scale_cols: int = 8) -> object:
    """The 128x4 swizzled scale layout: each scale (m, k) of a [rows, scale_cols] grid labelled with its byte offset."""
    import matplotlib.pyplot as plt
    import numpy as np

    from fp4lab import nvfp4

    m, k = np.meshgrid(np.arange(rows), np.arange(scale_cols), indexing="ij")
    offset = nvfp4.swizzled_offset(m, k, scale_cols)
    fig, ax = plt.subplots(figsize=(4 + scale_cols * 0.4, 7))
    ax.imshow(offset // 512, aspect="auto", cmap="tab20", interpolation="nearest")
    for r in range(0, rows, 8):
        for c in range(scale_cols):
            ax.text(c, r, str(int(offset[r, c])), ha="center", va="center", fontsize=5)
    for r in range(32, rows, 32):
        ax.axhline(r - 0.5, color="white", lw=0.6)
    for r in range(128, rows, 128):
        ax.axhline(r - 0.5, color="black", lw=1.5)
    for c in range(4, scale_cols, 4):
        ax.axvline(c - 0.5, color="black", lw=1.5)
    ax.set_xlabel("scale column k (one per 16 or 32 elements of K)")
    ax.set_ylabel("row m")
    ax.set_title("128x4 swizzle: colour = 512-byte tile, label = byte offset (every 8th row)\n"
                 "offset = tile*512 + (m%32)*16 + ((m%128)//32)*4 + k%4", fontsize=8)
    fig.tight_layout()
    return fig


def plot_quantize_throughput(rows: list[dict]) -> object:
    """Quantize GB/s per kernel and shape against the copy line measured in the same run (nvfp4_bench rows)."""
    import matplotlib.pyplot as plt

    frame = pd.DataFrame(rows)
    frame["shape"] = frame["M"].astype(str) + "x" + frame["K"].astype(str) + " bs" + frame["block_size"].astype(str)
    shapes = list(dict.fromkeys(frame["shape"]))
    fig, ax = plt.subplots(figsize=(7.5, 3.6))
    for kernel, group in frame.groupby("kernel", sort=False):
        ax.plot([shapes.index(s) for s in group["shape"]], group["gbps"], marker="o", label=kernel)
    copy = frame.drop_duplicates("shape")
    ax.plot([shapes.index(s) for s in copy["shape"]], copy["copy_gbps"], "k--", label="copy (same bytes)")
    ax.set_xticks(range(len(shapes)), shapes, fontsize=8)
    ax.set_yscale("log")
    ax.set_ylabel("GB/s of input")
    ax.set_title(f"FP4 quantize vs memory copy on {frame['device'].iloc[0]} ({frame['dtype'].iloc[0]} input)", fontsize=10)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig
