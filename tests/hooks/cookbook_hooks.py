"""Crash injection and recording for notebook tests, installed in every process of a notebook run.

tests/harness.py puts this folder first on the PYTHONPATH of a case's kernel when the case names hooks
(`NotebookCase(hooks=("kill_rank_after_optimizer_step=3",))`); its sitecustomize.py then installs the
hooks named in the environment, in the kernel, the launcher's fork server, every rank and everything they
start. The notebooks themselves contain nothing of this.

    COOKBOOK_TEST_HOOKS       comma-separated `name` or `name=value` (the names of HOOKS below)
    COOKBOOK_TEST_HOOKS_DIR   where hooks record what they did: one JSON object per line in <name>.jsonl

"The last rank" is the rank WORLD_SIZE - 1 of a launch (rank 0 when there is one); the notebook's own
process is never killed, even while it runs a plain call as rank 0 of 1.
"""
from __future__ import annotations

import json
import os
import signal
import sys

from after_import import when_imported


def record(hook: str, **fields) -> None:
    """Append one line to COOKBOOK_TEST_HOOKS_DIR/<hook>.jsonl (one write: lines of processes never mix)."""
    folder = os.environ["COOKBOOK_TEST_HOOKS_DIR"]
    os.makedirs(folder, exist_ok=True)
    line = json.dumps({"pid": os.getpid(), "rank": _rank(), **fields}) + "\n"
    fd = os.open(os.path.join(folder, f"{hook}.jsonl"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def _rank() -> int | None:
    return int(os.environ["RANK"]) if "RANK" in os.environ else None


def _is_last_rank() -> bool:
    if "ipykernel" in sys.modules or _rank() is None:  # the notebook's process, or no launch
        return False
    return _rank() == int(os.environ.get("WORLD_SIZE", "1")) - 1


def _die(hook: str, **fields) -> None:
    record(hook, **fields)
    os.kill(os.getpid(), signal.SIGKILL)  # no clean-up runs, as in a real crash


def kill_rank_after_optimizer_step(value: str) -> None:
    """The last rank is SIGKILLed right after its optimizer.step() number `value` (counted in that process)."""
    after = int(value)
    steps = 0

    def count(optimizer, args, kwargs):
        nonlocal steps
        steps += 1
        if steps == after and _is_last_rank():
            _die("kill_rank_after_optimizer_step", step=steps)

    when_imported("torch.optim.optimizer", lambda module: module.register_optimizer_step_post_hook(count))


def kill_rank_while_writing_checkpoint(value: str) -> None:
    """The last rank is SIGKILLed in its distributed-checkpoint save number `value`, before it writes its files."""
    at = int(value)
    saves = 0

    def patch(module):
        writer = getattr(module, "_FileSystemWriter", module.FileSystemWriter)  # the base of DCP's file writers
        write_data = writer.write_data

        def write_data_or_die(self, *args, **kwargs):
            nonlocal saves
            saves += 1
            if saves == at and _is_last_rank():
                _die("kill_rank_while_writing_checkpoint", save=saves, path=str(self.path))
            return write_data(self, *args, **kwargs)

        writer.write_data = write_data_or_die

    when_imported("torch.distributed.checkpoint.filesystem", patch)


def kill_rank_after_checkpoint(value: str) -> None:
    """The last rank is SIGKILLed once the checkpoint number `value` is sealed (nbhelpers.training.checkpoints.seal
    returned on that rank: the manifest is written), e.g. right after the Trainer's first checkpoint with value 1."""
    after = int(value)
    sealed = 0

    def patch(module):
        seal = module.seal

        def seal_then_die(folder, *args, **kwargs):
            nonlocal sealed
            result = seal(folder, *args, **kwargs)
            sealed += 1
            if sealed == after and _is_last_rank():
                _die("kill_rank_after_checkpoint", checkpoint=sealed, path=str(folder))
            return result

        module.seal = seal_then_die

    when_imported("nbhelpers.training.checkpoints", patch)


def record_checkpoint_writers(value: str) -> None:
    """Each file Lightning's TorchCheckpointIO saves is recorded with the rank that saved it."""
    def patch(module):
        save_checkpoint = module.TorchCheckpointIO.save_checkpoint

        def save_and_record(self, checkpoint, path, *args, **kwargs):
            save_checkpoint(self, checkpoint, path, *args, **kwargs)
            record("record_checkpoint_writers", path=os.path.abspath(path))

        module.TorchCheckpointIO.save_checkpoint = save_and_record

    when_imported("lightning.fabric.plugins.io.torch_io", patch)


def record_lightning_trainer(value: str) -> None:
    """After each Lightning Trainer.fit() in a rank: how Lightning found the ranks (its cluster environment), the
    backend of the process group it trained in and its world size."""

    def patch(module):
        fit = module.Trainer.fit

        def fit_and_record(self, *args, **kwargs):
            output = fit(self, *args, **kwargs)
            import torch.distributed as dist

            record("record_lightning_trainer", cluster_environment=type(self.strategy.cluster_environment).__name__,
                   process_group_backend=dist.get_backend() if dist.is_initialized() else None,
                   world_size=self.world_size)
            return output

        module.Trainer.fit = fit_and_record

    when_imported("lightning.pytorch.trainer.trainer", patch)


def count_started_processes(value: str) -> None:
    """Each process started through subprocess or multiprocessing is recorded with the starter's rank."""
    import multiprocessing.process
    import subprocess

    popen_init, process_start = subprocess.Popen.__init__, multiprocessing.process.BaseProcess.start

    def popen_and_record(self, args, *rest, **kwargs):
        popen_init(self, args, *rest, **kwargs)
        record("count_started_processes", kind="subprocess", child=self.pid,
               what=[str(a) for a in (args if isinstance(args, (list, tuple)) else [args])][:3])

    def start_and_record(self):
        process_start(self)
        record("count_started_processes", kind="multiprocessing", child=self.pid, what=[self.name])

    subprocess.Popen.__init__ = popen_and_record
    multiprocessing.process.BaseProcess.start = start_and_record


def simulate_gpus(value: str) -> None:
    """@distributed sees `value` GPUs named "simulated GPU": launches lease them host-wide and each gets its
    own CUDA_VISIBLE_DEVICES, while the ranks still run on the CPU with gloo. The leases go to a folder of
    this run (a real host's leases are not touched)."""
    count = int(value)
    os.environ.setdefault("NBHELPERS_GPU_LEASE_DIR", os.path.join(os.environ["COOKBOOK_TEST_HOOKS_DIR"], "gpu-leases"))

    def patch(module):
        module._visible_gpu_count = lambda: count
        module._gpu_names = lambda gpus: ["simulated GPU"] * len(gpus)

    when_imported("nbhelpers.launch.gpus", patch)


def simulate_gpu_memory(value: str) -> None:
    """The memory planner's pre-flight check (nbhelpers.planner.fits) sees COUNTxGIB GPUs ("1x39.4": one 40 GB
    A100), as a notebook on such a machine would; nothing else sees them (the ranks still run on the CPU)."""
    count, gib = value.split("x")

    def patch(module):
        module.visible_gpus = lambda: [("simulated GPU", float(gib))] * int(count)

    when_imported("nbhelpers.planner.fits", patch)


def record_trainer(value: str) -> None:
    """After each Hugging Face Trainer.train() in a rank: what the Trainer ran as (its world size, the class of the
    model it trained, FSDP or DeepSpeed and its ZeRO stage, the share of the parameters this rank holds, whether TRL
    fed it padding-free packed rows)."""

    def patch(module):
        train = module.Trainer.train

        def train_and_record(self, *args, **kwargs):
            output = train(self, *args, **kwargs)
            engine = getattr(self, "deepspeed", None)
            parameters = list(self.model_wrapped.parameters())
            held = sum(_local_numel(p) for p in parameters)
            record("record_trainer", world_size=self.args.world_size, wrapped=type(self.model_wrapped).__name__,
                   fsdp=bool(getattr(self, "is_fsdp_enabled", False)),
                   zero_stage=engine.zero_optimization_stage() if engine is not None else None,
                   held_fraction=held / max(1, sum(_full_numel(p) for p in parameters)),
                   fsdp_config={k: (self.args.fsdp_config or {}).get(k) for k in ("version", "reshard_after_forward")},
                   padding_free=getattr(self, "padding_free", None))  # an SFTTrainer's; None for other Trainers
            return output

        module.Trainer.train = train_and_record

    when_imported("transformers.trainer", patch)


def _local_numel(parameter) -> int:
    local = getattr(parameter, "to_local", None)  # an FSDP2 DTensor: this rank's shard
    if callable(local):
        return local().numel()
    return parameter.ds_tensor.numel() if hasattr(parameter, "ds_tensor") else parameter.numel()  # ZeRO-3: partition


def _full_numel(parameter) -> int:
    return parameter.ds_numel if hasattr(parameter, "ds_numel") else parameter.numel()  # a DTensor's numel is global


HOOKS = {hook.__name__: hook for hook in (kill_rank_after_optimizer_step, kill_rank_while_writing_checkpoint,
                                          kill_rank_after_checkpoint, record_checkpoint_writers,
                                          record_lightning_trainer, count_started_processes, simulate_gpus,
                                          simulate_gpu_memory, record_trainer)}


def parse(spec: str) -> dict:
    """"a=1,b" -> {"a": "1", "b": ""}; an unknown name is an error listing the known ones."""
    hooks = {}
    for item in filter(None, (part.strip() for part in spec.split(","))):
        name, _, value = item.partition("=")
        if name not in HOOKS:
            raise ValueError(f"unknown test hook {name!r} in COOKBOOK_TEST_HOOKS; known: {', '.join(HOOKS)}")
        hooks[name] = value
    return hooks


def install(spec: str) -> None:
    for name, value in parse(spec).items():
        HOOKS[name](value)
