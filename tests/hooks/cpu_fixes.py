"""Hugging Face trainers (TRL, accelerate, DeepSpeed) on the CPU processes of the tests, without GPUs.

A user without a GPU gets none of this: the TRL and DeepSpeed notebooks stop before loading anything with one line
saying they need a GPU (`nbhelpers.training.needs_gpu`, tests/test_cpu_path_without_hooks.py runs them
without these fixes). The tests still train those notebooks' code on 2 CPU processes, under the four fixes below,
so that resuming, merging, sealing and tracking are tested on every commit; each is applied through
tests/hooks/sitecustomize.py in every process the tests start, only when no GPU is visible (and not where
COOKBOOK_CPU_FIXES=0). The Unsloth notebook needs none of them: it passes what it needs on CPUs itself (`use_cpu`,
ACCELERATE_TORCH_DEVICE=cpu, as fix 1 explains) and its cases run without them (notebook_cases.py: cpu_fixes=False).
What would remove each:

1. accelerate (under the Trainer) treats processes started like torchrun as one distributed job only on GPU-like
   devices; on CPUs, unless `use_cpu=True` is passed, each process silently trains alone, and with `use_cpu=True`
   each rank's device is `cpu:0`, onto which the Trainer loads the optimizer's state when more than one rank resumes
   (`map_location=args.device`), and torch.load knows no location `cpu:0` ("don't know how to restore data
   location"); the setting ACCELERATE_TORCH_DEVICE=cpu gives the device `cpu` instead. The Unsloth notebook passes
   both openly; the TRL and DeepSpeed notebooks, which refuse to run on a user's CPUs, pass neither, so here CPU
   processes with the torchrun environment form one gloo job on plain `cpu`. Removed by accelerate treating
   LOCAL_RANK on CPUs as it does on GPUs, with the device `cpu` (no upstream issue found; accelerate 1.16), or, for
   the TRL notebooks, by their passing the same two settings (fix 2).
2. The TRL notebooks' refusal (`check_trl_runs_here`) is lifted: it exists because of what fixes 1, 3 and 4 fix (and
   TRL 1.15's Triton loss kernel, which TRL 1.16, installed here, replaces on CPU tensors with PyTorch). Removed by the
   notebooks passing `use_cpu` and ACCELERATE_TORCH_DEVICE=cpu openly, as the Unsloth notebook does, and by fix 3's.
3. accelerate turns an FSDP plugin into FSDP only for GPU-like devices; for CPU processes it silently trains with
   DDP instead. Here it keeps FSDP, so `fully_shard` (which works on CPU with gloo) really shards the model and a
   test can check the sharding. Removed by accelerate allowing FSDP2 on CPU processes (no upstream issue found).
4. DeepSpeed's CPU backend JIT-compiles a shared-memory all-reduce (C++, 30-60 s, and a build lock left by a
   killed build makes every later run wait for ever). Without it DeepSpeed uses torch.distributed (gloo) for its
   collectives, which is all a 2-process test needs. Removed by a DeepSpeed setting to skip the shm op on CPU (none
   in DeepSpeed 0.19).
"""
from __future__ import annotations

import functools
import importlib
import os

import torch


def join_cpu_processes() -> None:
    """accelerate makes CPU processes with the torchrun environment one gloo job (MULTI_CPU), as it makes GPU ones an
    NCCL job, instead of unrelated single runs; each rank's device is plain `cpu`."""
    from accelerate.state import PartialState
    from accelerate.utils import DistributedType

    if getattr(PartialState._prepare_backend, "_joins_cpu_processes", False):
        return
    original = PartialState._prepare_backend

    @functools.wraps(original)
    def prepare_backend(self, *args, **kwargs):
        backend, distributed_type = original(self, *args, **kwargs)
        if distributed_type == DistributedType.NO and "LOCAL_RANK" in os.environ:
            return "gloo", DistributedType.MULTI_CPU
        return backend, distributed_type

    prepare_backend._joins_cpu_processes = True
    PartialState._prepare_backend = prepare_backend
    set_device = PartialState.set_device

    @functools.wraps(set_device)
    def set_plain_cpu_device(self):
        set_device(self)
        if self.device is not None and self.device.type == "cpu":
            self.device = torch.device("cpu")  # not cpu:RANK (torch.load's map_location knows no such device)

    PartialState.set_device = set_plain_cpu_device


def lift_the_trl_refusal() -> None:
    """The TRL notebooks' check_trl_runs_here returns: under fixes 1, 3 and 4 their CPU processes train as one job."""
    importlib.import_module("nbhelpers.training.needs_gpu").check_trl_runs_here = lambda: None


def keep_fsdp_on_cpu() -> None:
    """accelerate keeps an FSDP plugin for CPU processes (instead of silently falling back to DDP)."""
    from accelerate.state import AcceleratorState as state_class
    from accelerate.utils import DistributedType

    if getattr(state_class.__init__, "_keeps_fsdp_on_cpu", False):
        return
    original = state_class.__init__

    @functools.wraps(original)
    def init(self, *args, fsdp_plugin=None, **kwargs):
        original(self, *args, fsdp_plugin=fsdp_plugin, **kwargs)
        if fsdp_plugin is not None and self.distributed_type == DistributedType.MULTI_CPU:
            self.distributed_type = DistributedType.FSDP
            self.fsdp_plugin = fsdp_plugin

    init._keeps_fsdp_on_cpu = True
    state_class.__init__ = init


def skip_deepspeed_shm_build() -> None:
    """DeepSpeed's CPU collectives go through torch.distributed instead of a JIT-compiled C++ op."""
    try:  # the module itself: the attribute deepspeed.comm.torch is the torch package
        comm = importlib.import_module("deepspeed.comm.torch")
    except ImportError:  # no DeepSpeed installed: nothing to skip
        return
    comm.build_shm_op = lambda: None


# The module each fix patches; install() watches these names.
FIXES = {
    "accelerate.state": (join_cpu_processes, keep_fsdp_on_cpu),
    "nbhelpers.training.needs_gpu": (lift_the_trl_refusal,),
    "deepspeed.comm.torch": (skip_deepspeed_shm_build,),
}


def apply_without_gpus(module) -> None:
    """Without a GPU, the fixes for `module`, which has just been imported (see FIXES)."""
    if not torch.cuda.is_available():
        for fix in FIXES[module.__name__]:
            fix()
