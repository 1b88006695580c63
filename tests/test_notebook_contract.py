"""The notebook anatomy every notebook keeps (DESIGN.md, 'Notebook anatomy')."""
import ast
from pathlib import Path

import nbformat
import pytest

from harness import REPO, UnknownParameterError, declared_parameters, run_notebook
from notebook_cases import CASES, NotebookCase

NOTEBOOKS = sorted(p.relative_to(REPO).as_posix() for p in (REPO / "notebooks").rglob("*.ipynb")
                   if ".ipynb_checkpoints" not in p.parts)


def _cells(path):
    return nbformat.read(REPO / path, as_version=4).cells


def test_every_notebook_has_a_smoke_case():
    covered = {c.notebook for c in CASES}
    assert not set(NOTEBOOKS) - covered, f"notebooks without a case in tests/notebook_cases.py: {set(NOTEBOOKS) - covered}"
    assert not covered - set(NOTEBOOKS), f"cases for notebooks that do not exist: {covered - set(NOTEBOOKS)}"


@pytest.mark.parametrize("path", NOTEBOOKS)
def test_notebook_has_no_committed_outputs(path):
    for i, cell in enumerate(_cells(path)):
        if cell.cell_type == "code":
            assert not cell.outputs, f"{path}: cell {i} has committed outputs (strip them)"
            assert cell.execution_count is None, f"{path}: cell {i} has an execution count (strip it)"


@pytest.mark.parametrize("path", NOTEBOOKS)
def test_notebook_opens_with_markdown_then_one_literal_parameters_cell(path):
    cells = _cells(path)
    assert cells[0].cell_type == "markdown", f"{path}: the first cell must say what the notebook does"
    header = cells[0].source
    assert "papermill" in header, f"{path}: the first cell must show the headless launch line"
    tagged = [c for c in cells if "parameters" in c.metadata.get("tags", [])]
    assert len(tagged) == 1, f"{path}: expected exactly one cell tagged 'parameters', found {len(tagged)}"
    source = tagged[0].source
    tree = ast.parse(source)
    names = []
    for node in tree.body:
        assert isinstance(node, (ast.Assign, ast.AnnAssign)), f"{path}: parameters cell holds only assignments"
        value = node.value
        ast.literal_eval(value)  # raises on anything but a literal
        target = node.targets[0] if isinstance(node, ast.Assign) else node.target
        names.append(target.id)
        line = source.splitlines()[node.lineno - 1]
        assert "#" in line, f"{path}: parameter {target.id!r} needs an inline comment saying what it is"
    assert "output_dir" in names, f"{path}: every notebook takes an output_dir parameter"
    seen_by_papermill = set(declared_parameters(REPO / path))
    assert set(names) == seen_by_papermill, (
        f"{path}: papermill cannot parse parameter(s) {set(names) - seen_by_papermill} "
        "(keep each on one line, and no '=' inside its comment)"
    )


def test_unknown_parameter_is_an_error_not_a_silent_no_op(tmp_path):
    case = NotebookCase("notebooks/00_getting_started.ipynb", parameters={"output_dir": "{output_dir}", "nmu_gpus": 2})
    with pytest.raises(UnknownParameterError, match="nmu_gpus"):
        run_notebook(case, tmp_path)
