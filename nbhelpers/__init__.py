"""Helpers for the multi-GPU training cookbook: run a notebook function on every GPU of the node."""
from nbhelpers.after_import import when_imported
from nbhelpers.launcher import DistributedError, distributed
from nbhelpers.params import read_parameters
from nbhelpers.runtime import backend, device, get_rank, get_world_size

__all__ = [
    "distributed",
    "DistributedError",
    "read_parameters",
    "backend",
    "device",
    "get_rank",
    "get_world_size",
]

# Without GPUs, TRL, accelerate and DeepSpeed get their CPU fixes as they are imported, in this process and in
# every rank (nbhelpers/trl_cpu.py says which and why); with GPUs this does nothing.
for _module in ("accelerate.state", "trl.trainer.utils", "deepspeed.comm.torch"):  # the keys of trl_cpu.FIXES
    when_imported(_module, lambda module: __import__("nbhelpers.trl_cpu").trl_cpu.apply_without_gpus(module))
