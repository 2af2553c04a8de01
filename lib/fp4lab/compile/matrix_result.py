"""What one FlashInfer version does with the story's trace, its verdict, and the matrix's summary."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

VERDICTS = (
    "blocked",
    "unblocked through torch.ops.flashinfer.fp4_quantize",
    "unblocked only through fp4lab's custom op",
)


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
    target: dict = field(default_factory=dict)
    packages: dict = field(default_factory=dict)
    import_staging: str | None = None

    @property
    def blockers(self) -> list[str]:
        """The public path's blockers in the order met (the last one ends the walk)."""
        return [row["signature"] for row in self.chain if row["signature"] != "ok"]

    @property
    def story_patches_needed(self) -> list[str]:
        """The story's own patches the walk had to apply on this version."""
        return [row["stage"] for row in self.chain if row["origin"] == "story"]

    @property
    def verdict(self) -> str:
        if self.env == "failed":
            return "not measured: " + self.error.splitlines()[0] if self.error else "not measured"
        if self.chain and self.chain[-1]["signature"] == "ok":
            return "unblocked: the public function traces"
        if self.upstream_op.get("signature") == "ok" and self.upstream_op.get("graph_count") == 1:
            return VERDICTS[1]
        if self.fp4lab_op.get("signature") == "ok" and self.fp4lab_op.get("graph_count") == 1:
            return VERDICTS[2]
        return VERDICTS[0]

    @property
    def story_decision_holds(self) -> bool | None:
        """The story's BLOCKED holds where nothing short of writing a custom op unblocks it."""
        return None if self.env == "failed" else self.verdict in (VERDICTS[0], VERDICTS[2])

    def as_record(self) -> dict:
        return {
            **asdict(self),
            "blockers": self.blockers,
            "story_patches_needed": self.story_patches_needed,
            "upstream_op_present": bool(self.upstream_op.get("present")),
            "verdict": self.verdict,
            "story_decision_holds": self.story_decision_holds,
        }


def summarize_versions(results: list[VersionResult]) -> dict:
    """Up to which version the story's decision holds, and from which the upstream op removes the blocker."""
    from packaging.version import Version

    measured = sorted((r for r in results if r.env != "failed"), key=lambda r: Version(r.version))
    holds = [r.version for r in measured if r.story_decision_holds]
    unblocked = [r.version for r in measured if r.verdict == VERDICTS[1]]
    return {
        "versions_measured": [r.version for r in measured],
        "versions_failed": [r.version for r in results if r.env == "failed"],
        "story_decision_holds_up_to": holds[-1] if holds else None,
        "upstream_op_unblocks_from": unblocked[0] if unblocked else None,
    }
