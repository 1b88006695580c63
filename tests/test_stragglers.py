"""Which rank held the others back, and why (nbhelpers.launch.stragglers, nbhelpers.training.step_times): CPU, gloo.

The launches train a small DDP model with the plain-loop call (StepTimes + step_done) on 2 or 3 ranks, one of them
made late on purpose: its data loader sleeps before each batch, or its batches are 4 times larger. The Trainer and
Lightning callbacks are exercised by the notebooks' tests (tests/notebook_cases.py: the MLP, two-tower and TRL cases
check that every rank recorded its steps); the report's arithmetic on its own is tested here with figures given.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader

from nbhelpers import DistributedError, backend, distributed
from nbhelpers.launch.processes import free_port
from nbhelpers.launch.stragglers import launch_figures
from nbhelpers.training.step_times import StepTimes

REPO = Path(__file__).resolve().parents[1]
LINE = "slower than the median rank"


class RandomRows(torch.utils.data.Dataset):
    """`size` rows of 256 random numbers, made as they are read."""

    def __init__(self, size):
        self.size = size

    def __len__(self):
        return self.size

    def __getitem__(self, index):
        return torch.randn(256)


def train(late_rank=None, how=None, steps=60, fail_at=None, killed_at=None):
    """A DDP MLP for `steps` steps; `late_rank`'s data loader sleeps 15 ms a batch (how="data"), or its batches are
    4 times larger (how="step"). fail_at: rank 0 raises after that many steps; killed_at: rank 1 is killed (SIGKILL)
    after that many."""
    dist.init_process_group(backend())
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    late = rank == late_rank
    rows = 256 * (4 if late and how == "step" else 1)

    def collate(items):
        if late and how == "data":
            time.sleep(0.015)  # a slow data pipeline: decoding, augmenting, a remote file system
        return torch.stack(items)

    loader = DataLoader(RandomRows(rows * steps), batch_size=rows, collate_fn=collate)
    step_times = StepTimes(model)
    for step, x in enumerate(loader):
        if step == fail_at and rank == 0:
            raise RuntimeError("rank 0 gives up")
        if step == killed_at and rank == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        loss = model(x).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        step_times.step_done()
    step_times.close()
    dist.destroy_process_group()
    return rank


def test_the_rank_whose_data_loader_is_delayed_is_named_waiting_for_data(capsys):
    results = distributed(train, gpus=3).distributed(late_rank=1, how="data")
    figures = results.step_times
    assert figures["straggler_rank"] == 1, figures
    assert figures["straggler"].startswith(f"rank 1 was ") and "waiting for data" in figures["straggler"], figures
    assert figures["steps"] == [59, 59, 59]  # every step of each rank but its first (no start to count from)
    assert figures["data_wait_s"][1] > 10 * max(figures["data_wait_s"][0], figures["data_wait_s"][2]), figures
    err = capsys.readouterr().err
    assert f"@distributed: train(): {figures['straggler']}" in err, err


def test_the_rank_whose_steps_are_slower_is_named_slower_steps(capsys):
    results = distributed(train, gpus=3).distributed(late_rank=2, how="step")
    figures = results.step_times
    assert figures["straggler_rank"] == 2, figures
    assert "slower steps" in figures["straggler"] and "waiting for data" not in figures["straggler"], figures
    # every step ended in DDP's all-reduce: the ranks' whole steps took about as long, yet rank 2 is named
    assert max(figures["step_s"]) < 1.5 * min(figures["step_s"]), figures
    assert f"@distributed: train(): rank 2 was " in capsys.readouterr().err


def test_even_ranks_are_reported_by_nobody(capsys):
    results = distributed(train, gpus=2).distributed()
    assert results.step_times["straggler_rank"] is None and results.step_times["straggler"] is None, results.step_times
    assert all(s < 0.10 for s in results.step_times["slower_than_median"]), results.step_times
    assert results.step_times["steps"] == [59, 59]
    assert LINE not in capsys.readouterr().err


def test_a_failed_launch_still_reports_the_steps_that_ran(capsys):
    with pytest.raises(DistributedError, match="rank 0 gives up"):
        distributed(train, gpus=2).distributed(late_rank=1, how="data", steps=200, fail_at=40)
    assert f"@distributed: train(): rank 1 was " in capsys.readouterr().err


def test_a_rank_killed_by_a_signal_has_left_its_steps_for_the_report(capsys):
    with pytest.raises(DistributedError, match="rank 1 of 2 was killed by signal SIGKILL"):
        distributed(train, gpus=2).distributed(late_rank=1, how="data", steps=200, killed_at=40)
    assert f"@distributed: train(): rank 1 was " in capsys.readouterr().err


def test_an_interrupted_launch_still_reports_the_steps_that_ran(capsys):
    interrupt = threading.Timer(6.0, os.kill, (os.getpid(), signal.SIGINT))  # as the notebook's Stop button
    interrupt.start()
    try:
        with pytest.raises(KeyboardInterrupt, match="stopped 2 ranks of train()"):
            distributed(train, gpus=2).distributed(late_rank=1, how="data", steps=2000)
    finally:
        interrupt.cancel()
    assert f"@distributed: train(): rank 1 was " in capsys.readouterr().err


def test_a_launch_that_times_no_step_reports_nothing(capsys):
    @distributed(gpus=2)
    def untimed():
        return os.environ["RANK"]

    assert untimed.distributed().step_times is None
    assert LINE not in capsys.readouterr().err


def test_the_figures_go_into_the_active_mlflow_run(tmp_path):
    import mlflow

    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlflow.db'}")
    try:
        experiment = mlflow.create_experiment("stragglers", artifact_location=tmp_path.as_uri())
        with mlflow.start_run(experiment_id=experiment) as run:
            figures = distributed(train, gpus=2).distributed(late_rank=1, how="data", steps=30).step_times
        logged = mlflow.MlflowClient().get_run(run.info.run_id).data
    finally:
        mlflow.set_tracking_uri(None)
    assert logged.tags["straggler"] == figures["straggler"]
    for rank in (0, 1):
        assert logged.metrics[f"system/rank_{rank}_data_wait_ms"] == pytest.approx(figures["data_wait_s"][rank] * 1000)
        assert logged.metrics[f"system/rank_{rank}_step_time_ms"] > 0


TORCHRUN_SCRIPT = """
import sys
import threading
sys.path.insert(0, {tests!r})
from test_stragglers import train
train(late_rank=1, how="data", steps=40)
"""


def test_under_torchrun_rank_0_prints_the_report_when_training_ends(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(TORCHRUN_SCRIPT.format(tests=str(REPO / "tests")))
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2", f"--master-port={free_port()}",
               str(script)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("NBHELPERS_STEP_TIMES_FILE", None)
    done = subprocess.run(command, capture_output=True, text=True, timeout=180, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [line for line in done.stderr.splitlines() if LINE in line]
    assert len(lines) == 1 and "nbhelpers: rank 1 was " in lines[0] and "waiting for data" in lines[0], done.stderr


# --- the report's arithmetic, on figures given -------------------------------------------------------------

def rank(data_wait, forward, step, steps=100):
    return {"steps": steps, "data_wait_s": data_wait, "forward_s": forward, "step_s": step}


def test_a_late_batch_is_data_and_a_slower_forward_pass_is_compute():
    # rank 1 waits 40 ms for its batch; the others compute for 100 ms and wait for it in the all-reduce
    figures = launch_figures([rank(0.002, 0.030, 0.142), rank(0.042, 0.030, 0.142), rank(0.002, 0.030, 0.142)])
    assert figures["straggler_rank"] == 1
    assert figures["straggler"] == ("rank 1 was 39 % slower than the median rank: 100 % of its extra time waiting "
                                    "for data (its wait for a batch 42 ms a step, the others' 2 ms)")
    # rank 2's forward pass takes 1.25 times the others': its whole computation is taken to, (1 - 1/1.25) of 140 ms
    figures = launch_figures([rank(0.002, 0.030, 0.142), rank(0.002, 0.030, 0.142), rank(0.002, 0.0375, 0.142)])
    assert figures["straggler_rank"] == 2
    assert figures["straggler"].startswith("rank 2 was 25 % slower than the median rank: slower steps, 100 % of its "
                                           "extra time (its forward pass 37.5 ms, the others' 30 ms)")


def test_nothing_is_said_below_a_tenth_slower_nor_for_one_rank_nor_with_an_untimed_rank():
    assert launch_figures([rank(0.002, 0.030, 0.142), rank(0.012, 0.030, 0.142)])["straggler"] is None  # 7.6 %
    assert launch_figures([rank(0.002, 0.030, 0.142)])["straggler"] is None
    assert launch_figures([rank(0.002, 0.030, 0.142), None])["straggler"] is None


def test_a_slower_gpu_clock_is_said_with_what_held_it_down():
    gpus = {"gpu_sm_clock_mhz_median": [1980, 1410, 1980, 1975], "gpu_temperature_celsius_max": [71, 88, 70, 72],
            "gpu_clock_limited_by": [[], ["thermal"], [], []]}
    ranks = [rank(0.002, 0.030, 0.190)] * 4
    ranks[1] = rank(0.002, 0.042, 0.190)
    line = launch_figures(ranks, gpus)["straggler"]
    assert line.startswith("rank 1 was ") and "slower steps" in line, line
    assert line.endswith("; its GPU ran at 1,410 MHz against 1,980 MHz on the others: thermal throttling (88 °C)"), line
    # a clock that tells nothing (the others' too) is not said
    gpus["gpu_sm_clock_mhz_median"] = [1980, 1975, 1980, 1975]
    assert "MHz" not in launch_figures(ranks, gpus)["straggler"]


def test_the_gpu_clock_read_is_the_one_while_busy_and_says_what_held_it_down():
    from nbhelpers.launch.system_metrics import RankSampler

    sampler = RankSampler([1, 2], gpus=["0", "1"])
    idle = (0.0, 10.0, 2**30, 0, 2**30, 345, 40, frozenset())  # (time, CPU %, host, GPU %, GPU bytes, MHz, °C, held by)
    sampler.samples = [[idle, (1.0, 100.0, 2**30, 99, 2**33, 1980, 70, frozenset())] * 3,
                       [idle, (1.0, 100.0, 2**30, 98, 2**33, 1410, 88, frozenset({"thermal"}))] * 3]
    summary = sampler.summary()
    assert summary["gpu_sm_clock_mhz_median"] == [1980, 1410]  # the idle samples' 345 MHz left out
    assert summary["gpu_temperature_celsius_max"] == [70, 88]
    assert summary["gpu_clock_limited_by"] == [[], ["thermal"]]
