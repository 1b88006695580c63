"""The two Ray Train recipes, run as Databricks' AI Runtime runs them: their workload.yaml's command (`python
recipes/<recipe>/train.py --config "$HYPERPARAMETERS_PATH" --num_workers "$LOCAL_WORLD_SIZE"`, as the READMEs say) with
the platform's variables for one node (tests/workload_runs.py), joining a 2-node Ray cluster on 127.0.0.1 with one CPU
per node (tests/ray_cluster.py, RAY_ADDRESS), so the two workers always land on two different nodes. Tiny sizes; the
GPU figures are in benchmarks/results/ray/."""
import sys
from pathlib import Path

import pytest
import torch
from mlflow_runs import assert_logged_text_generator, load_logged_model, tracked_runs
from ray_cluster import start_loopback_cluster, stop_loopback_cluster
from workload_runs import run_workload, workload

from nbhelpers.training import checkpoints

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "data"))
from make_image_folders import make_image_folders  # noqa: E402

# Ray Train's preemption watcher (node-drain notices, irrelevant here) costs one more process per
# worker group on a 2-core machine.
RECIPE_TEST_SETTINGS = {"RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "0"}
# Under pytest-timeout's 600 s (pyproject.toml), so that a recipe that hangs is killed by run_workload, whose failure
# shows the recipe's log, rather than by pytest, which shows only the test's own stack. Alone, a run takes about 170 s.
WORKLOAD_TIMEOUT_S = 480


@pytest.fixture(scope="module")
def ray_cluster():
    """The module's cluster; the recipes join it as drivers with the environment it yields (RAY_ADDRESS, ...)."""
    cluster, env = start_loopback_cluster(nodes=2, cpus_per_node=1)
    try:
        yield env
    finally:
        stop_loopback_cluster(cluster)


def run_recipe(recipe: str, settings: dict, env: dict, tmp_path: Path, timeout: int) -> tuple[dict, object]:
    """The workload's command with SETTINGS as its parameters, 2 workers (LOCAL_WORLD_SIZE), output in tmp_path/out
    and Ray Train's checkpoints under it (as on the Volume); (its metrics.json, the platform's MLflow run it logged
    into)."""
    output_dir = tmp_path / "out"
    return run_workload(recipe, {**settings, "output_dir": output_dir, "storage_path": output_dir / "ray_results"},
                        tmp_path, env={**env, **RECIPE_TEST_SETTINGS}, local_world_size=2, timeout=timeout)


def test_ray_resnet50_resumes_from_its_last_checkpoint_after_a_worker_is_killed_and_its_loss_falls(ray_cluster, tmp_path):
    images = make_image_folders(tmp_path / "images", train_per_class=16, val_per_class=4, size=32)
    metrics, platform_run = run_recipe("ray_resnet50", {
        "dataset_name": images, "weights": "none", "num_train_epochs": 3, "per_device_train_batch_size": 16,
        "image_size": 32, "dataloader_num_workers": 0, "fail_once_at_epoch": 1,
    }, ray_cluster, tmp_path, timeout=WORKLOAD_TIMEOUT_S)
    assert metrics["killed_worker"], "the test hook did not kill a worker"
    epochs = metrics["epochs"]
    assert [e["epoch"] for e in epochs] == [0, 1, 2], "an epoch ran twice or not at all: not resumed from the checkpoint"
    # The first worker group trained epoch 0 and died in epoch 1; the second began at epoch 1, from
    # the checkpoint of epoch 0 (a restart from scratch would report started_at_epoch 0 again).
    assert [e["started_at_epoch"] for e in epochs] == [0, 1, 1]
    assert metrics["worker_group_starts"] == [0, 1]
    assert metrics["world_size"] == 2
    # From scratch the epochs' mean loss went 3.12 -> 3.06 -> 2.56 (0.82x); at learning rate 0 2.81 -> 2.72 (0.97x).
    assert metrics["final_loss"] < 0.9 * metrics["initial_loss"], metrics["losses"]
    # images/s is every worker's training images of the epoch (10 classes x 16) over its timed seconds.
    for e in epochs:
        assert e["images_per_s"] * e["train_s"] == pytest.approx(10 * 16, rel=1e-6), e
        assert 0 < e["train_s"] <= e["epoch_s"], e

    # Ray's copies of the sealed checkpoints verify; save_total_limit 2 kept the last two epochs.
    kept = sorted((tmp_path / "out" / "ray_results" / "ray_resnet50").glob("checkpoint_*/"))
    assert [checkpoints.verify(folder)["epoch"] for folder in kept] == [1, 2]
    [run] = tracked_runs(tmp_path, workload("ray_resnet50")["experiment_name"], {"learning_rate": "0.001",
                                                                                 "num_workers": "2"}, "train_loss")
    assert run.info.run_id == platform_run.info.run_id
    info, model = load_logged_model(tmp_path, run, "pytorch")
    assert info.signature is not None
    assert model(torch.randn(1, 3, 32, 32)).shape == (1, 10)


def test_ray_qwen2_5_3b_resumes_from_its_checkpoint_after_a_worker_is_killed_and_lowers_the_loss(ray_cluster, standin,
                                                                                               tmp_path):
    metrics, platform_run = run_recipe("ray_qwen2_5_3b", {
        "model_name_or_path": standin("qwen2.5-3b"), "dataset_name": REPO / "data" / "alpaca",
        "max_length": 128, "max_steps": 30, "learning_rate": 2e-3, "logging_steps": 5,
        "timing_warmup_steps": 2, "save_steps": 10, "fail_once_at_step": 12,
    }, ray_cluster, tmp_path, timeout=WORKLOAD_TIMEOUT_S)
    assert metrics["killed_worker"], "the test hook did not kill a worker"
    assert metrics["world_size"] == 2
    assert [h["step"] for h in metrics["history"]] == [5, 10, 15, 20, 25, 30]  # each once, across the restart
    assert metrics["worker_group_starts"] == [0, 10]  # the second group began at step 10's checkpoint, not at 0
    assert metrics["final_loss"] < 0.6 * metrics["initial_loss"], metrics["losses"]
    # tokens/s is every worker's tokens of the timed steps over their seconds: the second group's steps 13..30 (after
    # its 2 warm-up steps from step 10), each 2 workers x 4 packed blocks of 128 tokens.
    assert metrics["timed_steps"] == 30 - 10 - 2, metrics["history"]
    assert metrics["tokens_per_s"] * metrics["timed_seconds"] == pytest.approx(18 * 2 * 4 * 128, rel=1e-6), metrics
    assert 0 < metrics["timed_seconds"] < metrics["wall_s"], metrics
    saved = Path(metrics["checkpoint"])
    assert (saved / "config.json").exists() and (saved / "model.safetensors").exists()
    assert checkpoints.verify(saved) == {"step": 30, "final_model": True}  # Ray's copy of what rank 0 sealed

    [run] = tracked_runs(tmp_path, workload("ray_qwen2_5_3b")["experiment_name"], {"learning_rate": "0.002",
                                                                                   "max_length": "128"}, "loss")
    assert run.info.run_id == platform_run.info.run_id
    assert_logged_text_generator(tmp_path, run)
