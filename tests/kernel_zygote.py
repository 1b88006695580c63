"""The zygote of tests/forked_kernels.py: imports the notebooks' libraries once, then forks a kernel per request.

    python tests/kernel_zygote.py FD     (FD: a socket to the pytest process; forked_kernels.py starts it)

One request a line on the socket, JSON {"argv": ["ipykernel_launcher", "-f", CONNECTION_FILE], "env": ..., "cwd": ...};
the answer a line {"pid": PID}. The first line it writes says whether it serves ({"error": null} or why not) and
which environment variables the imports set.
It imports nothing of Jupyter: ipykernel reads the kernel's environment (JPY_PARENT_PID) when it is imported.
"""
from __future__ import annotations

import atexit
import gc
import json
import os
import runpy
import signal
import socket
import sys
import threading

# What the notebooks import (their first code cells), less nbhelpers (see forked_kernels.py) and Jupyter's own: about
# 10 of the 13 CPU-s of a kernel's start.
PRELOAD = ("matplotlib.pyplot", "mlflow", "torch", "yaml", "pandas", "datasets", "peft", "transformers",
           "transformers.modeling_utils", "trl", "accelerate", "lightning", "torchvision")
# Must not be imported here: what reads a kernel's own environment when imported, and what the test hooks patch by
# replacing a module's functions.
NOT_PRELOADED = ("ipykernel", "IPython", "jupyter_client", "nbhelpers")


def _serve(fd: int) -> None:
    channel = socket.socket(fileno=fd).makefile("rw")
    gc.disable()
    error = None
    before = dict(os.environ)
    for name in PRELOAD:
        try:
            __import__(name)
        except ModuleNotFoundError as e:  # the package itself is not installed here: none to preload (Lightning
            if e.name != name.partition(".")[0]:  # beside Axolotl); one of its own imports missing is an error
                error = f"importing {name} failed: {e!r}"
        except Exception as e:
            error = f"importing {name} failed: {e!r}"
    imported = sorted({name.partition(".")[0] for name in sys.modules} & set(NOT_PRELOADED))
    if imported and not error:
        error = f"importing {', '.join(PRELOAD)} imported {imported}"
    threads = [open(f"/proc/self/task/{task}/comm").read().strip() for task in os.listdir("/proc/self/task")
               if int(task) != os.getpid()]
    # jemalloc (pyarrow's allocator, under MLflow and datasets) starts a background thread; it is made to be forked:
    # its fork handlers take its locks before the fork and reset its background threads' state in the child
    threads = [name for name in threads if name != "jemalloc_bg_thd"]
    if threads and not error:
        error = f"importing {', '.join(PRELOAD)} started threads {threads}: a fork would not copy them"
    # e.g. Lightning sets PYTORCH_NVML_BASED_CUDA_CHECK=1 when imported: a kernel gets it on top of its environment
    set_by_imports = {key: value for key, value in os.environ.items() if before.get(key) != value}
    gc.freeze()
    gc.enable()
    signal.signal(signal.SIGCHLD, _reap)
    channel.write(json.dumps({"error": error, "set_by_imports": set_by_imports}) + "\n")
    channel.flush()
    while request := channel.readline():
        request = json.loads(request)
        pid = os.fork()
        if pid == 0:
            channel.close()
            _become_kernel(**request, set_by_imports=set_by_imports)  # does not return
        channel.write(json.dumps({"pid": pid}) + "\n")
        channel.flush()
    os._exit(0)  # the pytest process has gone; its kernels notice their parent gone (ipykernel's parent poller)


def _reap(*_):
    try:
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass
    except ChildProcessError:
        pass


def _become_kernel(argv, env, cwd, set_by_imports) -> None:
    code = 1
    try:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        os.setsid()
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.close(devnull)
        os.chdir(cwd)
        os.environ.clear()
        os.environ.update(env)
        os.environ.update(set_by_imports)  # as the imports the kernel's notebook makes would set them
        if env.get("COOKBOOK_TEST_HOOKS"):  # what sitecustomize.py does at a start
            import cookbook_hooks

            cookbook_hooks.install(env["COOKBOOK_TEST_HOOKS"])
        import numpy

        numpy.random.seed()
        sys.path[0] = cwd  # as `python -m` sets it
        sys.argv = list(argv)
        runpy.run_module(argv[0], run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:  # what the interpreter does at exit, then exit without returning into the zygote's loop
        try:
            threading._shutdown()
            atexit._run_exitfuncs()
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


if __name__ == "__main__":
    if os.fork() == 0:  # the zygote; its short-lived parent exits at once (see forked_kernels._Zygote)
        os.setsid()
        _serve(int(sys.argv[1]))
    os._exit(0)
