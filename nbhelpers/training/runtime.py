"""Rank and device facts for code running under `@distributed`, torchrun or Ray.

Everything here reads the torchrun environment (RANK, LOCAL_RANK, WORLD_SIZE), so it answers
correctly before and after `init_process_group`, and as rank 0 of 1 in a plain process. Code written for
serverless_gpu's `runtime` module (`rt.get_global_rank()`, `rt.get_local_rank()`, `rt.get_world_size()`) runs with
`from nbhelpers import runtime as rt`.
"""
from __future__ import annotations

import os


def get_rank() -> int:
    """Global rank of this process (0 outside a distributed launch)."""
    return int(os.environ.get("RANK", 0))


get_global_rank = get_rank  # serverless_gpu.runtime's name for it


def get_local_rank() -> int:
    """Rank of this process on its node: the index of the GPU it should use."""
    return int(os.environ.get("LOCAL_RANK", 0))


def get_world_size() -> int:
    """Number of processes in the job (1 outside a distributed launch)."""
    return int(os.environ.get("WORLD_SIZE", 1))


def device():
    """This rank's device: `cuda:LOCAL_RANK` when CUDA is available, else the CPU."""
    import torch

    if torch.cuda.is_available():
        return torch.device("cuda", get_local_rank())
    return torch.device("cpu")


def backend() -> str:
    """The process-group backend for this machine: "nccl" on GPUs, "gloo" on CPUs."""
    import torch

    return "nccl" if torch.cuda.is_available() else "gloo"
