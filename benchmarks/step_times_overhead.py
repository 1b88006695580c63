"""What StepTimes (nbhelpers.training.step_times) costs a step of the PyTorch MLP notebook's loop, on CPU.

    .venv/bin/python benchmarks/step_times_overhead.py            # prints the figures, writes nothing

The notebook's loop (notebooks/pytorch/ddp_mlp.ipynb: DDP MLP, 32 features, hidden 256, batch 256, Adam) on one gloo
rank, in this process: one rank is the smallest step, so the largest share for the same cost. Two measurements:
1. what StepTimes adds to a step, timed alone: a step of nothing but a forward pass of nn.Identity (the hooks' cost
   does not depend on the module) and step_done(), with StepTimes against without, over 50,000 steps (the median of
   9 repeats); that against the MLP loop's step, taken from its fastest epoch (the least disturbed by other work on
   the machine, so the largest share).
2. the whole loop, epochs with and without StepTimes alternating (ABAB..., 40 epochs each), the median time per
   step of each, and of each one's fastest epoch: a check of 1 on the real loop, which on a shared machine resolves
   only a few per cent (the fastest epochs, least disturbed, resolve best).
"""
from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset  # noqa: E402

from nbhelpers.launch.processes import free_port  # noqa: E402
from nbhelpers.training.step_times import StepTimes  # noqa: E402

NUM_SAMPLES, NUM_FEATURES, HIDDEN, BATCH = 8192, 32, 256, 256  # the notebook's CPU test case


class MLP(nn.Module):  # the notebook's
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(NUM_FEATURES, HIDDEN), nn.ReLU(), nn.Dropout(0.2), nn.Linear(HIDDEN, 1))

    def forward(self, x):
        return self.net(x)


def epoch(model, loader, optimizer, step_times=None) -> float:
    """The notebook's train_one_epoch (without its all-reduce of the loss); seconds per step."""
    started = time.perf_counter()
    for x, y in loader:
        loss = F.mse_loss(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if step_times is not None:
            step_times.step_done()
    return (time.perf_counter() - started) / len(loader)


def per_call(fn, calls: int = 50000) -> float:
    """Median over 9 repeats of the seconds one call of fn takes."""
    repeats = []
    for _ in range(9):
        started = time.perf_counter()
        for _ in range(calls):
            fn()
        repeats.append((time.perf_counter() - started) / calls)
    return statistics.median(repeats)


def main():
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)
    torch.manual_seed(0)
    inputs = torch.randn(NUM_SAMPLES, NUM_FEATURES)
    data = TensorDataset(inputs, torch.randn(NUM_SAMPLES, 1))
    loader = DataLoader(data, batch_size=BATCH, sampler=DistributedSampler(data, shuffle=True, seed=0), drop_last=True)
    model = DDP(MLP())
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    for _ in range(3):
        epoch(model, loader, optimizer)  # warm-up

    # 1. what StepTimes adds to a step, alone
    identity, x = nn.Identity(), torch.zeros(1)

    def step(step_times=None):
        identity(x)
        if step_times is not None:
            step_times.step_done()

    bare = per_call(step)
    step_times = StepTimes(identity)
    added = per_call(lambda: step(step_times)) - bare
    step_times.close()

    # 2. the loop, with and without, alternating
    plain, timed = [], []
    for _ in range(40):
        plain.append(epoch(model, loader, optimizer))
        step_times = StepTimes(model)
        timed.append(epoch(model, loader, optimizer, step_times))
        step_times.close()
    fastest, step = min(plain), statistics.median(plain)
    dist.destroy_process_group()

    print(f"torch {torch.__version__}, {os.cpu_count()} CPU cores, OMP_NUM_THREADS={os.environ['OMP_NUM_THREADS']}")
    print(f"step of the MLP loop, {len(loader)} steps an epoch: {fastest * 1e6:.0f} us in the fastest of 40 epochs, "
          f"{step * 1e6:.0f} us the median")
    print(f"1. StepTimes adds {added * 1e6:.2f} us a step (two forward hooks and step_done): {added / fastest:.2%} of "
          f"the fastest epoch's step")
    timed_step = statistics.median(timed)
    spread = statistics.quantiles(plain, n=4)
    print(f"2. whole loop: {timed_step * 1e6:.0f} us a step with StepTimes, {step * 1e6:.0f} without "
          f"({timed_step / step - 1:+.2%}; epochs without it spread {(spread[2] - spread[0]) / step:.1%} interquartile); "
          f"fastest epochs {min(timed) * 1e6:.0f} us and {fastest * 1e6:.0f} us ({min(timed) / fastest - 1:+.2%})")


if __name__ == "__main__":
    main()
