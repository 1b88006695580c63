"""Summarise benchmarks/gpu/one_gpu.sh: which notebooks ran on one GPU and what each said, old vs new ddp_mlp
(issue 17), and what the project's MLflow store holds (issue 18).

Usage: python benchmarks/gpu/one_gpu_summary.py RESULTS_DIR TRACKING_URI
Writes RESULTS_DIR/ddp_mlp_old_vs_new.json and RESULTS_DIR/mlflow.json; prints one line per run.
"""
import csv
import json
import sys
from pathlib import Path

# what each run's one-rank statement is (metrics.json), besides its exit code
SAYS = {"getting_started": ("world_size", "error_named_rank"), "ddp_mlp": ("final_loss", "params_identical_across_ranks", "samples_per_s"),
        "ddp_mlp_old": ("final_loss", "samples_per_s"),
        "fsdp2_transformer": ("every_param_sharded_1_over_world", "samples_per_s", "checkpoints"),
        "fsdp2_transformer_resumed": ("resumed_from", "every_param_sharded_1_over_world", "samples_per_s", "unsharded_eval_accuracy"),
        "ddp_retinanet": ("final_loss_vs_initial", "weights_identical_across_ranks", "images_per_s", "val_map"),
        "ddp_two_tower": ("test_auroc", "test_auroc_same_on_all_ranks", "samples_per_s"),
        "choose_your_technique": ("num_plans", "plans_that_fit")}


def old_vs_new(folder: Path) -> dict | None:
    try:
        old, new = (json.loads((folder / f"{name}.json").read_text()) for name in ("ddp_mlp_old", "ddp_mlp"))
    except FileNotFoundError:
        return None
    pairs = list(zip(old["losses"], new["losses"]))
    return {"what": "ddp_mlp at commit 9f76f1e and now, one GPU, the same settings, one after the other",
            "epochs": [len(old["losses"]), len(new["losses"])],
            "losses_identical": old["losses"] == new["losses"],
            "max_abs_loss_difference": max(abs(a - b) for a, b in pairs) if pairs else None,
            "samples_per_s": {"old": old["samples_per_s"], "new": new["samples_per_s"]},
            "new_vs_old_samples_per_s": new["samples_per_s"] / old["samples_per_s"],
            "devices": new["environment"]["devices"], "date": new["environment"]["date"]}


def mlflow_store(tracking_uri: str) -> dict:
    import mlflow

    client = mlflow.MlflowClient(tracking_uri)
    mlflow.set_tracking_uri(tracking_uri)
    summary = {}
    for experiment in client.search_experiments():
        for run in client.search_runs([experiment.experiment_id]):
            models = mlflow.search_logged_models(experiment_ids=[experiment.experiment_id], output_format="list",
                                                 filter_string=f"source_run_id = '{run.info.run_id}'")
            summary[f"{experiment.name}/{run.info.run_id[:8]}"] = {
                "status": run.info.status, "params": len(run.data.params),
                "metrics": sorted(k for k in run.data.metrics if not k.startswith("system/")),
                "system_metrics": sorted(k for k in run.data.metrics if k.startswith("system/")),
                "gpu_system_metrics": any(k.startswith("system/gpu") for k in run.data.metrics),
                "models": [m.name for m in models]}
    return summary


def main(folder: Path, tracking_uri: str) -> None:
    with open(folder / "runs.tsv") as f:
        runs = [row for row in csv.DictReader(f, delimiter="\t") if row.get("exit_code") is not None]
    for row in runs:
        path = folder / f"{row['name']}.json"
        metrics = json.loads(path.read_text()) if path.exists() else {}
        said = {key: metrics.get(key) for key in SAYS.get(row["name"], ())}
        print(f"{row['name']:28s} exit {row['exit_code']:>3s} in {row['seconds']:>4s} s  {said}")
    comparison = old_vs_new(folder)
    if comparison:
        (folder / "ddp_mlp_old_vs_new.json").write_text(json.dumps(comparison, indent=2))
        print("ddp_mlp old vs new:", {k: comparison[k] for k in ("losses_identical", "max_abs_loss_difference",
                                                                 "new_vs_old_samples_per_s")})
    try:
        store = mlflow_store(tracking_uri)
    except Exception as error:  # noqa: BLE001 - the summary of the rest still counts
        store = {"error": f"{type(error).__name__}: {error}"}
    (folder / "mlflow.json").write_text(json.dumps(store, indent=2))
    for name, run in store.items():
        print(f"mlflow {name}: {run}" if name == "error" else
              f"mlflow {name}: {run['status']}, {run['params']} params, metrics {run['metrics']}, models {run['models']}, "
              f"GPU system metrics {run['gpu_system_metrics']}")


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2])
