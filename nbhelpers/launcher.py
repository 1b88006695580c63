"""`@distributed`: run a function defined in a notebook on every GPU of the node, one process each.

    from nbhelpers import distributed

    @distributed(gpus=2)                    # default: every visible GPU; no GPU: 2 CPU processes (gloo)
    def train(lr: float):
        dist.init_process_group(backend())  # plain PyTorch: it reads the torchrun environment set here
        ...
    results = train.distributed(lr=1e-3)    # one result per rank, in rank order
    train(lr=1e-3)                          # a plain call runs here, as rank 0 of 1 (debugging)

How it works. Ranks are forked from a server process that imported torch but never touched CUDA
(`multiprocessing`'s forkserver), never from the notebook's process, so a launch works after CUDA was
used in the notebook and a repeated launch costs a fork, not a Python start. The function and its
arguments travel by value (cloudpickle), with the source lines of notebook cells for the ranks'
tracebacks. Each rank gets the torchrun environment (RANK, LOCAL_RANK, WORLD_SIZE, ...,
MASTER_ADDR=127.0.0.1, a free MASTER_PORT; everything listens on loopback only), its own process group,
and pipes for its stdout and stderr, which this process prints into the running cell, prefixed
`[rank N]`. On the first failure every rank is stopped (SIGTERM, then SIGKILL, whole process groups;
a second interrupt does not cut that short) and one `DistributedError` names the rank whose failure
came first and carries its traceback. Ranks die with this process if it dies, and when a launch ends
whatever still refers to it.
"""
from __future__ import annotations

import codecs
import collections
import contextlib
import functools
import io
import linecache
import marshal
import multiprocessing
import os
import pickle
import re
from multiprocessing import forkserver
import selectors
import signal
import socket
import sys
import tempfile
import threading
import time
import types

import cloudpickle

DEFAULT_CPU_PROCESSES = 2
CPU_RANKS_PER_CORE = 2  # without GPUs: more ranks than this per core only time-slice the cores
TERMINATE_GRACE_S = 2.0  # between SIGTERM and SIGKILL
BLAME_WINDOW_S = 0.5  # after a first failure: how long to listen for the failure that caused it
_OUTPUT_MODES = ("all", "rank0")
_ENGINES = ("local", "ray")


class DistributedError(RuntimeError):
    """A rank failed, was killed, or the ranks stalled. `rank`, `exitcode`, `signal_name` and
    `remote_traceback` say which and how."""

    def __init__(self, message, *, rank=None, exitcode=None, signal_name=None, remote_traceback=None):
        super().__init__(message)
        self.rank = rank
        self.exitcode = exitcode
        self.signal_name = signal_name
        self.remote_traceback = remote_traceback


def distributed(fn=None, *, gpus: int | None = None, output: str = "all", stall_timeout: float | None = None,
                engine: str = "local"):
    """Decorate a function so that `fn.distributed(...)` runs it once per GPU (or CPU process).

    Precondition: the function sets up its own process group (`init_process_group`, or a framework
    that does: HF Trainer, Lightning, DeepSpeed); this launcher only starts the processes and sets the
    environment that torchrun would set.

    gpus: how many processes. Default: every visible GPU; with no GPU, 2 CPU processes (gloo).
        More than the visible GPUs, or fewer than 1, is refused before anything starts.
    output: "all" streams every rank's output into the cell; "rank0" only rank 0's (the others'
        last lines still appear in an error).
    stall_timeout: seconds without output from any rank after which every rank's Python stack is
        dumped into the error and all ranks are killed. None: wait for ever.
    engine: "local" (this node's GPUs, the default) or "ray": ranks on the nodes of the Ray cluster this
        process is attached to (`ray.init(address=...)`); `gpus` then counts the ranks of all nodes
        together (default: every GPU of the cluster). See nbhelpers.ray_engine.
    """
    if output not in _OUTPUT_MODES:
        raise ValueError(f"output must be one of {_OUTPUT_MODES}, got {output!r}")
    if stall_timeout is not None and stall_timeout <= 0:
        raise ValueError(f"stall_timeout must be a positive number of seconds or None, got {stall_timeout!r}")
    if engine not in _ENGINES:
        raise ValueError(f"engine must be one of {_ENGINES}, got {engine!r}")
    if gpus is not None:
        # A bad count fails at decoration, long before a launch (the cluster's GPUs are counted at launch).
        _check_count(gpus) if engine == "ray" else _world_size(gpus)

    def decorate(f):
        if engine == "local":
            _fork_server_context()
            forkserver.ensure_running()  # the server starts importing torch now, in the background
        return DistributedFunction(f, gpus=gpus, output=output, stall_timeout=stall_timeout, engine=engine)

    return decorate(fn) if fn is not None else decorate


