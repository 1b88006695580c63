"""`@distributed`: run a function defined in a notebook on every GPU of the node, one process each.

    from nbhelpers import distributed

    @distributed(gpus=2)                    # default: every visible GPU; no GPU: 2 CPU processes (gloo)
    def train(lr: float):
        dist.init_process_group(backend())  # plain PyTorch: it reads the torchrun environment set here
        ...
    results = train.distributed(lr=1e-3)    # one result per rank, in rank order
    run = train.distributed_async(lr=1e-4)  # in the background: run.result(), run.cancel()
    train(lr=1e-3)                          # a plain call runs here, as rank 0 of 1 (debugging)
    train.with_overrides(timeout=600).distributed(lr=1e-3)   # the same with settings changed; train.func: undecorated

Code written for Databricks runs with only the import changed: serverless_gpu's signature
(`@distributed(gpus=8, gpu_type="H100", remote=False)`) and the AI Runtime SDK's (`databricks.air`:
`@distributed(num_accelerators=8, accelerator_type="GPU_8xH100", timeout=10800)`, `.with_overrides(...)`, `.func`),
and `@ray_launch` (nbhelpers.ray_launch).

This module is the decorator only: it checks the arguments (every precondition at the top of `distributed`),
restarts a failed launch (`max_restarts`) and hands each launch to an engine, nbhelpers.launch.local_engine (this
host's GPUs, the default) or nbhelpers.launch.ray_engine (the nodes of a Ray cluster: `engine="ray"`, or
`remote=True`). Databricks' spellings are read by nbhelpers.launch.databricks, the GPU counts and types checked by
nbhelpers.launch.gpus; neither engine imports the other or this module.
"""
from __future__ import annotations

import functools
import importlib.util
import itertools
import os
import sys
import threading
import time
import warnings
from concurrent.futures import CancelledError, Future

from nbhelpers.launch import fork_server, local_engine
from nbhelpers.launch.databricks import (DEFAULT_TIMEOUT_S, UNSET, accelerator_shape, one_of, overridden,
                                         positional_num_accelerators, say_what_pools_mean_here)
from nbhelpers.launch.errors import (DistributedError, DistributedTimeoutError, LocalExecutionTimeoutError,
                                     import_ray)
from nbhelpers.launch.gpus import check_count, check_this_host
from nbhelpers.launch.payload import RankResults, pickle_call
from nbhelpers.launch.processes import single_process_environment

__all__ = ["distributed", "DistributedError", "DistributedTimeoutError", "LocalExecutionTimeoutError",
           "DistributedFunction", "DistributedRun"]

_OUTPUT_MODES = ("all", "rank0")
_ENGINES = ("local", "ray")
_run_numbers = itertools.count(1)


