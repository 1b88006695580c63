"""The TRL notebooks' whole workflow (issue 18): a run killed after its first checkpoint resumes to the
uninterrupted run's losses; the merged model reloads with the logits of base + adapter; the MLflow store holds
each run's settings, metrics and a loadable model. Bad input stops before any rank starts (issue 16).

The uninterrupted runs are the smoke cases of notebook_cases.py (run once per session: `notebook_run`).
"""
import json

import mlflow
import nbformat
import papermill
import pytest
import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM, AutoTokenizer, Mxfp4Config

from harness import hook_records, run_notebook
from notebook_cases import CASES, NotebookCase
from nbhelpers import checkpoints

pytestmark = pytest.mark.notebook


def smoke_case(notebook: str) -> NotebookCase:
    """The notebook's multi-rank smoke case (num_gpus None: 2 CPU processes)."""
    path = f"notebooks/trl/{notebook}.ipynb"
    return next(c for c in CASES if c.notebook == path and c.parameters["num_gpus"] is None)


def run_killed_then_resumed(case: NotebookCase, workdir, standin, **after):
    """Run `case` until the last rank is SIGKILLed right after the first sealed checkpoint, then the same command
    again (plus `after`: settings that change nothing before the end of training). Returns (checkpoints seen
    after the kill, the resumed run's metrics)."""
    killed = NotebookCase(case.notebook, case.parameters, timeout=case.timeout, hooks=("kill_rank_after_checkpoint=1",))
    with pytest.raises(papermill.PapermillExecutionError):  # which rank the error blames is the launcher's test
        run_notebook(killed, workdir, standin)
    [kill] = hook_records(workdir, "kill_rank_after_checkpoint")  # the last rank died right after that checkpoint
    folder = workdir / "output" / "checkpoints"
    assert kill["path"] == str(folder / "checkpoint-10")
    left = sorted(p.name for p in folder.glob("checkpoint-*"))
    checkpoints.verify(folder / "checkpoint-10")  # complete: every file matches its manifest
    resumed, _ = run_notebook(NotebookCase(case.notebook, {**case.parameters, **after}, timeout=case.timeout), workdir,
                              standin)
    return left, resumed


@pytest.mark.parametrize("notebook", ["ddp_gpt_oss_20b", "deepspeed_llama_3_2_1b", "fsdp_gpt_oss_120b"])
def test_killed_run_resumes_to_the_uninterrupted_runs_losses(notebook, notebook_run, standin, tmp_path):
    case = smoke_case(notebook)
    uninterrupted, _, _ = notebook_run(case)
    if case.parameters["save_steps"] != 10:  # the FSDP smoke run saves once, at the end: the same run saving every 10
        case = NotebookCase(case.notebook, {**case.parameters, "save_steps": 10}, timeout=case.timeout)
    cheaper = {"max_new_tokens": 0, "merge_adapter": False} if notebook.startswith("ddp") else {"max_new_tokens": 0}
    left, resumed = run_killed_then_resumed(case, tmp_path, standin, **cheaper)
    assert left == ["checkpoint-10"], "the run should have died right after its first checkpoint"
    assert resumed["resumed_from"][0].endswith("checkpoint-10")
    assert uninterrupted["resumed_from"] == [None, None]
    # Resuming restores weights, optimizer, scheduler, random states and the data position: the same losses,
    # bit for bit (the FSDP2 notebook's bound, tests/test_fsdp2_checkpoints.py)
    assert resumed["losses"] == uninterrupted["losses"]
    assert resumed["final_loss"] == uninterrupted["final_loss"]


def test_merged_model_reloads_with_the_logits_of_base_plus_adapter(notebook_run, standin):
    _, _, workdir = notebook_run(smoke_case("ddp_gpt_oss_20b"))
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
    # Tolerance: the dequantised experts are bf16, and the merge rounds each W + BA to bf16 once more (the adapter's
    # forward adds BA in one fused step): about one bf16 step (2^-8 relative) per expert weight. Measured: 5e-3.
    assert difference < 2e-2 and difference < 0.05 * effect, f"merged vs base + adapter {difference}, adapter {effect}"


@pytest.mark.parametrize("notebook", ["ddp_gpt_oss_20b", "fsdp_gpt_oss_120b", "deepspeed_llama_3_2_1b"])
def test_mlflow_store_holds_settings_metrics_and_a_loadable_model(notebook, notebook_run):
    metrics, _, workdir = notebook_run(smoke_case(notebook))
    assert metrics["mlflow_tracking_uri"] == f"sqlite:///{workdir / 'mlflow.db'}"  # the folder above output_dir
    client = mlflow.MlflowClient(metrics["mlflow_tracking_uri"])
    run = client.get_run(metrics["mlflow_run_id"])
    assert run.data.params["notebook.learning_rate"] == run.data.params["learning_rate"]  # notebook's and Trainer's
    assert client.get_metric_history(run.info.run_id, "loss")[-1].value == pytest.approx(metrics["final_loss"])
    [model] = client.search_logged_models([run.info.experiment_id], filter_string=f"source_run_id='{run.info.run_id}'")
    mlflow.set_tracking_uri(metrics["mlflow_tracking_uri"])
    signature = mlflow.models.get_model_info(model.model_uri).signature  # text in, text out
    assert signature.inputs.to_dict() == signature.outputs.to_dict() == [{"type": "string", "required": True}]
    loaded = mlflow.transformers.load_model(model.model_uri, return_type="components")
    tokenizer = loaded["tokenizer"]
    with torch.no_grad():
        logits = loaded["model"](**tokenizer("Hello", return_tensors="pt")).logits
    assert logits.shape[-1] == loaded["model"].config.vocab_size and torch.isfinite(logits).all()


def test_a_model_that_cannot_be_found_stops_before_any_rank_starts(tmp_path):
    # The Llama notebook's default is the gated meta-llama/Llama-3.2-1B-Instruct; offline it cannot be fetched.
    case = NotebookCase("notebooks/trl/deepspeed_llama_3_2_1b.ipynb", {"output_dir": "{output_dir}"}, timeout=120)
    with pytest.raises(papermill.PapermillExecutionError) as failure:
        run_notebook(case, tmp_path)
    message = str(failure.value)
    for needed in ("meta-llama/Llama-3.2-1B-Instruct", "not a folder on disk", "hub", "HF_TOKEN", "hf auth login"):
        assert needed in message, f"the error does not say {needed!r}: {message[-600:]}"
    executed = nbformat.read(tmp_path / "deepspeed_llama_3_2_1b.ipynb", as_version=4)
    launches = [c for c in executed.cells if c.cell_type == "code" and ".distributed(" in c.source]
    assert launches and all(c.execution_count is None for c in launches), "a rank was started"
    assert not (tmp_path / "output" / "metrics.json").exists()
