"""`@distributed`: run a function defined in a notebook on every GPU of the node, one process each.

    from nbhelpers import distributed

    @distributed(gpus=2)                    # default: every visible GPU; no GPU: 2 CPU processes (gloo)
    def train(lr: float):
        dist.init_process_group(backend())  # plain PyTorch: it reads the torchrun environment set here
        ...
    results = train.distributed(lr=1e-3)    # one result per rank, in rank order
    run = train.distributed_async(lr=1e-4)  # in the background: run.result(), run.cancel()
    train(lr=1e-3)                          # a plain call runs here, as rank 0 of 1 (debugging)

The signature is Databricks' `serverless_gpu` one (`@distributed(gpus=8, gpu_type="H100", remote=False)`),
so code written for it runs with only the import changed.

This module is the decorator only: it checks the arguments and hands each launch to an engine,
nbhelpers.local_engine (this host's GPUs, the default) or nbhelpers.ray_engine (the nodes of a Ray
cluster: `engine="ray"`, or `remote=True`). Both keep the contract of nbhelpers.launch_contract;
neither imports the other or this module.
"""
from __future__ import annotations

import functools
import itertools
import os
import sys
import threading
from concurrent.futures import CancelledError, Future

from nbhelpers.launch_contract import DistributedError, RankResults, check_count, pickle_call

__all__ = ["distributed", "DistributedError", "DistributedFunction", "DistributedRun"]

_OUTPUT_MODES = ("all", "rank0")
_ENGINES = ("local", "ray")
_run_numbers = itertools.count(1)


def distributed(fn=None, *, gpus: int | None = None, gpu_type: str | None = None, remote: bool = False,
                output: str = "all", stall_timeout: float | None = None, engine: str | None = None):
    """Decorate a function so that `fn.distributed(...)` runs it once per GPU (or CPU process).

    Precondition: the function sets up its own process group (`init_process_group`, or a framework
    that does: HF Trainer, Lightning, DeepSpeed); this launcher only starts the processes and sets the
    environment that torchrun would set.

    gpus: how many processes. Default: every visible GPU; with no GPU, 2 CPU processes (gloo).
        More than the visible GPUs (without GPUs: more than 2 per CPU core), or fewer than 1, is
        refused before anything starts. Launches on one host get disjoint GPUs (nbhelpers.gpu_lease).
    gpu_type: the GPUs the code expects ("H100", "A10", ...), as serverless_gpu takes it: checked
        against the visible GPUs (an error naming both when they differ); ignored, with one line saying
        so, where there is no GPU.
    remote: True runs on the Ray cluster this process is attached to (`ray.init(...)` done, or
        RAY_ADDRESS set), as engine="ray"; without one, an error at once says what to do.
    output: "all" streams every rank's output into the cell; "rank0" only rank 0's (the others'
        last lines still appear in an error).
    stall_timeout: seconds without output from any rank after which every rank's Python stack is
        dumped into the error and all ranks are killed. None: wait for ever. With engine="ray" the clock
        starts once every rank has begun (starting them may take up to 2 minutes on a busy cluster).
    engine: "local" (this node's GPUs, the default) or "ray": ranks on the nodes of the Ray cluster this
        process is attached to; `gpus` then counts the ranks of all nodes together (default: every GPU
        of the cluster). See nbhelpers.ray_engine.
    """
    if output not in _OUTPUT_MODES:
        raise ValueError(f"output must be one of {_OUTPUT_MODES}, got {output!r}")
    if stall_timeout is not None and stall_timeout <= 0:
        raise ValueError(f"stall_timeout must be a positive number of seconds or None, got {stall_timeout!r}")
    if engine is not None and engine not in _ENGINES:
        raise ValueError(f"engine must be one of {_ENGINES}, got {engine!r}")
    if remote and engine == "local":
        raise ValueError('remote=True runs on a Ray cluster (engine="ray"); engine="local" contradicts it. '
                         "Leave one of them out.")
    engine = engine or ("ray" if remote else "local")
    if remote:
        _check_ray_reachable()
    if gpus is not None:
        # A bad count fails at decoration, long before a launch (the cluster's GPUs are counted at launch).
        if engine == "ray":
            check_count(gpus)
        else:
            from nbhelpers import local_engine

            local_engine.world_size(gpus)
    if engine == "local":
        from nbhelpers import local_engine

        local_engine.check_gpu_type(gpu_type)

    def decorate(f):
        if engine == "local":
            from nbhelpers import local_engine

            local_engine.warm_up()
        return DistributedFunction(f, gpus=gpus, gpu_type=gpu_type, output=output, stall_timeout=stall_timeout,
                                   engine=engine)

    return decorate(fn) if fn is not None else decorate


