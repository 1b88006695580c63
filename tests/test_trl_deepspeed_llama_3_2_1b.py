"""notebooks/trl/deepspeed_llama_3_2_1b.ipynb: its smoke cases; ZeRO-3 really partitions (the Trainer ran a
DeepSpeedEngine at stage 3, each rank holds about half, from a JSON file too); the eval loss falls; a killed run
resumes to the uninterrupted losses; the MLflow run; a gated model without a token stops before any rank starts.
The cases' runs are shared (notebook_run), so this file's tests stay on one pytest-xdist worker."""
import nbformat
import papermill
import pytest
from harness import assert_case_passes, case_ids, hook_records, project_store, run_notebook
from notebook_cases import CASES, NotebookCase
from trl_checks import assert_mlflow_run_holds_settings_metrics_and_a_loadable_model, run_killed_then_resumed

NOTEBOOK = "notebooks/trl/deepspeed_llama_3_2_1b.ipynb"
MINE = [c for c in CASES if c.notebook == NOTEBOOK]
SMOKE, ONE_RANK = MINE
pytestmark = pytest.mark.notebook


@pytest.mark.parametrize("case", MINE, ids=case_ids(MINE))
def test_notebook_meets_its_expectations(case, notebook_run):
    assert_case_passes(case, notebook_run)


def test_zero3_partitions_the_parameters_and_the_eval_loss_falls(notebook_run):
    metrics, _, workdir = notebook_run(SMOKE)
    records = sorted(hook_records(workdir, "record_trainer"), key=lambda r: r["rank"])
    assert [(r["world_size"], r["wrapped"], r["zero_stage"]) for r in records] == [(2, "DeepSpeedEngine", 3)] * 2
    assert all(0.45 < r["held_fraction"] < 0.55 for r in records), records
    assert metrics["held_fraction"] == [r["held_fraction"] for r in records]  # what the notebook says it holds
    eval_losses = metrics["eval_losses"]
    assert len(eval_losses) == 3 and min(eval_losses) < 0.8 * eval_losses[0]  # on start, at 10 and at 20


def test_one_rank_takes_zero3_from_the_deepspeed_json_file(notebook_run):
    _, _, workdir = notebook_run(ONE_RANK)
    [record] = hook_records(workdir, "record_trainer")
    assert (record["wrapped"], record["zero_stage"], record["held_fraction"]) == ("DeepSpeedEngine", 3, 1.0)


def test_killed_run_resumes_to_the_uninterrupted_runs_losses(notebook_run, standin, tmp_path):
    uninterrupted, _, _ = notebook_run(SMOKE)
    resumed = run_killed_then_resumed(SMOKE, tmp_path, standin)
    assert resumed["losses"] == uninterrupted["losses"]  # (the resumed run also evaluates on its start, at step 10)


def test_mlflow_store_holds_settings_metrics_and_a_loadable_model(notebook_run):
    metrics, _, workdir = notebook_run(SMOKE)
    assert_mlflow_run_holds_settings_metrics_and_a_loadable_model(project_store(workdir), metrics)


def test_a_model_that_cannot_be_found_stops_before_any_rank_starts(tmp_path):
    # The default is the gated meta-llama/Llama-3.2-1B-Instruct; offline it cannot be fetched.
    case = NotebookCase(NOTEBOOK, {"output_dir": "{output_dir}"}, timeout=120)
    with pytest.raises(papermill.PapermillExecutionError) as failure:
        run_notebook(case, tmp_path)
    message = str(failure.value)
    for needed in ("meta-llama/Llama-3.2-1B-Instruct", "not a folder on disk", "hub", "HF_TOKEN", "hf auth login"):
        assert needed in message, f"the error does not say {needed!r}: {message[-600:]}"
    executed = nbformat.read(tmp_path / "deepspeed_llama_3_2_1b.ipynb", as_version=4)
    launches = [c for c in executed.cells if c.cell_type == "code" and ".distributed(" in c.source]
    assert launches and all(c.execution_count is None for c in launches), "a rank was started"
    assert not (tmp_path / "output" / "metrics.json").exists()
