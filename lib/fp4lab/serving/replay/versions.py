"""The SGLang versions the replay measures, the simulated SMs, and the checks that name them.

Each check raises before any install, naming the parameter and its allowed values.
"""

from __future__ import annotations

from fp4lab.core import params

VERSIONS = (
    "0.5.3.post2", "0.5.3.post3", "0.5.4", "0.5.5", "0.5.6", "0.5.7", "0.5.8", "0.5.9", "0.5.10",
    "0.5.11", "0.5.12", "0.5.13", "0.5.14", "0.5.15", "0.5.16", "0.5.17", "0.5.18", "0.5.19",
    "0.5.20", "0.5.21", "0.5.22", "0.5.23",
)  # fmt: skip
"""Every release from the first with piecewise CUDA graphs (``piecewise_cuda_graph_runner.py``,
``--enable-piecewise-cuda-graph``, 0.5.3.post2) to the newest on the registry, in release order:
what the replay measures by default (``ALL``). Adding a release is one line here."""

ALL = "all"
"""The value of ``sglang_versions`` that means every release of VERSIONS."""


def order(version: str) -> int:
    """A release's place in VERSIONS (release order); one not in it goes after them all."""
    return VERSIONS.index(version) if version in VERSIONS else len(VERSIONS)


def span(first: str, last: str) -> str:
    """A run of releases as a range ("0.5.13–0.5.19"), or the one release."""
    return first if first == last else f"{first}–{last}"


def ranges(releases: list[str] | set[str]) -> str:
    """Releases as runs of consecutive ones in release order ("0.5.6–0.5.12, 0.5.20–0.5.21")."""
    ordered = sorted(set(releases), key=order)
    runs: list[list[str]] = []
    for release in ordered:
        if runs and order(release) == order(runs[-1][-1]) + 1:
            runs[-1].append(release)
        else:
            runs.append([release])
    return ", ".join(span(r[0], r[-1]) for r in runs)


def by_sm(cells: list[tuple[str, str]]) -> str:
    """(release, SM) cells as release ranges per SM ("SM10.0 0.5.13–0.5.19; SM12.0 0.5.16")."""
    sms = sorted({sm for _, sm in cells}, key=float)
    return "; ".join(f"SM{sm} {ranges([v for v, s in cells if s == sm])}" for sm in sms)


TEST_VERSIONS = ("0.5.9", "0.5.16")
"""What ``make test`` replays with the real model: the story's release, through notebook 11 on
every SM (blocked), and one whose outcome differs (GLM-5 compiles as released on SM12.0), on
that SM only; each replay builds the release's GLM-5, so two keep the suite in its budget."""

SMS = {"9.0": (9, 0), "10.0": (10, 0), "12.0": (12, 0)}
"""The simulated targets: Hopper (H100/H200), datacenter Blackwell (B200), RTX PRO 6000 Blackwell."""

STORY_VERSION, STORY_SM = "0.5.9", "12.0"
"""Where the story happened: SGLang 0.5.9 on an RTX PRO 6000 (SM120)."""


def check_versions(
    versions: list[str] | tuple[str, ...] | str, extra: tuple[str, ...] = ()
) -> list[str]:
    """SGLang versions as given (a list or one comma-separated string, or ``all``: VERSIONS),
    duplicates dropped; each must be in VERSIONS (or ``extra``: a version to try as given, e.g.
    to record a failed install)."""
    versions = params.items("sglang_versions", versions, f"{ALL}, {', '.join(VERSIONS)}")
    if versions == [ALL]:
        return list(VERSIONS)
    params.choices("sglang_versions", versions, (*VERSIONS, *extra))
    return versions


def check_sms(sms: list[str] | tuple[str, ...] | str) -> list[str]:
    """Simulated SMs as "12.0" strings, each one of SMS."""
    return params.sms("sms", sms, tuple(SMS))
