"""How a launch of `@distributed` fails, in words: the error family and the texts that name the rank and how it ended.

- `DistributedError`: a rank failed, was killed, or the ranks stalled; it names the failing rank, how it failed and
  its traceback (`failure_error`: a rank that raised; `ended_without_result`: one that died or exited).
- `DistributedTimeoutError` (databricks.air's `LocalExecutionTimeoutError`): the launch ran past its `timeout`.
- The ranks that failed after the first: a peer whose collective broke when the first went away is said in words
  (`later_failures_text`, `lost_its_peer`), its raw transport error kept in the error's `later_failures`.
- An interrupt (`interrupted`: one line in a notebook) and a cancel (`cancelled`).
- Ray, which is optional: `import_ray` imports it for a Ray launch, or says how to install it.

Nothing here imports an engine, the decorator (nbhelpers.launch.launcher) or torch.
"""
from __future__ import annotations

import re
import sys
from concurrent.futures import CancelledError


class DistributedError(RuntimeError):
    """A rank failed, was killed, or the ranks stalled. `rank`, `exitcode`, `signal_name` and
    `remote_traceback` say which and how; after restarts (`max_restarts`), `attempts` lists each attempt's error.
    `later_failures`: {rank: its raw error} of the ranks that failed after `rank`, e.g. a peer's transport error
    ("Connection closed by peer") that the message says in words."""

    def __init__(self, message, *, rank=None, exitcode=None, signal_name=None, remote_traceback=None, attempts=(),
                 later_failures=None):
        super().__init__(message)
        self.rank = rank
        self.exitcode = exitcode
        self.signal_name = signal_name
        self.remote_traceback = remote_traceback
        self.attempts = list(attempts)
        self.later_failures = dict(later_failures or {})


class DistributedTimeoutError(DistributedError, TimeoutError):
    """The launch ran past its wall-clock `timeout` (databricks.air's `timeout`); every rank was stopped. Not restarted
    by `max_restarts`: the limit is the whole call's. `timeout` is the limit in seconds."""

    def __init__(self, message, *, timeout: float, **kwargs):
        super().__init__(message, **kwargs)
        self.timeout = timeout


LocalExecutionTimeoutError = DistributedTimeoutError  # databricks.air's name for it


def failure_error(outcome, *, rank: int, world_size: int, name: str, context: str = "",
                  later_failures=None) -> DistributedError:
    """The error for a rank whose call raised (or whose return value cannot be loaded here); `context`
    (ending in a newline) goes before the traceback; later_failures: the error's attribute of that name."""
    remote_tb = with_cell_names(outcome.traceback)
    if outcome.unloadable:
        return DistributedError(
            f"rank {rank} of {world_size} returned from {name}(), but its return value cannot be loaded in this "
            f"process: {outcome.summary}. The rank built it from a class or function of a module this process "
            "does not have. Return plain types (numbers, strings, lists, dicts, tensors), or define the class in "
            f"a module that both the notebook and the ranks import.\n{context}The other ranks were stopped. "
            f"Traceback of the load:\n{remote_tb}",
            rank=rank, exitcode=0, remote_traceback=remote_tb, later_failures=later_failures,
        )
    return DistributedError(
        f"rank {rank} of {world_size} failed in {name}(): {outcome.summary}\n{context}"
        f"The other ranks were stopped. Traceback from rank {rank}:\n{remote_tb}",
        rank=rank, exitcode=1, remote_traceback=remote_tb, later_failures=later_failures,
    )


def ended_without_result(*, rank: int, world_size: int, name: str, exitcode: int | None, context: str,
                         last_output: str, later_failures=None) -> DistributedError:
    """The error for a rank that ended without returning: killed by a signal (exitcode < 0), or exited (sys.exit,
    os._exit). `context` (ending in a newline) goes before its last output."""
    if exitcode is not None and exitcode < 0:
        signal_name = _signal_name(exitcode)
        hint = " (the kernel's out-of-memory killer sends SIGKILL: check host memory)" if signal_name == "SIGKILL" else ""
        return DistributedError(
            f"rank {rank} of {world_size} was killed by signal {signal_name}{hint}.\n{context}"
            f"The other ranks were stopped. Last output of rank {rank}:\n{last_output}",
            rank=rank, exitcode=exitcode, signal_name=signal_name, later_failures=later_failures,
        )
    return DistributedError(
        f"rank {rank} of {world_size} exited with code {exitcode} without returning from "
        f"{name}() (sys.exit or os._exit inside the function?).\n{context}The other ranks were stopped. "
        f"Last output of rank {rank}:\n{last_output}",
        rank=rank, exitcode=exitcode, later_failures=later_failures,
    )


