"""nbhelpers.trl_cpu: the CPU stand-in for TRL's loss kernel computes what the kernel computes."""
import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from nbhelpers.trl_cpu import TorchChunkedLogProbFunction, patch_for_cpu

# Runs TRL's Triton kernel on the CPU through Triton's interpreter (slow, so only a few tokens) and prints
# its outputs and input gradients as JSON.
KERNEL_SCRIPT = textwrap.dedent("""
    import json, torch
    from trl.kernels import ChunkedLogProbFunction
    torch.manual_seed(0)
    hidden = torch.randn(5, 16, requires_grad=True)
    weight = torch.randn(300, 16, requires_grad=True)
    targets = torch.randint(0, 300, (5,))
    outputs = ("entropy", "log_sum_sq_probs", "mean_logits", "is_top1")
    log_probs, entropy, log_sum_sq, mean_logits, is_top1 = ChunkedLogProbFunction.apply(
        hidden, weight, None, targets, 0.7, 128, 30.0, 1.5, outputs)
    (log_probs.sum() + 0.3 * entropy.sum()).backward()
    print(json.dumps({"log_probs": log_probs.tolist(), "entropy": entropy.tolist(), "log_sum_sq": log_sum_sq.tolist(),
                      "mean_logits": mean_logits.tolist(), "is_top1": is_top1.tolist(),
                      "grad_hidden": hidden.grad.tolist(), "grad_weight_norm": weight.grad.norm().item()}))
""")


def test_torch_logprob_matches_trl_triton_kernel():
    pytest.importorskip("triton")
    env = dict(os.environ, TRITON_INTERPRET="1")
    run = subprocess.run([sys.executable, "-c", KERNEL_SCRIPT], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    kernel = json.loads(run.stdout.strip().splitlines()[-1])

    torch.manual_seed(0)
    hidden = torch.randn(5, 16, requires_grad=True)
    weight = torch.randn(300, 16, requires_grad=True)
    targets = torch.randint(0, 300, (5,))
    outputs = ("entropy", "log_sum_sq_probs", "mean_logits", "is_top1")
    log_probs, entropy, log_sum_sq, mean_logits, is_top1 = TorchChunkedLogProbFunction.apply(
        hidden, weight, None, targets, 0.7, 128, 30.0, 1.5, outputs)
    (log_probs.sum() + 0.3 * entropy.sum()).backward()

    close = dict(rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(log_probs.detach(), torch.tensor(kernel["log_probs"]), **close)
    torch.testing.assert_close(entropy.detach(), torch.tensor(kernel["entropy"]), **close)
    torch.testing.assert_close(log_sum_sq, torch.tensor(kernel["log_sum_sq"]), **close)
    torch.testing.assert_close(mean_logits, torch.tensor(kernel["mean_logits"]), **close)
    assert is_top1.tolist() == kernel["is_top1"]
    torch.testing.assert_close(hidden.grad, torch.tensor(kernel["grad_hidden"]), **close)
    assert weight.grad.norm().item() == pytest.approx(kernel["grad_weight_norm"], rel=1e-4)


def test_patch_for_cpu_changes_nothing_when_a_gpu_is_visible(monkeypatch):
    import trl.trainer.utils

    kernel = trl.trainer.utils._ChunkedLogProbFunction
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert patch_for_cpu() == []
    assert trl.trainer.utils._ChunkedLogProbFunction is kernel


# A fresh process that imports nbhelpers, then TRL and DeepSpeed, and calls nothing; prints what it got as JSON.
# FAKE_GPU=1: nbhelpers.trl_cpu sees a GPU (only it: the libraries would try to use it).
SELF_APPLYING_SCRIPT = textwrap.dedent("""
    import importlib, json, os, types
    import nbhelpers
    if os.environ.get("FAKE_GPU"):
        import nbhelpers.trl_cpu
        nbhelpers.trl_cpu.torch = types.SimpleNamespace(cuda=types.SimpleNamespace(is_available=lambda: True))
    import trl
    from trl import SFTTrainer
    from accelerate.state import AcceleratorState, PartialState
    from nbhelpers.trl_cpu import TorchChunkedLogProbFunction, patch_for_cpu
    shm = importlib.import_module("deepspeed.comm.torch").build_shm_op
    utils = importlib.import_module("trl.trainer.utils")
    facts = lambda: {
        "torch_loss": utils._ChunkedLogProbFunction is TorchChunkedLogProbFunction,
        "gloo_aware_accelerate": getattr(PartialState._prepare_backend, "_joins_cpu_processes", False),
        "fsdp_kept": getattr(AcceleratorState.__init__, "_keeps_fsdp_on_cpu", False),
        "deepspeed_shm_skipped": shm.__name__ == "<lambda>",
    }
    before = facts()
    patch_for_cpu()  # what the TRL notebooks still call explicitly
    original = getattr(PartialState._prepare_backend, "__wrapped__", None)
    wrapped_once = not hasattr(original, "_joins_cpu_processes")
    print(json.dumps({"automatic": before, "after_explicit_call": facts(), "wrapped_once": wrapped_once}))
""")


def _self_applying(**environ) -> dict:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", **environ}
    run = subprocess.run([sys.executable, "-c", SELF_APPLYING_SCRIPT], env=env, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def test_cpu_process_gets_the_fixes_by_importing_nbhelpers_then_trl():
    got = _self_applying()
    assert got["automatic"] == {"torch_loss": True, "gloo_aware_accelerate": True, "fsdp_kept": True,
                                "deepspeed_shm_skipped": True}
    assert got["after_explicit_call"] == got["automatic"] and got["wrapped_once"], "patch_for_cpu() stays harmless"


def test_process_with_a_gpu_gets_no_cpu_fixes_on_import():
    got = _self_applying(FAKE_GPU="1")
    assert not any(got["automatic"].values()), got
