"""The local engine of `@distributed`: the ranks are processes on this host, one per GPU (or CPU process).

A launch, top to bottom (`run`, then _LocalLaunch):
1. With GPUs, it leases its GPUs host-wide (nbhelpers.launch.gpu_lease), so launches running at once
   (`distributed_async`) get disjoint GPUs; its ranks see only those.
2. _start: each rank is forked from the fork server (nbhelpers.launch.fork_server: never from the notebook's process,
   so a launch works after CUDA was used here) with the torchrun environment (MASTER_ADDR=127.0.0.1, a free
   MASTER_PORT; everything listens on loopback only: nbhelpers.launch.processes), its own process group, and pipes
   for its stdout, stderr, result, stacks and a lifeline (it dies with this process). The call travels by value
   (nbhelpers.launch.payload). While the ranks run, nbhelpers.launch.system_metrics samples them.
3. _supervise: their output is printed into the running cell as it comes, prefixed `[rank N]`
   (nbhelpers.launch.output). `stall_timeout` watches each rank on its own (nbhelpers.launch.stalls): its output,
   and snapshots of its Python stack sent through a pipe every quarter of the timeout. `timeout` is the launch's
   wall-clock limit (databricks.air's).
4. On the first failure, _blame names the rank whose failure came first, not a peer whose collective broke because
   it went away (a rank's end is seen through its pidfd at once; PEER_WAIT_S), and one DistributedError carries its
   traceback (nbhelpers.launch.errors); a stall's error shows every rank's stack, a timeout's the limit and how to
   change it.
5. _stop_all, after any end (returned, failed, stalled, timed out, interrupted): every rank's process tree is stopped
   (SIGTERM, then SIGKILL; a second interrupt does not cut that short), and whatever still refers to the launch.
6. When an MLflow run is active, each rank's output goes to it as logs/rank_N.txt; then the one line that names the
   rank that held the others back, if one did (its step times went into memory the launch reads at its end:
   nbhelpers.launch.stragglers). A launch writes no file of its own.
"""
from __future__ import annotations

import contextlib
import os
import selectors
import signal
import threading
import time
from concurrent.futures import CancelledError

from nbhelpers.launch import fork_server
from nbhelpers.launch.errors import (DistributedError, cancelled, ended_without_result, failure_error, how_it_ended,
                                     interrupted, later_failures_text, lost_its_peer, timeout_error)
from nbhelpers.launch.gpu_lease import GpuLease, LeaseCancelled
from nbhelpers.launch.gpus import cpu_threads_per_rank, visible_gpus, world_size
from nbhelpers.launch.output import Printers, save_rank_logs
from nbhelpers.launch.payload import RankResults, read_outcome
from nbhelpers.launch.processes import (free_port, loopback_environment, stop_despite_interrupts, stop_ranks,
                                        torchrun_environment)
from nbhelpers.launch.stalls import ProgressWatch, main_thread_stack, stall_error
from nbhelpers.launch.stragglers import LaunchStepTimes
from nbhelpers.launch.system_metrics import RankSampler

TERMINATE_GRACE_S = 2.0  # between SIGTERM and SIGKILL
BLAME_WINDOW_S = 0.5  # after a first failure: how long to listen for the failure that caused it
# ... and where every failure so far is a collective that lost its peer: how long to wait for that peer to be seen ending
PEER_WAIT_S = 10.0
CANCEL_POLL_S = 0.2  # how soon a cancelled launch in the background notices
# MLflow's INFO lines (creating tables, monitoring system metrics) arrive on a rank's stderr, which a notebook colours as
# an error: its warnings and errors only, unless MLFLOW_LOGGING_LEVEL is set (e.g. INFO, in the notebook's environment).
RANK_MLFLOW_LOGGING_LEVEL = "WARNING"
STACK_WAIT_S = 3.0  # after a stall: for every rank's fresh stacks (one that does not answer: its last snapshot)


