"""notebooks/unsloth/ddp_llama_3_2_3b.ipynb, on Unsloth's own kernel (cookbook-unsloth, .venv-unsloth: Unsloth caps
Transformers, TRL, datasets and torch below the main environment's): its smoke cases; without a GPU and without
tests/hooks, its 2 CPU processes train as one job; every rank imports Unsloth before Transformers; the merged model
gives base + adapter's logits (read back here with the main environment's Transformers and PEFT); a run killed after
its first checkpoint resumes, on a rerun of the same command, to exactly the losses of the uninterrupted run; a model
that cannot be found is named before any rank starts.

The uninterrupted run is the 2-rank smoke case itself (the notebook_run fixture runs it once per session). The kill
is real: the `kill_rank_after_checkpoint` test hook SIGKILLs the last rank once the Trainer's first checkpoint is
sealed. Every run here is without the tests' CPU fixes (the cases' cpu_fixes=False): the smoke run and the resumed
one start their kernels without tests/hooks, as a user's; the killed run gets the kill hook alone.
"""
import dataclasses
import os

import papermill
import pytest
import torch
from harness import (HOOKS, REPO, assert_case_passes, case_ids, declared_parameters, hook_records, hooks_in_kernel,
                     output_text, run_notebook)
from notebook_cases import CASES, NotebookCase
from peft import PeftModel
from transformers import AutoModelForCausalLM, AutoTokenizer

from nbhelpers.training import checkpoints

NOTEBOOK = "notebooks/unsloth/ddp_llama_3_2_3b.ipynb"
MINE = [c for c in CASES if c.notebook == NOTEBOOK]
SMOKE = MINE[0]
pytestmark = pytest.mark.notebook


@pytest.mark.parametrize("case", MINE, ids=case_ids(MINE))
def test_notebook_meets_its_expectations(case, notebook_run):
    assert_case_passes(case, notebook_run)


def test_without_a_gpu_the_unsloth_notebook_trains_as_one_job_of_two_ranks(notebook_run, tmp_path):
    """Without GPUs accelerate joins CPU processes into one job only with `use_cpu`; else each trains alone on the
    whole dataset and ends with the same adapter as the other (equal adapters prove nothing), and each, its own rank
    0, answers and exports. A resumed run also needs the device `cpu`, not accelerate's `cpu:0`
    (ACCELERATE_TORCH_DEVICE): the notebook sets both itself, so its runs here are without tests/hooks."""
    assert SMOKE.parameters["num_gpus"] is None and not SMOKE.cpu_fixes and not SMOKE.hooks
    with hooks_in_kernel((), tmp_path, cpu_fixes=False):  # the kernel papermill starts for the run
        assert str(HOOKS) not in os.environ["PYTHONPATH"].split(os.pathsep)
    metrics, _, _ = notebook_run(SMOKE)
    assert metrics["world_size"] == 2 and len(set(metrics["adapter_fingerprint"])) == 1
    assert metrics["reply"][0] and metrics["reply"][1] is None, "rank 1 answered: it was rank 0 of a job of its own"
    # the Trainer's epoch (logged to MLflow): each of the 20 steps took a batch of 2 conversations from each rank
    conversations = len((REPO / "data/finetome/train.jsonl").read_text().splitlines())
    per_rank = int(declared_parameters(REPO / SMOKE.notebook)["per_device_train_batch_size"]["default"])
    per_step = 2 * per_rank * SMOKE.parameters["config"]["gradient_accumulation_steps"]
    assert metrics["mlflow"]["metrics"]["epoch"] == pytest.approx(SMOKE.parameters["max_steps"] * per_step
                                                                  / conversations)


def test_every_rank_imports_unsloth_before_transformers_and_peft(notebook_run):
    """Unsloth patches Transformers, PEFT and TRL when it is imported; imported after them, some of its
    optimisations are missing and it warns so. A rank loads what `train` refers to before `train`'s first line
    runs, so a notebook-level name from a module that imports Transformers (nbhelpers.training.trainer_log) came
    too early."""
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

    resumed, _ = run_notebook(SMOKE, tmp_path, standin)  # the same command again, into the same output_dir (no hooks)
    assert [r.rsplit("/", 1)[-1] for r in resumed["resumed_from"]] == ["checkpoint-10", "checkpoint-10"]
    assert resumed["losses"] == uninterrupted["losses"], "resuming must reproduce the uninterrupted run exactly"


def test_missing_model_folder_is_named_before_any_rank_starts(tmp_path):
    missing = tmp_path / "no-such-model"
    case = NotebookCase(NOTEBOOK, parameters={**SMOKE.parameters, "model_name_or_path": str(missing)}, timeout=120,
                        kernel=SMOKE.kernel)
    with pytest.raises(papermill.PapermillExecutionError, match="looked for on disk") as failure:
        run_notebook(case, tmp_path / "run")
    assert str(missing) in str(failure.value)
    assert "find_model" in failure.value.source, "the settings cell should stop it, before training is launched"
