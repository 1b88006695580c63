"""What the recipe tests read back from a project's MLflow store (RUNS_FOLDER/mlflow.db)."""
from __future__ import annotations

import importlib
from pathlib import Path


def tracked_runs(runs_folder: Path, experiment: str, params: dict, metric: str) -> list:
    """The MLflow runs of `experiment` in the project's store (RUNS_FOLDER/mlflow.db), oldest first, each with
    `params` among its parameters and `metric` logged more than once (a curve, not just a final value)."""
    import mlflow

    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{runs_folder / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name(experiment).experiment_id],
                              order_by=["attributes.start_time ASC"])
    for run in runs:
        assert params.items() <= run.data.params.items(), run.data.params
        assert len(client.get_metric_history(run.info.run_id, metric)) > 1
    return runs


def load_logged_model(runs_folder: Path, run, flavor: str):
    """(its model info, the model as mlflow.FLAVOR.load_model gives it back) of the one MLflow model `run` logged."""
    import mlflow

    uri = f"sqlite:///{runs_folder / 'mlflow.db'}"
    [logged] = mlflow.MlflowClient(tracking_uri=uri).search_logged_models(
        [run.info.experiment_id], filter_string=f"source_run_id = '{run.info.run_id}'")
    previous = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(uri)
    try:
        return (mlflow.models.get_model_info(logged.model_uri),
                importlib.import_module(f"mlflow.{flavor}").load_model(logged.model_uri))
    finally:
        mlflow.set_tracking_uri(previous)


def assert_logged_text_generator(runs_folder: Path, run) -> None:
    """The run's MLflow model loads back as a text-generation pipeline, with a text-in, text-out signature."""
    info, generator = load_logged_model(runs_folder, run, "transformers")
    assert "string" in str(info.signature.inputs) and "string" in str(info.signature.outputs), info.signature
    reply = generator("### Instruction:\nSay hi\n\n### Response:\n", max_new_tokens=4, do_sample=False)
    assert isinstance(reply[0]["generated_text"], str)
