"""The stall test both engines share (tests/test_distributed.py, tests/test_ray.py)."""
import time

import pytest

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
    assert f"no rank of stalls() made progress (no output) for {stall_timeout} s" in message
    for rank in (0, 1):
        section = message.split(f"--- rank {rank} ---")[1].split("--- rank")[0]
        assert "wait_here_for_ever" in section, f"rank {rank}'s stack is missing:\n{message}"
