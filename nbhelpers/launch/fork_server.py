"""The local engine's fork server: every rank is a fork of one server process that imported torch but never touched
CUDA.

A rank is never forked from the notebook's process (CUDA may be in use there) nor started as a fresh Python (seconds of
imports each): `multiprocessing`'s forkserver starts one server, which imports this module, and with it torch, once.
So a launch works after CUDA was used in the notebook, and a repeated launch costs a fork, not a Python start. Without
GPUs the server also imports the installed modules the function refers to (trl, peft, ...: seconds each), once,
instead of every rank importing them; with GPUs it does not, as a library may touch CUDA as it is imported.

- In the notebook's process: `warm_up` starts the server (at decoration), naming the modules it imports
  (`modules_to_import_once`); `new_rank` and `start` fork a rank from it, with its pipes, without re-running the
  calling script's `__main__` in it.
- In the server, as it imports this module: it leaves the launcher's process group (and removes its socket's folder
  when the launcher ends, however it ends), imports torch and the modules named, and freezes what it imported.
- In each rank: `run_rank` gives it its own process group, its output to the launcher's pipes, its stacks on SIGUSR1,
  the torchrun environment, and runs the call (nbhelpers.launch.payload.run_call).

Nothing here imports an engine or the decorator; torch only in the server (and so in every rank). The notebook's
process imports this module with nbhelpers, so multiprocessing and the other modules only a launch needs are imported
where they are used: `import nbhelpers` stays as light as it was.
"""
from __future__ import annotations

import atexit
import contextlib
import gc
import os
import signal
import sys
import threading
import types

from nbhelpers.launch.gpus import any_gpu_visible
from nbhelpers.launch.payload import run_call
from nbhelpers.launch.processes import loopback_rendezvous

FORK_SERVER_IMPORTS = "NBHELPERS_FORK_SERVER_IMPORTS"  # the modules the fork server imports, while it starts
IN_FORK_SERVER = any(arg.startswith("from multiprocessing.forkserver import main") for arg in sys.orig_argv)
_FORK_SERVER_START = threading.Lock()


# ---------------------------------------------------------------------------------------------------
# In the notebook's process

def context():
    """The multiprocessing context whose server process preloads torch (and never touches CUDA)."""
    import multiprocessing

    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["nbhelpers.launch.fork_server"])
    return ctx


def warm_up(fn=None) -> None:
    """Start the fork server now: it imports torch in the background while the notebook goes on (without GPUs,
    also the installed modules `fn` refers to)."""
    from multiprocessing import forkserver

    context()
    modules = []
    if fn is not None and not any_gpu_visible():
        with contextlib.suppress(Exception):  # only a speed-up: an object that cannot be inspected leaves it out
            modules = modules_to_import_once(fn)
    with _FORK_SERVER_START:  # the server's environment names them only while it starts
        os.environ[FORK_SERVER_IMPORTS] = ",".join(modules)
        try:
            forkserver.ensure_running()
        finally:
            os.environ.pop(FORK_SERVER_IMPORTS, None)


def modules_to_import_once(fn) -> list[str]:
    """The installed modules (site-packages, nbhelpers) of what `fn` refers to, directly or through the functions of
    its own module it calls: what every rank would import to unpickle and run it. In the order this process imported
    them (Unsloth, say, must come before transformers)."""
    import sysconfig

    installed = tuple(dict.fromkeys(sysconfig.get_paths()[key] for key in ("purelib", "platlib")))
    found, seen, todo = set(), set(), [fn]
    while todo:
        f = todo.pop()
        if id(f) in seen or not hasattr(f, "__code__"):
            continue
        seen.add(id(f))
        codes = [f.__code__]
        for code in codes:
            codes.extend(c for c in code.co_consts if isinstance(c, types.CodeType))  # nested functions' names too
            for name in code.co_names:
                value = f.__globals__.get(name)
                try:
                    module = value.__name__ if isinstance(value, types.ModuleType) else getattr(value, "__module__", None)
                except Exception:  # an object that cannot say: its rank imports what it needs
                    continue
                if module == f.__module__:
                    todo.append(value)
                elif isinstance(module, str):
                    found.add(module)

    def is_installed(module):
        path = getattr(sys.modules.get(module), "__file__", None) or ""
        return module.startswith("nbhelpers.") or path.startswith(installed)

    return [module for module in list(sys.modules) if module in found and is_installed(module)]


