"""What a user without a GPU sees when opening a Hugging Face notebook: each runs here *without* tests/hooks (no CPU
fix of TRL, accelerate or DeepSpeed), as on a laptop (issue 40). TRL 1.15's SFT loss is a Triton kernel that needs a
GPU (cpu_fixes.py lists what the other tests patch, and why), so these notebooks stop before loading anything, with
one line that says what to do."""
import os
from unittest import mock

import papermill
import pytest
from conftest import HOOKS
from harness import REPO

NEEDS_A_GPU = ["notebooks/trl/ddp_gpt_oss_20b.ipynb", "notebooks/trl/fsdp_gpt_oss_120b.ipynb",
               "notebooks/trl/deepspeed_llama_3_2_1b.ipynb"]


@pytest.mark.parametrize("notebook", NEEDS_A_GPU, ids=lambda p: p.split("/")[-1])
def test_without_a_gpu_the_trl_notebook_stops_before_loading_with_one_line_of_advice(notebook, standin, tmp_path):
    model = standin("llama-3.2-1b" if "llama" in notebook else "gpt-oss-20b+mxfp4")
    without_hooks = os.pathsep.join(p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p != str(HOOKS))
    with mock.patch.dict(os.environ, {"PYTHONPATH": without_hooks}):
        with pytest.raises(papermill.PapermillExecutionError) as failure:
            papermill.execute_notebook(str(REPO / notebook), str(tmp_path / "out.ipynb"), cwd=str(REPO / "notebooks"),
                                       parameters={"output_dir": str(tmp_path / "run"), "model_name_or_path": str(model),
                                                   "dataset_name": str(REPO / "data/capybara")},
                                       execution_timeout=120, progress_bar=False)
    error = failure.value
    assert error.ename == "NeedsGpuError", f"{error.ename}: {error.evalue}"
    assert "no GPU is visible" in error.evalue and "run this notebook on a machine with an NVIDIA GPU" in error.evalue
    assert not (tmp_path / "run").exists(), "nothing may be written before the refusal"
