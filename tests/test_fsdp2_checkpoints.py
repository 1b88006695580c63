"""The FSDP2 notebook's distributed checkpoints: a killed run resumes to exactly the uninterrupted run's
losses, and a checkpoint whose save was cut short by a crash is never resumed from.

Each scenario runs the notebook with papermill (2 CPU processes, gloo, deterministic) on a small
Transformer: 12 steps, a checkpoint every 4. The crashes are real: the notebook's `stop_after_step` and
`crash_while_saving_step` parameters SIGKILL the last rank, so no clean-up code runs.
"""
import papermill
import pytest

from harness import run_notebook
from notebook_cases import NotebookCase

NOTEBOOK = "notebooks/pytorch/fsdp2_transformer.ipynb"
SMALL_RUN = {
    "num_gpus": None, "num_layers": 2, "width": 64, "num_heads": 4, "seq_len": 32, "num_samples": 2048,
    "eval_samples": 64, "batch_size": 16, "steps": 12, "warmup_steps": 2, "learning_rate": 0.001,
    "checkpoint_every": 4,
}

pytestmark = pytest.mark.notebook


def run(workdir, checkpoint_dir, **parameters):
    case = NotebookCase(NOTEBOOK, parameters={**SMALL_RUN, "output_dir": "{output_dir}",
                                              "checkpoint_dir": str(checkpoint_dir), **parameters}, timeout=150)
    metrics, _ = run_notebook(case, workdir)
    return metrics


def complete(checkpoint_dir):
    return sorted(p.name for p in checkpoint_dir.iterdir() if not p.name.endswith(".tmp"))


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    root = tmp_path_factory.mktemp("uninterrupted")
    metrics = run(root / "run", root / "checkpoints")
    assert metrics["resumed_from_step"] is None and len(metrics["losses"]) == SMALL_RUN["steps"]
    return metrics


def test_killed_run_resumes_to_the_same_losses(tmp_path, uninterrupted):
    checkpoints = tmp_path / "checkpoints"
    with pytest.raises(papermill.PapermillExecutionError, match="SIGKILL"):
        run(tmp_path / "killed", checkpoints, stop_after_step=6)
    assert complete(checkpoints) == ["step_4"], "the run should have died after its step-4 checkpoint"

    resumed = run(tmp_path / "resumed", checkpoints)
    assert resumed["resumed_from_step"] == 4
    assert resumed["losses"] == uninterrupted["losses"], "resuming must reproduce the uninterrupted run exactly"


def test_checkpoint_cut_short_by_a_crash_is_never_resumed_from(tmp_path, uninterrupted):
    checkpoints = tmp_path / "checkpoints"
    with pytest.raises(papermill.PapermillExecutionError, match="SIGKILL"):
        run(tmp_path / "crashed", checkpoints, crash_while_saving_step=8)
    partial = checkpoints / "step_8.tmp"
    assert partial.is_dir(), "the crash should have left the step-8 checkpoint half written"
    assert not (partial / ".metadata").exists(), "the crash should have come before the save finished"
    assert complete(checkpoints) == ["step_4"]

    resumed = run(tmp_path / "resumed", checkpoints)
    assert resumed["resumed_from_step"] == 4, "resume must take the last complete checkpoint, not the cut one"
    assert resumed["skipped_incomplete_checkpoints"] == ["step_8.tmp"]
    assert resumed["losses"] == uninterrupted["losses"]
