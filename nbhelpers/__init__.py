"""Helpers for the multi-GPU training cookbook: run a notebook function on every GPU of the node."""
from nbhelpers.launcher import DistributedError, distributed
from nbhelpers.params import read_parameters
from nbhelpers.runtime import backend, device, get_local_rank, get_rank, get_world_size, is_main_process, print0

__all__ = [
    "distributed",
    "DistributedError",
    "read_parameters",
    "backend",
    "device",
    "get_rank",
    "get_local_rank",
    "get_world_size",
    "is_main_process",
    "print0",
]

