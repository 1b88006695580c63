"""notebooks/pytorch/fsdp2_transformer.ipynb: its smoke cases; the unsharded model predicts what the sharded one did;
and its distributed checkpoints (issue 16 §3, issue 18): a killed run, rerun with the same
command, resumes to exactly the uninterrupted run's losses; a checkpoint whose save was cut short, whose bytes
changed after it was written, or whose shard was truncated is never resumed from; a checkpoint whose weights
were already broken when it was saved stops the run at its first loss.

Each scenario runs the notebook with papermill (2 CPU processes, gloo, deterministic) on a small Transformer:
12 steps, a checkpoint every 4, the newest 2 kept. The crashes are real: test hooks (tests/hooks) SIGKILL the
last rank after an optimizer step or inside a checkpoint write, so no clean-up code runs; the hooks' records
show that they did (which rank the launcher's error blames is the launcher's tests' concern). Damaged checkpoints
are copies of those two runs' checkpoints, damaged as a disk or a user would: 256 bytes of one weight
overwritten, a shard cut in half.
"""
import shutil

import papermill
import pytest
from torch.distributed.checkpoint import FileSystemReader

import re

from harness import assert_case_passes, case_ids, hook_records, output_text, run_notebook
from nbhelpers.training import checkpoints
from notebook_cases import CASES, NotebookCase

NOTEBOOK = "notebooks/pytorch/fsdp2_transformer.ipynb"
MINE = [c for c in CASES if c.notebook == NOTEBOOK]
SMOKE = MINE[0]
SMALL_RUN = {k: v for k, v in SMOKE.parameters.items() if k != "output_dir"}
A_WEIGHT = "app.model.blocks.0.mlp.0.weight"

pytestmark = pytest.mark.notebook


@pytest.mark.parametrize("case", MINE, ids=case_ids(MINE))
def test_notebook_meets_its_expectations(case, notebook_run):
    assert_case_passes(case, notebook_run)


def test_the_unsharded_checkpoint_predicts_what_the_sharded_model_did(notebook_run):
    for case in MINE:
        _, executed, _ = notebook_run(case)
        difference = re.search(r"largest logit difference vs the sharded model ([0-9.e+-]+)", output_text(executed))
        assert float(difference.group(1)) < 1e-4


def run(workdir, hooks=()):
    """The notebook with SMALL_RUN into workdir/output; the same workdir again is the same command again."""
    case = NotebookCase(NOTEBOOK, parameters={**SMALL_RUN, "output_dir": "{output_dir}"}, timeout=150, hooks=hooks)
    metrics, executed = run_notebook(case, workdir)
    return metrics, output_text(executed)


def fails(workdir, match, hooks=()):
    with pytest.raises(papermill.PapermillExecutionError, match=match):
        run(workdir, hooks)


def killed(workdir, hook):
    """Run with test hook `hook` (name=value); it must have killed the last rank (rank 1), which stops the run."""
    with pytest.raises(papermill.PapermillExecutionError):
        run(workdir, hooks=(hook,))
    name, value = hook.split("=")
    records = hook_records(workdir, name)
    assert [r["rank"] for r in records] == [1], f"{hook} should have killed rank 1 once: {records}"
    return records[0]


def complete(checkpoint_dir):
    return sorted((p.name for p in checkpoint_dir.iterdir() if not p.name.endswith(".tmp")), key=lambda n: int(n[5:]))


def copied(checkpoint_dir, workdir):
    """A copy of `checkpoint_dir` where a run in `workdir` resumes from it."""
    return shutil.copytree(checkpoint_dir, workdir / "output" / "checkpoints")


