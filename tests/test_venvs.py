"""core.venvs: side environments built by uv from one shared cache, reused by recipe, failures
returned and cleaned, files hardlinked from the cache and counted once."""

from __future__ import annotations

from importlib import metadata

import pytest

from fp4lab.core import paths, venvs

pytestmark = pytest.mark.environments


def test_built_then_reused_while_the_recipe_is_the_same(tmp_path):
    path = tmp_path / "env"
    first = venvs.ensure(path, [["list"]])
    assert first.status == "built" and first.python.exists() and first.bytes > 0
    assert venvs.ensure(path, [["list"]]).status == "reused"
    assert venvs.ensure(path, [["list"], ["freeze"]]).status == "built", "a new recipe rebuilds"
    assert "$ " in (tmp_path / "env.build.log").read_text(), "uv's commands and output are logged"


def test_a_failing_step_is_returned_with_uvs_words_and_leaves_nothing(tmp_path):
    path = tmp_path / "env"
    env = venvs.ensure(path, [["install", "--no-index", "no-such-package-fp4lab"]])
    assert env.status == "failed" and env.bytes == 0
    assert env.error.startswith("uv pip install --no-index no-such-package-fp4lab failed: ")
    assert "no-such-package-fp4lab" in env.error.split("failed: ", 1)[1]
    assert not path.exists()


def test_environments_share_the_caches_bytes_and_are_counted_once(tmp_path):
    first = venvs.ensure(tmp_path / "a", [["install", "six==1.17.0"]])
    second = venvs.ensure(tmp_path / "b", [["install", "six==1.17.0"]])
    assert first.status == second.status == "built", first.error or second.error
    (six,) = (tmp_path / "b").glob("lib/python*/site-packages/six.py")
    assert six.stat().st_nlink >= 2, "installed as a hardlink into uv's cache, not a copy"
    assert second.own_bytes < second.bytes
    both = paths.disk_bytes(tmp_path)
    assert both < first.bytes + second.bytes, "a file linked twice is counted once"


def test_side_environments_get_the_main_environments_torch():
    assert venvs.torch_requirement() == f"torch=={metadata.version('torch')}"
