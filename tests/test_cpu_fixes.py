"""The tests' CPU fixes of accelerate, DeepSpeed and the TRL notebooks' refusal (tests/hooks/cpu_fixes.py): every
process the tests start gets the fixes, a user's process never."""
import ast
import json
import os
import subprocess
import sys
import textwrap

from pathlib import Path

import cpu_fixes
from conftest import HOOKS

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
    from nbhelpers.training import needs_gpu
    facts.update({
        "trl_refusal_lifted": needs_gpu.check_trl_runs_here.__name__ == "<lambda>",
        "gloo_aware_accelerate": getattr(PartialState._prepare_backend, "_joins_cpu_processes", False),
        "fsdp_kept": getattr(AcceleratorState.__init__, "_keeps_fsdp_on_cpu", False),
        "deepspeed_shm_skipped": shm.__name__ == "<lambda>",
    })
    print(json.dumps(facts))
""")
FIXED = ("trl_refusal_lifted", "gloo_aware_accelerate", "fsdp_kept", "deepspeed_shm_skipped")


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
