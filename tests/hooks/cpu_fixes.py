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
   LOCAL_RANK on CPUs as it does on GPUs, with the device `cpu` (no upstream issue found; accelerate 1.15), or, for
   the TRL notebooks, by their passing the same two settings once they run on CPUs (fix 2).
2. TRL 1.15 computes the SFT loss (and its logged entropy and accuracy) with a Triton kernel
   (`trl.kernels.ChunkedLogProbFunction`), and Triton needs a GPU ("0 active drivers"; its interpreter,
   TRITON_INTERPRET=1, is right but takes seconds per 512 tokens). Replaced by the same computation in plain PyTorch
   (`TorchChunkedLogProbFunction`; like the kernel, its backward re-gathers a ZeRO-3 LM head). Removed by a PyTorch
   path in TRL for tensors on the CPU (no upstream issue found; TRL 1.15).
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


def _per_token(hidden, weight, bias, targets, temperature, softcap, logit_scale, outputs):
    logits = hidden.float() @ weight.float().t()
    if bias is not None:
        logits = logits + bias.float()
    logits = logits * logit_scale
    if softcap is not None:
        logits = softcap * torch.tanh(logits / softcap)
    logits = logits / temperature
    log_z = torch.logsumexp(logits, dim=-1)
    log_probs = logits.gather(-1, targets[:, None]).squeeze(-1) - log_z
    entropy = log_sum_sq = mean = top1 = None
    if "entropy" in outputs:
        entropy = log_z - (torch.softmax(logits, -1) * logits).sum(-1)
    if "log_sum_sq_probs" in outputs:
        log_sum_sq = torch.logsumexp(2 * (logits - log_z[:, None]), dim=-1)
    if "mean_logits" in outputs:
        mean = logits.mean(-1)
    if "is_top1" in outputs:
        top1 = logits.argmax(-1) == targets
    return log_probs, entropy, log_sum_sq, mean, top1


class TorchChunkedLogProbFunction(torch.autograd.Function):
    """`trl.kernels.ChunkedLogProbFunction` (same arguments, same outputs) in PyTorch ops.

    Like the kernel, the backward recomputes the logits and re-enters TRL's ZeRO-3 gather of the LM head,
    whose weight is released again after the forward.
    """

    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, temperature, chunk_size, final_logit_softcapping=None,
                logit_scale=1.0, outputs=("log_probs",)):
        ctx.set_materialize_grads(False)
        ctx.settings = (temperature, final_logit_softcapping, logit_scale)
        ctx.save_for_backward(hidden, weight, bias, targets)
        with torch.no_grad():
            results = _per_token(hidden, weight, bias, targets, temperature, final_logit_softcapping, logit_scale,
                                 outputs)
        log_probs, entropy = results[0].to(hidden.dtype), results[1]
        entropy = entropy.to(hidden.dtype) if entropy is not None else None
        ctx.mark_non_differentiable(*(x for x in results[2:] if x is not None))
        return (log_probs, entropy, *results[2:])

    @staticmethod
    def backward(ctx, grad_log_probs, grad_entropy, *_):
        from trl.trainer.utils import maybe_gather_lm_head_ctx

        hidden, weight, bias, targets = ctx.saved_tensors
        temperature, softcap, logit_scale = ctx.settings
        needs = ctx.needs_input_grad[:3]
        with maybe_gather_lm_head_ctx(weight, bias), torch.enable_grad():
            leaves = [x.detach().requires_grad_(need) if x is not None else None
                      for x, need in zip((hidden, weight, bias), needs)]
            log_probs, entropy, *_ = _per_token(*leaves, targets, temperature, softcap, logit_scale,
                                                ("entropy",) if grad_entropy is not None else ())
            pairs = [(out, grad) for out, grad in ((log_probs, grad_log_probs), (entropy, grad_entropy))
                     if grad is not None]
            wanted = [leaf for leaf, need in zip(leaves, needs) if need and leaf is not None]
            grads = iter(torch.autograd.grad([o for o, _ in pairs], wanted, [g.float() for _, g in pairs],
                                             allow_unused=True) if pairs and wanted else ())
            result = [next(grads) if need and leaf is not None else None for leaf, need in zip(leaves, needs)]
        result = [g.to(x.dtype) if g is not None else None for g, x in zip(result, (hidden, weight, bias))]
        return (*result, None, None, None, None, None, None)


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


def use_torch_loss() -> None:
    """TRL's fused LM head computes its per-token log-probabilities with `TorchChunkedLogProbFunction`."""
    # the module itself: right after it is imported (after_import) it is not yet an attribute of trl.trainer
    importlib.import_module("trl.trainer.utils")._ChunkedLogProbFunction = TorchChunkedLogProbFunction


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
    "trl.trainer.utils": (use_torch_loss,),
    "deepspeed.comm.torch": (skip_deepspeed_shm_build,),
}


def apply_without_gpus(module) -> None:
    """Without a GPU, the fixes for `module`, which has just been imported (see FIXES)."""
    if not torch.cuda.is_available():
        for fix in FIXES[module.__name__]:
            fix()
