"""notebooks/lightning/ddp_two_tower.ipynb: with one rank (notebook_cases.py) and on 2 CPU processes, Lightning joins
the ranks @distributed started (and starts none), only rank 0 writes checkpoints, the ranks agree on the test AUROC;
a run killed in its second epoch, rerun with the same command, resumes from Lightning's `last.ckpt` and trains the
remaining epochs to the uninterrupted run's losses; a ratings file that is not there and a download that stalls fail
early, saying what to do.

Which rank wrote which file, how Lightning found the ranks and which processes were started come from test hooks
(tests/hooks), not from the notebook; samples/s from what it writes (MLflow, metrics.json).
"""
import math
import shutil
import socket

import pandas as pd
import papermill
import pytest

from harness import REPO, assert_case_passes, case_ids, check_expectations, hook_records, output_text, run_notebook
from notebook_cases import CASES, LOADABLE_MLFLOW_MODEL, NotebookCase

NOTEBOOK = "notebooks/lightning/ddp_two_tower.ipynb"
MINE = [c for c in CASES if c.notebook == NOTEBOOK]
RATINGS = REPO / "data" / "ratings" / "item_ratings.csv"
TWO_RANKS = {"output_dir": "{output_dir}", "dataset_name": str(RATINGS), "num_train_epochs": 6,
             "per_device_train_batch_size": 256, "dataloader_num_workers": 0, "num_gpus": None}
EXPECT = {
    "world_size": ("==", 2),
    "hooks.record_lightning_trainer.process_group_backend": ("==", ["gloo", "gloo"]),
    "hooks.record_lightning_trainer.cluster_environment": ("==", ["TorchElasticEnvironment"] * 2),  # @distributed's launch
    "test_auroc": (">=", 0.7),
    "final_loss": ("<", ("initial_loss", 0.5)),
    "hooks.record_checkpoint_writers.ranks": ("==", [0]),  # rank 1 wrote no checkpoint file at all
    "mlflow.params.per_device_train_batch_size": ("==", "256"),
    "mlflow.metrics.train/device/samples_per_sec": (">", 0),  # Lightning's ThroughputMonitor, into rank 0's run
    "samples_per_s": (">", 0),
    "step_times.steps": ("==", [6 * 11 - 1] * 2),  # lightning_callback() timed every batch but the first (11 an epoch)
    **LOADABLE_MLFLOW_MODEL,
}

pytestmark = pytest.mark.notebook


@pytest.mark.parametrize("case", MINE, ids=case_ids(MINE))
def test_notebook_meets_its_expectations(case, notebook_run):
    assert_case_passes(case, notebook_run)


def run(workdir, hooks=(), expect=None, **parameters):
    case = NotebookCase(NOTEBOOK, parameters={**TWO_RANKS, **parameters}, expect=expect or {}, timeout=240, hooks=hooks)
    metrics, executed = run_notebook(case, workdir)
    return case, metrics, output_text(executed)


def steps_per_epoch(ranks=2, batch=TWO_RANKS["per_device_train_batch_size"]):
    """Optimizer steps of one epoch on each rank: the notebook's 70 % training split, shared by the ranks."""
    train = int(0.70 * min(len(pd.read_csv(RATINGS)), 100_000))
    return math.ceil(math.ceil(train / ranks) / batch)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("uninterrupted")
    case, metrics, text = run(workdir, hooks=("record_checkpoint_writers", "record_lightning_trainer",
                                              "count_started_processes"), expect=EXPECT)
    return case, metrics, text, workdir


def test_two_ranks_train_and_only_rank_0_writes_checkpoints(uninterrupted):
    case, metrics, text, workdir = uninterrupted
    failures = check_expectations(case, metrics)
    assert not failures, "; ".join(failures)
    assert "test AUROC the same on all 2 ranks: True" in text
    written = {w["path"] for w in metrics["hooks"]["record_checkpoint_writers"]["records"]}
    on_disk = {str(p) for p in (workdir / "output" / "checkpoints").iterdir()}
    assert {p.rsplit("/", 1)[1] for p in on_disk} >= {"last.ckpt"} and on_disk <= written, "a file nobody recorded"
    python_started_by_ranks = [r for r in metrics["hooks"]["count_started_processes"]["records"]
                               if r["rank"] is not None and r["kind"] == "subprocess" and "python" in r["what"][0]]
    assert not python_started_by_ranks, f"Lightning relaunched the ranks: {python_started_by_ranks}"


def test_run_killed_in_its_second_epoch_resumes_from_last_ckpt_to_the_same_losses(tmp_path, uninterrupted):
    with pytest.raises(papermill.PapermillExecutionError):
        run(tmp_path, hooks=(f"kill_rank_after_optimizer_step={steps_per_epoch() + 1}",))
    assert [r["rank"] for r in hook_records(tmp_path, "kill_rank_after_optimizer_step")] == [1], "rank 1 was killed"
    last = tmp_path / "output" / "checkpoints" / "last.ckpt"
    assert last.is_file()

    _, resumed, text = run(tmp_path)  # the same command again
    assert f"resuming from {last}" in text
    assert resumed["losses"] == uninterrupted[1]["losses"][1:], "epochs 2 to 6, as in the uninterrupted run"


def test_a_ratings_file_that_is_not_there_is_an_error_naming_it(tmp_path):
    missing = tmp_path / "no" / "item_ratings.csv"
    with pytest.raises(papermill.PapermillExecutionError, match=f"there is no ratings file {missing}"):
        run(tmp_path, dataset_name=str(missing))


def test_a_download_that_stalls_fails_after_download_timeout(tmp_path):
    with socket.socket() as server:  # accepts the connection (the kernel's backlog does), never answers
        server.bind(("127.0.0.1", 0))
        server.listen()
        url = f"http://127.0.0.1:{server.getsockname()[1]}/learning-from-sets-2019.zip"
        with pytest.raises(papermill.PapermillExecutionError, match=rf"downloading {url} failed \(timed out\)"):
            run(tmp_path, dataset_name=url, download_timeout=1)
