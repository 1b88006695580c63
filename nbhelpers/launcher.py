"""`@distributed`: run a function defined in a notebook on every GPU of the node, one process each.

    from nbhelpers import distributed

    @distributed(gpus=2)                    # default: every visible GPU; no GPU: 2 CPU processes (gloo)
    def train(lr: float):
        dist.init_process_group(backend())  # plain PyTorch: it reads the torchrun environment set here
        ...
    results = train.distributed(lr=1e-3)    # one result per rank, in rank order
    train(lr=1e-3)                          # a plain call runs here, as rank 0 of 1 (debugging)

This module is the decorator only: it checks the arguments and hands each launch to an engine,
nbhelpers.local_engine (this host's GPUs, the default) or nbhelpers.ray_engine (the nodes of a Ray
cluster). Both keep the contract of nbhelpers.launch_contract; neither imports the other or this module.
"""
from __future__ import annotations

import functools

from nbhelpers.launch_contract import DistributedError, check_count

__all__ = ["distributed", "DistributedError", "DistributedFunction"]

_OUTPUT_MODES = ("all", "rank0")
_ENGINES = ("local", "ray")


def distributed(fn=None, *, gpus: int | None = None, output: str = "all", stall_timeout: float | None = None,
                engine: str = "local"):
    """Decorate a function so that `fn.distributed(...)` runs it once per GPU (or CPU process).

    Precondition: the function sets up its own process group (`init_process_group`, or a framework
    that does: HF Trainer, Lightning, DeepSpeed); this launcher only starts the processes and sets the
    environment that torchrun would set.

    gpus: how many processes. Default: every visible GPU; with no GPU, 2 CPU processes (gloo).
        More than the visible GPUs (without GPUs: more than 2 per CPU core), or fewer than 1, is
        refused before anything starts.
    output: "all" streams every rank's output into the cell; "rank0" only rank 0's (the others'
        last lines still appear in an error).
    stall_timeout: seconds without output from any rank after which every rank's Python stack is
        dumped into the error and all ranks are killed. None: wait for ever.
    engine: "local" (this node's GPUs, the default) or "ray": ranks on the nodes of the Ray cluster this
        process is attached to (`ray.init(address=...)`); `gpus` then counts the ranks of all nodes
        together (default: every GPU of the cluster). See nbhelpers.ray_engine.
    """
    if output not in _OUTPUT_MODES:
        raise ValueError(f"output must be one of {_OUTPUT_MODES}, got {output!r}")
    if stall_timeout is not None and stall_timeout <= 0:
        raise ValueError(f"stall_timeout must be a positive number of seconds or None, got {stall_timeout!r}")
    if engine not in _ENGINES:
        raise ValueError(f"engine must be one of {_ENGINES}, got {engine!r}")
    if gpus is not None:
        # A bad count fails at decoration, long before a launch (the cluster's GPUs are counted at launch).
        if engine == "ray":
            check_count(gpus)
        else:
            from nbhelpers import local_engine

            local_engine.world_size(gpus)

    def decorate(f):
        if engine == "local":
            from nbhelpers import local_engine

            local_engine.warm_up()
        return DistributedFunction(f, gpus=gpus, output=output, stall_timeout=stall_timeout, engine=engine)

    return decorate(fn) if fn is not None else decorate


class DistributedFunction:
    """A function with a `.distributed(...)` launcher; calling it plainly runs it in this process."""

    def __init__(self, fn, *, gpus, output, stall_timeout, engine="local"):
        functools.update_wrapper(self, fn)
        self.fn = fn
        self.gpus = gpus
        self.output = output
        self.stall_timeout = stall_timeout
        self.engine = engine

    def __call__(self, *args, **kwargs):
        from nbhelpers import local_engine

        with local_engine.single_process_environment():
            return self.fn(*args, **kwargs)

    def distributed(self, *args, **kwargs) -> list:
        """Run on every rank; return the ranks' results in rank order (tensors on the CPU)."""
        if self.engine == "ray":
            from nbhelpers import ray_engine as engine
        else:
            from nbhelpers import local_engine as engine
        return engine.run(self.fn, args, kwargs, name=self.__name__, gpus=self.gpus, output=self.output,
                          stall_timeout=self.stall_timeout)