def new_rank(ctx, rank: int, name: str, payload: bytes, environ: dict):
    """A rank's process, to be forked from the server by `start`, with five pipes: (the process, the launcher's ends
    (stdout, stderr, results, lifeline, stacks), the rank's ends, which `start` closes here). environ: the rank's
    whole environment (OMP_NUM_THREADS set: its torch threads)."""
    (out_r, out_w), (err_r, err_w), (res_r, res_w), (life_r, life_w), (stack_r, stack_w) = [
        ctx.Pipe(duplex=False) for _ in range(5)]  # (read end, write end) of each
    process = ctx.Process(
        target=run_rank,
        name=name,
        args=(rank, payload, environ, os.getcwd(), list(sys.path), int(environ["OMP_NUM_THREADS"]),
              out_w, err_w, res_w, life_r, stack_w),
    )
    return process, (out_r, err_r, res_r, life_w, stack_r), (out_w, err_w, res_w, life_r, stack_w)


def start(process, rank_ends) -> None:
    """Fork the rank from the server; its ends of the pipes are then its own."""
    with _main_module_not_rerun():
        process.start()
    for rank_end in rank_ends:
        rank_end.close()


_MAIN_MODULE_LOCK = threading.Lock()


@contextlib.contextmanager
def _main_module_not_rerun():
    """Start a rank without multiprocessing re-running the calling script in it.

    multiprocessing re-imports a script's `__main__` in each child (the reason for its
    `if __name__ == "__main__"` idiom), found through `__main__.__file__` or `__main__.__spec__`. The
    function travels by value here, so a rank needs none of it: during the start both are hidden (the
    module itself stays in place, so other threads still pickle its classes). The lock keeps launches
    from several threads from restoring each other's hidden state. A notebook's `__main__` has neither.
    """
    with _MAIN_MODULE_LOCK:
        main = sys.modules["__main__"]
        hidden = {k: main.__dict__[k] for k in ("__file__", "__spec__") if k in main.__dict__}
        main.__dict__.pop("__file__", None)
        if "__spec__" in hidden:
            main.__spec__ = None
        try:
            yield
        finally:
            main.__dict__.update(hidden)


# ---------------------------------------------------------------------------------------------------
# In the server, as it imports this module

def _remove_the_socket_folder_when_the_launcher_ends() -> None:
    """In the fork server. The folder of its socket (multiprocessing's /tmp/pymp-*) is removed by the launcher only if
    the launcher exits normally: a kernel killed with its process group (a Jupyter restart, papermill after a failure)
    left one each time. The server ends when the launcher ends, however it ends (EOF on its `alive` pipe), so it
    removes the folder then; in a session of its own, it outlives a kill of the launcher's process group."""
    with contextlib.suppress(PermissionError):  # a process group leader already
        os.setsid()
    server = os.getpid()

    def remove():
        import shutil
        from multiprocessing import forkserver

        address = forkserver._forkserver._forkserver_address  # the server's socket, set as it starts serving
        folder = os.path.dirname(address) if isinstance(address, str) else ""
        if os.getpid() == server and os.path.basename(folder).startswith("pymp-"):  # not in a fork of it
            shutil.rmtree(folder, ignore_errors=True)

    atexit.register(remove)


def _import_what_the_ranks_need() -> None:
    """In the fork server: the modules the launcher named (warm_up; none with GPUs). One that fails is left to the
    rank that needs it, which meets the error itself."""
    import importlib

    for name in filter(None, os.environ.pop(FORK_SERVER_IMPORTS, "").split(",")):
        with contextlib.suppress(Exception):
            importlib.import_module(name)


