"""The contract both engines of `@distributed` keep (nbhelpers.local_engine, nbhelpers.ray_engine).

- The error: one `DistributedError` names the failing rank, how it failed and its traceback.
- The call: `pickle_call` turns (function, args, kwargs) into bytes for the ranks (cloudpickle, by value,
  with the source lines of notebook cells so that the ranks' tracebacks show them); `load_call` in a rank.
- The environment: `torchrun_environment` gives each rank what torchrun would (RANK, WORLD_SIZE, ...).
- The output: `PrefixedPrinter` prints a rank's stream into the cell, line by line, prefixed `[rank N]`.
- The result: a rank runs the call with `run_call` and sends back one message, an `Outcome` (its return
  value with tensors on the CPU, or the failure with its traceback and when it happened); the engine
  reads it with `read_outcome`, turns a failure into an error with `failure_error`, and returns the
  values as `RankResults` (a list, with the launch's `system_metrics`).
- The clean-up: every process of a launch carries its id in NBHELPERS_LAUNCH_ID (children inherit it, in
  whatever process group they end up); `kill_launch_processes` kills those left on this node.

Nothing here imports the engines or the decorator (nbhelpers.launcher), nor torch at import time.
"""
from __future__ import annotations

import codecs
import collections
import contextlib
import io
import linecache
import marshal
import os
import pickle
import re
import sys
import time
import traceback
import types
from typing import NamedTuple

import cloudpickle

DEFAULT_CPU_PROCESSES = 2  # ranks without GPUs when `gpus` is not given


class DistributedError(RuntimeError):
    """A rank failed, was killed, or the ranks stalled. `rank`, `exitcode`, `signal_name` and
    `remote_traceback` say which and how."""

    def __init__(self, message, *, rank=None, exitcode=None, signal_name=None, remote_traceback=None):
        super().__init__(message)
        self.rank = rank
        self.exitcode = exitcode
        self.signal_name = signal_name
        self.remote_traceback = remote_traceback


def check_count(gpus) -> None:
    if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 1:
        raise ValueError(f"gpus must be a whole number >= 1 (or None for every visible GPU), got {gpus!r}")



# ---------------------------------------------------------------------------------------------------
# The call

class _CallPickler(cloudpickle.Pickler):
    """cloudpickle, except that code keeps its file name (cloudpickle writes "<dynamic-code>"), and the
    files it names are recorded, so that their lines can travel with it."""

    def __init__(self, file):
        self.filenames = set()
        # read by the C pickler when it is initialised: set before
        self.dispatch_table = collections.ChainMap({types.CodeType: self._reduce_code}, cloudpickle.Pickler.dispatch_table)
        super().__init__(file)

    def _reduce_code(self, code):
        self.filenames.add(code.co_filename)
        return marshal.loads, (marshal.dumps(code),)  # the same Python reads it: ranks run this interpreter


def pickle_call(fn, args, kwargs) -> bytes:
    """The call as bytes for a rank, with the source lines of the code that travels by value (a notebook's
    cells live only in this process's linecache), so that the rank's tracebacks show them."""
    try:
        buffer = io.BytesIO()
        pickler = _CallPickler(buffer)
        pickler.dump((fn, args, kwargs))
        sources = {name: lines for name in sorted(pickler.filenames) if (lines := linecache.getlines(name))}
        return pickle.dumps((sources, buffer.getvalue()))
    except Exception as exc:
        culprits = _unpicklable_parts(fn, args, kwargs)
        what = "; ".join(culprits) if culprits else "something it refers to"
        raise TypeError(
            f"Cannot send {fn.__name__}() to the ranks, because {what} cannot be pickled ({exc}). "
            "Ranks are separate processes: create such objects inside the function, or pass what "
            "is needed to build them (a path, a config) as arguments."
        ) from exc


def _code_names(code) -> set:
    names = set(code.co_names)
    for const in code.co_consts:
        if hasattr(const, "co_names"):
            names |= _code_names(const)
    return names


