"""notebooks/axolotl/ddp_olmo3_7b.ipynb: its smoke case (the eval loss falls, the merged model gives base + adapter's
logits), and the workflow beyond it: a user's own Axolotl YAML drives a run,
the notebook's parameters overriding its keys; a run killed after its first checkpoint resumes, on a rerun of the same
command, to exactly the losses of the uninterrupted run; bad input stops the notebook before Axolotl starts.

The YAML (tests/axolotl_user_config.yml) is the notebook's recipe with the smoke case's sizes written in, so the run
it drives must reproduce the smoke run (the notebook_run fixture runs that once per session), and the killed and
resumed run is that YAML-driven run. The kill is real: the `kill_rank_after_checkpoint` test hook SIGKILLs the
training process once its first checkpoint is sealed (by the notebook's plugin nbhelpers.training.axolotl_plugins).
"""
import contextlib
import dataclasses
import re
import statistics

import mlflow
import papermill
import psutil
import pytest
import torch
import yaml

from harness import REPO, assert_case_passes, hook_records, output_text, project_store, run_notebook
from mlflow_runs import tracked_runs
from nbhelpers.training import checkpoints
from notebook_cases import CASES

NOTEBOOK = "notebooks/axolotl/ddp_olmo3_7b.ipynb"
SMOKE = next(c for c in CASES if c.notebook == NOTEBOOK)
USER_CONFIG = REPO / "tests" / "axolotl_user_config.yml"
# The YAML, with what a run on this machine must name (the stand-in, the local data) and max_steps over its 1000.
FROM_USER_CONFIG = dataclasses.replace(SMOKE, parameters={
    "config": str(USER_CONFIG), **{name: SMOKE.parameters[name] for name in (
        "output_dir", "num_gpus", "base_model", "datasets", "max_steps")}})

pytestmark = pytest.mark.notebook


def test_notebook_meets_its_expectations(notebook_run):
    assert_case_passes(SMOKE, notebook_run)


def test_the_eval_loss_falls_and_the_merged_model_gives_the_logits_of_base_plus_adapter(notebook_run):
    metrics, executed, _ = notebook_run(SMOKE)
    # The validation loss before training and after it (the same rows): 8.03 -> 7.48 (0.93x); at learning rate 0 1.0x.
    before, after = metrics["eval_losses"][0], metrics["eval_losses"][-1]
    assert after < 0.96 * before, metrics["eval_losses"]
    said = re.search(r"largest logit difference to base \+ adapter ([0-9.e+-]+) \(the adapter itself moved the logits "
                     r"by up to ([0-9.e+-]+)\)", output_text(executed))
    difference, effect = float(said.group(1)), float(said.group(2))
    assert difference < 1e-3 and effect > 0.1  # fp32 here: merged and base + adapter agree to rounding


def test_tokens_per_s_is_axolotls_own_throughput(notebook_run):
    metrics, _, workdir = notebook_run(SMOKE)
    [run] = tracked_runs(workdir, "axolotl_olmo3", {}, "tokens/train_per_sec_per_gpu")
    client = mlflow.MlflowClient(project_store(workdir))
    windows = [m.value for m in client.get_metric_history(run.info.run_id, "tokens/train_per_sec_per_gpu")]
    # Axolotl's rate of each logging window (every step but the first of the 16), as the notebook reports it: their
    # median, times the one GPU; not a figure of the notebook's own making.
    assert len(windows) == 15 and metrics["tokens_per_s"] == statistics.median(windows), (windows, metrics)
    # Axolotl counted every token slot of the 16 steps (2 packed sequences of 256 per step) and trained on some of them,
    # at a rate per second that fits in the run's timeout (one per millisecond would not).
    assert metrics["total_tokens"] == 16 * 2 * 256 and 0 < metrics["trainable_tokens"] < metrics["total_tokens"], metrics
    assert 0 < metrics["trainable_tokens"] / metrics["tokens_per_s"] < SMOKE.timeout, metrics


@pytest.fixture(scope="module")
def killed_then_resumed(tmp_path_factory, standin):
    """The YAML-driven run, killed after its first checkpoint, then run again in the same folder: (workdir, metrics)."""
    workdir = tmp_path_factory.mktemp("killed_then_resumed")
    killed = dataclasses.replace(FROM_USER_CONFIG, hooks=("kill_rank_after_checkpoint=1",))
    with pytest.raises(papermill.PapermillExecutionError, match="failed with exit code"):
        run_notebook(killed, workdir, standin)
    return workdir, run_notebook(FROM_USER_CONFIG, workdir, standin)[0]


def test_users_yaml_drives_the_run_and_parameters_override_its_keys(killed_then_resumed):
    config = yaml.safe_load((killed_then_resumed[0] / "output" / "config.yml").read_text())  # what Axolotl trained
    user = yaml.safe_load(USER_CONFIG.read_text())
    assert config["learning_rate"] == user["learning_rate"] == 0.01, "the YAML's value, not the recipe's 2e-4"
    assert config["train_on_inputs"] is False, "a key only the YAML has"
    assert config["max_steps"] == SMOKE.parameters["max_steps"] != user["max_steps"], "the parameter wins"
    assert config["base_model"].endswith("olmo-3-7b"), "the stand-in named by the parameter, not the YAML's hub id"


def test_killed_run_resumes_to_the_same_losses(killed_then_resumed, notebook_run):
    workdir, resumed = killed_then_resumed
    [kill] = hook_records(workdir, "kill_rank_after_checkpoint")
    assert kill["path"].endswith("checkpoint-8"), kill
    checkpoints.verify(kill["path"])  # sealed before the kill: the one to resume from
    assert resumed["resumed_from"] == kill["path"]

    uninterrupted = notebook_run(SMOKE)[0]
    after_the_checkpoint = {step: loss for step, loss in zip(uninterrupted["loss_steps"], uninterrupted["losses"])
                            if step > 8}
    assert dict(zip(resumed["loss_steps"], resumed["losses"])) == after_the_checkpoint, (
        "resuming must reproduce the uninterrupted run's losses exactly")


def test_a_killed_rank_leaves_no_process_behind(killed_then_resumed):
    """Its DataLoader workers sit in the process group torchrun gave the rank, which the notebook's command does not
    own; they carry the command's NBHELPERS_LAUNCH_ID, and the notebook ends them by it."""
    hooks_dir = str(killed_then_resumed[0])
    left = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        with contextlib.suppress(psutil.Error):
            if p.environ().get("COOKBOOK_TEST_HOOKS_DIR", "").startswith(hooks_dir):  # only the killed run has hooks
                left.append(p.info)
    assert not left, f"the killed run left processes running: {left}"


@pytest.mark.skipif(torch.cuda.is_available(), reason="with GPUs, one process per GPU is what it runs")
def test_more_than_one_process_without_gpus_is_refused_before_axolotl_starts(tmp_path):
    case = dataclasses.replace(SMOKE, parameters={"output_dir": "{output_dir}", "num_gpus": 2}, timeout=120)
    refused = "without GPUs Axolotl trains in one process"
    with pytest.raises(papermill.PapermillExecutionError, match=refused) as failure:
        run_notebook(case, tmp_path)
    assert "read_parameters()" in failure.value.source, "the settings cell should stop it"


def test_missing_config_file_is_named(tmp_path):
    missing = tmp_path / "my_config.yml"
    case = dataclasses.replace(SMOKE, parameters={"output_dir": "{output_dir}", "config": str(missing)}, timeout=120)
    with pytest.raises(papermill.PapermillExecutionError, match=re.escape(f"no such file {missing}")):
        run_notebook(case, tmp_path / "run")
