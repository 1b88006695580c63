"""notebooks/choose_your_technique.ipynb: its plan table (plan.csv) recommends what the guide's rule of thumb says,
in the planner's order: DDP where the whole training state fits one GPU, ZeRO-2 where sharding the optimizer states
and gradients is enough, FSDP2 where the parameters must be sharded too, none where nothing fits (and LoRA then
often does)."""
import pandas as pd
import pytest

from harness import assert_case_passes, case_ids
from notebook_cases import CASES

NOTEBOOK = "notebooks/choose_your_technique.ipynb"
MINE = [c for c in CASES if c.notebook == NOTEBOOK]

pytestmark = pytest.mark.notebook


@pytest.mark.parametrize("case", MINE, ids=case_ids(MINE))
def test_notebook_meets_its_expectations(case, notebook_run):
    assert_case_passes(case, notebook_run)


@pytest.fixture(scope="module")
def plans(notebook_run):
    _, _, workdir = notebook_run(MINE[0])
    table = pd.read_csv(workdir / "output" / "plan.csv")
    return {(r.model, f"{r.gpus}x{r.gpu}", r.fine_tune): r for r in table.itertuples()}


@pytest.mark.parametrize("model, setup, fine_tune, technique", [
    ("llama-3.2-1b", "1x80GB", "full", "ddp"),
    ("llama-3.2-3b", "2x80GB", "full", "zero2"),  # DDP's gradient buckets no longer fit
    ("llama-3.1-8b", "8x80GB", "full", "zero2"),
    ("qwen3-8b", "2x80GB", "full", "none"),
    ("gpt-oss-20b", "8x80GB", "full", "fsdp"),
    ("gpt-oss-120b", "1x141GB", "full", "none"),
    ("gpt-oss-120b", "8x141GB", "full", "none"),
    ("gpt-oss-120b", "8x141GB", "lora", "fsdp"),
    ("llama-3.1-8b", "1x80GB", "lora", "ddp"),
])
def test_the_plan_recommends_the_least_sharding_that_fits(plans, model, setup, fine_tune, technique):
    assert plans[(model, setup, fine_tune)].recommended == technique


def test_gpt_oss_120b_counts_its_117_billion_parameters(plans):
    assert plans[("gpt-oss-120b", "1x80GB", "full")].parameters_b > 116
