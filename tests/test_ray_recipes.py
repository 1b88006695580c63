"""The Ray Train recipes, run as their README says, on the 2-node loopback cluster (2 CPU workers).

Each runs as a separate driver (`python recipes/.../train.py`) that joins the shared test cluster
through RAY_ADDRESS, on tiny data; the assertions read the metrics.json the recipe writes.
"""
import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "data"))
from make_image_folders import make_image_folders  # noqa: E402

# Ray Train's preemption watcher (node-drain notices, irrelevant here) costs one more process per
# worker group on a 2-core machine.
TEST_SETTINGS = {"RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "0"}


def run_recipe(recipe: str, args: list, env: dict, output_dir: Path, timeout: int) -> dict:
    proc = subprocess.run([sys.executable, str(REPO / "recipes" / recipe / "train.py"), *map(str, args),
                           "--num-workers", "2", "--output-dir", str(output_dir)],
                          env={**env, **TEST_SETTINGS}, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{recipe} failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-6000:]}"
    return json.loads((output_dir / "metrics.json").read_text())


def test_ray_resnet50_resumes_from_its_last_checkpoint_after_a_worker_is_killed_and_its_loss_falls(ray_cluster, tmp_path):
    images = make_image_folders(tmp_path / "images", train_per_class=16, val_per_class=4, size=32)
    metrics = run_recipe("ray_resnet50", [
        "--data", images, "--weights", "none", "--epochs", 3, "--batch-size", 16, "--image-size", 32,
        "--loader-workers", 0, "--fail-once-at-epoch", 1,
    ], ray_cluster, tmp_path / "out", timeout=600)
    assert metrics["killed_worker"], "the test hook did not kill a worker"
    epochs = metrics["epochs"]
    assert [e["epoch"] for e in epochs] == [0, 1, 2], "an epoch ran twice or not at all: not resumed from the checkpoint"
    # The first worker group trained epoch 0 and died in epoch 1; the second began at epoch 1, from
    # the checkpoint of epoch 0 (a restart from scratch would report started_at_epoch 0 again).
    assert [e["started_at_epoch"] for e in epochs] == [0, 1, 1]
    assert metrics["worker_group_starts"] == [0, 1]
    assert metrics["world_size"] == 2
    assert metrics["final_loss"] < 0.95 * metrics["initial_loss"], metrics["losses"]
    assert all(e["images_per_s"] > 0 and e["epoch_s"] > 0 for e in epochs)


def test_ray_qwen2_5_3b_full_fine_tune_lowers_the_loss_on_two_workers(ray_cluster, standin, tmp_path):
    metrics = run_recipe("ray_qwen2_5_3b", [
        "--model", standin("qwen2.5-3b"), "--data", REPO / "data" / "alpaca", "--seq-len", 128,
        "--max-steps", 30, "--lr", 2e-3, "--log-every", 5, "--timing-warmup-steps", 2,
    ], ray_cluster, tmp_path / "out", timeout=600)
    assert metrics["world_size"] == 2
    assert [h["step"] for h in metrics["history"]] == [5, 10, 15, 20, 25, 30]
    assert metrics["final_loss"] < 0.6 * metrics["initial_loss"], metrics["losses"]
    assert metrics["tokens_per_s"] > 0
    saved = Path(metrics["checkpoint"])
    assert (saved / "config.json").exists() and (saved / "model.safetensors").exists()
