"""`@distributed(max_restarts=N)`: a failed launch starts every rank again, and the ranks resume from their checkpoint."""
import os
import signal
import time

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from nbhelpers import DistributedError, distributed
from nbhelpers.training import checkpoints

STEPS, KILLED_AT = 12, 7


def _train(folder, kill_at=None):
    """A DDP regression that saves a sealed checkpoint every 2 steps and resumes from the newest verified one;
    with kill_at, the last rank SIGKILLs itself after that step on the first attempt only."""
    dist.init_process_group("gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    data = torch.Generator().manual_seed(1)
    inputs, targets = torch.randn(STEPS, 16, 8, generator=data), torch.randn(STEPS, 16, 1, generator=data)
    losses, start = [], 0
    found = checkpoints.newest_verified(folder, "step_*")
    if found is not None:
        state = torch.load(found / f"rank{rank}.pt")
        model.load_state_dict(state["model"]), optimizer.load_state_dict(state["optimizer"])
        losses, start = state["losses"], state["step"]
    for step in range(start, STEPS):
        loss = torch.nn.functional.mse_loss(model(inputs[step, rank::world_size]), targets[step, rank::world_size])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        if (step + 1) % 2 == 0:
            with checkpoints.saving(folder / f"step_{step + 1}", {"step": step + 1}) as partial:
                torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "losses": losses,
                            "step": step + 1}, partial / f"rank{rank}.pt")
        attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
        if kill_at == step + 1 and attempt == 0 and rank == world_size - 1:
            os.kill(os.getpid(), signal.SIGKILL)
    dist.destroy_process_group()
    return {"losses": losses, "attempt": int(os.environ["TORCHELASTIC_RESTART_COUNT"]), "resumed_at": start}


def test_a_run_that_loses_a_rank_once_restarts_and_ends_with_the_uninterrupted_losses(tmp_path, capsys):
    uninterrupted = distributed(_train).distributed(tmp_path / "uninterrupted")
    restarted = distributed(max_restarts=1)(_train).distributed(tmp_path / "restarted", kill_at=KILLED_AT)
    assert [r["attempt"] for r in restarted] == [1, 1]
    assert [r["resumed_at"] for r in restarted] == [6, 6]  # the newest checkpoint before the kill at step 7
    assert [r["losses"] for r in restarted] == [r["losses"] for r in uninterrupted]
    said = capsys.readouterr().err
    assert said.count("restarting every rank") == 1
    assert ("@distributed: _train() attempt 1 failed (rank 1 of 2 was killed by signal SIGKILL (the kernel's "
            "out-of-memory killer sends SIGKILL: check host memory)); restarting every rank (restart 1 of 1)") in said


def _fails_on_every_attempt():
    rank, attempt = int(os.environ["RANK"]), int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    if rank == attempt % 2:
        raise RuntimeError(f"attempt {attempt} fails on rank {rank}")
    time.sleep(60)


def test_when_every_attempt_fails_the_error_names_each_attempts_failing_rank():
    with pytest.raises(DistributedError) as caught:
        distributed(max_restarts=2)(_fails_on_every_attempt).distributed()
    message = str(caught.value)
    assert message.startswith(
        "_fails_on_every_attempt() failed on each of its 3 attempts: attempt 1: rank 0 (rank 0 of 2 failed in "
        "_fails_on_every_attempt(): RuntimeError: attempt 0 fails on rank 0); attempt 2: rank 1 (rank 1 of 2 failed "
        "in _fails_on_every_attempt(): RuntimeError: attempt 1 fails on rank 1); attempt 3: rank 0 ("), message
    assert [a.rank for a in caught.value.attempts] == [0, 1, 0]
    assert caught.value.rank == 0


def test_max_restarts_must_be_a_whole_number():
    with pytest.raises(ValueError, match="max_restarts must be a whole number >= 0, got -1"):
        distributed(max_restarts=-1)(print)
