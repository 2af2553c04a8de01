"""environment.yml states the same pins as pyproject.toml and the Makefile's default torch."""

from __future__ import annotations

import re
import tomllib

from packaging.requirements import Requirement

from fp4lab.core import paths


def _yaml_pip_pins() -> dict[str, str]:
    text = (paths.REPO_ROOT / "environment.yml").read_text()
    pins = {}
    for line in re.findall(r"^\s+- (\S+==\S+)\s*$", text, flags=re.MULTILINE):
        req = Requirement(line)
        pins[req.name] = str(req.specifier)
    return pins


def test_environment_yml_agrees_with_pyproject():
    project = tomllib.loads((paths.REPO_ROOT / "pyproject.toml").read_text())["project"]
    declared = [
        Requirement(r) for r in project["dependencies"] + project["optional-dependencies"]["test"]
    ]
    yaml = _yaml_pip_pins()
    for req in declared:
        assert req.name in yaml, f"{req.name} is in pyproject.toml but not in environment.yml"
        if req.name == "torch":
            assert req.specifier.contains(yaml["torch"].removeprefix("=="))
        else:
            assert yaml[req.name] == str(req.specifier), (
                f"{req.name}: environment.yml {yaml[req.name]} vs pyproject {req.specifier}"
            )
    assert set(yaml) == {r.name for r in declared}, (
        "environment.yml pins a package pyproject.toml does not declare"
    )


def test_makefile_default_torch_is_the_environment_pin():
    makefile = (paths.REPO_ROOT / "Makefile").read_text()
    default = re.search(r"^TORCH\s*\?=\s*torch==(\S+)", makefile, flags=re.MULTILINE).group(1)
    assert _yaml_pip_pins()["torch"] == f"=={default}"
