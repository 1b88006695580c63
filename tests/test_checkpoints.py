"""nbhelpers.training.checkpoints: a checkpoint is resumed from only when every file it wrote is there, whole and unchanged.

The crashes are real (SIGKILL of a process in the middle of writing), the full disk is simulated (ENOSPC
raised while the manifest is written), the damage is done to the bytes on disk.
"""
from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest

from nbhelpers.training import checkpoints
from nbhelpers.training.checkpoints import CheckpointError

REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}

# Saves step_STEP with two shards of CONTENT; after the first shard it says so and waits to be killed.
KILLED_WHILE_WRITING = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from nbhelpers.training import checkpoints
    parent, step, content = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    with checkpoints.saving(parent / f"step_{step}", {"step": step, "content": content}) as folder:
        (folder / "shard_0.bin").write_bytes(content.encode() * 50_000)
        with open(folder / "shard_1.bin", "wb") as f:
            f.write(content.encode() * 1000)
            f.flush()
            print("half written", flush=True)
            time.sleep(120)
""")


def save(parent: Path, step: int, content: str = "good", **kwargs) -> Path:
    with checkpoints.saving(parent / f"step_{step}", {"step": step, "content": content}, **kwargs) as folder:
        (folder / "shard_0.bin").write_bytes(content.encode() * 50_000)
        (folder / "shard_1.bin").write_bytes(content.encode() * 70_000)
    return parent / f"step_{step}"


def kill_while_saving(parent: Path, step: int, content: str) -> None:
    process = subprocess.Popen([sys.executable, "-c", KILLED_WHILE_WRITING, str(parent), str(step), content],
                               env=ENV, stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout.readline().strip() == "half written"
        process.send_signal(signal.SIGKILL)
    finally:
        process.kill()
        assert process.wait(timeout=30) == -signal.SIGKILL


def content_of(folder: Path) -> str:
    return checkpoints.read_metadata(folder)["content"]


def test_a_save_killed_mid_write_is_never_resumed_from(tmp_path, capsys):
    save(tmp_path, 1)
    kill_while_saving(tmp_path, 2, "half")
    assert (tmp_path / "step_2.tmp").is_dir() and not (tmp_path / "step_2").exists()
    assert checkpoints.newest_verified(tmp_path, "step_*") == tmp_path / "step_1"
    assert "ignoring unfinished saves" in capsys.readouterr().err
    assert save(tmp_path, 2) == checkpoints.newest_verified(tmp_path, "step_*")  # the next save of step 2 works


def test_a_disk_that_fills_while_the_manifest_is_written_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    save(tmp_path, 1)

    class DiskFull:  # the manifest's file: takes half of what is written, then the disk is full
        def __init__(self, path, mode="r", **kwargs):
            self.file = open(path, mode, **kwargs)

        def write(self, text):
            self.file.write(text[: len(text) // 2])
            self.file.flush()
            raise OSError(errno.ENOSPC, "No space left on device")

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.file.close()

    def open_while_the_disk_fills(path, *args, **kwargs):
        return (DiskFull if Path(path).name.startswith(checkpoints.MANIFEST) else open)(path, *args, **kwargs)

    monkeypatch.setattr(checkpoints, "open", open_while_the_disk_fills, raising=False)  # this module's `open` only
    with pytest.raises(checkpoints.CheckpointError, match=r"the disk of .* is full \(errno 28, No space left on device\)"
                       r"\. It is left unfinished as step_2\.tmp.* it resumes from .*step_1\."):
        save(tmp_path, 2, "new")
    monkeypatch.undo()  # space freed

    assert not (tmp_path / "step_2").exists()
    for _ in range(2):  # every restart finds the step-1 checkpoint (no JSONDecodeError)
        assert checkpoints.newest_verified(tmp_path, "step_*") == tmp_path / "step_1"
    assert content_of(save(tmp_path, 2, "new")) == "new"


def test_an_empty_manifest_is_reported_and_skipped_not_a_json_error(tmp_path, capsys):
    save(tmp_path, 1)
    (save(tmp_path, 2) / checkpoints.MANIFEST).write_text("")
    assert checkpoints.newest_verified(tmp_path, "step_*") == tmp_path / "step_1"
    assert f"checkpoint {tmp_path / 'step_2'} is not usable: its {checkpoints.MANIFEST} cannot be read" in \
        capsys.readouterr().err


def test_a_resave_of_an_existing_step_killed_mid_write_resumes_the_old_complete_one(tmp_path):
    save(tmp_path, 1)
    save(tmp_path, 2, "old")
    kill_while_saving(tmp_path, 2, "new")
    found = checkpoints.newest_verified(tmp_path, "step_*")
    assert found == tmp_path / "step_2" and content_of(found) == "old"
    assert (found / "shard_1.bin").read_bytes() == b"old" * 70_000  # not a byte of the half-written one


def test_a_resave_of_an_existing_step_replaces_it_whole(tmp_path):
    save(tmp_path, 2, "old")
    save(tmp_path, 2, "new")
    assert content_of(checkpoints.newest_verified(tmp_path, "step_*")) == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_2"]


def test_256_overwritten_bytes_of_a_shard_fall_back_to_the_previous_checkpoint_and_say_why(tmp_path, capsys):
    save(tmp_path, 1)
    shard = save(tmp_path, 2) / "shard_1.bin"
    with open(shard, "r+b") as f:
        f.seek(1000)
        f.write(os.urandom(256))
    assert checkpoints.newest_verified(tmp_path, "step_*") == tmp_path / "step_1"
    said = capsys.readouterr().err
    assert f"checkpoint {tmp_path / 'step_2'} is not usable: shard_1.bin does not match its checksum" in said
    assert f"using {tmp_path / 'step_1'} instead" in said


def test_a_truncated_shard_names_the_checkpoint_folder_and_what_to_do(tmp_path):
    shard = save(tmp_path, 1) / "shard_0.bin"
    os.truncate(shard, shard.stat().st_size - 1000)
    with pytest.raises(CheckpointError) as error:
        checkpoints.newest_verified(tmp_path, "step_*")
    message = str(error.value)
    assert str(tmp_path / "step_1") in message and "shard_0.bin is 199000 bytes, its manifest says 200000" in message and "(truncated)" in message
    assert "What to do: restore one of them from a copy, or delete them" in message
    with pytest.raises(CheckpointError, match=rf"checkpoint {tmp_path / 'step_1'} cannot be used: .*What to do: delete"):
        checkpoints.verify(tmp_path / "step_1")


def test_rotation_keeps_the_newest_and_never_deletes_the_newest_verified_when_the_newest_is_corrupt(tmp_path):
    for step in (1, 2, 3):
        save(tmp_path, step)
    (tmp_path / "step_9.tmp").mkdir()  # an unfinished save
    with open(tmp_path / "step_3" / "shard_0.bin", "r+b") as f:
        f.write(b"X" * 256)
    deleted = checkpoints.rotate(tmp_path, keep=1, pattern="step_*")
    assert sorted(p.name for p in deleted) == ["step_1", "step_9.tmp"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_2", "step_3"]  # step_2: the newest verified

    save(tmp_path, 4, keep=2)  # saving rotates too: step_2 goes, as step_4 is verified and newer
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_3", "step_4"]


def test_checkpoints_are_ordered_by_the_numbers_in_their_names(tmp_path):
    for step in (9, 10):
        save(tmp_path, step)
    assert checkpoints.newest_verified(tmp_path, "step_*") == tmp_path / "step_10"


def test_a_folder_someone_else_wrote_is_trusted_only_once_sealed(tmp_path, capsys):
    for step in (5, 10):  # as HF Trainer writes them: checkpoint-N, in place
        folder = tmp_path / f"checkpoint-{step}" / f"global_step{step}"
        folder.mkdir(parents=True)
        (folder / "zero_pp_rank_0_mp_rank_00_optim_states.pt").write_bytes(b"x" * 1000)
    checkpoints.seal(tmp_path / "checkpoint-5", {"global_step": 5})
    assert checkpoints.newest_verified(tmp_path, "checkpoint-*") == tmp_path / "checkpoint-5"
    assert f"checkpoint-10 is not usable: it has no {checkpoints.MANIFEST}" in capsys.readouterr().err
    assert checkpoints.verify(tmp_path / "checkpoint-5") == {"global_step": 5}


def test_no_checkpoint_yet_means_start_fresh(tmp_path):
    assert checkpoints.newest_verified(tmp_path / "not_there", "step_*") is None
    assert checkpoints.newest_verified(tmp_path, "step_*") is None


def test_a_resumed_run_whose_first_loss_is_not_finite_stops_with_a_clear_error(tmp_path):
    checkpoints.check_resumed_loss(float("nan"), None)  # a fresh run is not judged here
    checkpoints.check_resumed_loss(2.5, tmp_path / "step_4")
    with pytest.raises(CheckpointError, match=r"first loss after resuming from .*step_4 is nan.*What to do: delete"):
        checkpoints.check_resumed_loss(float("nan"), tmp_path / "step_4")


# Two ranks (gloo) write a torch.distributed.checkpoint each into the same folder; the ranks split the checking.
TWO_RANKS = textwrap.dedent("""
    import os, sys
    from pathlib import Path
    import torch, torch.distributed as dist, torch.distributed.checkpoint as dcp
    from nbhelpers.training import checkpoints
    dist.init_process_group("gloo")
    rank, parent = dist.get_rank(), Path(sys.argv[1])
    for step in (1, 2):
        state = {f"rank{rank}": torch.full((1000,), float(step + rank))}  # one tensor each: one shard each
        with checkpoints.saving(parent / f"step_{step}", {"step": step}, keep=2) as folder:
            dcp.save(state, checkpoint_id=folder)
    if rank == 0:
        with open(sorted((parent / "step_2").glob("__1_*.distcp"))[0], "r+b") as f:  # rank 1's shard
            f.write(b"X" * 256)
    dist.barrier()
    found = checkpoints.newest_verified(parent, "step_*")
    state = {f"rank{rank}": torch.zeros(1000)}
    dcp.load(state, checkpoint_id=found)
    print(f"rank {rank}: {found.name} {state[f'rank{rank}'][0].item()}", flush=True)
    dist.destroy_process_group()
