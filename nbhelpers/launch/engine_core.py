"""What both engines of `@distributed` do the same way on the notebook's side (nbhelpers.launch.local_engine,
nbhelpers.launch.ray_engine): one copy of each.

- The error: one `DistributedError` names the failing rank, how it failed and its traceback (`failure_error`).
- The environment: `torchrun_environment` gives each rank what torchrun would (RANK, WORLD_SIZE, ...).
- The output: `Printers` print each rank's streams into the cell, line by line, prefixed `[rank N]`.
- The GPUs asked for: `gpu_type_matches` compares serverless_gpu's `gpu_type` (or databricks.air's
  `accelerator_type`) with GPU product names.
- Stalls: `ProgressWatch` keeps, per rank, when it last made progress (its own output, or a change in its main
  thread's Python stack between two snapshots); `stall_error` is the report with every rank's stacks.
- The clean-up: every process of a launch carries its id in NBHELPERS_LAUNCH_ID (children inherit it, in
  whatever process group or session they end up); `stop_launch_processes` ends those left on this node.
- Ray, which is optional: `import_ray` imports it when a Ray launch runs, or says how to install it.

What travels to and from a rank (the call, its Outcome) is nbhelpers.launch.payload. Nothing here imports the
engines, the decorator (nbhelpers.launch.launcher) or torch.
"""
from __future__ import annotations

import codecs
import collections
import contextlib
import operator
import os
import random
import re
import signal
import socket
import sys
import time
from concurrent.futures import CancelledError

DEFAULT_CPU_PROCESSES = 2  # ranks without GPUs when `gpus` is not given


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


def check_count(gpus, name: str = "gpus") -> int:
    """`gpus` as an int: any integer type counts (numpy's, as a notebook computes it); a bool, a float, a string
    or a count below 1 is refused, naming the setting `name`."""
    try:
        count = None if isinstance(gpus, bool) else operator.index(gpus)
    except TypeError:
        count = None
    if count is None or count < 1:
        raise ValueError(f"{name} must be a whole number >= 1 (or None for every visible GPU), got {gpus!r}")
    return count


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


class RankResults(list):
    """The ranks' return values in rank order, and `system_metrics`: what the launch measured of them
    (nbhelpers.launch.system_metrics' summary, one value per rank; None where the engine does not sample);
    `step_times`: the ranks' medians of their data wait, forward pass and step, and which rank held the others back
    and why (nbhelpers.launch.stragglers.launch_figures; None where no rank recorded its steps)."""

    def __init__(self, values, system_metrics: dict | None = None, step_times: dict | None = None):
        super().__init__(values)
        self.system_metrics = system_metrics
        self.step_times = step_times


# ---------------------------------------------------------------------------------------------------
# The environment

def torchrun_environment(rank: int, world_size: int, port: int, run_id: str, restart: int = 0,
                         max_restarts: int = 0) -> dict:
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
        # init_process_group returns once every rank has made the group (torch's barrier after init, off by default
        # since torch 2.2): without it, a rank that ends right after init (init, print, destroy) can close its side
        # while a slower peer still connects, which then fails with gloo's "connectFullMesh failed ... Connection
        # closed by peer" (the getting-started notebook's hello: 6 of 60 launches on a loaded 2-core machine, 0 of 60
        # with it). The user's own setting wins.
        "TORCH_DIST_INIT_BARRIER": os.environ.get("TORCH_DIST_INIT_BARRIER", "1"),
        "TORCHELASTIC_RUN_ID": run_id,  # frameworks (Lightning, accelerate) read it as "already launched"
        "TORCHELASTIC_RESTART_COUNT": str(restart),  # as torchrun: which attempt this is (0: the first)
        "TORCHELASTIC_MAX_RESTARTS": str(max_restarts),
        "PYTHONUNBUFFERED": "1",
        "NBHELPERS_LAUNCH_ID": run_id,  # inherited by all a rank starts: how leftovers are found
    }


