"""Papermill runs of every notebook with the smoke parameters of notebook_cases.py."""
import pytest

from harness import assert_case_passes, case_ids
from notebook_cases import CASES


# The notebooks whose cases run in a test file of their own, beside the tests that reuse their runs
# (pytest-xdist's --dist loadfile keeps a file's tests on one worker, where the session's runs are).
OWN_FILE = {f"notebooks/trl/{name}.ipynb" for name in ("ddp_gpt_oss_20b", "fsdp_gpt_oss_120b", "deepspeed_llama_3_2_1b")}
OWN_FILE |= {"notebooks/unsloth/ddp_llama_3_2_3b.ipynb", "notebooks/axolotl/ddp_olmo3_7b.ipynb",
             "notebooks/pytorch/fsdp2_transformer.ipynb", "notebooks/pytorch/ddp_retinanet.ipynb",
             "notebooks/lightning/ddp_two_tower.ipynb", "notebooks/choose_your_technique.ipynb",
             "notebooks/02_fast_steps.ipynb", "notebooks/03_surviving_failures.ipynb"}
HERE = [c for c in CASES if c.notebook not in OWN_FILE]


@pytest.mark.notebook
@pytest.mark.parametrize("case", HERE, ids=case_ids(HERE))
def test_notebook_meets_its_expectations(case, notebook_run):
    assert_case_passes(case, notebook_run)
