"""What runs inside each rank of the local engine (nbhelpers.launch.local_engine).

The engine's fork server imports this module (and with it torch) once, never touching CUDA, so a rank
forked from it starts warm and may still use CUDA; without GPUs it also imports the modules the launcher
names. Only `loopback_rendezvous` also serves plain calls in the notebook's process.
"""
from __future__ import annotations

import atexit
import contextlib
import faulthandler
import gc
import multiprocessing
import os
import shutil
import signal
import socket
import sys
import threading


def _remove_the_socket_folder_when_the_launcher_ends() -> None:
    """In the fork server. The folder of its socket (multiprocessing's /tmp/pymp-*) is removed by the launcher only if
    the launcher exits normally: a kernel killed with its process group (a Jupyter restart, papermill after a failure)
    left one each time. The server ends when the launcher ends, however it ends (EOF on its `alive` pipe), so it
    removes the folder then; in a session of its own, it outlives a kill of the launcher's process group."""
    with contextlib.suppress(PermissionError):  # a process group leader already
        os.setsid()
    server = os.getpid()

    def remove():
        from multiprocessing import forkserver

        address = forkserver._forkserver._forkserver_address  # the server's socket, set as it starts serving
        folder = os.path.dirname(address) if isinstance(address, str) else ""
        if os.getpid() == server and os.path.basename(folder).startswith("pymp-"):  # not in a fork of it
            shutil.rmtree(folder, ignore_errors=True)

    atexit.register(remove)


IN_FORK_SERVER = any(arg.startswith("from multiprocessing.forkserver import main") for arg in sys.orig_argv)

# Before torch (seconds to import): the sooner the server has left the launcher's process group, the better.
if IN_FORK_SERVER:
    _remove_the_socket_folder_when_the_launcher_ends()
    # The server's imports live as long as it does: a collection while importing only walks them (a fifth of the
    # import time of torch + transformers). Collection resumes after them (_import_what_the_ranks_need).
    gc.disable()

import torch  # noqa: E402  imported here so that every fork of the server has it already

from nbhelpers.launch.payload import run_call  # noqa: E402


def _import_what_the_ranks_need() -> None:
    """In the fork server: the modules the launcher named (local_engine.warm_up; none with GPUs). One that fails is
    left to the rank that needs it, which meets the error itself."""
    import importlib

    for name in filter(None, os.environ.pop("NBHELPERS_FORK_SERVER_IMPORTS", "").split(",")):
        with contextlib.suppress(Exception):
            importlib.import_module(name)


if IN_FORK_SERVER:
    _import_what_the_ranks_need()
    # Frozen: no collection in the server or in a rank forked from it walks the imported modules' objects again,
    # and none touches their pages (which a rank then shares with the server instead of copying).
    gc.freeze()
    gc.enable()


def _die_with_launcher(lifeline_fd: int) -> None:
    # The launcher holds the only write end: EOF means it is gone (crashed, killed, or done with us).
    while os.read(lifeline_fd, 1):
        pass
    os.killpg(0, signal.SIGKILL)


@contextlib.contextmanager
def loopback_rendezvous():
    """While inside: the TCPStore that rank 0 serves for `init_process_group` (env:// or tcp:// on
    127.0.0.1) listens on 127.0.0.1 only. torch's own listens on every interface and has no setting for
    it, so its store factory is wrapped to hand the store a socket bound to loopback (TCPStore's
    `master_listen_fd`). Each init still gets a fresh store, as without the wrapper.
    """
    import importlib

    from torch.distributed import TCPStore

    rendezvous = importlib.import_module("torch.distributed.rendezvous")  # the attribute is a function of that name
    create = getattr(rendezvous, "_create_c10d_store", None)
    if create is None:  # a torch without it: its own store, on every interface (a test says so)
        yield
        return

    def create_on_loopback(hostname, port, rank, world_size, timeout, use_libuv=True):
        if rank != 0 or hostname not in ("127.0.0.1", "localhost") or os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
            return create(hostname, port, rank, world_size, timeout, use_libuv)
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as torch's own: a re-init reuses the port
            listener.bind(("127.0.0.1", port))
            listener.listen(1024)
        except OSError:  # the port is served in this process already (multi-tenant): torch reuses that server
            listener.close()
            return create(hostname, port, rank, world_size, timeout, use_libuv)
        fd = listener.detach()  # the store owns the socket from here on
        try:
            return TCPStore(hostname, port, world_size, True, timeout, multi_tenant=True, master_listen_fd=fd,
                            use_libuv=use_libuv)
        except BaseException:
            os.close(fd)
            raise

    rendezvous._create_c10d_store = create_on_loopback
    try:
        yield
    finally:
        rendezvous._create_c10d_store = create


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
