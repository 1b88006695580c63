"""notebooks/trl/ddp_gpt_oss_20b.ipynb: its smoke cases, a run killed after its first checkpoint resuming to the
uninterrupted run's losses, the merged model, its MLflow run, and a model too large for the GPUs stopping before
it loads. The cases' runs are shared (notebook_run), so this file's tests stay on one pytest-xdist worker."""
import json

import papermill
import pytest
import torch
from harness import assert_case_passes, case_ids, hook_records, project_store, run_notebook
from notebook_cases import CASES, NotebookCase
from peft import PeftModel
from transformers import AutoModelForCausalLM, AutoTokenizer, Mxfp4Config
from trl_checks import assert_mlflow_run_holds_settings_metrics_and_a_loadable_model, run_killed_then_resumed

NOTEBOOK = "notebooks/trl/ddp_gpt_oss_20b.ipynb"
MINE = [c for c in CASES if c.notebook == NOTEBOOK]
SMOKE = MINE[0]
pytestmark = pytest.mark.notebook


@pytest.mark.parametrize("case", MINE, ids=case_ids(MINE))
def test_notebook_meets_its_expectations(case, notebook_run):
    assert_case_passes(case, notebook_run)


def test_the_trainer_ran_as_ddp_on_both_ranks(notebook_run):
    _, _, workdir = notebook_run(SMOKE)
    records = hook_records(workdir, "record_trainer")
    assert [(r["rank"], r["world_size"], r["wrapped"]) for r in sorted(records, key=lambda r: r["rank"])] == \
        [(0, 2, "DistributedDataParallel"), (1, 2, "DistributedDataParallel")]


def test_each_rank_trains_on_packed_rows(notebook_run):
    """packing=True: TRL's padding-free rows (the masks that keep their conversations apart are
    test_gpt_oss_compile_and_packing.py's)."""
    _, _, workdir = notebook_run(SMOKE)
    assert [r["padding_free"] for r in hook_records(workdir, "record_trainer")] == [True, True]


def test_killed_run_resumes_to_the_uninterrupted_runs_losses(notebook_run, standin, tmp_path):
    uninterrupted, _, _ = notebook_run(SMOKE)
    resumed = run_killed_then_resumed(SMOKE, tmp_path, standin, merge_adapter=False)
    assert uninterrupted["resumed_from"] == [None, None]
    # Resuming restores weights, optimizer, scheduler, random states and the data position: the same losses, bit
    # for bit
    assert resumed["losses"] == uninterrupted["losses"]


def test_merged_model_reloads_with_the_logits_of_base_plus_adapter(notebook_run, standin):
    _, _, workdir = notebook_run(SMOKE)
    output, base_path = workdir / "output", standin("gpt-oss-20b+mxfp4")
    tokenizer = AutoTokenizer.from_pretrained(output / "merged")
    inputs = tokenizer("¿Cuál es el capital de Australia? Canberra.", return_tensors="pt")
    base = AutoModelForCausalLM.from_pretrained(base_path, quantization_config=Mxfp4Config(dequantize=True))
    with torch.no_grad():
        before = base(**inputs).logits
        with_adapter = PeftModel.from_pretrained(base, output / "adapter")(**inputs).logits
    merged, loading = AutoModelForCausalLM.from_pretrained(output / "merged", output_loading_info=True)
    assert not any(loading.values()), f"the merged checkpoint does not load cleanly: {loading}"
    assert "quantization_config" not in json.loads((output / "merged" / "config.json").read_text())
    with torch.no_grad():
        after = merged(**inputs).logits
    difference, effect = (after - with_adapter).abs().max().item(), (with_adapter - before).abs().max().item()
    # Tolerance: the merge rounds each W + BA once more than the adapter's forward does (fp32 here).
    assert difference < 2e-2 and difference < 0.05 * effect, f"merged vs base + adapter {difference}, adapter {effect}"