def free_port(host: str = "127.0.0.1") -> int:
    """A port for rank 0's rendezvous store that nothing listens on now, taken below the kernel's ephemeral range
    (ip_local_port_range) and above Ray's worker ports (10002-19999): a port the kernel hands out for bind(0) or an
    outgoing connection (gloo's pairs, another test's port 0) could be taken again between this check and rank 0's
    bind a few seconds later; one from outside that range is taken only by someone who asks for it by number."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as ranges:
            ephemeral_low = int(ranges.read().split()[0])
    except (OSError, ValueError, IndexError):
        ephemeral_low = 32768  # Linux's default
    candidates = list(range(20000, ephemeral_low))
    random.SystemRandom().shuffle(candidates)
    for port in candidates[:200]:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            try:
                probe.bind((host, port))
                return port
            except OSError:
                continue
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:  # a range that small or that busy: any free one
        probe.bind((host, 0))
        return probe.getsockname()[1]


# ---------------------------------------------------------------------------------------------------
# The GPUs asked for

def gpu_type_name(gpu_type) -> str:
    """serverless_gpu's gpu_type ("H100", "a10", a GPUType member) or databricks.air's accelerator_type
    ("GPU_8xH100", "GPU_1xA10") as the product-name word(s) to look for: "h100", "a10"."""
    text = str(getattr(gpu_type, "value", gpu_type))
    return re.sub(r"^gpu_\d+x", "", text.strip().lower())


ACCELERATOR_TYPES = ("GPU_1xA10", "GPU_1xH100", "GPU_8xH100", "GPU_8xB300")  # databricks.air 0.1.1's


def accelerator_shape(accelerator_type) -> tuple[int, str]:
    """databricks.air's accelerator_type as its node shape: "GPU_8xH100" -> (8, "H100"), GPUs per node and their kind.
    A value not of the form GPU_<count>x<GPU> is refused, naming the documented ones."""
    text = str(getattr(accelerator_type, "value", accelerator_type))
    match = re.fullmatch(r"GPU_([1-9][0-9]*)x([A-Za-z0-9]+)", text.strip(), flags=re.IGNORECASE)
    if match is None:
        raise ValueError(f"accelerator_type={accelerator_type!r} is not a node shape GPU_<count>x<GPU>: Databricks "
                         f"names {', '.join(ACCELERATOR_TYPES)}. (serverless_gpu's spelling of the GPU alone, "
                         "gpu_type='H100', is gpu_type.)")
    return int(match.group(1)), match.group(2)


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


def gpu_type_matches(gpu_type, name: str) -> bool:
    """Whether a GPU of product name `name` ("NVIDIA H200", "Tesla V100-SXM2-32GB") is a `gpu_type`."""
    words = lambda text: set(re.findall(r"[a-z0-9]+", text.lower()))  # noqa: E731
    return words(gpu_type_name(gpu_type)) <= words(name)


# ---------------------------------------------------------------------------------------------------
# The error

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


class Printers:
    """One PrefixedPrinter per (rank, stream) of a launch, made on first use; `tails[rank]` keeps a rank's last
    40 lines (shown in errors even where output="rank0" hides them). With keep_logs, `logs[rank]` keeps what the rank
    wrote (stdout and stderr as they arrived, all ranks whatever `output` shows; bounded: RankLog)."""

    def __init__(self, output: str, label: str | None, keep_logs: bool = False):
        self.output, self.label = output, label
        self.printers = {}
        self.tails = collections.defaultdict(lambda: collections.deque(maxlen=40))
        self.logs = collections.defaultdict(RankLog) if keep_logs else None

    def feed(self, rank: int, stream: str, data: bytes) -> None:
        if self.logs is not None:
            self.logs[rank].feed(data)
        key = (rank, stream)
        if key not in self.printers:
            show = self.output == "all" or rank == 0
            self.printers[key] = PrefixedPrinter(rank, stream, show, self.tails[rank], run=self.label)
        self.printers[key].feed(data)

    def finish(self, rank: int | None = None) -> None:
        for (r, _), printer in self.printers.items():
            if rank is None or r == rank:
                printer.finish()

    def tail(self, rank: int) -> str:
        return "".join(self.tails[rank]) or "(no output)\n"


class RankLog:
    """One rank's output as a log: its first HEAD_BYTES and its last TAIL_BYTES, with a line saying how much was left
    out between them (a long run's log stays a few MB, as the cell's stream keeps only what it shows)."""

    HEAD_BYTES = 256 * 1024
    TAIL_BYTES = 768 * 1024

    def __init__(self):
        self.head = bytearray()
        self.tail = bytearray()
        self.left_out = 0

    def feed(self, data: bytes) -> None:
        room = self.HEAD_BYTES - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        self.tail += data
        if len(self.tail) > self.TAIL_BYTES:
            cut = len(self.tail) - self.TAIL_BYTES
            del self.tail[:cut]
            self.left_out += cut

    def text(self) -> str:
        gap = f"\n[... {self.left_out} bytes of this rank's output left out ...]\n".encode() if self.left_out else b""
        return bytes(self.head + gap + self.tail).decode(errors="replace")


def save_rank_logs(mlflow_run_id: str, logs: dict, world_size: int, restart: int = 0) -> None:
    """Each rank's log into the MLflow run as the artifact logs/rank_N.txt (a restart's under logs/restart_K/), as
    databricks.air saves them; a rank that said nothing gets an empty file. A failure to save is said in one line: the
    launch's own result or error stands."""
    folder = "logs" if restart == 0 else f"logs/restart_{restart}"
    try:
        from mlflow.tracking import MlflowClient

        client = MlflowClient()
        for rank in range(world_size):
            log = logs.get(rank)
            client.log_text(mlflow_run_id, log.text() if log is not None else "", f"{folder}/rank_{rank}.txt")
    except Exception as exc:
        print(f"nbhelpers: the ranks' logs not saved to MLflow run {mlflow_run_id}: {exc}", file=sys.stderr)


# ---------------------------------------------------------------------------------------------------
# Stalls