def how_it_ended(exitcode: int | None) -> str:
    """A rank that ended without returning, in a few words: "killed by signal SIGKILL", "exited with code 0 ..."."""
    if exitcode is not None and exitcode < 0:
        return f"killed by signal {_signal_name(exitcode)}"
    return f"exited with code {exitcode} without returning"


def _signal_name(exitcode: int) -> str:
    import signal

    return signal.Signals(-exitcode).name


# A rank whose peer died while it waited in a collective: gloo's and NCCL's words for a lost connection.
_PEER_LOST = re.compile(r"connection (closed|reset) by peer|broken pipe|socket closed|read error|write error|"
                        r"remote process exited|communicator was aborted|ncclRemoteError|DistNetworkError", re.IGNORECASE)


def lost_its_peer(error: str) -> bool:
    """Whether a rank's error is a collective that broke because another rank went away (a consequence)."""
    return bool(_PEER_LOST.search(error))


def later_failures_text(first: int, later: dict) -> str:
    """Lines (each ending in a newline) for the ranks that failed after rank `first` ({rank: raw error}): a peer whose
    collective broke when `first` went away is said in words (its raw transport error stays in the error's
    `later_failures`); any other error is quoted by its first line."""
    lines = []
    for rank in sorted(later):
        raw = later[rank]
        if lost_its_peer(raw):
            lines.append(f"Rank {rank} was waiting in a collective for rank {first}, lost its connection when rank {first} "
                         f"failed, and was stopped: a consequence, not a failure of its own (its raw error: "
                         f"err.later_failures[{rank}]).\n")
        else:
            first_line = raw.splitlines()[0][:300] if raw.strip() else "(no message)"
            lines.append(f"Rank {rank} failed after it: {first_line}\n")
    return "".join(lines)


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


def timeout_error(name: str, world_size: int, timeout: float, tails: dict) -> DistributedTimeoutError:
    """The error of a launch stopped at its wall-clock limit: the limit, how to change it, each rank's last lines."""
    text = "".join(f"--- rank {r} ---\n{tails[r]}" for r in sorted(tails))
    return DistributedTimeoutError(
        f"{name}() ran past its timeout of {format_seconds(timeout)} (wall clock); all {world_size} ranks were stopped, "
        f"with every process they started. To allow longer, pass a larger timeout in seconds to @distributed(timeout=...) "
        f"(or {name}.with_overrides(timeout=...)); timeout=None runs without a limit. The ranks' last output:\n{text}",
        timeout=timeout)


def format_seconds(seconds: float) -> str:
    """10800 -> "10800 s (3 h)"; 90 -> "90 s"."""
    shown = f"{seconds:g} s"
    if seconds >= 3600:
        return f"{shown} ({seconds / 3600:g} h)"
    if seconds >= 120:
        return f"{shown} ({seconds / 60:g} min)"
    return shown


def interrupted(name: str, stopped: int, seconds: float) -> KeyboardInterrupt:
    """The KeyboardInterrupt of a launch the user interrupted, once its ranks are stopped: one line says what happened,
    "stopped 2 ranks of train() after 10.3 s". IPython (a notebook) shows only that line (`_render_traceback_`, its
    protocol for exceptions that render themselves): the frames of the launcher and of `selectors` are no news."""
    message = f"stopped {stopped} rank{'' if stopped == 1 else 's'} of {name}() after {seconds:.1f} s"
    error = KeyboardInterrupt(message)
    error._render_traceback_ = lambda: [f"\x1b[0;31mKeyboardInterrupt\x1b[0m: {message}"]
    return error


def cancelled(name: str) -> CancelledError:
    return CancelledError(f"{name} was cancelled; its ranks were stopped")


def import_ray(what: str):
    """The `ray` module, imported for `what` (a Ray launch). Ray is optional (the cookbook's `ray` extra): where it is
    not installed, one ModuleNotFoundError says what needs it and how to install it."""
    try:
        import ray
    except ModuleNotFoundError as error:
        if error.name != "ray":
            raise
        raise ModuleNotFoundError(f'{what} runs on Ray, which is not installed here: pip install ".[ray]" in the '
                                  'cookbook\'s folder (its `ray` extra: Ray Train)', name="ray") from None
    return ray
