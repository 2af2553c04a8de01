"""Figure provenance: every saved figure carries a footer and a JSON sidecar naming its run."""

from __future__ import annotations

import json
from pathlib import Path

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


def annotate_provenance(fig: object, prov: dict) -> None:
    """Write the provenance line along the bottom edge of a figure."""
    fig.text(0.01, -0.02, provenance_line(prov), fontsize=6, color="0.35", ha="left", va="top")


def save_figure(fig: object, name: str, prov: dict, source: str) -> Path:
    """Write ``figures/<name>.png`` with a provenance footer, and ``<name>.json`` beside it."""
    folder = paths.figures_dir()
    folder.mkdir(parents=True, exist_ok=True)
    annotate_provenance(fig, prov)
    path = folder / f"{name}.png"
    fig.savefig(
        path,
        dpi=120,
        bbox_inches="tight",
        metadata={"Description": json.dumps(prov, sort_keys=True)},
    )
    (folder / f"{name}.json").write_text(
        json.dumps(
            {"figure": path.name, "source": source, "provenance": prov}, indent=2, sort_keys=True
        )
        + "\n"
    )
    return path
