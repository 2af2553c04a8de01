"""core.venvs: side environments built by pip steps, reused by recipe, failures returned and cleaned."""

from __future__ import annotations

from fp4lab.core import venvs


def test_built_then_reused_while_the_recipe_is_the_same(tmp_path):
    path = tmp_path / "env"
    first = venvs.ensure(path, [["--version"]])
    assert first.status == "built" and first.python.exists() and first.bytes > 0
    assert venvs.ensure(path, [["--version"]]).status == "reused"
    assert venvs.ensure(path, [["--version"], ["list"]]).status == "built", "a new recipe rebuilds"


def test_a_failing_step_is_returned_with_pips_words_and_leaves_nothing(tmp_path):
    path = tmp_path / "env"
    env = venvs.ensure(path, [["install", "--no-index", "no-such-package-fp4lab"]])
    assert env.status == "failed" and env.bytes == 0
    assert "pip install --no-index no-such-package-fp4lab failed: " in env.error
    assert "No matching distribution" in env.error or "Could not find" in env.error
    assert not path.exists()
