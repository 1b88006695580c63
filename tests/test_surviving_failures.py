"""notebooks/03_surviving_failures.ipynb on 2 CPU processes and on one (its cases in notebook_cases.py): the rank that
fails is named, the rerun resumes from the newest checkpoint to the uninterrupted run's losses, the hung collective
is caught with every rank's stack showing where it waits (rank 0 in the barrier the last rank skipped, rank 1 in the
next all_reduce), the process-group timeout fires, and torchrun's restart finishes the job."""
import re

import pytest

from harness import assert_case_passes, case_ids, output_text
from notebook_cases import CASES

NOTEBOOK = "notebooks/03_surviving_failures.ipynb"
MINE = [c for c in CASES if c.notebook == NOTEBOOK]

pytestmark = pytest.mark.notebook


@pytest.fixture(scope="module")
def guide(notebook_run):
    metrics, executed, _ = notebook_run(MINE[0])
    return metrics, output_text(executed)


@pytest.mark.parametrize("case", MINE, ids=case_ids(MINE))
def test_notebook_meets_its_expectations(case, notebook_run):
    assert_case_passes(case, notebook_run)


def test_one_rank_resumes_to_its_uninterrupted_losses_too(notebook_run):
    metrics, _, _ = notebook_run(MINE[1])  # the num_gpus=1 case
    assert metrics["world_size"] == 1 and len(metrics["resumed_losses"]) == len(metrics["losses"]) == 10
    assert max(abs(a - b) for a, b in zip(metrics["losses"], metrics["resumed_losses"])) < 1e-5


def test_the_failed_rank_is_named(guide):
    _, text = guide
    assert "DistributedError: rank 1 failed" in text
    assert "the failure demo: rank 1 fails at step 6" in text


def test_the_rerun_resumes_from_the_newest_checkpoint_to_the_uninterrupted_runs_losses(guide):
    metrics, text = guide
    assert "resuming from" in text and "(step 4)" in text
    assert max(abs(a - b) for a, b in zip(metrics["losses"], metrics["resumed_losses"])) < 1e-5
    assert len(metrics["resumed_losses"]) == len(metrics["losses"]) == 10


def collective_waited_in(stall_text, rank):
    section = re.search(rf"--- rank {rank} ---\n(.*?)(?=\n--- rank |\Z)", stall_text, re.S)
    waits = re.findall(r"in (barrier|all_reduce|all_gather|broadcast)\b", section.group(1)) if section else []
    return waits[0] if waits else None


def test_the_hung_collective_is_caught_with_each_ranks_stack(guide):
    _, text = guide
    assert "no rank of skips_a_barrier() made progress" in text
    stall = text[text.index("no rank of skips_a_barrier() made progress"):]
    assert collective_waited_in(stall, 0) == "barrier"
    assert collective_waited_in(stall, 1) == "all_reduce"


def test_the_process_group_timeout_turns_the_hang_into_a_failure(guide):
    _, text = guide
    failure = re.search(r"\(launch included\): rank (\d) failed:\n(.*)", text, re.S)
    assert failure, "the timeout demo reported no failed rank"
    assert "timed out" in failure.group(2)[:1500].lower()


def test_torchrun_restarts_the_group_and_the_second_attempt_finishes(guide):
    _, text = guide
    assert "torchrun exited with 0; attempts that finished: [1]" in text
