"""Committed notebooks are clean (no outputs), have exactly one parameters cell of literals, and declare needs."""

from __future__ import annotations

import ast

import nbformat
import papermill
import pytest

from fp4lab.core import catalog, paths, probe, runner

NOTEBOOKS = catalog.notebooks()


def test_every_notebook_file_is_in_the_catalog_in_number_order_reports_last():
    files = sorted(p.stem for p in paths.NOTEBOOKS_DIR.glob("*.ipynb"))
    assert sorted(nb.name for nb in NOTEBOOKS) == files
    assert sorted(int(nb.number) for nb in NOTEBOOKS) == list(range(len(files)))
    reports = [nb.name for nb in NOTEBOOKS if nb.reads_records]
    assert reports == ["10_decision_report"]
    assert [nb.name for nb in NOTEBOOKS] == [f for f in files if f not in reports] + reports


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


BAD = [
    ("00_environment", {"notebooks": "42"}, "notebooks contains '42', which is not a notebook"),
    ("01_nvcc_subprocess_crash", {"backend": "tvm"}, "backend='tvm' is not allowed"),
    ("02_file_io_trace", {"target_sm": "12.5"}, "target_sm='12.5' is not a known SM"),
    ("03_compiler_disable_fullgraph", {"ffn": 100}, "ffn=100 must be a multiple of 16"),
    ("04_fullgraph_false_tradeoff", {"scale": 3}, "scale=3 is not allowed"),
    ("05_custom_op_fix", {"tokens": 0}, "tokens=0 must be a positive integer"),
    ("06_nvfp4_kernels", {"shapes": [[64, 48]]}, "shapes K=48 must be a multiple of 32"),
    ("06_nvfp4_kernels", {"shapes": [[2, 64, 256]]}, "3-D inputs are not allowed"),
    ("06_nvfp4_kernels", {"distributions": ["cauchy"]},
     "distributions contains 'cauchy'; allowed values: normal, student_t, outlier_channels"),
    ("06_nvfp4_kernels", {"device": "tpu"}, "device='tpu' is not allowed"),
    ("07_mscclpp_allreduce", {"sizes": "3KiB"}, "sizes contains '3KiB'"),
    ("07_mscclpp_allreduce", {"sizes": "1KiB,1024GiB"},
     "sizes contains 1024GiB, more than a rank can hold here ("),
    ("07_mscclpp_allreduce", {"backends": ["nvlink"]}, "backends contains 'nvlink'"),
    ("07_mscclpp_allreduce", {"cpu_ranks": 1}, "world size 1 is too small"),
    ("07_mscclpp_allreduce", {"gpu_ranks": 1}, "gpu_ranks=1 is not allowed"),
    ("08_single_batch_overlap", {"chunks": [3]}, "chunks contains 3"),
    ("08_single_batch_overlap", {"collective": "broadcast"}, "collective='broadcast' is not allowed"),
    ("08_single_batch_overlap", {"scale": 5}, "scale=5 is not allowed"),
    ("08_single_batch_overlap", {"tp_size": -1}, "tp_size=-1 is not allowed"),
    ("08_single_batch_overlap", {"model_path": "/no/such/model"},
     "model_path='/no/such/model' is not allowed"),
    ("09_version_matrix", {"versions": "0.7.4,abc"}, "versions contains 'abc', which is not a version"),
    ("09_version_matrix", {"versions": "0.7.4,9.9.9"},
     "versions contains '9.9.9': flashinfer-python has no such release on the package index; "
     "allowed values: its releases, newest first: 0.7.4, "),
    ("12_fp4_api_audit", {"versions": ["0.0.1"]}, "versions contains '0.0.1': flashinfer-python has no"),
    ("09_version_matrix", {"versions": ","}, "versions is empty; allowed values: flashinfer-python versions such as"),
    ("10_decision_report", {"show_provenance": "yes"}, "show_provenance='yes' is not allowed"),
    ("11_sglang_piecewise_replay", {"sglang_versions": ["0.4.0"]},
     "sglang_versions contains '0.4.0'; allowed values: 0.5.3.post2"),
    ("11_sglang_piecewise_replay", {"sms": ["8.0"]}, "sms contains '8.0'; allowed values: 9.0, 10.0, 12.0"),
    ("12_fp4_api_audit", {"sms": ["12.0", "13.7"]}, "sms='13.7' is not a known SM; allowed values"),
    ("12_fp4_api_audit", {"entry_points": ["mm-fp4"]},
     "entry_points contains 'mm-fp4' is not an FP4 entry point of flashinfer"),
    ("12_fp4_api_audit", {"entry_points": "mm_fp4,nope"},
     "entry_points contains 'nope' is not an FP4 entry point of flashinfer 0.7.4; its FP4 entry "
     "points: "),
    ("12_fp4_api_audit", {"versions": 7.4}, "versions=7.4 must be a comma-separated string"),
]  # fmt: skip
"""Values a user could mistype, and the words the setup cell must answer with."""


@pytest.mark.parametrize(
    ("name", "bad", "message"), BAD, ids=[f"{n}-{next(iter(b))}" for n, b, _ in BAD]
)
def test_the_setup_cell_names_each_mistyped_value(name, bad, message, isolated_outputs):
    (nb,) = [n for n in NOTEBOOKS if n.name == name]
    defaults, setup = _parameters_and_setup(nb)
    with pytest.raises((ValueError, TypeError)) as refused:
        exec(compile(setup, f"{nb.name}-setup", "exec"), {**defaults, **bad})
    assert message in str(refused.value)
    assert not (isolated_outputs / "data").exists(), "nothing is recorded for a refused value"


@pytest.mark.notebook
def test_a_bad_parameter_stops_papermill_in_the_setup_cell(run_notebook, isolated_outputs):
    """One real papermill run: the refusal reaches the user naming the notebook, the cell and
    the value, before any record is written."""
    with pytest.raises(runner.NotebookFailed) as failure:
        run_notebook("05_custom_op_fix", tokens=0)
    assert str(failure.value).startswith("05_custom_op_fix, cell 3 of ")
    assert "tokens=0 must be a positive integer" in str(failure.value)
    assert not (isolated_outputs / "data").exists()
