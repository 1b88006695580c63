"""What the TRL (and Unsloth) notebooks' test files share: the kill-and-resume run, the MLflow run's contents."""
import mlflow
import papermill
import pytest
import torch
from harness import hook_records, run_notebook
from notebook_cases import NotebookCase

from nbhelpers.training import checkpoints


def run_killed_then_resumed(case: NotebookCase, workdir, standin, **after) -> dict:
    """Run `case` until the last rank is SIGKILLed right after the first sealed checkpoint (checkpoint-10), then the
    same command again (plus `after`: settings that change nothing before the end of training); the resumed run's
    metrics."""
    killed = NotebookCase(case.notebook, case.parameters, timeout=case.timeout, hooks=("kill_rank_after_checkpoint=1",))
    with pytest.raises(papermill.PapermillExecutionError):  # which rank the error blames is the launcher's test
        run_notebook(killed, workdir, standin)
    [kill] = hook_records(workdir, "kill_rank_after_checkpoint")  # the last rank died right after that checkpoint
    folder = workdir / "output" / "checkpoints"
    assert kill["path"] == str(folder / "checkpoint-10")
    assert sorted(p.name for p in folder.glob("checkpoint-*")) == ["checkpoint-10"], "it should have died there"
    checkpoints.verify(folder / "checkpoint-10")  # complete: every file matches its manifest
    resumed, _ = run_notebook(NotebookCase(case.notebook, {**case.parameters, **after}, timeout=case.timeout), workdir,
                              standin)
    assert resumed["resumed_from"][0].endswith("checkpoint-10")
    return resumed


def assert_mlflow_run_holds_settings_metrics_and_a_loadable_model(tracking_uri: str, metrics: dict) -> None:
    """The project's store (beside output_dir) holds the run: the notebook's and the Trainer's settings, the loss
    curve, and the adapter as a transformers model (text in, text out) that loads and computes logits."""
    client = mlflow.MlflowClient(tracking_uri)
    [experiment] = [e for e in client.search_experiments() if e.name != "Default"]
    [run] = client.search_runs([experiment.experiment_id], "attributes.status = 'FINISHED'")
    assert run.data.params["notebook.learning_rate"] == run.data.params["learning_rate"]  # notebook's and Trainer's
    assert client.get_metric_history(run.info.run_id, "loss")[-1].value == pytest.approx(metrics["final_loss"])
    [model] = client.search_logged_models([run.info.experiment_id], filter_string=f"source_run_id='{run.info.run_id}'")
    mlflow.set_tracking_uri(tracking_uri)
    signature = mlflow.models.get_model_info(model.model_uri).signature
    assert signature.inputs.to_dict() == signature.outputs.to_dict() == [{"type": "string", "required": True}]
    loaded = mlflow.transformers.load_model(model.model_uri, return_type="components")
    tokenizer = loaded["tokenizer"]
    with torch.no_grad():
        logits = loaded["model"](**tokenizer("Hello", return_tensors="pt")).logits
    assert logits.shape[-1] == loaded["model"].config.vocab_size and torch.isfinite(logits).all()
