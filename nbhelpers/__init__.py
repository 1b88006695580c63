"""Helpers for the multi-GPU training cookbook: run a notebook function on every GPU of the node."""
from nbhelpers.launcher import DistributedError, distributed
from nbhelpers.runtime import backend, device, get_rank, get_world_size

__all__ = [
    "distributed",
    "DistributedError",
    "backend",
    "device",
    "get_rank",
    "get_world_size",
]
