"""notebooks/02_fast_steps.ipynb on 2 CPU processes and on one (its cases in notebook_cases.py): every knob row is
measured, and each throughput counts all ranks' tokens of the timed steps over rank 0's seconds of them."""
import pytest

from harness import assert_case_passes, case_ids
from notebook_cases import CASES

NOTEBOOK = "notebooks/02_fast_steps.ipynb"
MINE = [c for c in CASES if c.notebook == NOTEBOOK]

pytestmark = pytest.mark.notebook


@pytest.fixture(scope="module")
def metrics(notebook_run):
    return notebook_run(MINE[0])[0]


@pytest.mark.parametrize("case", MINE, ids=case_ids(MINE))
def test_notebook_meets_its_expectations(case, notebook_run):
    assert_case_passes(case, notebook_run)


def test_every_knob_is_measured_with_two_ranks(metrics):
    assert [k["change"] for k in metrics["knobs"]] == [
        "baseline (FSDP2, bf16, eager)", "fp32 instead of bf16", "activation checkpointing", "2x batch size",
        "FSDP2 reshard_after_forward=False", "DDP instead of FSDP2", "DataLoader: 0 workers, pageable memory",
        "torch.compile"]
    assert all(k["fits"] for k in metrics["knobs"]), metrics["knobs"]  # no row ran out of memory here


def test_each_rows_throughput_counts_every_ranks_tokens_of_its_timed_steps(metrics):
    # tokens/s is all ranks' tokens of the timed steps over rank 0's seconds of them: 2 steps x 2 ranks x the row's
    # batch x 64 tokens. Counting one rank's tokens, or the warm-up's seconds, fails this.
    for k in metrics["knobs"]:
        batch = 2 * 2 if k["change"] == "2x batch size" else 2
        assert k["tokens_per_s"] * k["timed_s"] == pytest.approx(2 * 2 * batch * 64, rel=1e-6), k


def test_the_profiled_throughput_counts_the_timed_steps(metrics):
    assert metrics["tokens_per_s"] * metrics["timed_s"][0] == pytest.approx(2 * 2 * 2 * 64, rel=1e-6), metrics