def _unpicklable_parts(fn, args, kwargs) -> list[str]:
    def fails(obj) -> bool:
        try:
            cloudpickle.dumps(obj)
            return False
        except Exception:
            return True

    found = []
    code = getattr(fn, "__code__", None)
    if code is not None:
        for name, cell in zip(code.co_freevars, fn.__closure__ or ()):
            with contextlib.suppress(ValueError):  # an empty cell
                if fails(cell.cell_contents):
                    found.append(f"the captured variable {name!r} ({type(cell.cell_contents).__name__})")
        for name in sorted(_code_names(code) & set(fn.__globals__)):
            value = fn.__globals__[name]
            if fails(value):
                found.append(f"the global {name!r} ({type(value).__name__})")
    for i, value in enumerate(args):
        if fails(value):
            found.append(f"positional argument {i} ({type(value).__name__})")
    for name, value in kwargs.items():
        if fails(value):
            found.append(f"argument {name!r} ({type(value).__name__})")
    return found


def load_call(payload: bytes):
    """(fn, args, kwargs) from pickle_call's bytes; the source lines that came with them go
    into linecache, so that tracebacks show the lines of notebook cells."""
    sources, call = pickle.loads(payload)
    for filename, lines in sources.items():
        linecache.cache[filename] = (sum(map(len, lines)), None, lines, filename)  # mtime None: kept
    return cloudpickle.loads(call)



# ---------------------------------------------------------------------------------------------------
# The environment

def torchrun_environment(rank: int, world_size: int, port: int, run_id: str) -> dict:
    return {
        "RANK": str(rank),
        "LOCAL_RANK": str(rank),
        "WORLD_SIZE": str(world_size),
        "LOCAL_WORLD_SIZE": str(world_size),
        "GROUP_RANK": "0",
        "ROLE_RANK": str(rank),
        "ROLE_WORLD_SIZE": str(world_size),
        "ROLE_NAME": "default",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "TORCHELASTIC_RUN_ID": run_id,  # frameworks (Lightning, accelerate) read it as "already launched"
        "TORCHELASTIC_RESTART_COUNT": "0",
        "TORCHELASTIC_MAX_RESTARTS": "0",
        "PYTHONUNBUFFERED": "1",
        "NBHELPERS_LAUNCH_ID": run_id,  # inherited by all a rank starts: how leftovers are found
    }



# ---------------------------------------------------------------------------------------------------
# The result

class Outcome(NamedTuple):
    """The one message a rank sends back."""
    ok: bool
    value: object = None  # the function's return value, tensors on the CPU (ok)
    summary: str = ""  # "ValueError: ..." (failed)
    traceback: str = ""
    failed_at: float = 0.0  # time.time() of the failure: the engines blame the rank whose failure came first


def run_call(rank: int, payload: bytes) -> tuple[bool, bytes]:
    """Run pickle_call's call in this rank: (did it return?, its Outcome as bytes, the message to send
    back). SystemExit and KeyboardInterrupt are failures too: the notebook must hear of them."""
    try:
        fn, args, kwargs = load_call(payload)
        value = to_cpu(fn(*args, **kwargs))
        try:
            return True, cloudpickle.dumps(Outcome(True, value))
        except Exception as exc:
            raise TypeError(f"the return value of rank {rank} cannot be pickled: {exc}") from exc
    except BaseException as exc:
        failed_at = time.time()
        return False, cloudpickle.dumps(Outcome(False, summary=f"{type(exc).__name__}: {exc}",
                                                traceback=traceback.format_exc(), failed_at=failed_at))


def read_outcome(message: bytes) -> Outcome:
    return cloudpickle.loads(message)


class RankResults(list):
    """The ranks' return values in rank order, and `system_metrics`: what the launch measured of them
    (nbhelpers.system_metrics' summary, one value per rank; None where the engine does not sample)."""

    def __init__(self, values, system_metrics: dict | None = None):
        super().__init__(values)
        self.system_metrics = system_metrics


