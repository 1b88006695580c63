"""What several launcher test files share: the stall test of both engines, GPUs simulated for the local engine."""
import time

import pytest

import nbhelpers.launch.local_engine as local_engine
from nbhelpers import DistributedError, distributed


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


def simulate_gpus(monkeypatch, tmp_path, count, name="NVIDIA H200"):
    """This process sees `count` GPUs named `name` (the ranks still run on the CPU, with gloo), leased in
    a folder of this test's own."""
    monkeypatch.setattr(local_engine, "_visible_gpu_count", lambda: count)
    monkeypatch.setattr(local_engine, "_gpu_names", lambda gpus: [name] * len(gpus))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setenv("NBHELPERS_GPU_LEASE_DIR", str(tmp_path / "leases"))
