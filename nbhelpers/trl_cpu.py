"""Hugging Face trainers (TRL, accelerate, DeepSpeed) on a machine without GPUs: CI and laptops.

The notebooks run the same TRL code on GPUs and, for their tests, as 2 CPU processes. Four things in
the current stack assume a GPU; `patch_for_cpu()` fixes each of them when no GPU is visible, and does
nothing when one is. Call it first thing inside the training function (every rank is its own process
and patches its own copy of the libraries):

    from nbhelpers.trl_cpu import patch_for_cpu
    patch_for_cpu()   # a no-op on GPUs

1. accelerate (under the Trainer) treats processes started like torchrun as one distributed job only
   on GPU-like devices; on CPUs, unless `use_cpu=True` is passed, each process silently trains alone,
   and with DeepSpeed the Trainer and DeepSpeed then disagree on the world size. Here CPU processes
   form a gloo job whatever the arguments, as GPUs form an NCCL one.
2. TRL 1.15 computes the SFT loss (and its logged entropy and accuracy) with a Triton kernel
   (`trl.kernels.ChunkedLogProbFunction`); Triton needs a GPU ("0 active drivers"). Replaced by the
   same computation in plain PyTorch (`TorchChunkedLogProb`).
3. accelerate turns an FSDP plugin into FSDP only for GPU-like devices; for CPU processes it silently
   trains with DDP instead. Here it keeps FSDP, so `fully_shard` (which works on CPU with gloo) really
   shards the model and a test can check the sharding.
4. DeepSpeed's CPU backend JIT-compiles a shared-memory all-reduce (C++, 30-60 s, and a build lock
   left by a killed build makes every later run wait for ever). Without it DeepSpeed uses
   torch.distributed (gloo) for its collectives, which is all a 2-process test needs.
"""
from __future__ import annotations

import functools
import importlib
import os

import torch


class TorchChunkedLogProb:
    """`ChunkedLogProbFunction.apply` of TRL, in plain PyTorch: per-token statistics of the LM head's logits.

    Returns (log_probs, entropy, log_sum_sq_probs, mean_logits, is_top1) for `targets`, each None unless
    requested in `outputs` (log_probs always). The logits are transformed as in the kernel: scaled by
    `logit_scale`, soft-capped at `final_logit_softcapping`, divided by `temperature`.
    """

    @staticmethod
    def apply(hidden, weight, bias, targets, temperature, chunk_size, final_logit_softcapping=None, logit_scale=1.0,
              outputs=("entropy", "log_sum_sq_probs", "mean_logits", "is_top1")):
        logits = torch.nn.functional.linear(hidden, weight, bias).float() * logit_scale
        if final_logit_softcapping is not None:
            logits = final_logit_softcapping * torch.tanh(logits / final_logit_softcapping)
        logits = logits / temperature
        log_softmax = logits.log_softmax(dim=-1)
        log_probs = log_softmax.gather(-1, targets[:, None]).squeeze(-1)
        entropy = -(log_softmax.exp() * log_softmax).sum(-1) if "entropy" in outputs else None
        log_sum_sq_probs = None
        if "log_sum_sq_probs" in outputs:
            log_sum_sq_probs = torch.logsumexp(2 * log_softmax, dim=-1).detach()
        mean_logits = logits.mean(-1).detach() if "mean_logits" in outputs else None
        is_top1 = (logits.argmax(-1) == targets) if "is_top1" in outputs else None  # argmax: the first maximum
        return log_probs, entropy, log_sum_sq_probs, mean_logits, is_top1


def join_cpu_processes() -> None:
    """accelerate makes CPU processes with WORLD_SIZE > 1 one gloo job (MULTI_CPU) instead of unrelated single runs."""
    from accelerate.state import PartialState
    from accelerate.utils import DistributedType

    if getattr(PartialState._prepare_backend, "_joins_cpu_processes", False):
        return
    original = PartialState._prepare_backend

    @functools.wraps(original)
    def prepare_backend(self, *args, **kwargs):
        backend, distributed_type = original(self, *args, **kwargs)
        if distributed_type == DistributedType.NO and int(os.environ.get("WORLD_SIZE", "1")) > 1:
            return "gloo", DistributedType.MULTI_CPU
        return backend, distributed_type

    prepare_backend._joins_cpu_processes = True
    PartialState._prepare_backend = prepare_backend


def use_torch_loss() -> None:
    """TRL's fused LM head computes its per-token log-probabilities with `TorchChunkedLogProb`."""
    import trl.trainer.utils

    trl.trainer.utils._ChunkedLogProbFunction = TorchChunkedLogProb


def keep_fsdp_on_cpu() -> None:
    """accelerate keeps an FSDP plugin for CPU processes (instead of silently falling back to DDP)."""
    import accelerate.state
    from accelerate.utils import DistributedType

    state_class = accelerate.state.AcceleratorState
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


def patch_for_cpu() -> list[str]:
    """Without a GPU, apply the four fixes above; return the names of those applied ([] on GPUs)."""
    if torch.cuda.is_available():
        return []
    patches = [join_cpu_processes, use_torch_loss, keep_fsdp_on_cpu, skip_deepspeed_shm_build]
    for patch in patches:
        patch()
    return [patch.__name__ for patch in patches]