class DistributedFunction:
    """A function with a `.distributed(...)` launcher; calling it plainly runs it in this process."""

    def __init__(self, fn, *, gpus, output, stall_timeout, engine="local"):
        functools.update_wrapper(self, fn)
        self.fn = fn
        self.gpus = gpus
        self.output = output
        self.stall_timeout = stall_timeout
        self.engine = engine

    def __call__(self, *args, **kwargs):
        with _single_process_environment():
            return self.fn(*args, **kwargs)

    def distributed(self, *args, **kwargs) -> list:
        """Run on every rank; return the ranks' results in rank order (tensors on the CPU)."""
        if self.engine == "ray":
            from nbhelpers import ray_engine

            return ray_engine.run(self.fn, args, kwargs, name=self.__name__, gpus=self.gpus, output=self.output,
                                  stall_timeout=self.stall_timeout)
        world_size = _world_size(self.gpus)
        payload = _pickle_call(self.fn, args, kwargs)
        launch = _Launch(self.__name__, payload, world_size, self.output, self.stall_timeout)
        return launch.run()


def _visible_gpu_count() -> int:
    import torch

    return torch.cuda.device_count()  # asks NVML: does not initialise CUDA in this process


def _check_count(gpus) -> None:
    if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 1:
        raise ValueError(f"gpus must be a whole number >= 1 (or None for every visible GPU), got {gpus!r}")


def _world_size(gpus) -> int:
    visible = _visible_gpu_count()
    if gpus is None:
        return visible or DEFAULT_CPU_PROCESSES
    _check_count(gpus)
    if visible and gpus > visible:
        raise ValueError(
            f"gpus={gpus} but only {visible} GPU(s) are visible to this process "
            f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '<unset>')}). "
            f"Ask for at most {visible}, or leave gpus unset to use every visible GPU."
        )
    cores = _usable_cores()
    if not visible and gpus > CPU_RANKS_PER_CORE * cores:
        raise ValueError(
            f"gpus={gpus} but no GPU is visible, so every rank would be a CPU process, and this machine has "
            f"{cores} CPU core(s): at most {CPU_RANKS_PER_CORE * cores} CPU ranks ({CPU_RANKS_PER_CORE} per core) "
            f"are allowed. Ask for at most {CPU_RANKS_PER_CORE * cores}, or run where GPUs are visible."
        )
    return gpus


def _usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))  # the cores this process may run on (taskset, cgroup cpusets)
    except AttributeError:
        return os.cpu_count() or 1


# ---------------------------------------------------------------------------------------------------
# Pickling the call, with the unpicklable part named

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


def _pickle_call(fn, args, kwargs) -> bytes:
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


# ---------------------------------------------------------------------------------------------------
# The processes

def _fork_server_context():
    """The multiprocessing context whose server process preloads torch (and never touches CUDA)."""
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["nbhelpers._worker"])
    return ctx


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


def _loopback_interface() -> str:
    import psutil

    for name, addresses in psutil.net_if_addrs().items():
        if any(a.family == socket.AF_INET and a.address == "127.0.0.1" for a in addresses):
            return name
    return "lo"


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _loopback_environment() -> dict:
    """Gloo and NCCL listen on the interface these name: the loopback one, since all ranks are on this host
    (rank 0's rendezvous store is kept on loopback by _worker.loopback_rendezvous)."""
    interface = _loopback_interface()
    return {"GLOO_SOCKET_IFNAME": interface, "NCCL_SOCKET_IFNAME": interface}


def _torchrun_environment(rank: int, world_size: int, port: int, run_id: str) -> dict:
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


@contextlib.contextmanager
def _single_process_environment():
    """For a plain call: the environment of rank 0 of 1, unless a launcher already set one."""
    if "RANK" in os.environ:
        yield
        return
    import torch.distributed as dist

    was_initialized = dist.is_available() and dist.is_initialized()
    from nbhelpers._worker import loopback_rendezvous

    added = _torchrun_environment(0, 1, _free_port(), run_id=f"local-{os.getpid()}")
    added.pop("PYTHONUNBUFFERED")
    added.pop("NBHELPERS_LAUNCH_ID")
    added.update(_loopback_environment())
    os.environ.update(added)
    try:
        with loopback_rendezvous():
            yield
    finally:
        for key in added:
            os.environ.pop(key, None)
        if not was_initialized and dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()


