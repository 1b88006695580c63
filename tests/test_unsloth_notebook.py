"""notebooks/unsloth/ddp_llama_3_2_3b.ipynb: its smoke cases; every rank imports Unsloth before Transformers; the
merged model gives base + adapter's logits; a run killed after its first checkpoint resumes, on a rerun of the same
command, to exactly the losses of the uninterrupted run; a model that cannot be found is named before any rank starts.

The uninterrupted run is the 2-rank smoke case itself (the notebook_run fixture runs it once per session). The kill
is real: the `kill_rank_after_checkpoint` test hook SIGKILLs the last rank once the Trainer's first checkpoint is
sealed.
"""
import dataclasses

import papermill
import pytest
import torch
from harness import assert_case_passes, case_ids, hook_records, output_text, run_notebook
from notebook_cases import CASES, NotebookCase
from peft import PeftModel
from transformers import AutoModelForCausalLM, AutoTokenizer

from nbhelpers import checkpoints

NOTEBOOK = "notebooks/unsloth/ddp_llama_3_2_3b.ipynb"
MINE = [c for c in CASES if c.notebook == NOTEBOOK]
SMOKE = MINE[0]
pytestmark = pytest.mark.notebook


@pytest.mark.parametrize("case", MINE, ids=case_ids(MINE))
def test_notebook_meets_its_expectations(case, notebook_run):
    assert_case_passes(case, notebook_run)


def test_every_rank_imports_unsloth_before_transformers_and_peft(notebook_run):
    """Unsloth patches Transformers, PEFT and TRL when it is imported; imported after them, some of its
    optimisations are missing and it warns so. A rank loads what `train` refers to before `train`'s first line
    runs, so a notebook-level name from a module that imports Transformers (nbhelpers.hf) came too early."""
    _, executed, _ = notebook_run(SMOKE)
    assert "Unsloth should be imported before" not in output_text(executed)


def test_the_merged_model_gives_the_logits_of_base_plus_adapter(notebook_run, standin):
    """Saved in 16 bits, the merged model's logits may differ from base + adapter's (fp32) by the rounding of its
    weights, well under 0.02 here, while the adapter moves them by more than 0.1 (so dropping it would show)."""
    _, _, workdir = notebook_run(SMOKE)
    output = workdir / "output"
    tokenizer = AutoTokenizer.from_pretrained(output / "adapter")
    inputs = tokenizer("Continue the Fibonacci sequence: 1, 1, 2, 3, 5, 8,", return_tensors="pt")
    base = AutoModelForCausalLM.from_pretrained(standin("llama-3.2-3b"), dtype=torch.float32)
    with torch.no_grad():
        before = base(**inputs).logits
        with_adapter = PeftModel.from_pretrained(base, output / "adapter")(**inputs).logits
        merged = AutoModelForCausalLM.from_pretrained(output / "merged", dtype=torch.float32)(**inputs).logits
    assert (merged - with_adapter).abs().max().item() < 0.02
    assert (with_adapter - before).abs().max().item() > 0.1


def test_killed_run_resumes_to_the_same_losses(tmp_path, standin, notebook_run):
    uninterrupted = notebook_run(SMOKE)[0]
    killed = dataclasses.replace(SMOKE, hooks=("kill_rank_after_checkpoint=1",))
    # which rank the error blames is the launcher's to test
    with pytest.raises(papermill.PapermillExecutionError, match="DistributedError"):
        run_notebook(killed, tmp_path, standin)
    [kill] = hook_records(tmp_path, "kill_rank_after_checkpoint")
    assert kill["rank"] == 1 and kill["path"].endswith("checkpoint-10"), kill
    checkpoints.verify(kill["path"])  # sealed before the kill: the one to resume from

    resumed, _ = run_notebook(SMOKE, tmp_path, standin)  # (its hook-free twin)  # the same command again, into the same output_dir
    assert [r.rsplit("/", 1)[-1] for r in resumed["resumed_from"]] == ["checkpoint-10", "checkpoint-10"]
    assert resumed["losses"] == uninterrupted["losses"], "resuming must reproduce the uninterrupted run exactly"


def test_missing_model_folder_is_named_before_any_rank_starts(tmp_path):
    missing = tmp_path / "no-such-model"
    case = NotebookCase(NOTEBOOK, parameters={**SMOKE.parameters, "model_name_or_path": str(missing)}, timeout=120)
    with pytest.raises(papermill.PapermillExecutionError, match="looked for on disk") as failure:
        run_notebook(case, tmp_path / "run")
    assert str(missing) in str(failure.value)
    assert "find_model" in failure.value.source, "the settings cell should stop it, before training is launched"
