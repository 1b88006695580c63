"""notebooks/pytorch/ddp_retinanet.ipynb on the coloured-shapes COCO set (data/make_detection.py): its 2-rank
case (notebook_cases.py) and the loss falling there; with one rank, it says there is nothing to compare and its
MLflow store holds the run and a model that loads; a run killed in its second epoch, rerun with the same command,
resumes from the first epoch's checkpoint to exactly the uninterrupted run's losses (CPU, one rank: deterministic).
"""
import papermill
import pytest

from harness import assert_case_passes, case_ids, check_expectations, hook_records, output_text, run_notebook
from notebook_cases import CASES, LOADABLE_MLFLOW_MODEL, NotebookCase

NOTEBOOK = "notebooks/pytorch/ddp_retinanet.ipynb"
MINE = [c for c in CASES if c.notebook == NOTEBOOK]
# two epochs of 6 steps (the 6th of each is timed): 12 training images, 2 per step, one rank
ONE_RANK = {"output_dir": "{output_dir}", "num_gpus": 1, "dataset_name": "{dataset:detection}", "image_size": 64,
            "per_device_train_batch_size": 2, "num_train_epochs": 2, "max_train_samples": 12, "learning_rate": 0.02,
            "dataloader_num_workers": 0, "max_eval_samples": 2}
EXPECT = {
    "world_size": ("==", 1),
    "mlflow.params.per_device_train_batch_size": ("==", "2"),
    "mlflow.metrics.images_per_s": ("==", ("images_per_s", 1)),  # what metrics.json holds
    **LOADABLE_MLFLOW_MODEL,
}

pytestmark = pytest.mark.notebook


@pytest.mark.parametrize("case", MINE, ids=case_ids(MINE))
def test_notebook_meets_its_expectations(case, notebook_run):
    assert_case_passes(case, notebook_run)


def test_two_ranks_lower_the_loss(notebook_run):
    metrics, _, _ = notebook_run(MINE[0])
    losses = metrics["losses"]
    tenth = len(losses) // 10
    assert len(losses) == 30
    assert sum(losses[-tenth:]) / sum(losses[:tenth]) < 0.88, "the mean loss of the last tenth against the first"


def test_images_per_s_counts_every_ranks_timed_images(notebook_run):
    metrics, _, _ = notebook_run(MINE[0])
    # 30 steps a rank, timed from the 6th: 25 steps x 2 images x 2 ranks over rank 0's timed seconds (one rank's
    # images, or every step's, fail this)
    assert metrics["images_per_s"] * metrics["train_s"][0] == pytest.approx(25 * 2 * 2, rel=1e-6), metrics


def run(workdir, hooks=(), expect=None):
    case = NotebookCase(NOTEBOOK, parameters=ONE_RANK, expect=expect or {}, timeout=300, hooks=hooks)
    metrics, executed = run_notebook(case, workdir)
    return case, metrics, output_text(executed)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    return run(tmp_path_factory.mktemp("uninterrupted"), expect=EXPECT)


def test_one_rank_has_nothing_to_compare_and_its_model_is_in_mlflow(uninterrupted):
    case, metrics, text = uninterrupted
    failures = check_expectations(case, metrics)
    assert not failures, "; ".join(failures)
    assert "one rank: it holds the only copy of the weights and scored every validation image itself" in text
    assert "validation mAP" in text and "on 2 images" in text
    # 2 epochs of 6 steps, the 6th of each timed: 2 steps x 2 images
    assert metrics["images_per_s"] * metrics["train_s"][0] == pytest.approx(2 * 2, rel=1e-6), metrics


def test_run_killed_in_its_second_epoch_resumes_from_the_first_to_the_same_losses(tmp_path, uninterrupted):
    with pytest.raises(papermill.PapermillExecutionError):
        run(tmp_path, hooks=("kill_rank_after_optimizer_step=8",))
    assert [r["step"] for r in hook_records(tmp_path, "kill_rank_after_optimizer_step")] == [8], "killed at step 8"
    assert sorted(p.name for p in (tmp_path / "output").glob("checkpoint.pt*")) == ["checkpoint.pt"]

    _, resumed, text = run(tmp_path)  # the same command again
    assert "resuming after epoch 1 of" in text
    assert resumed["losses"] == uninterrupted[1]["losses"], "the same images, flips and steps as the uninterrupted run"