def distributed(fn=None, accelerator_type: str | None = None, remote: bool = False,
                timeout: float | None = DEFAULT_TIMEOUT_S, *, gpus: int | None = None, gpu_type=None,
                num_accelerators: int | None = None, output: str = "all",
                stall_timeout: float | None = None, max_restarts: int = 0, engine: str | None = None):
    """Decorate a function so that `fn.distributed(...)` runs it once per GPU (or CPU process).

    Used bare (`@distributed`), with keywords, or positionally as databricks.air's
    `distributed(num_accelerators, accelerator_type, remote, timeout)`: a whole number first is num_accelerators.

    Precondition: the function sets up its own process group (`init_process_group`, or a framework
    that does: HF Trainer, Lightning, DeepSpeed); this launcher only starts the processes and sets the
    environment that torchrun would set.

    gpus (databricks.air: num_accelerators): how many processes. Default: every visible GPU; with no GPU,
        2 CPU processes (gloo). More than the visible GPUs (without GPUs: more than 2 per CPU core), or fewer
        than 1, is refused before anything starts. Launches on one host get disjoint GPUs (nbhelpers.launch.gpu_lease).
    gpu_type: the GPUs the code expects ("H100", "A10"), checked against the visible GPUs (an error naming
        both when they differ); ignored, with one line saying so, where there is no GPU.
    accelerator_type (databricks.air): the node shape the code expects, "GPU_1xA10", "GPU_1xH100", "GPU_8xH100",
        "GPU_8xB300" (any GPU_<count>x<GPU>), checked against this node as databricks.air checks a local run: the
        visible GPUs must be of its kind, no more than its count, and not a single GPU for a multi-GPU shape (a
        mismatch is refused naming both); ranks: every visible GPU unless num_accelerators says fewer. Without
        GPUs ignored, with one line. gpus/gpu_type are not deprecated here (databricks.air warns on them): they
        are serverless_gpu's spelling, which the cookbook keeps.
    timeout (databricks.air's): wall-clock seconds the whole call may run (restarts included), default 10800
        (3 hours); past it every rank's process tree is stopped and a DistributedTimeoutError (a TimeoutError)
        says the limit and how to change it. None: no limit. Local runs only: with remote=True (the Ray engine)
        a timeout other than the default is said, with a warning, to be ignored.
    remote: True runs on the Ray cluster this process is attached to (`ray.init(...)` done, or
        RAY_ADDRESS set), as engine="ray"; without one, an error at once says what to do.
    output: "all" streams every rank's output into the cell; "rank0" only rank 0's (the others'
        last lines still appear in an error).
    stall_timeout: seconds after which a rank that made no progress (no output, no change in its Python
        stack) counts as stalled, even while the others go on: every rank's Python stack goes into the
        error and all ranks are killed. None: wait for ever. With engine="ray" the clock starts once every
        rank has begun (starting them may take up to 2 minutes on a busy cluster).
    max_restarts: after a failure (a rank raised, died or stalled), start every rank again, up to this many
        times, as torchrun's --max-restarts does; each rank sees TORCHELASTIC_RESTART_COUNT and resumes from
        its newest verified checkpoint itself. Each restart is said in one line; the final error names each
        attempt's failing rank.
    engine: "local" (this node's GPUs, the default) or "ray": ranks on the nodes of the Ray cluster this
        process is attached to; `gpus` then counts the ranks of all nodes together (default: every GPU
        of the cluster). See nbhelpers.launch.ray_engine.
    """
    fn, num_accelerators = positional_num_accelerators(fn, num_accelerators)  # databricks.air's @distributed(8, ...)
    settings = dict(gpus=gpus, gpu_type=gpu_type, remote=remote, num_accelerators=num_accelerators,
                    accelerator_type=accelerator_type, timeout=timeout, output=output, stall_timeout=stall_timeout,
                    max_restarts=max_restarts, engine=engine)
    gpus = one_of("gpus", gpus, "num_accelerators", num_accelerators)
    if accelerator_type is not None:
        accelerator_shape(accelerator_type)  # a value that is no node shape is refused here, engine or not
    gpu_type = one_of("gpu_type", gpu_type, "accelerator_type", accelerator_type)
    if output not in _OUTPUT_MODES:
        raise ValueError(f"output must be one of {_OUTPUT_MODES}, got {output!r}")
    if stall_timeout is not None and stall_timeout <= 0:
        raise ValueError(f"stall_timeout must be a positive number of seconds or None, got {stall_timeout!r}")
    if isinstance(max_restarts, bool) or not isinstance(max_restarts, int) or max_restarts < 0:
        raise ValueError(f"max_restarts must be a whole number >= 0, got {max_restarts!r}")
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0):
        raise ValueError(f"timeout must be a positive number of seconds or None (no limit), got {timeout!r}")
    engine = _engine(engine, remote)
    if engine == "ray" and timeout is not None and timeout != DEFAULT_TIMEOUT_S:
        warnings.warn(f"timeout={timeout!r} applies to local runs only (remote=False): the ranks on the Ray cluster "
                      "run without it (stall_timeout still applies there).", UserWarning, stacklevel=2)
    say_what_pools_mean_here()
    if gpus is not None:  # a bad count fails at decoration, long before a launch (a cluster's GPUs: at launch)
        gpus = check_count(gpus, "gpus" if num_accelerators is None else "num_accelerators")
    if engine == "local":
        check_this_host(gpus, gpu_type, accelerator_type)

    def decorate(f):
        if engine == "local":
            fork_server.warm_up(f)  # it imports torch while the notebook goes on
        return DistributedFunction(f, gpus=gpus, gpu_type=gpu_type, output=output, stall_timeout=stall_timeout,
                                   engine=engine, max_restarts=max_restarts, timeout=timeout, settings=settings)

    return decorate(fn) if fn is not None else decorate


def _engine(engine, remote) -> str:
    if engine is not None and engine not in _ENGINES:
        raise ValueError(f"engine must be one of {_ENGINES}, got {engine!r}")
    if remote and engine == "local":
        raise ValueError('remote=True runs on a Ray cluster (engine="ray"); engine="local" contradicts it. '
                         "Leave one of them out.")
    if remote:
        _check_ray_reachable()
    return engine or ("ray" if remote else "local")


def _check_ray_reachable() -> None:
    ray = sys.modules.get("ray")  # not imported here: that alone takes seconds
    if (ray is not None and ray.is_initialized()) or os.environ.get("RAY_ADDRESS"):
        return
    if importlib.util.find_spec("ray") is None:
        import_ray("remote=True")  # not installed: raises, saying how to install it
    raise RuntimeError(
        "remote=True runs the function on the GPUs of a Ray cluster, and this process is attached to none. "
        'Call ray.init(address="HEAD_IP:6379") (or set RAY_ADDRESS) before the launch, or use remote=False '
        "for the GPUs of this machine."
    )