if IN_FORK_SERVER:
    # Before torch (seconds to import): the sooner the server has left the launcher's process group, the better.
    _remove_the_socket_folder_when_the_launcher_ends()
    # The server's imports live as long as it does: a collection while importing only walks them (a fifth of the
    # import time of torch + transformers). Collection resumes after them.
    gc.disable()
    import torch  # noqa: F401  imported here so that every fork of the server has it already

    _import_what_the_ranks_need()
    # Frozen: no collection in the server or in a rank forked from it walks the imported modules' objects again,
    # and none touches their pages (which a rank then shares with the server instead of copying).
    gc.freeze()
    gc.enable()


# ---------------------------------------------------------------------------------------------------
# In each rank

def _die_with_launcher(lifeline_fd: int) -> None:
    # The launcher holds the only write end: EOF means it is gone (crashed, killed, or done with us).
    while os.read(lifeline_fd, 1):
        pass
    os.killpg(0, signal.SIGKILL)


def _end_mlflow_runs(status: str) -> None:
    """End the MLflow runs this rank's main thread has open (a training function's `mlflow.start_run()`, the HF
    Trainer's callback) with `status`, so that none stays RUNNING for ever; MLflow's own exit hook would call a rank
    that raised FINISHED, and a rank ended by a signal gets no exit hook at all."""
    mlflow = sys.modules.get("mlflow")  # a rank that never imported it opened no run
    if mlflow is None:
        return
    with contextlib.suppress(Exception):
        for _ in range(16):  # nested runs: innermost first
            if mlflow.active_run() is None:
                return
            mlflow.end_run(status)


def _stop_on_sigterm(rank_pid: int) -> None:
    """SIGTERM is how the launcher stops a rank (an interrupt, another rank's failure, a timeout, a stall): its open
    MLflow runs end KILLED, then it dies of the signal as without a handler. Processes the rank forks (DataLoader
    workers) inherit the handler and die at once: their MLflow state is a copy, and PyTorch ends them with SIGTERM too."""
    def stop(signum, frame):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the launcher signals the group and the process: once is enough
        if os.getpid() == rank_pid:
            _end_mlflow_runs("KILLED")
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)

    signal.signal(signal.SIGTERM, stop)


def run_rank(rank, payload, environ, cwd, sys_path, threads, stdout, stderr, results, lifeline, stacks):
    """Entry point of one rank (a child of the fork server). On SIGUSR1 it writes the Python stack of every
    thread into the pipe `stacks` (faulthandler: even while a C call holds the GIL); the launcher asks for them
    to see whether the rank moves, and after a stall. Its first line names the main thread."""
    import faulthandler
    import multiprocessing

    import torch  # imported by the server already

    os.setsid()  # a process group of its own: the launcher ends the rank and all it started at once
    os.dup2(stdout.fileno(), 1)
    os.dup2(stderr.fileno(), 2)
    stdout.close()
    stderr.close()
    sys.stdout.reconfigure(line_buffering=True)
    sys.stderr.reconfigure(line_buffering=True)
    threading.Thread(target=_die_with_launcher, args=(lifeline.fileno(),), daemon=True).start()
    faulthandler.register(signal.SIGUSR1, file=stacks.fileno(), all_threads=True)
    # after the handler: the launcher sends SIGUSR1 only to a rank whose first line it has read
    os.write(stacks.fileno(), f"main thread 0x{threading.main_thread().ident:016x}\n".encode())

    # A child of the fork server inherits "forkserver" as its default start method; under torchrun a rank has
    # the platform's default (fork on Linux), and e.g. DataLoader workers of a notebook-defined Dataset need it.
    multiprocessing.set_start_method(None, force=True)
    os.environ.clear()
    os.environ.update(environ)
    os.chdir(cwd)
    sys.path[:] = sys_path
    torch.set_num_threads(threads)

    _stop_on_sigterm(os.getpid())
    with loopback_rendezvous():
        ok, message = run_call(rank, payload)
    if not ok:
        _end_mlflow_runs("FAILED")
    results.send_bytes(message)
    sys.stdout.flush()
    sys.stderr.flush()
    if not ok:
        sys.exit(1)
