"""notebooks/trl/fsdp_gpt_oss_120b.ipynb: its smoke cases; FSDP2 really shards (the Trainer ran FSDP, each rank
holds about half); the adapter file is what PEFT expects, trained, with the notebook's ranks; a killed run resumes
to the uninterrupted losses (the adapter comes back from each checkpoint's file); the MLflow run. The cases' runs are
shared (notebook_run), so this file's tests stay on one pytest-xdist worker."""
import json

import pytest
import torch
from harness import assert_case_passes, case_ids, hook_records, project_store
from notebook_cases import CASES
from peft import LoraConfig, get_peft_model, get_peft_model_state_dict
from safetensors import safe_open
from transformers import AutoConfig, AutoModelForCausalLM
from trl_checks import assert_mlflow_run_holds_settings_metrics_and_a_loadable_model, run_killed_then_resumed

NOTEBOOK = "notebooks/trl/fsdp_gpt_oss_120b.ipynb"
MINE = [c for c in CASES if c.notebook == NOTEBOOK]
SMOKE, ONE_RANK = MINE
pytestmark = pytest.mark.notebook


@pytest.mark.parametrize("case", MINE, ids=case_ids(MINE))
def test_notebook_meets_its_expectations(case, notebook_run):
    assert_case_passes(case, notebook_run)


def test_the_trainer_ran_fsdp2_and_each_rank_holds_about_half_of_the_parameters(notebook_run):
    metrics, _, workdir = notebook_run(SMOKE)
    records = sorted(hook_records(workdir, "record_trainer"), key=lambda r: r["rank"])
    assert [(r["world_size"], r["fsdp"], r["fsdp_config"]["version"]) for r in records] == [(2, True, 2)] * 2
    assert all(0.45 < r["held_fraction"] < 0.55 for r in records), records  # the hook counts DTensor shards
    assert all(0.45 < f < 0.55 for f in metrics["held_fraction"])  # and the notebook says the same


def test_each_rank_trains_on_packed_rows(notebook_run):
    _, _, workdir = notebook_run(SMOKE)
    assert [r["padding_free"] for r in hook_records(workdir, "record_trainer")] == [True, True]


def test_one_rank_takes_its_fsdp_settings_from_the_accelerate_config_file(notebook_run):
    _, _, workdir = notebook_run(ONE_RANK)
    [record] = hook_records(workdir, "record_trainer")
    assert record["fsdp_config"] == {"version": 2, "reshard_after_forward": False}  # the file's, not the default


def test_the_adapter_file_is_what_peft_expects_with_every_lora_b_trained(notebook_run):
    _, _, workdir = notebook_run(SMOKE)
    adapter = workdir / "output" / "adapter"
    settings = json.loads((adapter / "adapter_config.json").read_text())
    assert settings["r"] == 32 and set(settings["rank_pattern"].values()) == {8}  # the experts: a quarter
    model_config = AutoConfig.from_pretrained(settings["base_model_name_or_path"])  # the stand-in's folder
    with torch.device("meta"):
        reference = get_peft_model(AutoModelForCausalLM.from_config(model_config), LoraConfig.from_pretrained(adapter))
    expected = {name: tuple(t.shape) for name, t in get_peft_model_state_dict(reference).items()}
    with safe_open(str(adapter / "adapter_model.safetensors"), framework="pt") as saved:
        assert {name: tuple(saved.get_slice(name).get_shape()) for name in saved.keys()} == expected
        assert all(saved.get_tensor(name).abs().sum() > 0 for name in saved.keys() if "lora_B" in name)


def test_killed_run_resumes_to_the_uninterrupted_runs_losses(notebook_run, standin, tmp_path):
    uninterrupted, _, _ = notebook_run(SMOKE)
    resumed = run_killed_then_resumed(SMOKE, tmp_path, standin, merge_adapter=False)
    assert resumed["losses"] == uninterrupted["losses"]  # the adapter came back from checkpoint-10's file


def test_mlflow_store_holds_settings_metrics_and_a_loadable_model(notebook_run):
    metrics, _, workdir = notebook_run(SMOKE)
    assert_mlflow_run_holds_settings_metrics_and_a_loadable_model(project_store(workdir), metrics)
