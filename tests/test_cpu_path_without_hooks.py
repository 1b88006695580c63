"""What a user without a GPU sees when opening a Hugging Face notebook: each runs here *without* tests/hooks (no CPU
fix of TRL, accelerate or DeepSpeed), as on a laptop (issue 40). TRL 1.15's SFT loss is a Triton kernel that needs a
GPU (cpu_fixes.py lists what the other tests patch, and why), so the TRL and DeepSpeed notebooks stop before loading
anything, with one line that says what to do. The Unsloth notebook passes what it needs on CPUs itself and trains
as 2 CPU processes of one DDP job: its runs are all without tests/hooks, and tests/test_unsloth_notebook.py checks
there, on the smoke run it shares, that the 2 ranks trained as one job (and that a killed run resumes)."""
import os
from concurrent.futures import ThreadPoolExecutor
from unittest import mock

import papermill
from conftest import HOOKS
from harness import REPO

NEEDS_A_GPU = ["notebooks/trl/ddp_gpt_oss_20b.ipynb", "notebooks/trl/fsdp_gpt_oss_120b.ipynb",
               "notebooks/trl/deepspeed_llama_3_2_1b.ipynb"]


def refusal(notebook, model, folder):
    """The error papermill reports for `notebook` run without a GPU and without the hooks (None: it ran through)."""
    folder.mkdir()
    try:
        papermill.execute_notebook(str(REPO / notebook), str(folder / "out.ipynb"), cwd=str(REPO / "notebooks"),
                                   parameters={"output_dir": str(folder / "run"), "model_name_or_path": str(model),
                                               "dataset_name": str(REPO / "data/capybara")},
                                   execution_timeout=120, progress_bar=False)
    except papermill.PapermillExecutionError as error:
        return error
    return None


def test_without_a_gpu_each_trl_notebook_stops_before_loading_with_one_line_of_advice(standin, tmp_path):
    runs = {notebook: (standin("llama-3.2-1b" if "llama" in notebook else "gpt-oss-20b+mxfp4"), tmp_path / str(i))
            for i, notebook in enumerate(NEEDS_A_GPU)}
    without_hooks = os.pathsep.join(p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p != str(HOOKS))
    with mock.patch.dict(os.environ, {"PYTHONPATH": without_hooks}), ThreadPoolExecutor(len(runs)) as pool:
        # the kernels start and import TRL side by side: most of each run is waiting for imports
        errors = dict(zip(runs, pool.map(lambda item: refusal(item[0], *item[1]), runs.items())))
    for notebook, error in errors.items():
        assert error is not None, f"{notebook} ran through without a GPU"
        assert error.ename == "NeedsGpuError", f"{notebook}: {error.ename}: {error.evalue}"
        assert "no GPU is visible" in error.evalue and "on a machine with an NVIDIA GPU" in error.evalue, notebook
        assert not (runs[notebook][1] / "run").exists(), f"{notebook} wrote to output_dir before the refusal"
