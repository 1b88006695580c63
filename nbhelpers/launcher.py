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
arguments travel by value (cloudpickle). Each rank gets the torchrun environment (RANK, LOCAL_RANK,
WORLD_SIZE, ..., MASTER_ADDR=127.0.0.1, a free MASTER_PORT), its own process group, and pipes for its
stdout and stderr, which this process prints into the running cell, prefixed `[rank N]`. On the first
failure every rank is stopped (SIGTERM, then SIGKILL, whole process groups) and one `DistributedError`
names the rank and carries its traceback. Ranks die with this process if it dies.
"""
from __future__ import annotations

import codecs
import collections
import contextlib
import functools
import multiprocessing
import os
from multiprocessing import forkserver
import selectors
import signal
import socket
import sys
import tempfile
import time
import types

import cloudpickle

DEFAULT_CPU_PROCESSES = 2
TERMINATE_GRACE_S = 2.0  # between SIGTERM and SIGKILL
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
    return gpus


# ---------------------------------------------------------------------------------------------------
# Pickling the call, with the unpicklable part named

def _pickle_call(fn, args, kwargs) -> bytes:
    try:
        return cloudpickle.dumps((fn, args, kwargs))
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


@contextlib.contextmanager
def _main_module_not_rerun():
    """Start a rank without multiprocessing re-running the calling script in it.

    multiprocessing re-imports a script's `__main__` in each child (the reason for its
    `if __name__ == "__main__"` idiom). The function travels by value here, so a rank needs none of
    it: during the start, `__main__` is a module without a file. A notebook's `__main__` has none anyway.
    """
    main = sys.modules["__main__"]
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        sys.modules["__main__"] = main


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
    added = _torchrun_environment(0, 1, _free_port(), run_id=f"local-{os.getpid()}")
    added.pop("PYTHONUNBUFFERED")
    added.pop("NBHELPERS_LAUNCH_ID")
    os.environ.update(added)
    try:
        yield
    finally:
        for key in added:
            os.environ.pop(key, None)
        if not was_initialized and dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()


class _Rank:
    """The launcher's view of one rank: its process, its pipes and what it said."""

    def __init__(self, rank, process, stdout, stderr, results, lifeline, stack_file):
        self.rank = rank
        self.process = process
        self.stdout, self.stderr, self.results, self.lifeline = stdout, stderr, results, lifeline
        self.stack_file = stack_file
        self.outcome = None  # ("ok", value) or ("error", summary, traceback)
        self.tail = collections.deque(maxlen=40)  # its last output lines, for error messages
        self.open_streams = 2