def test_mlflow_store_holds_settings_metrics_and_a_loadable_model(notebook_run):
    metrics, _, workdir = notebook_run(SMOKE)
    assert_mlflow_run_holds_settings_metrics_and_a_loadable_model(project_store(workdir), metrics)


def test_a_model_too_large_for_the_gpus_stops_before_it_loads(standin, tmp_path):
    """On one 40 GB GPU the full-size GPT-OSS-20B (config only: nothing is loaded) does not fit with DDP, even with
    gradient checkpointing: the planner's verdict stops the notebook before the model loads, with what would fit
    instead."""
    case = NotebookCase(NOTEBOOK, {**SMOKE.parameters, "model_name_or_path": "{standin:gpt-oss-20b@full}",
                                   "max_length": 2048}, hooks=("simulate_gpu_memory=1x39.4",), timeout=180)
    with pytest.raises(papermill.PapermillExecutionError) as failure:
        run_notebook(case, tmp_path, standin)
    error = failure.value
    assert error.ename == "WillNotFit"
    assert "gradient checkpointing: about 48.0 GiB per GPU are needed and one GPU has 39.4" in error.evalue
    assert "What would fit: FSDP2 (ZeRO-3) on 2 such GPUs" in error.evalue
    assert "check_memory=False" in error.evalue
    assert not (tmp_path / "output" / "checkpoints").exists()


@pytest.mark.parametrize("gpu_memory_gib, torch_compile, every_n_layers", [(79.6, True, None), (140.4, False, None),
                                                                          (79.6, False, 2)])
def test_the_trainer_gets_the_planners_way_to_fit_with_the_same_tokens_a_step(monkeypatch, capsys, gpu_memory_gib,
                                                                               torch_compile, every_n_layers):
    """The notebook's settings as its settings cell leaves them for the full-size model: its own 4 rows and 4
    accumulation steps without recomputation where that fits (compiled layers on an 80 GB GPU, any on a 141 GB one),
    every 2nd layer checkpointed eager on 80 GB; 16 rows a step either way. A config file's checkpointing wins, also
    under the name Transformers 5.17 gave it."""
    from types import SimpleNamespace

    from nbhelpers.planner import fits
    from nbhelpers.training.activation_checkpointing import checkpointing_field, with_installed_names
    from notebook_code import notebook_cells

    monkeypatch.setattr(fits, "visible_gpus", lambda: [("NVIDIA GPU", gpu_memory_gib)])
    nb = notebook_cells(NOTEBOOK, "sft_config")
    for config_file in ({}, {"gradient_checkpointing": True}):
        args = SimpleNamespace(output_dir="/tmp/out", learning_rate=2e-4, max_steps=8, per_device_train_batch_size=4,
                               max_length=2048, sft_settings=with_installed_names(config_file))
        args.sft_settings |= fits.fit_activations(  # as the notebook's settings cell
            "gpt-oss-20b", "ddp", per_device_train_batch_size=args.per_device_train_batch_size,
            gradient_accumulation_steps=args.sft_settings.get("gradient_accumulation_steps", 4),
            gradient_checkpointing=args.sft_settings.get(checkpointing_field()), lora_rank=8, seq_len=2048,
            attention="flex", chunked_loss=True, torch_compile=torch_compile)
        sft = nb["sft_config"](args)
        assert (sft.per_device_train_batch_size, sft.gradient_accumulation_steps) == (4, 4)
        every = 1 if config_file else every_n_layers
        field = checkpointing_field()  # activation checkpointing's, in this Transformers
        assert getattr(sft, field) == (every is not None)
        assert getattr(sft, f"{field}_kwargs").get("every_n_layers", 1) == (every or 1)
        assert getattr(sft, f"{field}_kwargs")["use_reentrant"] is False  # DDP with frozen weights needs it
    assert len(capsys.readouterr().err.strip().splitlines()) == 2  # one verdict a run
