"""Figure provenance: every saved figure carries a footer and a JSON sidecar naming its run."""

from __future__ import annotations

import json
from pathlib import Path

from fp4lab.core import evidence as levels
from fp4lab.core import paths


def provenance_line(prov: dict) -> str:
    """A one-line summary of a record's provenance, for figure footers and captions."""
    pk = prov.get("packages", {})
    target = (
        f"target SM{prov['target_sm']} ({'simulated' if prov['simulated'] else 'real'})"
        if prov.get("target_sm")
        else "no target SM"
    )
    git = prov.get("git", {})
    commit = (git.get("commit") or "no-commit")[:10] + ("-dirty" if git.get("dirty") else "")
    return (
        f"fp4lab {commit} · torch {pk.get('torch')} · flashinfer {pk.get('flashinfer-python')} · "
        f"{prov.get('device')} · {target} · {prov.get('time_utc')}"
    )


def evidence_line(evidence: list[str]) -> str:
    """``evidence: trace, simulated_target`` (core.evidence's words), or that none was reached."""
    return f"evidence: {', '.join(levels.check(evidence)) or 'none of the levels (a measurement)'}"


def annotate_provenance(fig: object, prov: dict, evidence: list[str]) -> None:
    """Write the provenance and evidence line along the bottom edge of a figure."""
    text = f"{provenance_line(prov)} · {evidence_line(evidence)}"
    fig.text(0.01, -0.02, text, fontsize=6, color="0.35", ha="left", va="top")


def save_figure(fig: object, name: str, prov: dict, source: str, *, evidence: list[str]) -> Path:
    """Write ``figures/<name>.png`` with a provenance and evidence footer, and ``<name>.json``
    beside it; ``evidence`` is what the plotted records reached (core.evidence)."""
    folder = paths.figures_dir()
    folder.mkdir(parents=True, exist_ok=True)
    annotate_provenance(fig, prov, evidence)
    path = folder / f"{name}.png"
    fig.savefig(
        path,
        dpi=120,
        bbox_inches="tight",
        metadata={"Description": json.dumps(prov, sort_keys=True)},
    )
    (folder / f"{name}.json").write_text(
        json.dumps(
            {
                "figure": path.name,
                "source": source,
                "provenance": prov,
                "evidence": levels.check(evidence),
            },
            indent=2,
            sort_keys=True,
        )
        + "\n"
    )
    return path
