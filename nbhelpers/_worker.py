"""What runs inside each rank of `@distributed`.

The launcher's fork server imports this module (and with it torch) once, never touching CUDA, so a
rank forked from it starts warm and may still use CUDA. Nothing here runs in the notebook's process.
"""
from __future__ import annotations

import faulthandler
import multiprocessing
import os
import signal
import sys
import threading
import traceback

import cloudpickle
import torch  # noqa: F401  imported here so that every fork of the server has it already


def _die_with_launcher(lifeline_fd: int) -> None:
    # The launcher holds the only write end: EOF means it is gone (crashed, killed, or done with us).
    while os.read(lifeline_fd, 1):
        pass
    os.killpg(0, signal.SIGKILL)


def _to_cpu(obj):
    if isinstance(obj, torch.Tensor):
        full_tensor = getattr(obj, "full_tensor", None)  # a DTensor comes back whole
        return (full_tensor() if callable(full_tensor) else obj).detach().cpu()
    if isinstance(obj, dict):
        return type(obj)((k, _to_cpu(v)) for k, v in obj.items())
    if isinstance(obj, (list, tuple)) and not hasattr(obj, "_fields"):
        return type(obj)(_to_cpu(v) for v in obj)
    return obj


def run_rank(rank, payload, environ, cwd, sys_path, threads, stdout, stderr, results, lifeline, stack_file):
    """Entry point of one rank (a child of the fork server)."""
    os.setsid()  # a process group of its own: the launcher ends the rank and all it started at once
    os.dup2(stdout.fileno(), 1)
    os.dup2(stderr.fileno(), 2)
    stdout.close()
    stderr.close()
    sys.stdout.reconfigure(line_buffering=True)
    sys.stderr.reconfigure(line_buffering=True)
    threading.Thread(target=_die_with_launcher, args=(lifeline.fileno(),), daemon=True).start()
    dump_file = open(stack_file, "w")
    faulthandler.register(signal.SIGUSR1, file=dump_file, all_threads=True)

    # A child of the fork server inherits "forkserver" as its default start method; under torchrun a rank has
    # the platform's default (fork on Linux), and e.g. DataLoader workers of a notebook-defined Dataset need it.
    multiprocessing.set_start_method(None, force=True)
    os.environ.clear()
    os.environ.update(environ)
    os.chdir(cwd)
    sys.path[:] = sys_path
    torch.set_num_threads(threads)

    try:
        fn, args, kwargs = cloudpickle.loads(payload)
        result = _to_cpu(fn(*args, **kwargs))
        try:
            message = cloudpickle.dumps(("ok", result))
        except Exception as exc:
            raise TypeError(f"the return value of rank {rank} cannot be pickled: {exc}") from exc
    except BaseException as exc:  # SystemExit and KeyboardInterrupt too: the launcher must hear of it
        text = traceback.format_exc()
        message = cloudpickle.dumps(("error", f"{type(exc).__name__}: {exc}", text))
        results.send_bytes(message)
        sys.stdout.flush()
        sys.stderr.flush()
        sys.exit(1)
    results.send_bytes(message)
    sys.stdout.flush()
    sys.stderr.flush()