def run(name: str, payload: bytes, *, gpus: int | None, output: str, stall_timeout: float | None,
        label: str | None = None, cancel=None, mlflow_run_id: str | None = None, restart: int = 0,
        max_restarts: int = 0, timeout: float | None = None, deadline: float | None = None) -> RankResults:
    """Run pickle_call's call once per rank on this host; the ranks' results in rank order.

    With GPUs the launch first leases its GPUs host-wide (nbhelpers.launch.gpu_lease: waiting while other
    launches hold them) and its ranks see only those. label: the run's name, before each output line.
    cancel: a threading.Event that stops the ranks (concurrent.futures.CancelledError). mlflow_run_id:
    where the ranks' system metrics and logs go. restart, max_restarts: which attempt this is, of how many more allowed
    (the ranks see them as torchrun's TORCHELASTIC_RESTART_COUNT and TORCHELASTIC_MAX_RESTARTS). timeout, deadline:
    the call's wall-clock limit in seconds and the time.monotonic() at which it passes (None: no limit); past it
    every rank is stopped (nbhelpers.launch.errors.DistributedTimeoutError).
    """
    ranks = world_size(gpus)
    visible = visible_gpus()
    lease = GpuLease(visible, ranks, holder=label or name, cancel=cancel) if visible else contextlib.nullcontext([])
    try:
        with lease as leased:
            return _LocalLaunch(name, payload, ranks, output, stall_timeout, leased, label, cancel, mlflow_run_id,
                                (restart, max_restarts), (timeout, deadline)).run()
    except LeaseCancelled as exc:
        raise CancelledError(str(exc)) from None


_RANKS_RUNNING = [0]  # ranks of this process's launches running now, behind the lock
_RANKS_RUNNING_LOCK = threading.Lock()


@contextlib.contextmanager
def _ranks_running(count: int):
    """Count a launch's ranks while it runs; yields the count of all running ones, this launch's included
    (oversubscribed OpenMP threads spin each other to a crawl: 25x slower was seen)."""
    with _RANKS_RUNNING_LOCK:
        _RANKS_RUNNING[0] += count
        running = _RANKS_RUNNING[0]
    try:
        yield running
    finally:
        with _RANKS_RUNNING_LOCK:
            _RANKS_RUNNING[0] -= count


def _pidfd(process) -> int | None:
    """A file descriptor that the kernel makes readable as soon as the rank's process has ended. The process's sentinel
    becomes readable only once the fork server, its parent, has reaped it and written its exit status: on a loaded
    machine that came after a peer's report of the broken collective, and the peer was blamed. None where pidfds are
    missing (Linux < 5.3, not Linux) or the process has ended already: the sentinel, watched too, tells then."""
    with contextlib.suppress(AttributeError, OSError):
        return os.pidfd_open(process.pid)
    return None


class _RankProcess:
    """The launcher's view of one rank: its process, its pipes and what it said."""

    def __init__(self, rank, process, stdout, stderr, results, lifeline, stacks):
        self.rank = rank
        self.process = process
        self.stdout, self.stderr, self.results, self.lifeline, self.stacks = stdout, stderr, results, lifeline, stacks
        self.outcome = None  # its nbhelpers.launch.payload.Outcome
        self.died = None  # it ended without a result: time.time() before which it was still alive
        self.main_thread = None  # "0x...": its main thread's id in its stack dumps
        self.dump = b""  # the stack dump arriving since the last request
        self.exit_fd = None  # its pidfd, readable once it has ended (_pidfd)

    @property
    def failed(self) -> bool:
        return self.died is not None or (self.outcome is not None and not self.outcome.ok)

    @property
    def settled(self) -> bool:
        return self.died is not None or self.outcome is not None

    @property
    def lost_a_peer(self) -> bool:
        """It raised because a peer went away in a collective: a consequence of another rank's end."""
        return self.outcome is not None and not self.outcome.ok and lost_its_peer(self.outcome.summary)


