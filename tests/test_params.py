"""nbhelpers.read_parameters: a notebook's settings as one namespace; bad papermill parameters fail at once."""
import subprocess
import sys

import nbformat
import papermill
import pytest

from harness import REPO
from nbhelpers.training.params import INJECTED_HEADER, ParameterError, parameters_from_cells

PARAMETERS_CELL = '''output_dir = "runs/x"  # where metrics.json goes
num_gpus = None  # processes to start
num_train_epochs = 20  # passes over the data
learning_rate = 0.001  # Adam learning rate
bf16 = True  # bf16 autocast
max_ratings: int | None = 100000  # ratings kept; None keeps all
'''
IMPORTS_CELL = "import torch\nfrom nbhelpers import read_parameters"


def injected(**values) -> str:
    """The cell papermill injects after the parameters cell."""
    return INJECTED_HEADER + "\n" + "".join(f"{name} = {value!r}\n" for name, value in values.items())


def test_parameters_cell_values_come_back_as_a_namespace():
    args = parameters_from_cells(["", PARAMETERS_CELL, IMPORTS_CELL])
    assert vars(args) == {"output_dir": "runs/x", "num_gpus": None, "num_train_epochs": 20, "learning_rate": 0.001,
                          "bf16": True, "max_ratings": 100000}


def test_papermill_values_replace_the_defaults():
    args = parameters_from_cells(["", PARAMETERS_CELL, injected(num_train_epochs=3, output_dir="/tmp/y"), IMPORTS_CELL])
    assert (args.num_train_epochs, args.output_dir, args.learning_rate) == (3, "/tmp/y", 0.001)


def test_misspelt_parameter_is_refused_with_a_suggestion_and_the_list():
    with pytest.raises(ParameterError) as error:
        parameters_from_cells(["", PARAMETERS_CELL, injected(learnig_rate=0.01), IMPORTS_CELL])
    message = str(error.value)
    assert "unknown parameter 'learnig_rate' (did you mean 'learning_rate'?)" in message
    assert "num_train_epochs=20" in message and "output_dir='runs/x'" in message  # the notebook's parameters


def test_wrong_type_is_refused_naming_the_expected_type():
    expected = r"'num_train_epochs' must be int \(its default is 20\), got 'abc' \(str\)"
    with pytest.raises(ParameterError, match=expected):
        parameters_from_cells(["", PARAMETERS_CELL, injected(num_train_epochs="abc"), IMPORTS_CELL])


def test_every_bad_parameter_is_named_in_one_error():
    with pytest.raises(ParameterError, match="learnig_rate.*num_train_epochs"):
        parameters_from_cells(["", PARAMETERS_CELL, injected(learnig_rate=0.1, num_train_epochs="abc")])


def test_bool_is_not_taken_for_an_int():
    with pytest.raises(ParameterError, match="'num_train_epochs' must be int"):
        parameters_from_cells(["", PARAMETERS_CELL, injected(num_train_epochs=True)])


def test_int_is_accepted_for_a_float_and_becomes_one():
    args = parameters_from_cells(["", PARAMETERS_CELL, injected(learning_rate=1)])
    assert args.learning_rate == 1.0 and type(args.learning_rate) is float


def test_none_default_accepts_any_value():
    assert parameters_from_cells(["", PARAMETERS_CELL, injected(num_gpus=2)]).num_gpus == 2


def test_annotation_states_the_accepted_types():
    assert parameters_from_cells(["", PARAMETERS_CELL, injected(max_ratings=None)]).max_ratings is None
    with pytest.raises(ParameterError, match=r"'max_ratings' must be int or None"):
        parameters_from_cells(["", PARAMETERS_CELL, injected(max_ratings="all")])


def test_latest_parameters_cell_is_read_when_it_was_edited_and_run_again():
    edited = PARAMETERS_CELL.replace("num_train_epochs = 20", "num_train_epochs = 2")
    args = parameters_from_cells(["", PARAMETERS_CELL, IMPORTS_CELL, "args = read_parameters()", edited, "x = f(1)"])
    assert args.num_train_epochs == 2