""")


def test_two_ranks_write_one_checkpoint_and_agree_to_fall_back_from_a_corrupt_shard(tmp_path):
    script = tmp_path / "two_ranks.py"
    script.write_text(TWO_RANKS)
    result = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                             str(script), str(tmp_path / "checkpoints")], env={**ENV, "OMP_NUM_THREADS": "1"},
                            capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    manifest = (tmp_path / "checkpoints" / "step_1" / checkpoints.MANIFEST).read_text()
    assert "__0_0.distcp" in manifest and "__1_0.distcp" in manifest and ".metadata" in manifest
    assert "rank 0: step_1 1.0" in result.stdout and "rank 1: step_1 2.0" in result.stdout
    assert result.stderr.count("step_2 is not usable: __1_0.distcp does not match its checksum") == 1  # rank 0 says it


# --------------------------------------------------------------------------------------------------
# HF Trainer: trainer_callback() seals checkpoint-N; resuming takes the newest verified one
# --------------------------------------------------------------------------------------------------
def tiny_trainer(output_dir: Path, **overrides):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32))
    generator = torch.Generator().manual_seed(0)
    rows = [{"input_ids": ids, "labels": ids} for ids in torch.randint(0, 64, (32, 16), generator=generator)]
    settings = dict(max_steps=6, save_steps=2, save_total_limit=2, logging_steps=1, per_device_train_batch_size=4,
                    learning_rate=1e-2, use_cpu=True, report_to=[], seed=0, disable_tqdm=True)
    args = TrainingArguments(output_dir=str(output_dir), **{**settings, **overrides})
    return Trainer(model=model, args=args, train_dataset=rows, callbacks=[checkpoints.trainer_callback()])


def losses(trainer) -> dict:
    return {h["step"]: h["loss"] for h in trainer.state.log_history if "loss" in h}


def test_trainer_checkpoints_are_sealed_rotated_and_resumed_from_the_newest_verified_on_the_same_data(tmp_path, capsys):
    uninterrupted = tiny_trainer(tmp_path / "out")
    uninterrupted.train()
    names = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert names == ["checkpoint-4", "checkpoint-6"]  # save_total_limit=2, each sealed:
    assert checkpoints.verify(tmp_path / "out" / "checkpoint-6") == {"global_step": 6}

    with open(tmp_path / "out" / "checkpoint-6" / "model.safetensors", "r+b") as f:
        f.seek(-300, os.SEEK_END)
        f.write(os.urandom(256))
    found = checkpoints.newest_verified(tmp_path / "out", "checkpoint-*")
    assert found == tmp_path / "out" / "checkpoint-4"
    assert "checkpoint-6 is not usable: model.safetensors does not match its checksum" in capsys.readouterr().err

    resumed = tiny_trainer(tmp_path / "out")
    resumed.train(resume_from_checkpoint=str(found))
    assert losses(resumed) == pytest.approx(losses(uninterrupted), rel=1e-4)  # steps 1-4 from checkpoint-4's history
    assert checkpoints.newest_verified(tmp_path / "out", "checkpoint-*") == tmp_path / "out" / "checkpoint-6"


def test_a_trainer_resumed_from_a_checkpoint_with_nan_weights_stops_at_its_first_loss(tmp_path):
    from safetensors.torch import load_file, save_file

    tiny_trainer(tmp_path / "out", max_steps=2).train()
    checkpoint = tmp_path / "out" / "checkpoint-2"
    weights = load_file(checkpoint / "model.safetensors")
    save_file({k: v * float("nan") for k, v in weights.items()}, checkpoint / "model.safetensors",
              metadata={"format": "pt"})
    checkpoints.seal(checkpoint, {"global_step": 2})  # saved broken: its checksums match
    resumed = tiny_trainer(tmp_path / "out", max_steps=4)
    with pytest.raises(CheckpointError, match=rf"first loss after resuming from {checkpoint} is nan"):
        resumed.train(resume_from_checkpoint=str(checkpoints.newest_verified(tmp_path / "out", "checkpoint-*")))


def test_an_fsdp_checkpoint_that_holds_no_weights_is_refused_before_it_is_sealed(tmp_path):
    """accelerate 1.15 writes an FSDP2 PEFT model's sharded checkpoint with no tensors in it; sealing it would let a
    resume restart the adapter from its first values under the optimizer of step N (it did, silently)."""
    import torch
    import torch.distributed.checkpoint as dcp
    from safetensors.torch import save_file

    folder = tmp_path / "out" / "checkpoint-10"
    dcp.save({}, checkpoint_id=folder / "pytorch_model_fsdp_0")  # what the Trainer wrote for the adapter
    dcp.save({"state": {"w": torch.ones(2)}}, checkpoint_id=folder / "optimizer_0")
    (folder / "training_args.bin").write_bytes(b"settings, not weights")
    callback = checkpoints.trainer_callback()
    args, state = SimpleNamespace(output_dir=str(tmp_path / "out")), SimpleNamespace(global_step=10)
    with pytest.raises(CheckpointError, match="pytorch_model_fsdp_0 holds no tensors.*adapter"):
        callback.on_save(args, state, None)
    assert not (folder / "checkpoint_manifest.json").exists(), "never sealed"

    save_file({"lora_A.weight": torch.ones(2, 2)}, folder / "adapter_model.safetensors")  # the notebook's fix
    callback.on_save(args, state, None)
    assert checkpoints.verify(folder) == {"global_step": 10}
