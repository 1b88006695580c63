"""notebooks/choose_your_technique.ipynb: its plan table (plan.csv) recommends what the guide's rule of thumb says,
in the planner's order: DDP where the whole training state fits one GPU, ZeRO-2 where sharding the optimizer states
and gradients is enough, FSDP2 where the parameters must be sharded too, none where nothing fits (and LoRA then
often does); and says how long each recommended setup takes, in hours and GPU-hours, from the measured speeds."""
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
    ("llama-3.2-1b", "1xH100 80GB", "full", "ddp"),
    ("llama-3.2-3b", "2xH100 80GB", "full", "zero2"),  # DDP's gradient buckets no longer fit
    ("llama-3.1-8b", "8xH100 80GB", "full", "zero2"),
    ("qwen3-8b", "2xH100 80GB", "full", "none"),
    ("gpt-oss-20b", "8xH100 80GB", "full", "fsdp"),
    ("gpt-oss-120b", "1xH200 141GB", "full", "none"),
    ("gpt-oss-120b", "8xH200 141GB", "full", "none"),
    ("gpt-oss-120b", "8xH200 141GB", "lora", "fsdp"),
    ("llama-3.1-8b", "1xH100 80GB", "lora", "ddp"),
])
def test_the_plan_recommends_the_least_sharding_that_fits(plans, model, setup, fine_tune, technique):
    assert plans[(model, setup, fine_tune)].recommended == technique


def test_gpt_oss_120b_counts_its_117_billion_parameters(plans):
    assert plans[("gpt-oss-120b", "1xH100 80GB", "full")].parameters_b > 116


def test_every_setup_that_fits_says_its_hours_and_gpu_hours_and_where_they_come_from(plans):
    for row in plans.values():
        if not row.fits:
            assert pd.isna(row.hours) and pd.isna(row.gpu_hours), row
            continue
        assert row.hours > 0 and row.gpu_hours == pytest.approx(row.hours * row.gpus), row
        assert row.time_from.startswith(("measured", "no measured run")), row
    qwen = plans[("qwen3.8-27b", "8xH200 141GB", "lora")]  # measured: the FSDP2 recipe's 12 layers on one H200
    assert qwen.time_from.startswith("measured on 1 x H200: h200x1_2026-12-05/qwen35_call1/packed_4096; ")
    assert "8 GPUs at 97 % of one GPU's speed each, as measured on 2, assumed beyond 2" in qwen.time_from
    one, eight = plans[("llama-3.2-1b", "1xH100 80GB", "full")], plans[("llama-3.2-1b", "8xH100 80GB", "full")]
    assert one.gpu_hours < eight.gpu_hours  # 8 GPUs: sooner, at more GPU-hours
    assert eight.hours < one.hours
