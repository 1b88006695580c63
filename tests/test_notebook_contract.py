"""The notebook anatomy every notebook keeps (README, "The notebooks"): a short header, one cell of a few
literal parameters read with read_parameters(), short cells, nothing only for the tests, one vocabulary
(docs/vocabulary.md) shared with the recipes."""
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
MAX_HEADER_LINES = 12  # what, the one idea, the launch line, the measured result
MAX_PARAMETERS = 14  # the GPT-OSS-20B notebook: its 13 and torch_compile
# Test machinery that belongs in tests/hooks, and values or stamps computed only so that a test can read them:
# never in a lesson (issue 31 names the ones that were).
TEST_ONLY_NAMES = ("patch_for_cpu", "trl_cpu", "stop_after_step", "crash_while_saving_step", "CrashWhileWriting",
                   "RecordingCheckpointIO", "lightning_started_processes", "os.kill", "os._exit", "SIGKILL",
                   "fail_once_at_epoch", "COOKBOOK_TEST_HOOKS", "written_by_rank", "facts", "collective_in_stack",
                   "checkpoint_quantization", "wrapped_model", "trainer_world_size", "ResumableSampler",
                   "SealedCheckpointIO", "StopOnBrokenResume", "EpochHistory", "TrainLog",
                   "metrics.json: null", "standins", "hub_templates", "launch_contract", "engine_core", "_worker")
VOCABULARY = REPO / "docs" / "vocabulary.md"


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


# Their metadata is still the old one (issue 41 §7): other work on these folders was under way; the test says when fixed
@pytest.mark.parametrize("path", NOTEBOOKS)
def test_opening_a_notebook_in_jupyterlab_changes_nothing(path):
    # JupyterLab fills in the kernelspec and the whole language_info from the kernel it starts and marks the notebook
    # changed when they differ from the file's: closing an unrun notebook then asks to save. Fix: python
    # tests/jupyterlab_metadata.py PATH (or open and save it in JupyterLab). Python's patch version is this machine's.
    from jupyterlab_metadata import as_jupyterlab_saves

    text = (REPO / path).read_text()
    try:
        saved = as_jupyterlab_saves(text)
    except KeyError as missing:  # jupyter_client's NoSuchKernel: e.g. cookbook-axolotl before make setup-axolotl
        pytest.skip(f"kernel {missing} is not installed here")
    committed = nbformat.reads(text, as_version=4).metadata.get("language_info", {}).get("version", "")
    here = nbformat.reads(saved, as_version=4).metadata.language_info.version
    if committed.rsplit(".", 1)[0] == here.rsplit(".", 1)[0]:  # another patch release of the same Python: not the files'
        saved = saved.replace(f'"version": "{here}"', f'"version": "{committed}"', 1)
    assert saved == text, f"{path}: JupyterLab would change it on opening (metadata or JSON layout)"


def test_the_sweep_notebook_says_where_background_runs_print_and_what_to_expect_without_gpus():
    # issue 41 §3 and §6, documented choices: Jupyter sends a background thread's output to the cell running when it
    # arrives (the cell that launched it has ended), and the defaults take minutes on a 2-core machine without GPUs
    cells = _cells("notebooks/01_sweeps_and_remote.ipynb")
    launch = next(i for i, c in enumerate(cells) if "distributed_async(" in c.source and c.cell_type == "code")
    said = " ".join(cells[launch - 1].source.split())
    assert cells[launch - 1].cell_type == "markdown" and "appear under the cell that is running when they arrive" in said
    assert "**Without GPUs**" in cells[0].source and "about 6 minutes" in " ".join(cells[0].source.split())


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
    """The names of docs/vocabulary.md's table."""
    return set(re.findall(r"^\| `([a-z0-9_]+)` \|", VOCABULARY.read_text(), flags=re.MULTILINE))


def users_of_each_name() -> dict:
    """{setting name: the notebooks and recipes that take it}."""
    users = {}
    for path in NOTEBOOKS:
        for name in declared_parameters(REPO / path):
            users.setdefault(name, set()).add(path)
    for recipe in RECIPES:
        for name in recipe_flags(recipe):
            users.setdefault(name, set()).add(f"recipes/{recipe}")
    return users


def long_cells(path) -> list[str]:
    return [f"cell {i} has {len(c.source.splitlines())} lines" for i, c in enumerate(_cells(path))
            if c.cell_type == "code" and len(c.source.splitlines()) > MAX_CELL_LINES]


def names_only_for_tests(path) -> list[str]:
    text = "\n".join(c.source for c in _cells(path))
    return [name for name in TEST_ONLY_NAMES if re.search(rf"(?<![\w]){re.escape(name)}(?!\w)", text)]


def header_lines(path) -> int:
    """Lines of text in the first cell (the blank lines between paragraphs aside)."""
    return sum(1 for line in _cells(path)[0].source.splitlines() if line.strip())


def parameters_not_read_first(path) -> list[str]:
    """Where the notebook does not read its parameters with read_parameters() before it launches anything."""
    code = [c.source for c in _cells(path) if c.cell_type == "code"]
    reads = [i for i, source in enumerate(code) if re.search(r"^args = read_parameters\(\)", source, re.MULTILINE)]
    launches = [i for i, source in enumerate(code) if "distributed" in source and "import" not in source]
    if not reads:
        return ["no `args = read_parameters()`"]
    return [f"code cell {i} uses `distributed` before `args = read_parameters()`" for i in launches if i < reads[0]]


def recipe_flags(recipe) -> set:
    """The keys of a recipe's config files and the --flags of its scripts' argparse parsers (hidden ones aside);
    workload.yaml is Databricks' job description, whose keys are the platform's, not settings."""
    folder = REPO / "recipes" / recipe
    flags = set()
    for config in set(folder.glob("*.yaml")) - {folder / "workload.yaml"}:
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
    assert not found, (f"{path} holds test machinery {found}: the tests bring their CPU fixes, crash and "
                       "recording hooks themselves (tests/hooks)")


@pytest.mark.parametrize("path", NOTEBOOKS)
def test_a_header_is_at_most_12_lines(path):
    assert header_lines(path) <= MAX_HEADER_LINES, (
        f"{path}: the header has {header_lines(path)} lines; keep what it does, the one idea, the launch line and the "
        "measured result, and move history and notes about machines to benchmarks/README.md")


@pytest.mark.parametrize("path", NOTEBOOKS)
def test_a_notebook_has_at_most_14_parameters(path):
    names = declared_parameters(REPO / path)
    assert len(names) <= MAX_PARAMETERS, (
        f"{path}: {len(names)} parameters; keep the ones the lesson needs, the rest through `config` or the "
        "framework's own config object")


@pytest.mark.parametrize("path", NOTEBOOKS)
def test_parameters_are_read_with_read_parameters_before_any_launch(path):
    assert not parameters_not_read_first(path), f"{path}: {parameters_not_read_first(path)}"


def test_every_name_two_notebooks_or_recipes_share_is_in_the_vocabulary():
    shared = {name: sorted(users) for name, users in users_of_each_name().items() if len(users) >= 2}
    missing = {name: users for name, users in shared.items() if name not in vocabulary()}
    assert not missing, f"add these shared settings to docs/vocabulary.md (or use a name that is there): {missing}"


def test_every_name_in_the_vocabulary_is_shared_by_two_notebooks_or_recipes():
    users = users_of_each_name()
    lonely = {name: sorted(users.get(name, ())) for name in vocabulary() if len(users.get(name, ())) < 2}
    assert not lonely, f"docs/vocabulary.md lists settings no longer shared (remove them): {lonely}"
