"""The Unsloth notebook's workflow beyond its smoke run (notebook_cases.py): a run killed after its first checkpoint
resumes, on a rerun of the same command, to exactly the losses of the uninterrupted run; a model that cannot be found
is named before any rank starts.

The uninterrupted run is the 2-rank smoke case itself (the notebook_run fixture runs it once per session). The kill
is real: the `kill_rank_after_checkpoint` test hook SIGKILLs the last rank once the Trainer's first checkpoint is
sealed.
"""
import dataclasses

import papermill
import pytest

from nbhelpers import checkpoints

from harness import hook_records, run_notebook
from notebook_cases import CASES, NotebookCase

NOTEBOOK = "notebooks/unsloth/ddp_llama_3_2_3b.ipynb"
SMOKE = next(c for c in CASES if c.notebook == NOTEBOOK and c.parameters["num_gpus"] is None)

pytestmark = pytest.mark.notebook


def test_killed_run_resumes_to_the_same_losses(tmp_path, standin, notebook_run):
    uninterrupted = notebook_run(SMOKE)[0]
    killed = dataclasses.replace(SMOKE, hooks=("kill_rank_after_checkpoint=1",))
    # which rank the error blames is the launcher's to test
    with pytest.raises(papermill.PapermillExecutionError, match="DistributedError"):
        run_notebook(killed, tmp_path, standin)
    [kill] = hook_records(tmp_path, "kill_rank_after_checkpoint")
    assert kill["rank"] == 1 and kill["path"].endswith("checkpoint-10"), kill
    checkpoints.verify(kill["path"])  # sealed before the kill: the one to resume from

    resumed, _ = run_notebook(SMOKE, tmp_path, standin)  # the same command again, into the same output_dir
    assert [r.rsplit("/", 1)[-1] for r in resumed["resumed_from"]] == ["checkpoint-10", "checkpoint-10"]
    assert resumed["losses"] == uninterrupted["losses"], "resuming must reproduce the uninterrupted run exactly"


def test_missing_model_folder_is_named_before_any_rank_starts(tmp_path):
    missing = tmp_path / "no-such-model"
    case = NotebookCase(NOTEBOOK, parameters={**SMOKE.parameters, "model_name_or_path": str(missing)}, timeout=120)
    with pytest.raises(papermill.PapermillExecutionError, match="looked for on disk") as failure:
        run_notebook(case, tmp_path / "run")
    assert str(missing) in str(failure.value)
    assert "find_model" in failure.value.source, "the settings cell should stop it, before training is launched"
