"""The tests' notebook kernels, forked from a process that has already imported the notebooks' libraries.

A kernel's start costs about 13 CPU-s on the 2-core CI machine, 11 of them importing torch, Transformers, MLflow...
(benchmarks/README.md), and the suite starts about 60. Here each pytest process starts a zygote, which imports
those libraries once; a kernel of `harness.run_notebook` is then a fork of it that runs `python -m ipykernel_launcher
-f CONNECTION_FILE` as jupyter_client's launch_kernel would have started it: in its own session, in its folder, with
its environment, stdin at end of file, stdout and stderr those of the pytest process. A user's kernel starts as
Jupyter starts it; only the tests' start is shared.

What a preloaded library could change, and why it does not:
- A test hook or CPU fix that replaces a module's function must patch it before other modules import it: the zygote
  imports no module of nbhelpers (whose functions the hooks replace), and the hooks named for a kernel are installed
  after the fork, as tests/hooks/sitecustomize.py installs them at a start; what they patch in the preloaded
  libraries is a class's method, the same class whenever it is patched. The CPU fixes are applied in the zygote when
  their modules load, as in a fresh kernel.
- A library reads some settings from the environment when it is imported: a kernel whose environment differs from
  the zygote's in anything but PER_KERNEL_ENV starts as Jupyter starts it. What a library sets in the environment
  when imported (Lightning: PYTORCH_NVML_BASED_CUDA_CHECK=1) is set in each kernel, as its notebook's import would.
  Each interpreter (the Axolotl kernel's is another) has its zygote. Each fork draws a fresh NumPy seed, as a fresh
  process does.
- A fork copies only the thread that forked: the zygote refuses to serve if importing started a thread (but
  jemalloc's, made to be forked).
When the zygote cannot serve (its first line says why, printed once), or with COOKBOOK_FORKED_KERNELS=0 (to compare),
kernels start as Jupyter starts them.
"""
from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid

from jupyter_client.manager import AsyncKernelManager
from jupyter_client.provisioning import LocalProvisioner

# Set per kernel, read after the fork: the test hooks (installed then), Jupyter's own, the MLflow store (read when
# used); and what the pytest process gains as it runs: the current test, MLflow's telemetry session (telemetry is off)
PER_KERNEL_ENV = {"COOKBOOK_TEST_HOOKS", "COOKBOOK_TEST_HOOKS_DIR", "JPY_PARENT_PID", "JPY_SESSION_NAME",
                  "MLFLOW_TRACKING_URI", "PYTEST_CURRENT_TEST", "_MLFLOW_TELEMETRY_SESSION_ID"}
HERE = os.path.dirname(os.path.abspath(__file__))
ENABLED = os.environ.get("COOKBOOK_FORKED_KERNELS") != "0"


class ForkedKernelManager(AsyncKernelManager):
    """papermill.execute_notebook(..., kernel_manager_class=ForkedKernelManager)"""

    async def _async_pre_start_kernel(self, **kw):
        if self.provisioner is None and ENABLED:  # where AsyncKernelManager would make a LocalProvisioner
            self.kernel_id = self.kernel_id or kw.pop("kernel_id", str(uuid.uuid4()))
            self.provisioner = ForkingProvisioner(kernel_id=self.kernel_id, kernel_spec=self.kernel_spec, parent=self)
        return await super()._async_pre_start_kernel(**kw)


class ForkingProvisioner(LocalProvisioner):
    async def launch_kernel(self, cmd, **kwargs):
        zygote = _zygote(_interpreter(cmd))
        if not zygote.serves(cmd, kwargs.get("env") or {}):
            return await super().launch_kernel(cmd, **kwargs)
        env = {**kwargs["env"], "JPY_PARENT_PID": str(os.getpid())}  # as launch_kernel sets it (not `independent`)
        pid = await asyncio.get_running_loop().run_in_executor(None, zygote.fork, cmd, env, kwargs.get("cwd"))
        self.process = _ForkedProcess(pid)
        self.pid = self.pgid = pid  # the kernel leads its own session, as launch_kernel's start_new_session=True
        self.cwd = kwargs.get("cwd")
        return self.connection_info


