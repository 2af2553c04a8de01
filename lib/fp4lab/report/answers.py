"""Answers a lead can scan, from records only. Each notebook's verdict as its page opens with it
(``answer``). The SGLang replay's, from the timelines notebooks 11 and 14 record in their
summaries: per SM (GLM-5) and per model, the release ranges where tc_piecewise prefill graphs
compile or are blocked, what the releases give with no flag, and what to run; the deciding
figure is notebook 11's grid (``GRID``)."""

from __future__ import annotations

import base64

from fp4lab.core import figures, page, paths, records

SGLANG, MODELS = "11_sglang_piecewise_replay", "14_fp4_model_matrix"
GRID = "11_sglang_grid"
"""The per-SM grid notebook 11 writes (``serving.replay.plots.GRID``)."""


def _span(run: dict) -> str:
    return run["from"] if run["from"] == run["to"] else f"{run['from']}–{run['to']}"


def _where(runs: list[dict], outcome: str) -> str:
    """The releases of ``outcome`` as ranges, neighbouring runs (consecutive releases, another
    state of the same outcome) joined."""
    merged: list[dict] = []
    for i, run in enumerate(runs):
        if run["outcome"] != outcome:
            continue
        if merged and runs[i - 1]["outcome"] == outcome:
            merged[-1] = {**merged[-1], "to": run["to"]}
        else:
            merged.append(run)
    return ", ".join(_span(r) for r in merged)


def _defaults(line: dict) -> str:
    return ", ".join(f"{_span(g)} {g['default_prefill'] or 'unknown'}"
                     for g in line.get("defaults") or [])  # fmt: skip


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _timeline(notebook: str) -> dict | None:
    found = [r for r in records.latest(notebook) if r["kind"] == "summary"]
    return found[-1]["values"] if found else None


def verdict(notebook: str) -> str:
    """A notebook's decision in one sentence: its verdict and deciding number ('' before a run
    that recorded one)."""
    summary = _timeline(notebook) or {}
    if "verdict" not in summary:
        return ""
    return f"**{summary['verdict']}**: {summary['number']}.\n\n"


def _per_sm(header: list[str], cells: object) -> str:
    """A Markdown table of GLM-5's timeline, a row per SM: ``cells(timeline of the SM)`` after
    the SM ('' before a run of notebook 11 that recorded one)."""
    timeline = (_timeline(SGLANG) or {}).get("timeline")
    if not timeline:
        return ""
    lines = ["| SM | " + " | ".join(header) + " |", "|---" * (len(header) + 1) + "|"]
    for sm in sorted(timeline, key=float):
        row = [f"SM{sm}", *cells(timeline[sm])]
        lines.append("| " + " | ".join(_cell(c) for c in row) + " |")
    return "\n".join(lines) + "\n"


def _captured(line: dict, graph: str) -> str:
    """The runs of one captured graph in one SM's timeline, each outcome with its release
    ranges ("not applicable" where the timeline holds none: no release reached that graph)."""
    found = line.get(f"{graph}_runs") or []
    said = "; ".join(f"{o}: {_where(found, o)}" for o in dict.fromkeys(r["outcome"] for r in found))
    return said or "not applicable"


def _graphs(lines: dict) -> list[str]:
    """The captured graphs any of these timelines holds runs of (``<graph>_runs``), in order."""
    keys = dict.fromkeys(k for line in lines.values() for k in line)
    return [k.removesuffix("_runs") for k in keys if k.endswith("_runs") and k != "runs"]


def per_sm() -> str:
    """GLM-5 per SM: where tc_piecewise compiles, is blocked, reaches a kernel the SM lacks, each
    captured graph's outcomes, and what to run."""
    graphs = _graphs((_timeline(SGLANG) or {}).get("timeline") or {})
    return _per_sm(
        ["tc_piecewise compiles in", "blocked in", "a kernel the SM lacks in",
         *(f"{g} (simulated capture)" for g in graphs), "what to run"],
        lambda line: [_where(line["runs"], o) or "none"
                      for o in ("compiles", "blocked", "kernel unavailable")]
        + [_captured(line, g) for g in graphs] + [line["run"]],
    )  # fmt: skip


def per_sm_given() -> str:
    """GLM-5 per SM, keyed as ``per_sm``: the prefill graph each release gives with no flag, and
    the kernels the newest measured release resolves with their availability."""
    return _per_sm(["with no flag the release gives", "its kernels: backends, availability"],
                   lambda line: [_defaults(line), line.get("kernels") or ""])  # fmt: skip


def per_model() -> str:
    """Each built-in model per SM as a Markdown table ('' before a run of notebook 14)."""
    summary = _timeline(MODELS)
    timelines = (summary or {}).get("timelines")
    if not timelines:
        return ""
    graphs = _graphs({(n, sm): line for n, sms in timelines.items() for sm, line in sms.items()})
    header = ["model", "SM", "tc_piecewise compiles in", "blocked in", "a kernel the SM lacks in",
              "not measured in", *(f"{g} (simulated capture)" for g in graphs)]  # fmt: skip
    lines = ["| " + " | ".join(header) + " |", "|---" * len(header) + "|"]
    for name, sms in timelines.items():
        for sm in sorted(sms, key=float):
            runs = sms[sm]["runs"]
            cells = [name, f"SM{sm}", _where(runs, "compiles") or "none",
                     _where(runs, "blocked") or "none",
                     _where(runs, "kernel unavailable") or "none",
                     _where(runs, "not measured") or "none",
                     *(_captured(sms[sm], g) for g in graphs)]  # fmt: skip
            lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return "\n".join(lines) + "\n"


def grid_html(width: str = "100%") -> str:
    """Notebook 11's grid as an embedded image ('' where no run has written it)."""
    path = paths.figures_dir() / f"{GRID}.png"
    if not path.exists():
        return ""
    data = base64.b64encode(path.read_bytes()).decode()
    return (f'<img alt="GLM-5 per release and SM: the tc_piecewise outcome, the blocker, the '
            f'prefill graph with no flag" style="max-width:{width}" '
            f'src="data:image/png;base64,{data}">')  # fmt: skip


def answer(notebook: str) -> object:
    """The newest summary of ``notebook`` as its page opens with it (its verdict cell, tagged
    ``page.ANSWER``): the verdict in bold with its deciding number, the one-sentence why, and
    how it was obtained (evidence; versions, machine, target, time)."""
    import html

    import pandas as pd
    from IPython.display import HTML, display

    found = [r for r in records.latest(notebook) if r["kind"] == "summary"]
    if not found:
        return HTML("<p>No summary was recorded: this run decided nothing.</p>")
    said, prov = found[-1]["values"], found[-1]["provenance"]
    display(HTML(f"<p><strong>{html.escape(said['verdict'])}</strong>: "
                 f"{html.escape(said['number'])}. {html.escape(said['why'])}.</p>"))  # fmt: skip
    return page.table(pd.DataFrame([{"evidence": ", ".join(said.get("evidence") or []),
                                     "provenance": figures.provenance_line(prov)}]))  # fmt: skip