class _LocalLaunch:
    def __init__(self, name, payload, world_size, output, stall_timeout, gpus, label, cancel, mlflow_run_id,
                 attempt=(0, 0), limit=(None, None)):
        self.name = name
        self.payload = payload
        self.world_size = world_size
        self.stall_timeout = stall_timeout
        self.gpus = gpus  # the leased GPUs, one per rank; [] without GPUs
        self.label, self.cancel, self.mlflow_run_id = label, cancel, mlflow_run_id
        self.restart, self.max_restarts = attempt
        self.timeout, self.deadline = limit  # the call's wall-clock limit (s), and when it passes (time.monotonic())
        self.ranks: list[_RankProcess] = []
        self.selector = selectors.DefaultSelector()
        self.printers = Printers(output, label, keep_logs=mlflow_run_id is not None)
        self.watch = None  # a ProgressWatch, with a stall timeout
        self.run_id = None  # set once the port is picked: the stop must work from any point of the start
        self.step_times = LaunchStepTimes(world_size)  # where the ranks record their steps, for the straggler report

    def run(self) -> RankResults:
        started = time.monotonic()
        try:
            return self._run()
        except KeyboardInterrupt:  # the ranks are stopped by now (_run's finally): say what happened, in one line
            stopped = sum(r.process.pid is not None for r in self.ranks)
            self.step_times.report(self.label or f"{self.name}()", None, self.mlflow_run_id)
        finally:
            self.step_times.close()
        raise interrupted(self.name, stopped, time.monotonic() - started)  # outside the handler: no "During handling"

    def _run(self) -> RankResults:
        ctx = fork_server.context()
        sampler = None
        with _ranks_running(self.world_size) as running:
            try:
                # CPU threads per rank (OMP_NUM_THREADS, unless set): the cores shared by the ranks running now;
                # one in the background, where more launches are to come (as torchrun gives several ranks)
                threads = 1 if self.label else cpu_threads_per_rank(running)
                self._start(ctx, threads)
                sampler = self._started_sampler()  # None until it runs: the stop below joins only a started one
                failure = self._supervise()
                if failure is None:
                    self._wait_for_exit()
            finally:  # returned, failed or interrupted (the notebook's interrupt button): nothing stays
                self._stop_all_despite_interrupts()
                system_metrics = sampler.stop() if sampler is not None else None
            self._drain(deadline=time.monotonic() + 1.0)
            self._close_pipes()
            self.selector.close()
            if self.mlflow_run_id is not None and self.ranks:
                for r in self.ranks:  # a rank's traceback travels in its outcome: into its log, as torchrun's shows it
                    if r.outcome is not None and not r.outcome.ok and r.outcome.traceback:
                        self.printers.logs[r.rank].feed(r.outcome.traceback.encode(errors="replace"))
                save_rank_logs(self.mlflow_run_id, self.printers.logs, self.world_size, self.restart)
        step_times = self.step_times.report(self.label or f"{self.name}()", system_metrics,
                                            self.mlflow_run_id)  # after the ranks' output: the straggler, if any
        if failure is not None:
            raise failure
        return RankResults([r.outcome.value for r in self.ranks], system_metrics, step_times)

    # -- start ----------------------------------------------------------------------------------
    def _start(self, ctx, threads):
        port = free_port()
        run_id = self.run_id = f"nbhelpers-{os.getpid()}-{port}-{time.time_ns()}"
        for rank in range(self.world_size):
            environ = self._environment(rank, port, run_id, threads)
            process, ends, rank_ends = fork_server.new_rank(ctx, rank, f"{self.name}-rank{rank}", self.payload, environ)
            r = _RankProcess(rank, process, *ends)
            self.ranks.append(r)  # before it starts: an interrupt from here on stops it
            fork_server.start(process, rank_ends)
            self._watch_rank(r)
        if self.stall_timeout is not None:
            self.watch = ProgressWatch(range(self.world_size), self.stall_timeout)

    def _environment(self, rank, port, run_id, threads) -> dict:
        environ = dict(os.environ)
        environ.setdefault("OMP_NUM_THREADS", str(threads))
        environ.setdefault("MLFLOW_LOGGING_LEVEL", RANK_MLFLOW_LOGGING_LEVEL)
        environ.update(torchrun_environment(rank, self.world_size, port, run_id, self.restart, self.max_restarts))
        environ.update(loopback_environment())
        environ.update(self.step_times.environment())
        if self.gpus:
            environ["CUDA_VISIBLE_DEVICES"] = ",".join(self.gpus)  # the leased ones: cuda:LOCAL_RANK is its own
        return environ

    def _watch_rank(self, r):
        """Its pipes and its end, in the selector the loop waits on."""
        self.selector.register(r.stdout.fileno(), selectors.EVENT_READ, (r, "stdout"))
        self.selector.register(r.stderr.fileno(), selectors.EVENT_READ, (r, "stderr"))
        self.selector.register(r.results.fileno(), selectors.EVENT_READ, (r, "results"))
        self.selector.register(r.stacks.fileno(), selectors.EVENT_READ, (r, "stacks"))
        self.selector.register(r.process.sentinel, selectors.EVENT_READ, (r, "exit"))
        r.exit_fd = _pidfd(r.process)
        if r.exit_fd is not None:
            self.selector.register(r.exit_fd, selectors.EVENT_READ, (r, "exit"))

    def _started_sampler(self) -> RankSampler:
        sampler = RankSampler([r.process.pid for r in self.ranks], self.gpus or [None] * self.world_size,
                              self.mlflow_run_id)
        sampler.start()
        return sampler

    # -- watch ----------------------------------------------------------------------------------
    def _supervise(self):
        """Print output until every rank has returned; a failure comes back as an error.

        Once a rank has failed, listen a moment longer (BLAME_WINDOW_S) for the failure that caused it:
        a rank that dies or exits in a collective makes its peers fail too ("Connection closed by peer"), and
        their report may be read first (on a loaded machine a dying rank can close its sockets well before its
        pipes). Where every failure so far is such a lost peer, wait until the rank that went away is seen
        ending (PEER_WAIT_S at most): _blame names it, whichever was read first. With a stall timeout, every
        rank is asked for its stacks every `watch.snapshot_every` seconds, and a rank without progress is a stall.
        """
        settle_by = None  # set at the first failure
        failing_since = None  # time.monotonic() of the first failure
        polled_at = time.time()  # every rank that has not ended was alive then
        next_snapshot = time.monotonic()
        while True:
            if settle_by is None and all(r.settled for r in self.ranks):
                return None  # every rank returned (a failure would have set settle_by)
            if settle_by is not None and (all(r.settled for r in self.ranks) or time.monotonic() >= settle_by):
                return self._blame()
            if self.cancel is not None and self.cancel.is_set():
                return cancelled(self.label or self.name)
            if settle_by is None and self.deadline is not None and time.monotonic() >= self.deadline:
                return self._timed_out()
            if self.watch is not None and settle_by is None:
                now = time.monotonic()
                if now >= next_snapshot:
                    self._snapshot_stacks()
                    next_snapshot = now + self.watch.snapshot_every
                if self.watch.stalled(now):
                    return self._stalled()
            if not self.selector.select(self._wait(settle_by, next_snapshot)):
                continue
            # Poll again right after a timestamp: what is not ready now was still alive at `polled_at`.
            alive_before, polled_at = polled_at, time.time()
            for key, _ in self.selector.select(0):
                if key.fd not in self.selector.get_map():
                    continue  # read already, with its rank's exit in this batch
                r = self._read(key, alive_before)
                if r.failed and failing_since is None:
                    failing_since = time.monotonic()
            if failing_since is not None:
                cause_seen = any(r.failed and not r.lost_a_peer for r in self.ranks)
                settle_by = failing_since + (BLAME_WINDOW_S if cause_seen else PEER_WAIT_S)

    def _wait(self, settle_by, next_snapshot) -> float | None:
        """How long the selector may wait: until the first of the blame's end, the next snapshot, the first stall,
        the launch's deadline (CANCEL_POLL_S at most for a launch that can be cancelled); None: until something comes."""
        wake_at = [t for t in (settle_by, next_snapshot if self.watch else None,
                               self.watch.deadline() if self.watch else None, self.deadline) if t is not None]
        timeout = max(0.0, min(wake_at) - time.monotonic()) if wake_at else None
        if timeout == float("inf"):
            timeout = None
        if self.cancel is not None:
            timeout = CANCEL_POLL_S if timeout is None else min(timeout, CANCEL_POLL_S)
        return timeout

    def _read(self, key, alive_before) -> _RankProcess:
        """What a rank's pipe (or its end) brought; its rank. A rank that ended without a result is dated by
        `alive_before`, the last moment it was seen alive."""
        r, kind = key.data
        if kind in ("stdout", "stderr"):
            self._read_output(key.fd, r, kind)
            if self.watch is not None:
                self.watch.output(r.rank)
        elif kind == "stacks":
            self._read_stacks(key.fd, r)
        elif kind == "results":
            self._read_outcome(r, alive_before)
        elif kind == "exit":
            self.selector.unregister(key.fd)
            if r.results.fileno() in self.selector.get_map() and r.results.poll():  # its last words
                self._read_outcome(r, alive_before)
            if not r.settled:
                r.died = alive_before
        if r.settled and self.watch is not None:
            self.watch.done(r.rank)
        return r

    def _read_outcome(self, r, alive_before):
        fd = r.results.fileno()
        try:
            message = r.results.recv_bytes()
        except (EOFError, OSError):  # it ended without a word: its exit says how
            r.died = alive_before
        else:
            r.outcome = read_outcome(message)
        self.selector.unregister(fd)

    def _read_output(self, fd, r, stream):
        data = os.read(fd, 65536)
        if not data:
            self.selector.unregister(fd)
            self.printers.finish(r.rank)
            return
        self.printers.feed(r.rank, stream, data)

    def _read_stacks(self, fd, r):
        data = os.read(fd, 65536)
        if not data:
            self.selector.unregister(fd)
            return
        r.dump += data
        if r.main_thread is None and b"\n" in r.dump:  # the first line, written as the rank starts
            first, r.dump = r.dump.split(b"\n", 1)
            r.main_thread = first.decode().rpartition(" ")[2]

    def _snapshot_stacks(self):
        """The dumps that arrived since the last request are the ranks' last snapshots; ask for new ones."""
        for r in self.ranks:
            if r.dump:
                text = r.dump.decode(errors="replace")
                self.watch.snapshot(r.rank, text, main_thread_stack(text, r.main_thread))
                r.dump = b""
            self._ask_for_stacks(r)

    @staticmethod
    def _ask_for_stacks(r):
        if r.main_thread is not None and not r.settled:  # its SIGUSR1 handler is in place (fork_server.run_rank)
            with contextlib.suppress(ProcessLookupError):
                os.kill(r.process.pid, signal.SIGUSR1)

    # -- fail -----------------------------------------------------------------------------------
    def _blame(self) -> DistributedError:
        """The failure that happened first, of those that are not a lost peer (where there is one): a rank that
        ended in a collective makes the others' collectives break, and which of the two is read first depends on
        the machine's load. A rank that died without a result (a signal, os._exit) is dated by the last moment it
        was seen alive, and wins a tie."""
        failed = [r for r in self.ranks if r.failed]
        causes = [r for r in failed if not r.lost_a_peer] or failed
        first = min(causes, key=lambda r: (r.died, 0) if r.died is not None else (r.outcome.failed_at, 1))
        return self._rank_failed(first, [r for r in failed if r is not first])

    def _rank_failed(self, r, also_failed) -> DistributedError:
        self._drain(deadline=time.monotonic() + 0.3, only=r)  # its last output, before we kill anyone
        later = {o.rank: self._summary(o) for o in also_failed}
        after = later_failures_text(r.rank, later)
        if r.outcome is not None:
            return failure_error(r.outcome, rank=r.rank, world_size=self.world_size, name=self.name, context=after,
                                 later_failures=later)
        r.process.join(10)  # the fork server reports the exit status (late, on a loaded machine)
        return ended_without_result(rank=r.rank, world_size=self.world_size, name=self.name,
                                    exitcode=r.process.exitcode, context=after, last_output=self.printers.tail(r.rank),
                                    later_failures=later)

    @staticmethod
    def _summary(r) -> str:
        """A rank that failed: its error as raised (whole), or how it ended."""
        if r.outcome is not None:
            return r.outcome.summary or "(no message)"
        r.process.join(0.5)
        return how_it_ended(r.process.exitcode)

    def _timed_out(self) -> DistributedError:
        """The launch's wall-clock limit has passed: what the ranks said last (the stop follows in run())."""
        self._drain(deadline=time.monotonic() + 0.3)
        self.printers.finish()
        tails = {r.rank: "".join(list(self.printers.tails[r.rank])[-5:]) or "(no output)\n" for r in self.ranks}
        return timeout_error(self.name, self.world_size, self.timeout, tails)

    def _stalled(self) -> DistributedError:
        """Every rank's stacks, fresh (the last snapshot where a rank does not answer), into the stall's report."""
        stalled = self.watch.quiet()
        for r in self.ranks:
            r.dump = b""
            self._ask_for_stacks(r)
        deadline = time.monotonic() + STACK_WAIT_S
        while time.monotonic() < deadline and not all(r.dump or r.settled or r.main_thread is None for r in self.ranks):
            for key, _ in self.selector.select(max(0.0, deadline - time.monotonic())):
                r, kind = key.data
                if kind == "stacks":
                    self._read_stacks(key.fd, r)
                elif kind in ("stdout", "stderr"):
                    self._read_output(key.fd, r, kind)
                elif kind == "exit":
                    self.selector.unregister(key.fd)
        time.sleep(0.2)  # faulthandler writes thread by thread: the rest of each dump
        for r in self.ranks:
            with contextlib.suppress(OSError):
                while r.stacks.poll(0):
                    if not (data := os.read(r.stacks.fileno(), 65536)):
                        break
                    r.dump += data
        stacks = {r.rank: r.dump.decode(errors="replace") or self.watch.stacks.get(r.rank) for r in self.ranks}
        return stall_error(self.name, self.world_size, self.stall_timeout, stalled, stacks)

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
                elif kind == "stacks":
                    self._read_stacks(key.fd, r)

    # -- stop -----------------------------------------------------------------------------------
    def _wait_for_exit(self):
        deadline = time.monotonic() + 30
        for r in self.ranks:
            r.process.join(max(0.0, deadline - time.monotonic()))

    def _stop_all_despite_interrupts(self):
        stop_despite_interrupts(self._stop_all)

    def _stop_all(self):
        """SIGTERM every rank's process group, its descendants and whatever carries the launch id, SIGKILL what
        remains; then close the lifelines, whatever still refers to this launch (a traceback kept by the notebook)."""
        stop_ranks([r.process.pid for r in self.ranks if r.process.pid is not None], self.run_id, TERMINATE_GRACE_S)
        for r in self.ranks:
            r.lifeline.close()  # any rank we could not reach kills itself on this EOF
        for r in self.ranks:
            if r.process.pid is not None:
                r.process.join(5)

    def _close_pipes(self):
        self.printers.finish()
        for r in self.ranks:
            if r.exit_fd is not None:
                with contextlib.suppress(KeyError):
                    self.selector.unregister(r.exit_fd)
                os.close(r.exit_fd)
            for conn in (r.stdout, r.stderr, r.results, r.stacks):
                with contextlib.suppress(OSError):
                    if conn.fileno() in self.selector.get_map():
                        self.selector.unregister(conn.fileno())
                    conn.close()
