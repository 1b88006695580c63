"""What several launcher test files share: the stall tests of both engines, GPUs simulated for the local engine, the
check that a launch left no process running (in this process, or in a notebook kernel)."""
import contextlib
import os
import threading
import time

import psutil
import pytest
import torch
import torch.distributed as dist

import nbhelpers.launch.gpus as gpus
from nbhelpers import DistributedError, distributed
from timed_stream import TimedStream


def assert_a_stall_names_every_ranks_stack(stall_timeout: float, **options) -> None:
    """A launch whose ranks stop printing raises after `stall_timeout` s with every rank's Python stack."""
    @distributed(stall_timeout=stall_timeout, **options)
    def stalls():
        def wait_here_for_ever():
            time.sleep(300)

        print("started", flush=True)
        wait_here_for_ever()

    with pytest.raises(DistributedError) as caught:
        stalls.distributed()
    message = str(caught.value)
    assert f"no rank of stalls() made progress (no output, no change in its Python stack) for {stall_timeout} s" in message
    for rank in (0, 1):
        section = message.split(f"--- rank {rank} ---")[1].split("--- rank")[0]
        assert "wait_here_for_ever" in section, f"rank {rank}'s stack is missing:\n{message}"


def assert_a_rank_stuck_in_a_collective_is_a_stall(stall_timeout: float, reported_within: float = 30,
                                                   **options) -> None:
    """Rank 0 waits in an all_reduce that rank 1 never joins while rank 1 keeps printing: rank 0 alone is stalled,
    and the report, within `reported_within` s of rank 0's last output (rank 1 talks for 60 s), shows it in
    all_reduce. Timed from that output, not from the launch: starting the ranks (Ray's above all) takes a minute on a
    loaded 2-core machine, and says nothing about how soon a stall is seen."""
    @distributed(stall_timeout=stall_timeout, **options)
    def waits_in_all_reduce_while_rank_1_talks(seconds):
        def talk(until):
            for i in range(int(seconds / 0.5)):
                if until.is_set():
                    return
                print(f"still busy ({i})", flush=True)
                time.sleep(0.5)

        # Both ranks talk while they meet in init_process_group: on a loaded machine one may wait there for the
        # other longer than the stall timeout, which would make the waiting rank, not rank 0, the stalled one.
        met = threading.Event()
        talker = threading.Thread(target=talk, args=(met if os.environ["RANK"] == "0" else threading.Event(),))
        talker.start()
        dist.init_process_group("gloo")
        if dist.get_rank() == 0:
            met.set()
            talker.join()
            dist.all_reduce(torch.ones(1))  # rank 1 never joins: this waits for ever
        talker.join()

    out = TimedStream()  # when each rank's output arrived
    with pytest.raises(DistributedError) as caught, contextlib.redirect_stdout(out):
        waits_in_all_reduce_while_rank_1_talks.distributed(60)
    reported = time.monotonic()
    message = str(caught.value)
    rank_0_silent_since = max(at for at, text in out.pieces if "[rank 0] still busy" in text)
    took = reported - rank_0_silent_since
    assert took < reported_within, f"reported {took:.1f} s after rank 0's last output:\n{message}"
    assert caught.value.rank == 0
    assert message.startswith("rank 0 of waits_in_all_reduce_while_rank_1_talks() made no progress (no output, "
                              f"no change in its Python stack) for {stall_timeout} s while rank 1 went on"), message
    rank_0, rank_1 = message.split("--- rank 0 ---")[1].split("--- rank 1 ---")
    assert "all_reduce" in rank_0, message
    assert "talk" in rank_1, message


def simulate_gpus(monkeypatch, tmp_path, count, name="NVIDIA H200"):
    """This process sees `count` GPUs named `name` (the ranks still run on the CPU, with gloo), leased in
    a folder of this test's own."""
    monkeypatch.setattr(gpus, "_visible_gpu_count", lambda: count)
    monkeypatch.setattr(gpus, "_gpu_names", lambda gpus: [name] * len(gpus))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setenv("NBHELPERS_GPU_LEASE_DIR", str(tmp_path / "leases"))


INFRASTRUCTURE = ("multiprocessing.forkserver", "multiprocessing.resource_tracker")


def leftover_processes(root_pid=None):
    """Descendants of `root_pid` (default: this process) except the idle fork server (kept for fast
    relaunches) and multiprocessing's resource tracker. Ranks and anything they started count."""
    root = psutil.Process(root_pid or os.getpid())
    left = []
    for p in root.children(recursive=True):
        try:
            # Ranks are forks of the server and share its command line: only the server itself,
            # a direct child of root, is infrastructure.
            is_infrastructure = p.ppid() == root.pid and any(m in " ".join(p.cmdline()) for m in INFRASTRUCTURE)
            if p.status() == psutil.STATUS_ZOMBIE or is_infrastructure:
                continue
        except psutil.Error:
            continue
        left.append(p)
    return left


def assert_nothing_left_running(root_pid=None, within: float = 2):
    deadline = time.monotonic() + within  # the kernel reaps asynchronously
    while (left := leftover_processes(root_pid)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not left, f"processes left running: {[(p.pid, p.cmdline()) for p in left]}"
