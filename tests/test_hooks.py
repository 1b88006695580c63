"""tests/hooks: crash injection and recording do what they say in a process that has them. That they reach every
process of a notebook run (kernel, fork server, ranks) the notebooks' own tests show: their kills and records name
the rank that was hit (e.g. test_fsdp2_transformer.py's `killed`, the TRL cases' `hooks.record_trainer.ranks`)."""
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from harness import HOOKS, hook_records, hooks_in_kernel


def run_with_hooks(code: str, hooks: str, folder, **environ) -> subprocess.CompletedProcess:
    """`code` in a fresh Python whose environment installs `hooks`, as a notebook kernel's would."""
    with hooks_in_kernel(tuple(hooks.split(",")), folder):
        env = {**os.environ, **environ}
        return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True,
                              timeout=180, cwd=folder.parent)


def records(folder, hook):
    return hook_records(folder.parent, hook)


OPTIMIZER_STEPS = """
    import torch
    weight = torch.nn.Parameter(torch.ones(2))
    optimizer = torch.optim.SGD([weight], lr=0.1)
    for step in range(1, 6):
        weight.sum().backward()
        optimizer.step()
        print("step", step, flush=True)
"""


def test_last_rank_is_killed_right_after_the_optimizer_step_named(tmp_path):
    hooks = tmp_path / "hooks"
    last = run_with_hooks(OPTIMIZER_STEPS, "kill_rank_after_optimizer_step=3", hooks, RANK="1", WORLD_SIZE="2")
    assert last.returncode == -signal.SIGKILL, last.stderr[-2000:]
    assert last.stdout.split("\n")[:-1] == ["step 1", "step 2"], "killed inside step 3, before it printed"
    other = run_with_hooks(OPTIMIZER_STEPS, "kill_rank_after_optimizer_step=3", hooks, RANK="0", WORLD_SIZE="2")
    assert other.returncode == 0 and "step 5" in other.stdout, "only the last rank is killed"
    assert [(r["rank"], r["step"]) for r in records(hooks, "kill_rank_after_optimizer_step")] == [(1, 3)]


def test_last_rank_is_killed_while_writing_the_checkpoint_named(tmp_path):
    hooks = tmp_path / "hooks"
    run = run_with_hooks("""
        import torch
        import torch.distributed.checkpoint as dcp
        for save in (1, 2):
            dcp.save({"w": torch.ones(4)}, storage_writer=dcp.FileSystemWriter(f"save_{save}"), no_dist=True)
    """, "kill_rank_while_writing_checkpoint=2", hooks, RANK="0", WORLD_SIZE="1")
    assert run.returncode == -signal.SIGKILL, run.stderr[-2000:]
    assert (tmp_path / "save_1" / ".metadata").is_file(), "the first save is complete"
    assert (tmp_path / "save_2").is_dir() and not (tmp_path / "save_2" / ".metadata").exists(), "the second is cut"
    assert [r["save"] for r in records(hooks, "kill_rank_while_writing_checkpoint")] == [2]


def test_lightning_checkpoint_files_are_recorded_with_the_rank_that_wrote_them(tmp_path):
    hooks = tmp_path / "hooks"
    run = run_with_hooks("""
        from lightning.pytorch.plugins import TorchCheckpointIO
        TorchCheckpointIO().save_checkpoint({"epoch": 1}, "best.ckpt")
    """, "record_checkpoint_writers", hooks, RANK="1", WORLD_SIZE="2")
    assert run.returncode == 0, run.stderr[-2000:]
    assert [(r["rank"], r["path"]) for r in records(hooks, "record_checkpoint_writers")] == [
        (1, str(tmp_path / "best.ckpt"))]


def test_started_processes_are_recorded_with_the_starting_rank(tmp_path):
    hooks = tmp_path / "hooks"
    run = run_with_hooks("""
        import multiprocessing, subprocess
        subprocess.run(["true"], check=True)
        if __name__ == "__main__":
            process = multiprocessing.get_context("fork").Process(target=print, name="worker-1")
            process.start()
            process.join()
    """, "count_started_processes", hooks, RANK="0", WORLD_SIZE="2")
    assert run.returncode == 0, run.stderr[-2000:]
    started = [(r["rank"], r["kind"], r["what"][0]) for r in records(hooks, "count_started_processes")]
    assert started == [(0, "subprocess", "true"), (0, "multiprocessing", "worker-1")]


def test_unknown_hook_is_refused_before_the_kernel_starts(tmp_path):
    with pytest.raises(ValueError, match="unknown test hook 'kill_rank_after_step'.*kill_rank_after_optimizer_step"):
        with hooks_in_kernel(("kill_rank_after_step=3",), tmp_path):
            pass


def test_the_sitecustomize_it_shadows_still_runs(tmp_path):
    (tmp_path / "sitecustomize.py").write_text("import builtins\nbuiltins.SHADOWED_SITECUSTOMIZE_RAN = True\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HOOKS), str(tmp_path)]), "COOKBOOK_TEST_HOOKS": ""}
    run = subprocess.run([sys.executable, "-c", "import sitecustomize, builtins; "
                          "print(sitecustomize.__file__, builtins.SHADOWED_SITECUSTOMIZE_RAN)"],
                         env=env, capture_output=True, text=True, timeout=60)
    assert run.stdout.split() == [str(HOOKS / "sitecustomize.py"), "True"], run.stderr