def failure_error(outcome: Outcome, *, rank: int, world_size: int, name: str, context: str = "") -> DistributedError:
    """The error for a rank whose call raised; `context` (ending in a newline) goes before the traceback."""
    remote_tb = with_cell_names(outcome.traceback)
    return DistributedError(
        f"rank {rank} of {world_size} failed in {name}(): {outcome.summary}\n{context}"
        f"The other ranks were stopped. Traceback from rank {rank}:\n{remote_tb}",
        rank=rank, exitcode=1, remote_traceback=remote_tb,
    )


def to_cpu(obj):
    import torch  # in a rank it is imported already

    if isinstance(obj, torch.Tensor):
        full_tensor = getattr(obj, "full_tensor", None)  # a DTensor comes back whole
        return (full_tensor() if callable(full_tensor) else obj).detach().cpu()
    if isinstance(obj, dict):
        return type(obj)((k, to_cpu(v)) for k, v in obj.items())
    if isinstance(obj, (list, tuple)) and not hasattr(obj, "_fields"):
        return type(obj)(to_cpu(v) for v in obj)
    return obj


def with_cell_names(traceback_text: str) -> str:
    """In a notebook: `File "/tmp/ipykernel_1234/567.py", line 7` becomes `Cell In[3], line 7`, as in
    the kernel's own tracebacks (IPython knows which cell each such file name is)."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    compiler = getattr(shell, "compile", None)
    if compiler is None or not hasattr(compiler, "format_code_name"):
        return traceback_text

    def cell(match):
        label = compiler.format_code_name(match.group(1))
        return f"  {label[0]} {label[1]}, line" if label else match.group(0)

    return re.sub(r'^  File "([^"]+)", line', cell, traceback_text, flags=re.MULTILINE)



# ---------------------------------------------------------------------------------------------------
# The output

class PrefixedPrinter:
    """Writes one rank's stream into this process's stdout/stderr, each line prefixed `[rank N]` (with the
    run's name first for a launch in the background: `[train#2 rank N]`).

    A line ends at "\\n" or at "\\r" (progress bars redraw their line with "\\r"), so a tqdm bar on a
    rank still updates in place in the cell.
    """

    def __init__(self, rank, stream, show, tail, run: str | None = None):
        self.prefix = f"[{run} rank {rank}] " if run else f"[rank {rank}] "
        self.stream = stream
        self.show = show
        self.tail = tail
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.pending = ""
        self.after_cr = False

    def feed(self, data: bytes):
        self.pending += self.decoder.decode(data)
        out = []
        start = 0
        for i, ch in enumerate(self.pending):
            if ch in "\n\r":
                segment = self.pending[start:i + 1]
                start = i + 1
                if segment == "\n" and self.after_cr:  # "\r\n" is one line end
                    out.append("\n")
                else:
                    out.append(self.prefix + segment)
                    if ch == "\n":
                        self.tail.append(self.prefix + segment)
                self.after_cr = ch == "\r"
        self.pending = self.pending[start:]
        if len(self.pending) > 8192:  # a very long line without an end: show it anyway
            out.append(self.prefix + self.pending)
            self.pending = ""
        self._write("".join(out))

    def finish(self):
        self.pending += self.decoder.decode(b"", final=True)
        if self.pending:
            self.tail.append(self.prefix + self.pending + "\n")
            self._write(self.prefix + self.pending + "\n")
            self.pending = ""

    def _write(self, text: str):
        if text and self.show:
            target = sys.stdout if self.stream == "stdout" else sys.stderr
            target.write(text)
            target.flush()


def kill_launch_processes(launch_id: str, spare: int | None = None) -> int:
    """SIGKILL every process of this node whose environment carries the launch id (but `spare` and this
    process); return how many."""
    import psutil

    found = []
    for p in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if p.pid not in (spare, os.getpid()) and p.environ().get("NBHELPERS_LAUNCH_ID") == launch_id:
                found.append(p)
    for p in found:
        with contextlib.suppress(psutil.Error):
            p.kill()
    psutil.wait_procs(found, timeout=5)
    return len(found)