class ProgressWatch:
    """When each rank last made progress: its own output (shown in the cell or not), or a change in its main
    thread's Python stack between two snapshots. A rank with none for `stall_timeout` seconds is stalled,
    whatever the other ranks do: a rank stuck in a collective while another keeps printing is a stall too.

    Precondition: the engine sends each rank's output to `output` and a snapshot of its stacks at least every
    `snapshot_every` seconds to `snapshot` (the first snapshot only sets the reference to compare with).
    """

    def __init__(self, ranks, stall_timeout: float, now: float | None = None):
        now = time.monotonic() if now is None else now
        self.stall_timeout = stall_timeout
        self.last_progress = {rank: now for rank in ranks}
        self.stacks = {}  # rank -> its last snapshot, whole
        self.main_stacks = {}  # rank -> its main thread's stack in that snapshot
        self.snapshot_at = {}

    @property
    def snapshot_every(self) -> float:
        # two snapshots fit well inside the timeout: a rank that moves is seen to move before it counts as stalled
        return max(0.2, self.stall_timeout / 4)

    def output(self, rank: int, now: float | None = None) -> None:
        self.last_progress[rank] = time.monotonic() if now is None else now

    def snapshot(self, rank: int, stacks: str, main_stack: str, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        if rank in self.main_stacks and main_stack != self.main_stacks[rank]:
            self.last_progress[rank] = now
        self.stacks[rank], self.main_stacks[rank], self.snapshot_at[rank] = stacks, main_stack, now

    def done(self, rank: int) -> None:
        """The rank has returned (or ended): it is watched no longer."""
        self.last_progress.pop(rank, None)

    def deadline(self) -> float:
        """When the first rank will count as stalled if none of them makes progress meanwhile."""
        return min(self.last_progress.values(), default=float("inf")) + self.stall_timeout

    def stalled(self, now: float | None = None) -> list[int]:
        now = time.monotonic() if now is None else now
        return sorted(r for r, at in self.last_progress.items() if now - at >= self.stall_timeout)

    def quiet(self, now: float | None = None) -> list[int]:
        """For a stall's report: the ranks without progress for half the timeout (those with more recent
        progress went on); ranks that stalled a moment apart count as stalled together."""
        now = time.monotonic() if now is None else now
        return sorted(r for r, at in self.last_progress.items() if now - at >= self.stall_timeout / 2)


def main_thread_stack(stacks: str, thread_id: str | None = None) -> str:
    """The section of a stack dump that belongs to the main thread: in faulthandler's dump, the thread whose id
    is `thread_id` ("0x00007f..."); in a dump of traceback.format_stack sections, "Thread MainThread:". The whole
    dump where neither is found."""
    sections, current = {}, None
    for line in stacks.splitlines():
        if line and not line[0].isspace():
            current = line
            sections[current] = []
        elif current is not None:
            sections[current].append(line)
    for header, lines in sections.items():
        if (thread_id and thread_id in header) or (not thread_id and header.startswith("Thread MainThread")):
            return "\n".join(lines)
    return stacks


def stall_error(name: str, world_size: int, stall_timeout: float, stalled: list[int], stacks: dict) -> DistributedError:
    """The report of a stall: which ranks made no progress, and every rank's Python stacks (`stacks`: rank ->
    text, or missing where a rank did not answer)."""
    how = "no output, no change in its Python stack"
    if len(stalled) == world_size:
        what = f"no rank of {name}() made progress ({how}) for {stall_timeout} s"
    else:
        went_on = [r for r in range(world_size) if r not in stalled]
        what = (f"rank {', '.join(map(str, stalled))} of {name}() made no progress ({how}) for {stall_timeout} s "
                f"while rank {', '.join(map(str, went_on))} went on")
    text = "\n".join(f"--- rank {r} ---\n{(stacks.get(r) or '(no stack: not responding)').strip()}"
                     for r in range(world_size))
    return DistributedError(f"{what}; all {world_size} ranks were killed. Their Python stacks:\n{text}",
                            rank=stalled[0])


# ---------------------------------------------------------------------------------------------------
# The clean-up

def launch_processes(launch_id: str, spare=()) -> list:
    """The processes of this node whose environment carries the launch id (psutil.Process), but `spare` and this
    process."""
    import psutil

    found = []
    for p in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if p.pid not in (*spare, os.getpid()) and p.environ().get("NBHELPERS_LAUNCH_ID") == launch_id:
                found.append(p)
    return found


def stop_processes(processes, grace: float = 0.0, also=lambda sig: None) -> None:
    """SIGTERM, then after `grace` seconds SIGKILL, what is still running of `processes` (psutil.Process);
    `also(sig)` is called with each signal (to signal process groups as well). grace 0: SIGKILL at once."""
    import psutil

    for sig in ((signal.SIGTERM, signal.SIGKILL) if grace > 0 else (signal.SIGKILL,)):
        also(sig)
        for p in processes:
            with contextlib.suppress(psutil.Error):
                p.send_signal(sig)
        _, processes = psutil.wait_procs(processes, timeout=grace if sig == signal.SIGTERM else 5)
        if not processes:
            return


def stop_launch_processes(launch_id: str, spare=(), grace: float = 0.0) -> int:
    """End every process of this node that carries the launch id (but `spare` and this process), in whatever
    process group or session it is; return how many there were."""
    found = launch_processes(launch_id, spare)
    stop_processes(found, grace)
    return len(found)