def _check_ray_reachable() -> None:
    ray = sys.modules.get("ray")  # not imported here: that alone takes seconds
    if (ray is not None and ray.is_initialized()) or os.environ.get("RAY_ADDRESS"):
        return
    raise RuntimeError(
        "remote=True runs the function on the GPUs of a Ray cluster, and this process is attached to none. "
        'Call ray.init(address="HEAD_IP:6379") (or set RAY_ADDRESS) before the launch, or use remote=False '
        "for the GPUs of this machine."
    )


class DistributedFunction:
    """A function with a `.distributed(...)` launcher; calling it plainly runs it in this process."""

    def __init__(self, fn, *, gpus, output, stall_timeout, engine="local", gpu_type=None):
        functools.update_wrapper(self, fn)
        self.fn = fn
        self.gpus = gpus
        self.gpu_type = gpu_type
        self.output = output
        self.stall_timeout = stall_timeout
        self.engine = engine

    def __call__(self, *args, **kwargs):
        from nbhelpers import local_engine

        with local_engine.single_process_environment():
            return self.fn(*args, **kwargs)

    def distributed(self, *args, **kwargs) -> RankResults:
        """Run on every rank; return the ranks' results in rank order (tensors on the CPU), with the
        launch's `system_metrics` (peak memory and mean utilisation per rank)."""
        return self._launch(pickle_call(self.fn, args, kwargs), label=None, cancel=None,
                            mlflow_run_id=_active_mlflow_run_id())

    def distributed_async(self, *args, **kwargs) -> DistributedRun:
        """Start the launch in the background and return at once: a Future-like DistributedRun
        (`result()`, `cancel()`, `done()`). Its output lines start with its name, `[train#2 rank 0]`.
        Several at once share the host's GPUs without overlap: one that cannot get its GPUs waits."""
        run = DistributedRun(f"{self.__name__}#{next(_run_numbers)}")
        payload = pickle_call(self.fn, args, kwargs)  # here: what cannot be pickled is said at once
        mlflow_run_id = _active_mlflow_run_id()  # MLflow's active run belongs to this thread

        def launch():
            run._future.set_running_or_notify_cancel()
            try:
                run._future.set_result(self._launch(payload, label=run.name, cancel=run._cancel,
                                                    mlflow_run_id=mlflow_run_id))
            except BaseException as exc:
                run._future.set_exception(exc)

        run._thread = threading.Thread(target=launch, name=f"nbhelpers-{run.name}", daemon=True)
        run._thread.start()
        return run

    def _launch(self, payload, *, label, cancel, mlflow_run_id) -> RankResults:
        options = dict(gpus=self.gpus, output=self.output, stall_timeout=self.stall_timeout, label=label, cancel=cancel,
                       mlflow_run_id=mlflow_run_id)
        if self.engine == "ray":
            from nbhelpers import ray_engine

            return ray_engine.run(self.__name__, payload, gpu_type=self.gpu_type, **options)
        from nbhelpers import local_engine  # (gpu_type was checked at decoration)

        return local_engine.run(self.__name__, payload, **options)


class DistributedRun:
    """A launch running in the background (`fn.distributed_async(...)`), used like a
    concurrent.futures.Future: `result(timeout)` waits for the ranks' results (or raises the launch's
    error), `cancel()` stops its ranks and only those, and returns once they are stopped."""

    def __init__(self, name: str):
        self.name = name
        self._future = Future()
        self._cancel = threading.Event()
        self._thread = None

    def result(self, timeout: float | None = None) -> RankResults:
        return self._future.result(timeout)

    def exception(self, timeout: float | None = None):
        return self._future.exception(timeout)

    def done(self) -> bool:
        return self._future.done()

    def running(self) -> bool:
        return self._future.running()

    def cancelled(self) -> bool:
        return self._cancel.is_set() and self.done() and isinstance(self._future.exception(), CancelledError)

    def cancel(self) -> bool:
        """Stop the run's ranks (or its wait for GPUs); False if it had ended already."""
        if self.done():
            return False
        self._cancel.set()
        self._thread.join()
        return self.cancelled()

    def add_done_callback(self, fn) -> None:
        self._future.add_done_callback(lambda _: fn(self))

    @property
    def system_metrics(self) -> dict | None:
        return self.result().system_metrics

    def __repr__(self):
        state = "cancelled" if self.cancelled() else "done" if self.done() else "running"
        return f"<DistributedRun {self.name} {state}>"


def _active_mlflow_run_id() -> str | None:
    mlflow = sys.modules.get("mlflow")  # a notebook that tracks runs has imported it
    run = mlflow.active_run() if mlflow is not None else None
    return run.info.run_id if run is not None else None
