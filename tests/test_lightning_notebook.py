"""The Lightning DDP notebook on 2 CPU processes: Lightning joins the ranks @distributed started (and starts none),
only rank 0 writes checkpoints, the ranks agree on the metrics; a run killed after its first checkpoint, rerun
with the same command, resumes and reaches the same final loss as the uninterrupted run, and one resumed from a
checkpoint whose weights were saved broken stops at its first loss; a ratings file that is not there and a
download that stalls fail early, saying what to do.

Which rank wrote which file and which processes were started come from test hooks (tests/hooks), not from the
notebook. The one-rank run is a case in notebook_cases.py.
"""
import math
import shutil
import socket
from pathlib import Path

import pandas as pd
import papermill
import pytest
import torch

from harness import REPO, check_expectations, hook_records, output_text, run_notebook
from nbhelpers import checkpoints
from notebook_cases import LOADABLE_MLFLOW_MODEL, NotebookCase

NOTEBOOK = "notebooks/lightning/ddp_two_tower.ipynb"
RATINGS = REPO / "data" / "ratings" / "item_ratings.csv"
TWO_RANKS = {"output_dir": "{output_dir}", "dataset_name": str(RATINGS), "num_train_epochs": 6,
             "per_device_train_batch_size": 256, "dataloader_num_workers": 0, "num_gpus": None}
EXPECT = {
    "world_size": ("==", 2),
    "lightning_world_size": ("==", 2),
    "process_group_backend": ("==", "gloo"),
    "lightning_cluster_environment": ("==", "TorchElasticEnvironment"),  # saw @distributed's launch
    "test_auroc": (">=", 0.7),
    "test_auroc_same_on_all_ranks": ("==", True),
    "final_loss": ("<", ("initial_loss", 0.5)),
    "hooks.record_checkpoint_writers.ranks": ("==", [0]),  # rank 1 wrote no checkpoint file at all
    "best_checkpoint_stamp_rank": ("==", 0),
    "mlflow.params.per_device_train_batch_size": ("==", "256"),
    "mlflow.metrics.samples_per_s": (">", 0),
    **LOADABLE_MLFLOW_MODEL,
}

pytestmark = pytest.mark.notebook


def run(workdir, hooks=(), expect=None, **parameters):
    case = NotebookCase(NOTEBOOK, parameters={**TWO_RANKS, **parameters}, expect=expect or {}, timeout=240, hooks=hooks)
    metrics, executed = run_notebook(case, workdir)
    return case, metrics, output_text(executed)


def steps_per_epoch(ranks=2, batch=TWO_RANKS["per_device_train_batch_size"]):
    """Optimizer steps of one epoch on each rank: the notebook's 70 % training split, shared by the ranks."""
    train = int(0.70 * min(len(pd.read_csv(RATINGS)), 100_000))
    return math.ceil(math.ceil(train / ranks) / batch)


def in_final_folder(path):
    """A file written into NAME.ckpt.tmp lives in NAME.ckpt once its checkpoint is sealed."""
    return Path(path.replace(".ckpt.tmp/", ".ckpt/"))


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("uninterrupted")
    case, metrics, text = run(workdir, hooks=("record_checkpoint_writers", "count_started_processes"), expect=EXPECT)
    return case, metrics, text, workdir


def test_two_ranks_train_and_only_rank_0_writes_checkpoints(uninterrupted):
    case, metrics, text, workdir = uninterrupted
    failures = check_expectations(case, metrics)
    assert not failures, "; ".join(failures)
    writes = metrics["hooks"]["record_checkpoint_writers"]["records"]
    best = Path(metrics["best_checkpoint"])
    assert sorted({w["rank"] for w in writes if in_final_folder(w["path"]).parent == best}) == [0]
    on_disk = {p for p in (workdir / "output" / "checkpoints").rglob("*") if p.is_file()
               and p.name != "checkpoint_manifest.json"}
    assert on_disk and not on_disk - {in_final_folder(w["path"]) for w in writes}, "a checkpoint file nobody recorded"
    python_started_by_ranks = [r for r in metrics["hooks"]["count_started_processes"]["records"]
                               if r["rank"] is not None and r["kind"] == "subprocess" and "python" in r["what"][0]]
    assert not python_started_by_ranks, f"Lightning relaunched the ranks: {python_started_by_ranks}"


@pytest.fixture(scope="module")
def killed_after_epoch_1(tmp_path_factory):
    """The checkpoints of a run whose last rank was killed in its second epoch: the first epoch's."""
    workdir = tmp_path_factory.mktemp("killed")
    with pytest.raises(papermill.PapermillExecutionError):
        run(workdir, hooks=(f"kill_rank_after_optimizer_step={steps_per_epoch() + 1}",))
    assert [r["rank"] for r in hook_records(workdir, "kill_rank_after_optimizer_step")] == [1], "rank 1 was killed"
    return workdir / "output" / "checkpoints"


def test_run_killed_after_its_first_checkpoint_resumes_to_the_same_final_loss(tmp_path, uninterrupted,
                                                                              killed_after_epoch_1):
    first = f"epoch=0-step={steps_per_epoch()}.ckpt"
    assert first in sorted(p.name for p in killed_after_epoch_1.iterdir())
    checkpoint_dir = shutil.copytree(killed_after_epoch_1, tmp_path / "output" / "checkpoints")

    _, resumed, text = run(tmp_path)  # the same command again
    assert f"resuming from {checkpoint_dir / first}" in text
    assert resumed["resumed_from"] == str(checkpoint_dir / first)
    assert resumed["final_loss"] == uninterrupted[1]["final_loss"]
    assert resumed["losses"] == uninterrupted[1]["losses"], "every epoch's loss, as in the uninterrupted run"


def test_a_checkpoint_saved_with_broken_weights_stops_the_resumed_run_at_its_first_loss(tmp_path, killed_after_epoch_1):
    folder = shutil.copytree(killed_after_epoch_1, tmp_path / "output" / "checkpoints") / \
        f"epoch=0-step={steps_per_epoch()}.ckpt"
    saved = torch.load(folder / "checkpoint.pt", weights_only=False)
    saved["state_dict"]["user_tower.embedding.weight"].fill_(float("nan"))
    torch.save(saved, folder / "checkpoint.pt")
    checkpoints.seal(folder)  # its checksums match: broken before it was sealed
    with pytest.raises(papermill.PapermillExecutionError, match=r"the first loss after resuming from \S*epoch=0-step"):
        run(tmp_path)


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
