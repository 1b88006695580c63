"""What cannot run without a GPU says so in one line, before anything loads, instead of failing minutes later."""
from __future__ import annotations

import torch


class NeedsGpuError(RuntimeError):
    """What the notebook trains with cannot run on this machine's CPUs."""


def check_trl_loss_runs_here() -> None:
    """Before anything loads: TRL 1.15's SFTTrainer computes its loss with a Triton kernel (`trl.kernels`), which needs
    a GPU. Without one, one line says so here, instead of Triton's "0 active drivers" at the first training step.
    With a GPU nothing is run (the notebook's own process keeps off the GPU)."""
    if torch.cuda.is_available():
        return
    from trl.trainer import utils

    try:
        utils._ChunkedLogProbFunction.apply(torch.zeros(1, 8), torch.zeros(4, 8), None, torch.zeros(1, dtype=torch.long),
                                            1.0, 4)
    except RuntimeError as error:
        if "active drivers" not in str(error):
            raise
        raise NeedsGpuError("no GPU is visible, and TRL's SFTTrainer computes its loss with a Triton kernel that needs "
                            "one (TRL 1.15): run this notebook on a machine with an NVIDIA GPU; on CPUs, the PyTorch "
                            "notebooks (notebooks/pytorch/) run as 2 processes") from None