def overwrite_256_bytes_of_a_weight(folder):
    """256 bytes of 0xff (NaN as float32, at any alignment) in the middle of one stored shard of A_WEIGHT."""
    stored = FileSystemReader(folder).read_metadata().storage_data
    where = next(info for index, info in stored.items() if index.fqn == A_WEIGHT)
    with open(folder / where.relative_path, "r+b") as shard:
        shard.seek(where.offset + where.length // 2)
        shard.write(b"\xff" * 256)


@pytest.fixture(scope="module")
def uninterrupted(notebook_run):
    """The smoke case's run: (its metrics, its checkpoint folder)."""
    metrics, _, workdir = notebook_run(SMOKE)
    assert metrics["resumed_from"] == [None, None] and len(metrics["losses"]) == SMALL_RUN["max_steps"]
    assert complete(workdir / "output" / "checkpoints") == ["step_8", "step_12"]
    return metrics, workdir / "output" / "checkpoints"


@pytest.fixture(scope="module")
def killed_after_step_6(tmp_path_factory):
    """The checkpoints of a run whose last rank was killed right after step 6: step_4 only."""
    workdir = tmp_path_factory.mktemp("killed")
    assert killed(workdir, "kill_rank_after_optimizer_step=6")["step"] == 6
    assert complete(workdir / "output" / "checkpoints") == ["step_4"], "it should have died after its step-4 checkpoint"
    return workdir / "output" / "checkpoints"


def test_killed_run_resumes_to_the_same_losses(tmp_path, uninterrupted, killed_after_step_6):
    copied(killed_after_step_6, tmp_path)
    resumed, _ = run(tmp_path)
    assert resumed["resumed_from"] == ["step_4", "step_4"]
    assert resumed["losses"] == uninterrupted[0]["losses"], "resuming must reproduce the uninterrupted run exactly"


def test_checkpoint_cut_short_by_a_crash_is_never_resumed_from(tmp_path, uninterrupted):
    checkpoint_dir = tmp_path / "output" / "checkpoints"
    record = killed(tmp_path, "kill_rank_while_writing_checkpoint=2")  # the second save: step 8
    assert record["path"].endswith("step_8.tmp"), record
    partial = checkpoint_dir / "step_8.tmp"
    assert partial.is_dir(), "the crash should have left the step-8 checkpoint half written"
    assert not (partial / ".metadata").exists(), "the crash should have come before the save finished"
    assert complete(checkpoint_dir) == ["step_4"]

    resumed, text = run(tmp_path)
    assert resumed["resumed_from"] == ["step_4", "step_4"], "resume must take the last complete checkpoint, not the cut one"
    assert "ignoring unfinished saves" in text and "step_8.tmp" in text
    assert resumed["losses"] == uninterrupted[0]["losses"]


def test_a_checkpoint_changed_after_it_was_written_is_passed_over_for_the_one_before(tmp_path, uninterrupted):
    checkpoint_dir = copied(uninterrupted[1], tmp_path)
    overwrite_256_bytes_of_a_weight(checkpoint_dir / "step_12")

    resumed, text = run(tmp_path)
    assert f"checkpoint {checkpoint_dir / 'step_12'} is not usable" in text and "does not match its checksum" in text
    assert f"using {checkpoint_dir / 'step_8'} instead" in text
    assert resumed["resumed_from"] == ["step_8", "step_8"]
    assert resumed["losses"] == uninterrupted[0]["losses"], "every loss finite, as in the uninterrupted run"
    assert complete(checkpoint_dir) == ["step_8", "step_12"], "rotation kept the good one; step 12 saved anew"
    for folder in checkpoint_dir.iterdir():
        checkpoints.verify(folder)


def test_a_checkpoint_saved_with_broken_weights_stops_the_resumed_run_at_its_first_loss(
        tmp_path, killed_after_step_6):
    checkpoint_dir = copied(killed_after_step_6, tmp_path)
    overwrite_256_bytes_of_a_weight(checkpoint_dir / "step_4")
    checkpoints.seal(checkpoint_dir / "step_4", {"step": 4})  # the checksums match: broken before it was sealed
    fails(tmp_path, r"the first loss after resuming from \S*step_4 is nan")


def test_a_truncated_shard_names_the_checkpoint_folder_and_what_to_do(tmp_path, killed_after_step_6):
    checkpoint_dir = copied(killed_after_step_6, tmp_path)
    shard = max((checkpoint_dir / "step_4").glob("*.distcp"), key=lambda p: p.stat().st_size)
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
    fails(tmp_path, rf"(?s){checkpoint_dir / 'step_4'}: {shard.name} is \d+ bytes.*truncated.*What to do")