def test_injected_values_without_a_parameters_cell_are_an_error():
    with pytest.raises(ParameterError, match="no cell tagged `parameters`"):
        parameters_from_cells(["", injected(num_train_epochs=3), IMPORTS_CELL])


def read_in_a_kernel_running_in(folder, monkeypatch, *cells):
    """read_parameters() as a kernel whose cells were `cells` and whose current folder is `folder` finds them."""
    import types

    import nbhelpers.training.params as params

    monkeypatch.chdir(folder)
    shell = types.SimpleNamespace(user_ns={"In": ["", *cells]})
    monkeypatch.setattr(params, "get_ipython", lambda: shell, raising=False)
    return params.read_parameters()


def test_one_mlflow_store_for_the_cookbook_whichever_folder_the_kernel_runs_in(tmp_path, monkeypatch):
    # JupyterLab runs a kernel in its notebook's folder, papermill in the caller's: the default output_dir
    # "runs/x" means the repository's runs/x in each, and so one store, the one the README's `mlflow ui` line opens
    from nbhelpers.training.tracking import mlflow_tracking_uri

    monkeypatch.delenv("COOKBOOK_ROOT", raising=False)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("DATABRICKS_RUNTIME_VERSION", raising=False)
    for folder in (REPO / "notebooks" / "pytorch", REPO / "notebooks", REPO, tmp_path):
        args = read_in_a_kernel_running_in(folder, monkeypatch, PARAMETERS_CELL)
        assert args.output_dir == str(REPO / "runs" / "x"), folder
        assert mlflow_tracking_uri(args.output_dir) == f"sqlite:///{REPO / 'runs' / 'mlflow.db'}"
    assert "`mlflow ui --backend-store-uri sqlite:///runs/mlflow.db`" in (REPO / "README.md").read_text()
    # an absolute output_dir (papermill -p output_dir /abs) stays; COOKBOOK_ROOT moves the relative ones
    args = read_in_a_kernel_running_in(REPO, monkeypatch, PARAMETERS_CELL, injected(output_dir=str(tmp_path / "y")))
    assert args.output_dir == str(tmp_path / "y")
    monkeypatch.setenv("COOKBOOK_ROOT", str(tmp_path))
    args = read_in_a_kernel_running_in(REPO / "notebooks", monkeypatch, PARAMETERS_CELL)
    assert args.output_dir == str(tmp_path / "runs" / "x")


def test_outside_a_notebook_it_says_that_scripts_use_argparse():
    run = subprocess.run([sys.executable, "-c", "from nbhelpers import read_parameters; read_parameters()"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode != 0 and "argparse" in run.stderr and "Jupyter kernel" in run.stderr


@pytest.mark.notebook
def test_bad_papermill_parameters_stop_the_notebook_in_its_first_cell_naming_them(tmp_path):
    notebook = REPO / "notebooks" / "pytorch" / "ddp_mlp.ipynb"
    executed = tmp_path / "executed.ipynb"
    with pytest.raises(papermill.PapermillExecutionError) as error:
        papermill.execute_notebook(str(notebook), str(executed), cwd=str(tmp_path), execution_timeout=120,
                                   progress_bar=False, parameters={"output_dir": str(tmp_path / "out"),
                                                                   "learnig_rate": 0.1, "num_train_epochs": "abc"})
    assert error.value.ename == "ParameterError"
    assert "unknown parameter 'learnig_rate' (did you mean 'learning_rate'?)" in error.value.evalue
    assert "'num_train_epochs' must be int (its default is 20), got 'abc' (str)" in error.value.evalue
    cells = [c for c in nbformat.read(executed, as_version=4).cells if c.cell_type == "code"]
    failed = next(i for i, c in enumerate(cells) if any(o.output_type == "error" for o in c.outputs))
    assert "read_parameters()" in cells[failed].source, "the parameters must be checked before anything else runs"
    assert all(c.execution_count is None for c in cells[failed + 1:]), "nothing after the check may run"
    assert not (tmp_path / "out").exists()
