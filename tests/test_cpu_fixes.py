"""The tests' CPU fixes of TRL, accelerate and DeepSpeed (tests/hooks/cpu_fixes.py): the PyTorch stand-in for TRL's
loss kernel computes what the kernel computes; every process the tests start gets the fixes, a user's process never."""
import ast
import json
import os
import subprocess
import sys
import textwrap

from pathlib import Path

import cpu_fixes
import pytest
import torch
from conftest import HOOKS
from cpu_fixes import TorchChunkedLogProbFunction

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


# A fresh process that imports TRL, accelerate and DeepSpeed and calls nothing; prints what it got as JSON.
# FAKE_GPU=1: the fixes see a GPU (only they: the libraries would try to use it).
FACTS_SCRIPT = textwrap.dedent("""
    import importlib, json, os, sys, types
    meta_path = [type(finder).__name__ for finder in sys.meta_path]
    import nbhelpers
    facts = {"meta_path_unchanged_by_nbhelpers": [type(f).__name__ for f in sys.meta_path] == meta_path}
    if os.environ.get("FAKE_GPU"):
        import cpu_fixes
        cpu_fixes.torch = types.SimpleNamespace(cuda=types.SimpleNamespace(is_available=lambda: True))
    import trl
    from trl import SFTTrainer
    from accelerate.state import AcceleratorState, PartialState
    shm = importlib.import_module("deepspeed.comm.torch").build_shm_op
    utils = importlib.import_module("trl.trainer.utils")
    facts.update({
        "torch_loss": utils._ChunkedLogProbFunction.__name__ == "TorchChunkedLogProbFunction",
        "gloo_aware_accelerate": getattr(PartialState._prepare_backend, "_joins_cpu_processes", False),
        "fsdp_kept": getattr(AcceleratorState.__init__, "_keeps_fsdp_on_cpu", False),
        "deepspeed_shm_skipped": shm.__name__ == "<lambda>",
    })
    print(json.dumps(facts))
""")
FIXED = ("torch_loss", "gloo_aware_accelerate", "fsdp_kept", "deepspeed_shm_skipped")


def _facts(pythonpath: str, **environ) -> dict:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": pythonpath, **environ}
    run = subprocess.run([sys.executable, "-c", FACTS_SCRIPT], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def test_importing_nbhelpers_changes_neither_the_import_system_nor_trl_accelerate_or_deepspeed():
    got = _facts(pythonpath="")  # a user's process: no tests/hooks on its path
    assert got["meta_path_unchanged_by_nbhelpers"]
    assert not any(got[key] for key in FIXED), got


def test_a_cpu_process_the_tests_start_gets_the_fixes_once_trl_is_imported():
    got = _facts(pythonpath=HOOKS)  # what conftest.py gives every process the tests start
    assert all(got[key] for key in FIXED), got


def test_with_a_gpu_visible_the_fixes_change_nothing():
    got = _facts(pythonpath=HOOKS, FAKE_GPU="1")
    assert not any(got[key] for key in FIXED), got


def test_sitecustomize_watches_every_module_the_fixes_patch():
    source = (Path(HOOKS) / "sitecustomize.py").read_text()
    watched = ast.literal_eval(source.split("for _module in ")[1].split(":\n")[0])
    assert set(watched) == set(cpu_fixes.FIXES)
