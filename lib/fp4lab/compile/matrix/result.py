"""What one FlashInfer version does with the story's trace, its verdict, and the summary across
versions: where each verdict holds, and on which versions each blocker and patch was met."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from packaging.version import Version

VERDICTS = (
    "blocked",
    "compiles, wrong arguments forwarded",
    "unblocked through the upstream op",
    "unblocked only with fp4lab's op",
)
"""Every verdict a measured version can get (one that could not be measured says why instead)."""


def _one_graph(found: dict) -> bool:
    return found.get("signature") == "ok" and found.get("graph_count") == 1


@dataclass
class VersionResult:
    """What one FlashInfer version does with the story's trace."""

    version: str
    env: str  # reused | built | failed
    install_seconds: float = 0.0
    env_bytes: int = 0
    wheel_bytes: int = 0
    error: str = ""
    chain: list[dict] = field(default_factory=list)
    upstream_op: dict = field(default_factory=dict)
    fp4lab_op: dict = field(default_factory=dict)
    forwarding: dict = field(default_factory=dict)
    target: dict = field(default_factory=dict)
    packages: dict = field(default_factory=dict)
    python: str | None = None
    import_staging: str | None = None

    @property
    def blockers(self) -> list[str]:
        """The public path's blockers in the order met (the last one ends the walk)."""
        return [row["signature"] for row in self.chain if row["signature"] != "ok"]

    @property
    def stages_applied(self) -> list[str]:
        """The patches the walk applied on this version, in order."""
        return [row["stage"] for row in self.chain[1:]]

    @property
    def story_patches_needed(self) -> list[str]:
        """The story's own patches the walk had to apply on this version."""
        return [row["stage"] for row in self.chain if row["origin"] == "story"]

    @property
    def forwarding_status(self) -> str | None:
        """What the detector saw the upstream op forward: present | absent | not testable here."""
        return self.forwarding.get("capture", {}).get("status")

    @property
    def verdict(self) -> str:
        """One of VERDICTS, or "not measured: <why>"."""
        if self.env == "failed":
            return "not measured: " + self.error.splitlines()[0] if self.error else "not measured"
        if _one_graph(self.upstream_op):
            if self.forwarding_status == "present":
                return VERDICTS[1]
            if self.forwarding_status == "absent":
                return VERDICTS[2]
            reason = self.forwarding.get("capture", {}).get("reason", "no detector record")
            return f"not measured: the argument-forwarding detector could not run: {reason}"
        if _one_graph(self.fp4lab_op):
            return VERDICTS[3]
        return VERDICTS[0]

    @property
    def story_decision_holds(self) -> bool | None:
        """The story's BLOCKED holds where no shipped op gives a correct one-graph compile."""
        return None if self.verdict not in VERDICTS else self.verdict != VERDICTS[2]

    def as_record(self) -> dict:
        return {
            **asdict(self),
            "blockers": self.blockers,
            "public_function_blocker": self.blockers[-1] if self.blockers else None,
            "stages_applied": self.stages_applied,
            "story_patches_needed": self.story_patches_needed,
            "upstream_op_present": bool(self.upstream_op.get("present")),
            "upstream_op_forwarding": self.forwarding_status,
            "verdict": self.verdict,
            "story_decision_holds": self.story_decision_holds,
        }


def _across(measured: list[VersionResult], key: str) -> dict[str, dict]:
    """For each stage (``key="stage"``) or blocker (``"signature"``) met in the chains: the
    versions it appears on and its scope ("every version measured" or "version-specific: ...");
    a stage also keeps its origin."""
    found: dict[str, dict] = {}
    for r in measured:
        for row in r.chain:
            entry = found.setdefault(row[key], {"versions": []})
            if key == "stage":
                entry["origin"] = row["origin"]
            if r.version not in entry["versions"]:
                entry["versions"].append(r.version)
    everyone = [r.version for r in measured]
    for entry in found.values():
        entry["on_every_version_measured"] = entry["versions"] == everyone
        entry["scope"] = (
            "every version measured"
            if entry["on_every_version_measured"]
            else "version-specific: only " + ", ".join(entry["versions"])
        )
    return found


def _decision(measured: list[VersionResult], holds: list[str], unblocked: list[str]) -> dict:
    """The decision report's verdict, number and why over the versions measured."""
    if not measured:
        return {"verdict": "UNMEASURED", "number": "no FlashInfer version measured",
                "why": "no version's environment could be built here"}  # fmt: skip
    if unblocked:
        return {
            "verdict": "UNBLOCKED",
            "number": f"FlashInfer's own op unblocks from {unblocked[0]}; the story's decision "
            f"holds up to {holds[-1] if holds else 'no version measured'}",
            "why": "from that version FlashInfer registers its quantize as a torch op with a "
            "fake, and the story's trace compiles to one graph through it",
        }  # fmt: skip
    return {"verdict": "BLOCKED", "number": f"no version of {len(measured)} measured unblocks it",
            "why": "no measured FlashInfer version registers a quantize op the trace compiles through"}  # fmt: skip


def summarize_versions(results: list[VersionResult]) -> dict:
    """Where each verdict holds, up to which version the story's decision holds, from which the
    upstream op removes the blocker, and on which versions each patch and blocker was met."""
    measured = sorted((r for r in results if r.env != "failed"), key=lambda r: Version(r.version))
    holds = [r.version for r in measured if r.story_decision_holds]
    unblocked = [r.version for r in measured if r.verdict == VERDICTS[2]]
    stages = _across(measured, "stage")
    stages.pop("none", None)
    ranges = {v: [r.version for r in measured if r.verdict == v] for v in VERDICTS}
    return {
        "status": "measured" if measured else "not measured",
        "headline": "; ".join(f"{v}: {', '.join(vs)}" for v, vs in ranges.items() if vs)
        or "no version measured",
        **_decision(measured, holds, unblocked),
        "versions_measured": [r.version for r in measured],
        "versions_failed": [r.version for r in results if r.env == "failed"],
        "versions_undecided": [r.version for r in measured if r.verdict not in VERDICTS],
        "story_decision_holds_up_to": holds[-1] if holds else None,
        "upstream_op_unblocks_from": unblocked[0] if unblocked else None,
        "verdict_ranges": ranges,
        "stages_across_versions": stages,
        "blockers_across_versions": _across(measured, "signature"),
    }
