"""What cannot run without a GPU says so in one line, before anything loads, instead of going wrong minutes later."""
from __future__ import annotations

import torch


class NeedsGpuError(RuntimeError):
    """What the notebook trains with cannot run on this machine's CPUs."""


def check_trl_runs_here() -> None:
    """Before anything loads: the TRL notebooks (DDP, FSDP, DeepSpeed through TRL's SFTTrainer) are made for GPUs.
    Without one, one line says so here. On CPUs accelerate (1.16) joins the notebook's processes into one job only
    with `use_cpu=True`, which these notebooks do not set (each process would train alone on all the data), and runs
    FSDP as DDP; TRL 1.15 computes the SFT loss with a Triton kernel that needs a GPU (TRL 1.16 has a PyTorch path
    for CPU tensors). With a GPU nothing is run (the notebook's own process keeps off the GPU)."""
    if torch.cuda.is_available():
        return
    raise NeedsGpuError("no GPU is visible, and this notebook trains with TRL on GPUs (on CPUs accelerate would run its "
                        "processes as separate jobs, FSDP as DDP, and TRL 1.15's loss needs a GPU): run it on a machine "
                        "with an NVIDIA GPU; on CPUs, the PyTorch notebooks (notebooks/pytorch/) and the Unsloth "
                        "notebook run as 2 processes")