class DistributedFunction:
    """A function with a `.distributed(...)` launcher; calling it plainly runs it in this process."""

    def __init__(self, fn, *, gpus, output, stall_timeout, engine="local", gpu_type=None, max_restarts=0,
                 timeout=None, settings=None):
        functools.update_wrapper(self, fn)
        self.fn = fn
        self.func = fn  # databricks.air's name for the undecorated function
        self.settings = settings or {}  # the decorator's arguments as given (for with_overrides)
        self.timeout = timeout
        self.gpus = gpus
        self.gpu_type = gpu_type
        self.output = output
        self.stall_timeout = stall_timeout
        self.engine = engine
        self.max_restarts = max_restarts

    def __call__(self, *args, **kwargs):
        with single_process_environment():
            return self.fn(*args, **kwargs)

    def with_overrides(self, num_accelerators=UNSET, accelerator_type=UNSET, remote=UNSET, timeout=UNSET,
                       **others) -> DistributedFunction:
        """A new decorated function: this one's decorator arguments with the given ones changed, checked as the
        decorator checks them; this one is unchanged. databricks.air's: num_accelerators, accelerator_type, remote
        (None leaves each as it was, as there), timeout (None: no limit); also gpus, gpu_type and any other
        argument of @distributed. Changing one spelling of a setting (num_accelerators) drops the other (gpus).

            fast = train.with_overrides(num_accelerators=1, timeout=600)
        """
        given = dict(num_accelerators=num_accelerators, accelerator_type=accelerator_type, remote=remote,
                     timeout=timeout, **others)
        return distributed(self.fn, **overridden(self.settings, given))

    def distributed(self, *args, **kwargs) -> RankResults:
        """Run on every rank; return the ranks' results in rank order (tensors on the CPU), with the
        launch's `system_metrics` (peak memory and mean utilisation per rank).

        An interrupt (the notebook's Stop button, Ctrl-C) stops every rank and raises KeyboardInterrupt with one line,
        "stopped 2 ranks of train() after 10.3 s", which a notebook shows alone, without the launcher's frames."""
        return self._launch(pickle_call(self.fn, args, kwargs), label=None, cancel=None,
                            mlflow_run_id=_active_mlflow_run_id(), deadline=self._deadline())

    def distributed_async(self, *args, **kwargs) -> DistributedRun:
        """Start the launch in the background and return at once: a Future-like DistributedRun
        (`result()`, `cancel()`, `done()`). Its output lines start with its name, `[train#2 rank 0]`.
        Several at once share the host's GPUs without overlap: one that cannot get its GPUs waits."""
        run = DistributedRun(f"{self.__name__}#{next(_run_numbers)}")
        payload = pickle_call(self.fn, args, kwargs)  # here: what cannot be pickled is said at once
        mlflow_run_id = _active_mlflow_run_id()  # MLflow's active run belongs to this thread
        deadline = self._deadline()  # the clock runs from the call

        def launch():
            run._future.set_running_or_notify_cancel()
            try:
                run._future.set_result(self._launch(payload, label=run.name, cancel=run._cancel,
                                                    mlflow_run_id=mlflow_run_id, deadline=deadline))
            except BaseException as exc:
                run._future.set_exception(exc)

        run._thread = threading.Thread(target=launch, name=f"nbhelpers-{run.name}", daemon=True)
        run._thread.start()
        return run

    def _deadline(self) -> float | None:
        return None if self.timeout is None or self.engine != "local" else time.monotonic() + self.timeout

    def _launch(self, payload, *, label, cancel, mlflow_run_id, deadline=None) -> RankResults:
        """One attempt, and up to max_restarts more after a failure (not after a cancel, an interrupt or the timeout)."""
        failures = []
        for restart in range(self.max_restarts + 1):
            try:
                return self._attempt(payload, label=label, cancel=cancel, mlflow_run_id=mlflow_run_id,
                                     restart=restart, deadline=deadline)
            except DistributedTimeoutError:
                raise
            except DistributedError as exc:
                failures.append(exc)
                if restart == self.max_restarts:
                    break
                print(f"@distributed: {label or self.__name__}() attempt {restart + 1} failed ({_first_line(exc)}); "
                      f"restarting every rank (restart {restart + 1} of {self.max_restarts})", file=sys.stderr,
                      flush=True)
        if len(failures) == 1:
            raise failures[0]
        attempts = "; ".join(f"attempt {i + 1}: rank {f.rank} ({_first_line(f)})" for i, f in enumerate(failures))
        raise DistributedError(f"{self.__name__}() failed on each of its {len(failures)} attempts: {attempts}.\n"
                               f"The last attempt's error: {failures[-1]}", rank=failures[-1].rank,
                               exitcode=failures[-1].exitcode, signal_name=failures[-1].signal_name,
                               remote_traceback=failures[-1].remote_traceback, attempts=failures,
                               later_failures=failures[-1].later_failures) from failures[-1]

    def _attempt(self, payload, *, label, cancel, mlflow_run_id, restart, deadline=None) -> RankResults:
        options = dict(gpus=self.gpus, output=self.output, stall_timeout=self.stall_timeout, label=label, cancel=cancel,
                       mlflow_run_id=mlflow_run_id, restart=restart, max_restarts=self.max_restarts)
        if self.engine == "ray":
            from nbhelpers.launch import ray_engine  # not before a Ray launch: `import nbhelpers` loads nothing of Ray

            return ray_engine.run(self.__name__, payload, gpu_type=self.gpu_type, **options)
        # (gpu_type was checked at decoration)
        return local_engine.run(self.__name__, payload, timeout=self.timeout, deadline=deadline, **options)


def _first_line(error: BaseException) -> str:
    return str(error).split("\n", 1)[0].rstrip(".")[:300]


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