@contextlib.contextmanager
def _interrupts_ignored():
    """While inside: SIGINT (the notebook's interrupt button, Ctrl-C) does nothing. Signal handlers
    belong to the main thread; in another thread, interrupts do not arrive anyway."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        if previous is not None:  # None: a handler installed from C, which cannot be put back
            signal.signal(signal.SIGINT, previous)


class _RankProcess:
    """The launcher's view of one rank: its process, its pipes and what it said."""

    def __init__(self, rank, process, stdout, stderr, results, lifeline, stack_file):
        self.rank = rank
        self.process = process
        self.stdout, self.stderr, self.results, self.lifeline = stdout, stderr, results, lifeline
        self.stack_file = stack_file
        self.outcome = None  # ("ok", value) or ("error", summary, traceback, time.time() of the failure)
        self.died = None  # it ended without a result: time.time() before which it was still alive
        self.tail = collections.deque(maxlen=40)  # its last output lines, for error messages

    @property
    def failed(self) -> bool:
        return self.died is not None or (self.outcome is not None and self.outcome[0] == "error")

    @property
    def settled(self) -> bool:
        return self.died is not None or self.outcome is not None


class _Launch:
    def __init__(self, name, payload, world_size, output, stall_timeout):
        self.name = name
        self.payload = payload
        self.world_size = world_size
        self.output = output
        self.stall_timeout = stall_timeout
        self.ranks: list[_RankProcess] = []
        self.selector = selectors.DefaultSelector()
        self.printers = {}

    def run(self) -> list:
        ctx = _fork_server_context()
        with tempfile.TemporaryDirectory(prefix="nbhelpers-") as tmp:
            try:
                self._start(ctx, tmp)
                failure = self._supervise()
                if failure is None:
                    self._wait_for_exit()
            finally:  # returned, failed or interrupted (the notebook's interrupt button): nothing stays
                self._stop_all_despite_interrupts()
            self._drain(deadline=time.monotonic() + 1.0)
            self.selector.close()
        if failure is not None:
            raise failure
        return [r.outcome[1] for r in self.ranks]

    # -- start ----------------------------------------------------------------------------------
    def _start(self, ctx, tmp):
        port = _free_port()
        run_id = self.run_id = f"nbhelpers-{os.getpid()}-{port}-{time.time_ns()}"
        threads = max(1, (os.cpu_count() or 1) // self.world_size)
        from nbhelpers._worker import run_rank

        for rank in range(self.world_size):
            out_r, out_w = ctx.Pipe(duplex=False)
            err_r, err_w = ctx.Pipe(duplex=False)
            res_r, res_w = ctx.Pipe(duplex=False)
            life_r, life_w = ctx.Pipe(duplex=False)
            environ = dict(os.environ)
            environ.setdefault("OMP_NUM_THREADS", str(threads))
            environ.update(_torchrun_environment(rank, self.world_size, port, run_id))
            environ.update(_loopback_environment())
            stack_file = os.path.join(tmp, f"rank{rank}.stack")
            process = ctx.Process(
                target=run_rank,
                name=f"{self.name}-rank{rank}",
                args=(rank, self.payload, environ, os.getcwd(), list(sys.path), int(environ["OMP_NUM_THREADS"]),
                      out_w, err_w, res_w, life_r, stack_file),
            )
            r = _RankProcess(rank, process, out_r, err_r, res_r, life_w, stack_file)
            self.ranks.append(r)  # before it starts: an interrupt from here on stops it
            with _main_module_not_rerun():
                process.start()
            for child_end in (out_w, err_w, res_w, life_r):
                child_end.close()
            self.selector.register(out_r.fileno(), selectors.EVENT_READ, (r, "stdout"))
            self.selector.register(err_r.fileno(), selectors.EVENT_READ, (r, "stderr"))
            self.selector.register(res_r.fileno(), selectors.EVENT_READ, (r, "results"))
            self.selector.register(process.sentinel, selectors.EVENT_READ, (r, "exit"))

    # -- watch ----------------------------------------------------------------------------------
    def _supervise(self):
        """Print output until every rank has returned; a failure comes back as an error.

        Once a rank has failed, listen a moment longer (BLAME_WINDOW_S) for the failure that caused it:
        a rank killed in a collective makes its peers fail too ("Connection reset by peer"), and their
        report may be read first. _blame decides by what happened first.
        """
        last_progress = time.monotonic()
        settle_by = None  # set at the first failure
        polled_at = time.time()  # every rank that has not ended was alive then
        while True:
            if settle_by is None and all(r.settled for r in self.ranks):
                return None  # every rank returned (a failure would have set settle_by)
            if settle_by is not None and (all(r.settled for r in self.ranks) or time.monotonic() >= settle_by):
                return self._blame()
            if settle_by is not None:
                timeout = settle_by - time.monotonic()
            elif self.stall_timeout is not None:
                timeout = max(0.0, last_progress + self.stall_timeout - time.monotonic())
            else:
                timeout = None
            if not self.selector.select(timeout):
                if settle_by is None:
                    return self._stalled()
                continue
            # Poll again right after a timestamp: what is not ready now was still alive at `polled_at`.
            alive_before, polled_at = polled_at, time.time()
            for key, _ in self.selector.select(0):
                r, kind = key.data
                if key.fd not in self.selector.get_map():
                    continue  # read already, with its rank's exit in this batch
                if kind in ("stdout", "stderr"):
                    self._read_output(key.fd, r, kind)
                elif kind == "results":
                    self._read_outcome(r, alive_before)
                elif kind == "exit":
                    self.selector.unregister(key.fd)
                    if r.results.fileno() in self.selector.get_map() and r.results.poll():  # its last words
                        self._read_outcome(r, alive_before)
                    if not r.settled:
                        r.died = alive_before
                last_progress = time.monotonic()
                if r.failed and settle_by is None:
                    settle_by = time.monotonic() + BLAME_WINDOW_S

    def _read_outcome(self, r, alive_before):
        fd = r.results.fileno()
        try:
            r.outcome = cloudpickle.loads(r.results.recv_bytes())
        except (EOFError, OSError):  # it ended without a word: its exit says how
            r.died = alive_before
        self.selector.unregister(fd)

    def _read_output(self, fd, r, stream):
        data = os.read(fd, 65536)
        if not data:
            self.selector.unregister(fd)
            self._printer(r, stream).finish()
            return
        self._printer(r, stream).feed(data)

    def _printer(self, r, stream):
        key = (r.rank, stream)
        if key not in self.printers:
            show = self.output == "all" or r.rank == 0
            self.printers[key] = _PrefixedPrinter(r.rank, stream, show, r.tail)
        return self.printers[key]

    # -- fail -----------------------------------------------------------------------------------
    def _blame(self) -> DistributedError:
        """The failure that happened first. A rank that died without a result (a signal, os._exit) is
        dated by the last moment it was seen alive, and wins a tie: the peers' errors that follow a
        death ("Connection reset by peer") come after it."""
        failed = [r for r in self.ranks if r.failed]
        first = min(failed, key=lambda r: (r.died, 0) if r.died is not None else (r.outcome[3], 1))
        return self._rank_failed(first, [r for r in failed if r is not first])

    def _rank_failed(self, r, also_failed) -> DistributedError:
        self._drain(deadline=time.monotonic() + 0.3, only=r)  # its last output, before we kill anyone
        after = "".join(f"Rank {o.rank} failed after it: {self._summary(o)}\n" for o in also_failed)
        if r.outcome is not None:
            _, summary, remote_tb, _ = r.outcome
            remote_tb = _with_cell_names(remote_tb)
            return DistributedError(
                f"rank {r.rank} of {self.world_size} failed in {self.name}(): {summary}\n{after}"
                f"The other ranks were stopped. Traceback from rank {r.rank}:\n{remote_tb}",
                rank=r.rank, exitcode=1, remote_traceback=remote_tb,
            )
        r.process.join(2)  # the fork server reports the exit status
        code = r.process.exitcode
        tail = "".join(r.tail) or "(no output)\n"
        if code is not None and code < 0:
            name = signal.Signals(-code).name
            hint = " (the kernel's out-of-memory killer sends SIGKILL: check host memory)" if name == "SIGKILL" else ""
            return DistributedError(
                f"rank {r.rank} of {self.world_size} was killed by signal {name}{hint}.\n{after}"
                f"The other ranks were stopped. Last output of rank {r.rank}:\n{tail}",
                rank=r.rank, exitcode=code, signal_name=name,
            )
        return DistributedError(
            f"rank {r.rank} of {self.world_size} exited with code {code} without returning from "
            f"{self.name}() (sys.exit or os._exit inside the function?).\n{after}The other ranks were stopped. "
            f"Last output of rank {r.rank}:\n{tail}",
            rank=r.rank, exitcode=code,
        )

    @staticmethod
    def _summary(r) -> str:
        if r.outcome is not None:
            return r.outcome[1].splitlines()[0][:300] if r.outcome[1] else "(no message)"
        r.process.join(0.5)
        code = r.process.exitcode
        if code is not None and code < 0:
            return f"killed by signal {signal.Signals(-code).name}"
        return f"exited with code {code} without returning"

    def _stalled(self) -> DistributedError:
        for r in self.ranks:
            with contextlib.suppress(ProcessLookupError):
                os.kill(r.process.pid, signal.SIGUSR1)
        time.sleep(1.0)  # faulthandler writes from a signal handler; give every rank the moment
        stacks = []
        for r in self.ranks:
            with contextlib.suppress(OSError):
                with open(r.stack_file) as f:
                    stacks.append(f"--- rank {r.rank} ---\n{f.read().strip() or '(no stack: not responding)'}")
        return DistributedError(
            f"no rank of {self.name}() made progress (no output) for {self.stall_timeout} s; "
            f"all {self.world_size} ranks were killed. Their Python stacks:\n" + "\n".join(stacks)
        )

    def _drain(self, deadline, only=None):
        """Print what is still in the pipes (of one rank, or of all) until EOF or the deadline."""
        while time.monotonic() < deadline:
            keys = [k for k in self.selector.get_map().values()
                    if k.data[1] in ("stdout", "stderr") and (only is None or k.data[0] is only)]
            if not keys:
                return
            events = self.selector.select(max(0.0, deadline - time.monotonic()))
            if not events:
                return
            for key, _ in events:
                r, kind = key.data
                if kind in ("stdout", "stderr") and (only is None or r is only):
                    self._read_output(key.fd, r, kind)

    # -- stop -----------------------------------------------------------------------------------
    def _wait_for_exit(self):
        deadline = time.monotonic() + 30
        for r in self.ranks:
            r.process.join(max(0.0, deadline - time.monotonic()))

    def _stop_all_despite_interrupts(self):
        """_stop_all, carried to its end even if the user interrupts again: a second KeyboardInterrupt
        during the stop must not leave ranks running."""
        while True:
            try:
                with _interrupts_ignored():
                    self._stop_all()
                return
            except KeyboardInterrupt:
                continue

    def _stop_all(self):
        """SIGTERM every rank's process group and every descendant, SIGKILL what remains; then close the
        lifelines, whatever still refers to this launch (a traceback kept by the notebook)."""
        import psutil

        procs = {}
        for r in self.ranks:
            pid = r.process.pid
            if pid is None:
                continue
            with contextlib.suppress(psutil.Error):
                parent = psutil.Process(pid)
                procs.update((p.pid, p) for p in [parent, *parent.children(recursive=True)])
        # Processes whose rank already died (re-parented away) or that left the rank's session still
        # carry the launch id in their environment.
        for p in psutil.process_iter():
            with contextlib.suppress(psutil.Error):
                if p.pid not in procs and p.environ().get("NBHELPERS_LAUNCH_ID") == self.run_id:
                    procs[p.pid] = p
        procs = list(procs.values())
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for r in self.ranks:
                if r.process.pid is not None:
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.killpg(r.process.pid, sig)
            for p in procs:
                with contextlib.suppress(psutil.Error):
                    p.send_signal(sig)
            _, procs = psutil.wait_procs(procs, timeout=TERMINATE_GRACE_S if sig == signal.SIGTERM else 5)
            if not procs:
                break
        for r in self.ranks:
            r.lifeline.close()  # any rank we could not reach kills itself on this EOF
        for r in self.ranks:
            if r.process.pid is not None:
                r.process.join(5)
            for conn in (r.stdout, r.stderr, r.results):
                with contextlib.suppress(OSError):
                    fd = conn.fileno()
                    if fd in self.selector.get_map():
                        continue  # still drained after the stop
                    conn.close()


def _with_cell_names(traceback_text: str) -> str:
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


class _PrefixedPrinter:
    """Writes one rank's stream into this process's stdout/stderr, each line prefixed `[rank N]`.

    A line ends at "\\n" or at "\\r" (progress bars redraw their line with "\\r"), so a tqdm bar on a
    rank still updates in place in the cell.
    """

    def __init__(self, rank, stream, show, tail):
        self.prefix = f"[rank {rank}] "
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
