"""The FlashInfer versions the matrix measures by default, and the check of a list given."""

from __future__ import annotations

from packaging.version import InvalidVersion, Version

from fp4lab.core import params, venvs

DEFAULT_VERSIONS = (
    "0.6.3",
    "0.6.11.post3",
    "0.6.12",
    "0.6.18.post1",
    "0.7.0",
    "0.7.1",
    "0.7.2",
    "0.7.4",
)
"""The story's era (early 2026); the last release before the upstream op; the first with it
(PR #3081); the last 0.6 release; the first 0.7 (still forwarding enable_pdl wrongly, as
measured); the first measured to forward by keyword; a middle 0.7; the newest."""


def check_versions(versions: list[str] | str) -> list[str]:
    """Versions as written ("0.6.12"; a list or one comma-separated string), duplicates dropped;
    a clear error naming ``versions`` for anything that is not a version."""
    versions = params.items("versions", versions, "flashinfer-python versions such as 0.6.12,0.7.4")
    for v in versions:
        try:
            Version(v)
        except InvalidVersion:
            raise ValueError(
                f"versions contains {v!r}, which is not a version; e.g. 0.6.12 or 0.7.4"
            ) from None
    return versions


def check_released(versions: list[str] | str) -> list[str]:
    """``check_versions``, then each version looked up on the package index (one lookup), so a
    version that does not exist is named before any environment is built."""
    return venvs.check_released("versions", "flashinfer-python", check_versions(versions))
