"""Helpers for the multi-GPU training cookbook: run a notebook function on every GPU of the node.

Importing it changes no other library: it only defines what is below. Ray is not imported (`ray_launch` loads on
first use; Ray itself only when a Ray launch runs).
"""
from nbhelpers.launch.commands import run_command
from nbhelpers.launch.launcher import (DistributedError, DistributedTimeoutError, LocalExecutionTimeoutError,
                                      distributed)
from nbhelpers.training import runtime  # serverless_gpu's `runtime`: `from nbhelpers import runtime as rt`
from nbhelpers.training.params import read_parameters
from nbhelpers.training.runtime import backend, device, get_rank, get_world_size

__all__ = [
    "distributed",
    "DistributedError",
    "DistributedTimeoutError",
    "LocalExecutionTimeoutError",
    "ray_launch",
    "read_parameters",
    "run_command",
    "backend",
    "device",
    "get_rank",
    "get_world_size",
]


def __getattr__(name: str):
    if name == "ray_launch":  # `from nbhelpers import ray_launch`: the Ray side of the launcher loads here
        from nbhelpers.launch.ray_launcher import ray_launch

        globals()["ray_launch"] = ray_launch
        return ray_launch
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted({*globals(), *__all__})
