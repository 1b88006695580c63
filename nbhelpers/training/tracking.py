"""Where the runs are tracked (MLflow): one store for every run of the project, its experiments, a notebook's run.

    mlflow_experiment("ddp_mlp", mlflow_tracking_uri(args.output_dir))   # runs/mlflow.db beside runs/ddp_mlp
    run_id = start_mlflow_run(args, experiment="axolotl_olmo3")           # the notebook's run, shared with its Trainer
"""
from __future__ import annotations

import os
from pathlib import Path


def mlflow_tracking_uri(output_dir, tracking_uri: str | None = None) -> str:
    """Where a run is tracked: `tracking_uri`, else MLFLOW_TRACKING_URI (MLflow's own setting), else on Databricks
    the workspace ("databricks"), else one SQLite store for every run of the project: the folder above output_dir.

    The notebooks' runs go to `runs/<name>` under the cookbook's root by default (read_parameters() starts a relative
    output_dir there: params.cookbook_root, $COOKBOOK_ROOT or the repository), so all of them land in
    `runs/mlflow.db` there, one store to browse from the repository's folder:
    `mlflow ui --backend-store-uri sqlite:///runs/mlflow.db`.
    """
    if tracking_uri or os.environ.get("MLFLOW_TRACKING_URI"):
        return tracking_uri or os.environ["MLFLOW_TRACKING_URI"]
    if os.environ.get("DATABRICKS_RUNTIME_VERSION"):
        return "databricks"
    return f"sqlite:///{Path(output_dir).resolve().parent / 'mlflow.db'}"


def mlflow_experiment(name: str, tracking_uri: str) -> str:
    """Precondition: `tracking_uri` as mlflow_tracking_uri() returns it. Make `name` this process's MLflow experiment.

    A new experiment in a local SQLite store keeps its artifacts (models, plots) beside the store, in
    `mlartifacts/`: MLflow's default, `./mlruns`, would land wherever the notebook runs. Returns its id.
    """
    import mlflow

    mlflow.set_tracking_uri(tracking_uri)
    try:
        found = mlflow.get_experiment_by_name(name)
    except mlflow.exceptions.MlflowException as exc:
        if "out-of-date database schema" not in str(exc):
            raise
        raise RuntimeError(  # MLflow's own advice (`mlflow db upgrade`) fails on a store a newer MLflow migrated
            f"The MLflow store {tracking_uri} has another schema than this environment's MLflow "
            f"{mlflow.__version__} ({exc.message.split('. ')[0]}): most likely a newer MLflow (yours) opened it and "
            "migrated it, and MLflow cannot take a store back. Give the cookbook's runs a store of their own, e.g. "
            "export MLFLOW_TRACKING_URI=sqlite:///$PWD/runs/cookbook.db (or use MLflow "
            f"{mlflow.__version__} for both).") from None
    if found is None:
        store = Path(tracking_uri.removeprefix("sqlite:///")) if tracking_uri.startswith("sqlite:///") else None
        if store is not None:
            store.parent.mkdir(parents=True, exist_ok=True)
        artifacts = (store.parent / "mlartifacts").as_uri() if store else None
        try:
            mlflow.create_experiment(name, artifact_location=artifacts)
        except mlflow.exceptions.MlflowException:  # another process created it meanwhile
            pass
    return mlflow.set_experiment(name).experiment_id


def start_mlflow_run(args, experiment: str) -> str:
    """Start this notebook run's MLflow run, log the notebook's settings (as `notebook.<name>`), return its id.

    The store: mlflow_tracking_uri (MLFLOW_TRACKING_URI, else the project's store beside args.output_dir). The
    Trainer's MLflow callback (`report_to=["mlflow"]`, rank 0) logs its settings and metrics into the same run: it
    reads MLFLOW_RUN_ID, set here and inherited by the ranks, and with MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING MLflow
    samples CPU, memory and (where nvidia-ml-py is installed) GPU use while it trains.
    """
    import mlflow

    os.environ.pop("MLFLOW_RUN_ID", None)  # a second run of the notebook in this kernel starts a new MLflow run
    tracking_uri = mlflow_tracking_uri(args.output_dir)
    mlflow_experiment(experiment, tracking_uri)
    with mlflow.start_run(run_name=Path(args.output_dir).name) as run:
        mlflow.log_params({f"notebook.{name}": value for name, value in vars(args).items()})
    os.environ.update(MLFLOW_TRACKING_URI=tracking_uri, MLFLOW_RUN_ID=run.info.run_id,
                      MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING="true")
    return run.info.run_id
