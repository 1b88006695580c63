"""nbhelpers.training.metrics.write_metrics: one call turns the ranks' results into metrics.json."""
import json

import pytest

import torch

from nbhelpers.training.metrics import write_metrics

RESULTS = [  # what train.distributed(args) returns on 2 ranks
    {"losses": [2.0, 1.0], "samples_per_s": 90.0, "peak_memory_bytes": 100, "params": torch.ones(8),
     "steps": torch.tensor(5)},
    {"losses": [2.0, 1.0], "samples_per_s": 110.0, "peak_memory_bytes": 120, "params": torch.ones(8),
     "steps": torch.tensor(5)},
]


def written(tmp_path, *args, **metrics) -> dict:
    return json.loads(write_metrics(tmp_path, *args, **metrics).read_text())


def test_ranks_results_become_the_world_size_and_one_list_per_key(tmp_path):
    metrics = written(tmp_path, RESULTS)
    assert metrics["world_size"] == 2
    assert metrics["peak_memory_bytes"] == [100, 120] and metrics["samples_per_s"] == [90.0, 110.0]
    assert metrics["steps"] == [5, 5], "a one-number tensor is written as its number"
    assert "environment" in metrics and metrics["environment"]["versions"]["torch"]


def test_a_metric_given_by_name_replaces_the_ranks_list(tmp_path):
    metrics = written(tmp_path, RESULTS, samples_per_s=RESULTS[0]["samples_per_s"], losses=RESULTS[0]["losses"])
    assert metrics["samples_per_s"] == 90.0 and metrics["losses"] == [2.0, 1.0]


def test_losses_give_the_initial_and_final_loss_and_their_ratio(tmp_path):
    metrics = written(tmp_path, losses=[2.0, 1.5, 0.5])
    assert (metrics["initial_loss"], metrics["final_loss"], metrics["final_loss_vs_initial"]) == (2.0, 0.5, 0.25)


def test_a_value_json_cannot_hold_is_left_out_and_named(tmp_path, capsys):
    metrics = written(tmp_path, RESULTS)
    assert "params" not in metrics
    assert "leaves out the ranks' params" in capsys.readouterr().out


def test_a_fact_without_meaning_for_one_rank_is_written_as_null(tmp_path):
    path = write_metrics(tmp_path, RESULTS[:1], params_identical_across_ranks=None)
    assert '"params_identical_across_ranks": null' in path.read_text()


def test_mlflow_tracking_uri_defaults_to_one_store_beside_every_run(tmp_path):
    from nbhelpers.training.tracking import mlflow_tracking_uri

    assert mlflow_tracking_uri(tmp_path / "runs" / "a") == mlflow_tracking_uri(tmp_path / "runs" / "b")
    assert mlflow_tracking_uri(tmp_path / "runs" / "a") == f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}"
    assert mlflow_tracking_uri(tmp_path / "runs" / "a", "http://mlflow:5000") == "http://mlflow:5000"


def test_a_store_migrated_by_a_newer_mlflow_is_refused_with_what_to_do(tmp_path):
    import shutil
    import sqlite3

    from nbhelpers.training.tracking import mlflow_experiment

    mlflow_experiment("made_here", f"sqlite:///{tmp_path / 'mlflow.db'}")
    (tmp_path / "newer").mkdir()  # another path: MLflow keeps the store it opened for each one
    shutil.copy(tmp_path / "mlflow.db", tmp_path / "newer" / "mlflow.db")
    # a newer MLflow's migration: a revision this one does not know (MLflow 3.18's own, f4a9b2c7d1e6, served while the
    # cookbook had 3.17)
    with sqlite3.connect(tmp_path / "newer" / "mlflow.db") as store:
        store.execute("UPDATE alembic_version SET version_num = 'from_a_newer_mlflow'")
    with pytest.raises(RuntimeError, match=r"(?s)out-of-date database schema.*newer MLflow.*"
                                           r"export MLFLOW_TRACKING_URI=sqlite:///\$PWD/runs/cookbook.db"):
        mlflow_experiment("made_here", f"sqlite:///{tmp_path / 'newer' / 'mlflow.db'}")


def test_mlflow_experiment_of_a_local_store_keeps_its_artifacts_beside_the_store(tmp_path, monkeypatch):
    import mlflow

    from nbhelpers.training.tracking import mlflow_experiment, mlflow_tracking_uri

    monkeypatch.chdir(tmp_path)  # MLflow's default would be ./mlruns here
    uri = mlflow_tracking_uri(tmp_path / "runs" / "a")
    (tmp_path / "runs").mkdir()
    first = mlflow_experiment("notebook", uri)
    assert mlflow_experiment("notebook", uri) == first  # the same experiment the second time
    with mlflow.start_run():
        mlflow.log_text("hello", "note.txt")
    assert list((tmp_path / "runs" / "mlartifacts").rglob("note.txt"))
    assert not (tmp_path / "mlruns").exists()
