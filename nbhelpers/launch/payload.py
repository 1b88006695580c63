"""What travels between the notebook and a rank of `@distributed`: the call, and the one message it answers with.

- `pickle_call` turns (function, args, kwargs) into bytes (cloudpickle, by value, with the source lines of the
  notebook cells it uses, so that the rank's tracebacks show them); a rank turns them back with `load_call`.
- A rank runs the call with `run_call` and sends back one `Outcome`: its return value (tensors on the CPU,
  pickled on their own), or its failure with the traceback and when it happened.
- The notebook reads it with `read_outcome(message, rank)`. A return value this process cannot load (its class
  lives in a module only the rank imports) becomes a failure that says so and what to do.
- A launch returns its ranks' values in rank order as `RankResults`, with what it measured of them.

Nothing here imports torch at import time, nor any other module of nbhelpers.
"""
from __future__ import annotations

import collections
import contextlib
import io
import linecache
import marshal
import pickle
import time
import traceback
import types
from typing import NamedTuple

import cloudpickle


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


class Outcome(NamedTuple):
    """The one message a rank sends back."""
    ok: bool
    value: object = None  # the function's return value, tensors on the CPU (ok; as bytes until read_outcome)
    summary: str = ""  # "ValueError: ..." (failed)
    traceback: str = ""
    failed_at: float = 0.0  # time.time() of the failure: the engines blame the rank whose failure came first
    unloadable: bool = False  # it returned, but its value cannot be loaded in the notebook's process


def run_call(rank: int, payload: bytes, on_loaded=None) -> tuple[bool, bytes]:
    """Run pickle_call's call in this rank: (did it return?, its Outcome as bytes, the message to send
    back). `on_loaded()` is called once the function is loaded, as it begins. SystemExit and
    KeyboardInterrupt are failures too: the notebook must hear of them."""
    try:
        fn, args, kwargs = load_call(payload)
        if on_loaded is not None:
            on_loaded()
        value = to_cpu(fn(*args, **kwargs))
        try:
            value = cloudpickle.dumps(value)  # on its own: read_outcome can tell a value it cannot load
        except Exception as exc:
            raise TypeError(f"the return value of rank {rank} cannot be pickled: {exc}. Return plain types "
                            "(numbers, strings, lists, dicts, tensors)") from exc
        return True, cloudpickle.dumps(Outcome(True, value))
    except BaseException as exc:
        failed_at = time.time()
        return False, cloudpickle.dumps(Outcome(False, summary=f"{type(exc).__name__}: {exc}",
                                                traceback=traceback.format_exc(), failed_at=failed_at))


def read_outcome(message: bytes) -> Outcome:
    """The rank's Outcome, its value loaded; a value that cannot be loaded here is a failure saying why."""
    outcome = cloudpickle.loads(message)
    if not outcome.ok:
        return outcome
    try:
        return outcome._replace(value=cloudpickle.loads(outcome.value))
    except Exception as exc:
        return Outcome(False, summary=f"{type(exc).__name__}: {exc}", traceback=traceback.format_exc(),
                       failed_at=time.time(), unloadable=True)


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


class RankResults(list):
    """The ranks' return values in rank order, and `system_metrics`: what the launch measured of them
    (nbhelpers.launch.system_metrics' summary, one value per rank; None where the engine does not sample);
    `step_times`: the ranks' medians of their data wait, forward pass and step, and which rank held the others back
    and why (nbhelpers.launch.stragglers.launch_figures; None where no rank recorded its steps)."""

    def __init__(self, values, system_metrics: dict | None = None, step_times: dict | None = None):
        super().__init__(values)
        self.system_metrics = system_metrics
        self.step_times = step_times