class _ForkedProcess:
    """What LocalProvisioner uses of a Popen, for a kernel that is the zygote's child (the zygote reaps it)."""

    stdin = stdout = stderr = None

    def __init__(self, pid: int):
        self.pid = pid

    def poll(self):
        try:
            with open(f"/proc/{self.pid}/stat") as stat:
                state = stat.read().rpartition(")")[2].split()[0]
        except OSError:
            return 0  # reaped by the zygote; its exit code stays there
        return 0 if state in ("Z", "X") else None

    def wait(self, timeout=None):
        while self.poll() is None:
            time.sleep(0.05)
        return 0

    def send_signal(self, signum):
        os.kill(self.pid, signum)

    def kill(self):
        self.send_signal(signal.SIGKILL)

    def terminate(self):
        self.send_signal(signal.SIGTERM)


class _Zygote:
    def __init__(self, python: tuple):
        self.python = list(python)  # the interpreter and its options, e.g. [python, "-Xfrozen_modules=off"]
        self.env = {key: value for key, value in os.environ.items() if key not in PER_KERNEL_ENV}
        mine, theirs = socket.socketpair()
        # Started through a short-lived parent, so that it is no child of this process: the tests that look for
        # processes left behind under the pytest process do not find it (nor its kernels).
        subprocess.run([*python, os.path.join(HERE, "kernel_zygote.py"), str(theirs.fileno())],
                       pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL, env=self.env, cwd=HERE, check=True)
        theirs.close()
        self.channel = mine.makefile("rw")
        self.lock = threading.Lock()
        ready = json.loads(self.channel.readline() or '{"error": "it exited"}')
        self.error, self.set_by_imports = ready["error"], ready.get("set_by_imports", {})
        if self.error:
            print(f"forked_kernels: kernels start as Jupyter starts them: {self.error}", file=sys.stderr)

    def serves(self, cmd, env) -> bool:
        if self.error or cmd[:len(self.python) + 2] != [*self.python, "-m", "ipykernel_launcher"]:
            return False
        for key in set(env) | set(self.env):
            if key in PER_KERNEL_ENV or env.get(key) == self.env.get(key):
                continue
            if key in self.set_by_imports and env.get(key) == self.set_by_imports[key]:  # an import since set it here
                continue
            return False
        return True

    def fork(self, cmd, env, cwd) -> int:
        with self.lock:
            request = {"argv": cmd[len(self.python) + 1:], "env": env, "cwd": cwd or os.getcwd()}
            self.channel.write(json.dumps(request) + "\n")
            self.channel.flush()
            return json.loads(self.channel.readline())["pid"]


_zygotes = {}


def start(kernel_name: str) -> _Zygote | None:
    """Start the zygote of kernel `kernel_name`'s interpreter now (about 10 s), with this process's environment as the
    one it serves: call it outside any change of the environment made for one kernel."""
    if ENABLED:
        from jupyter_client.kernelspec import KernelSpecManager

        argv = KernelSpecManager().get_kernel_spec(kernel_name).argv
        return _zygote(_interpreter([sys.executable if argv[0] in ("python", "python3") else argv[0], *argv[1:]]))
    return None


def _interpreter(cmd) -> tuple:
    """The interpreter and its options of a kernel's command: what comes before `-m ipykernel_launcher`."""
    return tuple(cmd[:cmd.index("-m")]) if "-m" in cmd else tuple(cmd)


def _zygote(python: tuple) -> _Zygote:
    key = (os.getpid(), python)  # per process: a fork of a test process has none
    if key not in _zygotes:
        _zygotes[key] = _Zygote(python)
    return _zygotes[key]
