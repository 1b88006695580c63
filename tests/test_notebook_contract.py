"""The notebook anatomy every notebook keeps (DESIGN.md, 'Notebook anatomy'), and the conventions of
issue 17 (/work/plan/CONVENTIONS.md): short cells, nothing only for the tests, one vocabulary, parameters
read with read_parameters()."""
import ast
import re

import nbformat
import pytest
import yaml

from harness import REPO, UnknownParameterError, declared_parameters, run_notebook
from notebook_cases import CASES, NotebookCase

NOTEBOOKS = sorted(p.relative_to(REPO).as_posix() for p in (REPO / "notebooks").rglob("*.ipynb")
                   if ".ipynb_checkpoints" not in p.parts)
RECIPES = sorted(p.name for p in (REPO / "recipes").iterdir() if (p / "train.py").is_file())

MAX_CELL_LINES = 40
# Test machinery that belongs in tests/hooks or nbhelpers, never in a lesson.
TEST_ONLY_NAMES = ("patch_for_cpu", "trl_cpu", "stop_after_step", "crash_while_saving_step", "CrashWhileWriting",
                   "RecordingCheckpointIO", "lightning_started_processes", "os.kill", "os._exit", "SIGKILL",
                   "fail_once_at_epoch", "COOKBOOK_TEST_HOOKS")


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


def vocabulary() -> set:
    """The names of the README table "One name for each setting"."""
    readme = (REPO / "README.md").read_text()
    section = readme.split("## One name for each setting", 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"^\| `([a-z0-9_]+)` \|", section, flags=re.MULTILINE))


def long_cells(path) -> list[str]:
    return [f"cell {i} has {len(c.source.splitlines())} lines" for i, c in enumerate(_cells(path))
            if c.cell_type == "code" and len(c.source.splitlines()) > MAX_CELL_LINES]


def names_only_for_tests(path) -> list[str]:
    text = "\n".join(c.source for c in _cells(path))
    return [name for name in TEST_ONLY_NAMES if re.search(rf"(?<![\w.]){re.escape(name)}(?!\w)", text)]


def names_outside_the_vocabulary(path) -> list[str]:
    return sorted(set(declared_parameters(REPO / path)) - vocabulary())


def parameters_not_read_first(path) -> list[str]:
    """Where the notebook does not read its parameters with read_parameters() before it launches anything."""
    code = [c.source for c in _cells(path) if c.cell_type == "code"]
    reads = [i for i, source in enumerate(code) if re.search(r"^args = read_parameters\(\)", source, re.MULTILINE)]
    launches = [i for i, source in enumerate(code) if "distributed" in source and "import" not in source]
    if not reads:
        return ["no `args = read_parameters()`"]
    return [f"code cell {i} uses `distributed` before `args = read_parameters()`" for i in launches if i < reads[0]]


def recipe_flags(recipe) -> set:
    """The keys of a recipe's config.yaml and the --flags of its scripts' argparse parsers (hidden ones aside)."""
    folder = REPO / "recipes" / recipe
    flags = set()
    for config in folder.glob("*.yaml"):
        flags |= set(yaml.safe_load(config.read_text()) or {})
    for script in folder.glob("*.py"):
        for node in ast.walk(ast.parse(script.read_text())):
            if (isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "add_argument"
                    and not any(k.arg == "help" and "SUPPRESS" in ast.unparse(k.value) for k in node.keywords)):
                flags |= {a.value[2:] for a in node.args
                          if isinstance(a, ast.Constant) and str(a.value).startswith("--")}
    return flags


@pytest.mark.parametrize("path", NOTEBOOKS)
def test_no_code_cell_is_over_40_lines(path):
    assert not long_cells(path), f"{path}: split these cells into steps: {long_cells(path)}"


@pytest.mark.parametrize("path", NOTEBOOKS)
def test_no_test_only_name_appears_in_a_notebook(path):
    found = names_only_for_tests(path)
    assert not found, (f"{path} holds test machinery {found}: CPU fixes apply themselves (nbhelpers), "
                       "crash and recording hooks live in tests/hooks")


@pytest.mark.parametrize("path", NOTEBOOKS)
def test_every_parameter_name_is_in_the_readme_vocabulary(path):
    assert not names_outside_the_vocabulary(path), (
        f"{path}: parameters {names_outside_the_vocabulary(path)} are not in the README table "
        "'One name for each setting': use its name, or add the new one there")


@pytest.mark.parametrize("path", NOTEBOOKS)
def test_parameters_are_read_with_read_parameters_before_any_launch(path):
    assert not parameters_not_read_first(path), f"{path}: {parameters_not_read_first(path)}"


@pytest.mark.parametrize("recipe", RECIPES)
def test_every_recipe_flag_is_in_the_readme_vocabulary(recipe):
    unknown = sorted(recipe_flags(recipe) - vocabulary())
    assert not unknown, f"recipes/{recipe}: flags {unknown} are not in the README table 'One name for each setting'"
