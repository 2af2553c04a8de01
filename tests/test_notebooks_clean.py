"""Committed notebooks are clean (no outputs), have exactly one parameters cell of literals, and declare needs."""

from __future__ import annotations

import ast

import nbformat
import papermill
import pytest

from fp4lab.core import catalog, probe

NOTEBOOKS = catalog.notebooks()


def test_there_are_notebooks():
    assert len(NOTEBOOKS) >= 6


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda nb: nb.name)
def test_committed_without_outputs(nb):
    notebook = nbformat.read(nb.path, as_version=4)
    nbformat.validate(notebook)
    for cell in notebook.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, (
                f"{nb.name}: a cell carries outputs"
            )


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda nb: nb.name)
def test_one_parameters_cell_of_plain_literals_then_validation(nb):
    cells = nbformat.read(nb.path, as_version=4).cells
    tagged = [i for i, c in enumerate(cells) if "parameters" in c.metadata.get("tags", [])]
    assert len(tagged) == 1, f"{nb.name}: {len(tagged)} parameters cells"
    tree = ast.parse(cells[tagged[0]].source)
    names = set()
    for statement in tree.body:
        assert isinstance(statement, ast.Assign), (
            f"{nb.name}: parameters cell holds only assignments"
        )
        ast.literal_eval(statement.value)  # raises for anything but a plain literal
        names.update(target.id for target in statement.targets)
    following = cells[tagged[0] + 1]
    unchecked = {name for name in names if name not in following.source}
    assert following.cell_type == "code" and not unchecked, (
        f"{nb.name}: the cell after the parameters does not check {unchecked}"
    )
    assert set(papermill.inspect_notebook(str(nb.path))) == names, (
        "papermill must see every parameter (a comment with '=' hides one)"
    )


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda nb: nb.name)
def test_declares_needs_duration_and_kernel(nb):
    notebook = nbformat.read(nb.path, as_version=4)
    meta = notebook.metadata["fp4lab"]
    assert meta["needs"] in probe.NEEDS and int(meta["duration_s"]) > 0 and meta["title"]
    assert notebook.metadata["kernelspec"]["name"] == catalog.KERNEL


_LOGIC = (ast.For, ast.AsyncFor, ast.While, ast.Try, ast.If, ast.FunctionDef, ast.ClassDef, ast.Lambda,
          ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)  # fmt: skip


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda nb: nb.name)
def test_code_cells_are_thin(nb):
    """Notebooks narrate and call the library: no loops, branches, try/except, definitions or plotting code."""
    for cell in nbformat.read(nb.path, as_version=4).cells:
        if cell.cell_type != "code":
            continue
        tree = ast.parse(cell.source)
        logic = sorted({type(node).__name__ for node in ast.walk(tree) if isinstance(node, _LOGIC)})
        assert not logic, f"{nb.name}: a code cell holds {logic}; move it into lib/fp4lab"
        assert "matplotlib" not in cell.source and "plt." not in cell.source, (
            f"{nb.name}: plotting code in a cell"
        )


def _parameters_and_setup(nb) -> tuple[dict, str]:
    """A notebook's parameter defaults and the source of its setup (validation) cell."""
    cells = nbformat.read(nb.path, as_version=4).cells
    [index] = [i for i, c in enumerate(cells) if "parameters" in c.metadata.get("tags", [])]
    defaults: dict = {}
    exec(cells[index].source, {}, defaults)
    return defaults, cells[index + 1].source


def _wrong_type(value: object) -> object:
    """A value of another type than the default: every validation must refuse it."""
    if isinstance(value, bool):
        return "maybe"
    if isinstance(value, (int, float)):
        return "many"
    if isinstance(value, str):
        return 17
    return 17  # lists


PARAMETERS = [(nb, name) for nb in NOTEBOOKS for name in sorted(_parameters_and_setup(nb)[0])]


@pytest.mark.parametrize(
    ("nb", "name"), PARAMETERS, ids=[f"{nb.name}-{name}" for nb, name in PARAMETERS]
)
def test_the_setup_cell_refuses_a_bad_value_of_every_parameter(nb, name, isolated_outputs):
    """Each parameter is really validated: a value of the wrong type stops the setup cell
    with a ValueError that names the parameter, before any heavy work."""
    defaults, setup = _parameters_and_setup(nb)
    namespace = {**defaults, name: _wrong_type(defaults[name])}
    with pytest.raises((ValueError, TypeError)) as refused:
        exec(compile(setup, f"{nb.name}-setup", "exec"), namespace)
    assert name in str(refused.value), f"{nb.name}: the error does not name {name}: {refused.value}"