class _Launch:
    def __init__(self, name, payload, world_size, output, stall_timeout):
        self.name = name
        self.payload = payload
        self.world_size = world_size
        self.output = output
        self.stall_timeout = stall_timeout
        self.ranks: list[_Rank] = []
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
            except BaseException:  # KeyboardInterrupt from the notebook's interrupt button too
                self._stop_all()
                raise
            if failure is not None:
                self._stop_all()
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
        for rank in range(self.world_size):
            out_r, out_w = ctx.Pipe(duplex=False)
            err_r, err_w = ctx.Pipe(duplex=False)
            res_r, res_w = ctx.Pipe(duplex=False)
            life_r, life_w = ctx.Pipe(duplex=False)
            environ = dict(os.environ)
            environ.setdefault("OMP_NUM_THREADS", str(threads))
            environ.update(_torchrun_environment(rank, self.world_size, port, run_id))
            stack_file = os.path.join(tmp, f"rank{rank}.stack")
            from nbhelpers._worker import run_rank

            process = ctx.Process(
                target=run_rank,
                name=f"{self.name}-rank{rank}",
                args=(rank, self.payload, environ, os.getcwd(), list(sys.path), int(environ["OMP_NUM_THREADS"]),
                      out_w, err_w, res_w, life_r, stack_file),
            )
            with _main_module_not_rerun():
                process.start()
            for child_end in (out_w, err_w, res_w, life_r):
                child_end.close()
            r = _Rank(rank, process, out_r, err_r, res_r, life_w, stack_file)
            self.ranks.append(r)
            self.selector.register(out_r.fileno(), selectors.EVENT_READ, (r, "stdout"))
            self.selector.register(err_r.fileno(), selectors.EVENT_READ, (r, "stderr"))
            self.selector.register(res_r.fileno(), selectors.EVENT_READ, (r, "results"))
            self.selector.register(process.sentinel, selectors.EVENT_READ, (r, "exit"))

    # -- watch ----------------------------------------------------------------------------------
    def _supervise(self):
        """Print output until every rank has returned; the first failure comes back as an error."""
        last_progress = time.monotonic()
        while any(r.outcome is None for r in self.ranks):
            timeout = None
            if self.stall_timeout is not None:
                timeout = max(0.0, last_progress + self.stall_timeout - time.monotonic())
            events = self.selector.select(timeout)
            if not events:
                return self._stalled()
            for key, _ in events:
                r, kind = key.data
                if kind in ("stdout", "stderr"):
                    self._read_output(key.fd, r, kind)
                    last_progress = time.monotonic()
                elif kind == "results":
                    self._read_outcome(r)
                    last_progress = time.monotonic()
                    if r.outcome is not None and r.outcome[0] == "error":
                        return self._rank_failed(r)
                else:  # the process ended
                    self.selector.unregister(key.fd)
                    if r.outcome is None and r.results.poll():  # its last words may still sit in the pipe
                        self._read_outcome(r)
                    if r.outcome is None or r.outcome[0] == "error":
                        return self._rank_failed(r)
        return None

    def _read_outcome(self, r):
        with contextlib.suppress(EOFError, OSError):  # EOF: it died without a word; its exit says how
            r.outcome = cloudpickle.loads(r.results.recv_bytes())
        with contextlib.suppress(KeyError, ValueError):
            self.selector.unregister(r.results.fileno())

    def _read_output(self, fd, r, stream):
        data = os.read(fd, 65536)
        if not data:
            self.selector.unregister(fd)
            r.open_streams -= 1
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
    def _rank_failed(self, r) -> DistributedError:
        self._drain(deadline=time.monotonic() + 0.3, only=r)  # its last output, before we kill anyone
        if r.outcome is not None:
            _, summary, remote_tb = r.outcome
            return DistributedError(
                f"rank {r.rank} of {self.world_size} failed in {self.name}(): {summary}\n"
                f"The other ranks were stopped. Traceback from rank {r.rank}:\n{remote_tb}",
                rank=r.rank, exitcode=1, remote_traceback=remote_tb,
            )
        r.process.join(1)
        code = r.process.exitcode
        tail = "".join(r.tail) or "(no output)\n"
        if code is not None and code < 0:
            name = signal.Signals(-code).name
            hint = " (the kernel's out-of-memory killer sends SIGKILL: check host memory)" if name == "SIGKILL" else ""
            return DistributedError(
                f"rank {r.rank} of {self.world_size} was killed by signal {name}{hint}. "
                f"The other ranks were stopped. Last output of rank {r.rank}:\n{tail}",
                rank=r.rank, exitcode=code, signal_name=name,
            )
        return DistributedError(
            f"rank {r.rank} of {self.world_size} exited with code {code} without returning from "
            f"{self.name}() (sys.exit or os._exit inside the function?). The other ranks were stopped. "
            f"Last output of rank {r.rank}:\n{tail}",
            rank=r.rank, exitcode=code,
        )

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
        self._stop_all()  # anything still alive (or started by a rank and left behind) goes now

    def _stop_all(self):
        """SIGTERM every rank's process group and every descendant, SIGKILL what remains."""
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
            r.process.join(5)
            for conn in (r.stdout, r.stderr, r.results):
                with contextlib.suppress(OSError):
                    fd = conn.fileno()
                    if fd in self.selector.get_map():
                        continue  # still drained after the stop
                    conn.close()


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
