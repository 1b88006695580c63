"""Helpers for the multi-GPU training cookbook: run a notebook function on every GPU of the node.

Importing it changes no other library: it only defines what is below.
"""
from nbhelpers.launch.commands import run_command
from nbhelpers.launch.launcher import (DistributedError, DistributedTimeoutError, LocalExecutionTimeoutError,
                                      distributed)
from nbhelpers.launch.ray_launcher import ray_launch
from nbhelpers.params import read_parameters
from nbhelpers.runtime import backend, device, get_rank, get_world_size

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
