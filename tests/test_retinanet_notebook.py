"""The RetinaNet DDP notebook with one rank, on a few 64-px images of the coloured-shapes COCO set: it says one
rank has nothing to compare (null, not true), its MLflow store holds the run and a model that loads; a run killed
after its first checkpoint, rerun with the same command, resumes to exactly the uninterrupted run's losses.
(The 2-rank run is a case in notebook_cases.py.) With one rank, the killed "last rank" is rank 0 itself.
"""
import papermill
import pytest

from harness import check_expectations, hook_records, output_text, run_notebook
from notebook_cases import LOADABLE_MLFLOW_MODEL, NotebookCase

NOTEBOOK = "notebooks/pytorch/ddp_retinanet.ipynb"
ONE_RANK = {"output_dir": "{output_dir}", "num_gpus": 1, "dataset_name": "{dataset:detection}", "min_size": 64,
            "max_size": 64, "per_device_train_batch_size": 2, "max_steps": 4, "save_steps": 2, "warmup_steps": 2,
            "learning_rate": 0.02, "dataloader_num_workers": 0, "max_eval_samples": 2, "timing_warmup_steps": 1}
EXPECT = {
    "world_size": ("==", 1),
    "weights_identical_across_ranks": ("==", None),
    "eval_images_scored": ("==", 2),
    "mlflow.params.per_device_train_batch_size": ("==", "2"),
    "mlflow.metrics.images_per_s": (">", 0),
    **LOADABLE_MLFLOW_MODEL,
}

pytestmark = pytest.mark.notebook


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


def test_run_killed_after_its_first_checkpoint_resumes_to_the_same_losses(tmp_path, uninterrupted):
    with pytest.raises(papermill.PapermillExecutionError):
        run(tmp_path, hooks=("kill_rank_after_optimizer_step=3",))
    assert [r["step"] for r in hook_records(tmp_path, "kill_rank_after_optimizer_step")] == [3], "killed at step 3"
    assert sorted(p.name for p in (tmp_path / "output" / "checkpoints").iterdir()) == ["step_2"]

    _, resumed, _ = run(tmp_path)  # the same command again
    assert resumed["resumed_from"] == "step_2"
    assert resumed["losses"] == uninterrupted[1]["losses"], "the same images, flips and steps as the uninterrupted run"
    assert resumed["grad_norms_before_clipping"] == uninterrupted[1]["grad_norms_before_clipping"]
