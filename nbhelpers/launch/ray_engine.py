"""`@distributed(engine="ray")`: run a notebook function on GPUs of several nodes of a Ray cluster.

    import ray
    from nbhelpers import distributed

    ray.init(address="auto")                    # attach this notebook to a running Ray cluster
    @distributed(gpus=16, engine="ray")         # 16 ranks in all, on whichever nodes have the GPUs
    def train(lr: float):
        dist.init_process_group(backend())      # the same torchrun environment as on one node
        ...
    results = train.distributed(lr=1e-3)        # one result per rank, in rank order

The contract is the local engine's (the same errors, output, stalls, environment and payload), carried out by Ray:
- One placement group reserves every rank's bundle at once ({"GPU": 1, "CPU": 1}, or {"CPU": 1} on a
  cluster without GPUs), packed onto as few nodes as possible; the ranks are Ray actors in its bundles.
  Nothing starts until all bundles are reserved (gang scheduling).
- Ranks are numbered node by node (like torchrun's): RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE,
  GROUP_RANK (the node's index), MASTER_ADDR = rank 0's node address, MASTER_PORT = a port found free
  on rank 0's node. On a node with several ranks, CUDA_VISIBLE_DEVICES lists all their GPUs and each
  rank's LOCAL_RANK is the index of its own, so `cuda:LOCAL_RANK` is its GPU (what Ray Train does too).
- The function and its arguments travel by value (payload.pickle_call); each rank runs it in the
  main thread of its actor, in the notebook's working directory when that exists on the node.
- Each rank's stdout and stderr (file descriptors 1 and 2, so subprocesses too) go to a small queue
  actor on this node; this process prints them into the cell as they come, prefixed `[rank N]`.
- The first failure (an exception, or a rank's process dying) raises one `DistributedError` naming
  the rank with its traceback (or Ray's account of the death). Afterwards, failed or not, every rank
  actor and the queue are killed, the placement group is removed, and processes the ranks started are
  killed on every node (found by the launch id in their environment). Nothing is left.
- Every wait on the cluster has an end: starting the actors and the function on every rank
  START_TIMEOUT_S (on a busy cluster that alone can take longer than a short `stall_timeout`), then
  each rank's progress `stall_timeout` (its output, or a change in the stack snapshots it sends while silent).

Ranks import nbhelpers, torch and what the function imports: these must be installed on every node
(or shipped with `ray.init(runtime_env={"py_modules": [...]})`).
"""
from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import select
import sys
import threading
import time
import traceback

from nbhelpers.launch.errors import (DistributedError, cancelled, failure_error, import_ray, later_failures_text,
                                     lost_its_peer)
from nbhelpers.launch.gpus import cluster_gpu_resource, cluster_world_size
from nbhelpers.launch.output import Printers
from nbhelpers.launch.payload import RankResults, read_outcome, run_call
from nbhelpers.launch.processes import free_port, stop_launch_processes, torchrun_environment
from nbhelpers.launch.stalls import ProgressWatch, main_thread_stack, stall_error

PLACEMENT_TIMEOUT_S = 120.0  # to reserve every rank's bundle before giving up
START_TIMEOUT_S = 120.0  # then to start the rank actors (a Python process each) and hear from them
OUTPUT_POLL_S = 0.5
STACK_WAIT_S = 15.0  # for fresh stacks after a stall; a rank that answers later is shown by its last snapshot
CLEANUP_WAIT_S = 5.0
PEER_WAIT_S = 10.0  # a rank whose collective lost its peer: how long to wait for the peer that went away to be seen


def run(name: str, payload: bytes, *, gpus: int | None, output: str, stall_timeout: float | None,
        label: str | None = None, cancel=None, mlflow_run_id: str | None = None, gpu_type: str | None = None,
        restart: int = 0, max_restarts: int = 0) -> RankResults:
    """Run pickle_call's call once per rank on the Ray cluster this process is attached to (or the one
    RAY_ADDRESS names). label, cancel, restart, max_restarts: as local_engine.run. The ranks' system metrics are not
    sampled here (`system_metrics` is None; Ray's dashboard shows the nodes'), so mlflow_run_id is unused.
    """
    ray = import_ray('@distributed(engine="ray")')

    if not ray.is_initialized() and os.environ.get("RAY_ADDRESS"):
        ray.init()  # joins the cluster at RAY_ADDRESS
    if not ray.is_initialized():
        raise RuntimeError(
            'engine="ray" runs the function on the Ray cluster this process is attached to, and it is '
            'attached to none: call ray.init(address="auto") (or address="HEAD_IP:6379"; plain ray.init() '
            "starts a one-machine Ray) before the launch."
        )
    resources = ray.cluster_resources()
    use_gpu, world_size = cluster_world_size(gpus, resources)
    bundle = {"GPU": 1, "CPU": 1} if use_gpu else {"CPU": 1}
    bundle.update(cluster_gpu_resource(gpu_type, use_gpu, resources))
    return RankResults(_RayLaunch(name, payload, world_size, bundle, output, stall_timeout, label, cancel,
                                  (restart, max_restarts)).run())


# ---------------------------------------------------------------------------------------------------
# The actors

class _Outbox:
    """An asyncio actor on the notebook's node: ranks put output into it, the notebook takes it out; the
    notebook posts commands ("stacks", "clean up") that every rank's control thread waits for."""

    def __init__(self):
        self.items = []
        self.arrived = asyncio.Event()
        self.commands = []
        self.commanded = asyncio.Event()

    def put(self, rank: int, stream: str, data: bytes) -> None:
        self.items.append((rank, stream, data))
        self.arrived.set()

    async def take(self, timeout: float) -> list:
        if not self.items:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.arrived.wait(), timeout)
        items, self.items = self.items, []
        self.arrived.clear()
        return items

    def command(self, name: str) -> None:
        self.commands.append(name)
        self.commanded.set()

    async def next_command(self, index: int) -> str:
        while len(self.commands) <= index:
            self.commanded.clear()
            await self.commanded.wait()
        return self.commands[index]


class _RankActor:
    """One rank: a Ray actor that runs the function in its main thread, its output sent to the outbox."""

    def __init__(self, outbox):
        self.outbox = outbox
        self.last_output = time.monotonic()  # the forwarders' clock of this rank's last output

    def where(self) -> dict:
        import ray

        return {"node_id": ray.get_runtime_context().get_node_id(), "ip": ray.util.get_node_ip_address(),
                "gpu_ids": [str(g) for g in ray.get_gpu_ids()], "pid": os.getpid()}

    def free_port(self) -> int:
        return free_port("")  # every interface: the other nodes connect to this node's address

    def run(self, rank: int, payload: bytes, environ: dict, cwd: str, sys_path: list,
            snapshot_every: float | None) -> bytes:
        """Run the call; its payload.Outcome as bytes."""
        os.environ.update(environ)
        if os.path.isdir(cwd):
            os.chdir(cwd)
        sys.path.extend(p for p in sys_path if p not in sys.path and os.path.exists(p))
        threading.Thread(target=self._obey, args=(rank, environ["NBHELPERS_LAUNCH_ID"]), daemon=True,
                         name="nbhelpers-control").start()
        if snapshot_every is not None:
            threading.Thread(target=self._snapshot_while_silent, args=(rank, snapshot_every), daemon=True,
                             name="nbhelpers-snapshots").start()
        with self._output_to_outbox(rank):
            # The notebook's stall clock starts when every rank has begun the function: loading it imports what
            # it uses (torch: many seconds on a loaded machine), which START_TIMEOUT_S covers.
            _, message = run_call(rank, payload, on_loaded=lambda: self.outbox.put.remote(rank, "started", b""))
        return message

    @contextlib.contextmanager
    def _output_to_outbox(self, rank: int):
        """File descriptors 1 and 2 (this process and what it starts) into pipes read by forwarding threads."""
        import ray

        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        saved, forwarders = {}, []
        for fd, stream in ((1, "stdout"), (2, "stderr")):
            read_end, write_end = os.pipe()
            saved[fd] = os.dup(fd)
            os.dup2(write_end, fd)
            os.close(write_end)
            forwarder = _Forwarder(self, rank, stream, read_end)
            forwarder.start()
            forwarders.append(forwarder)
        try:
            yield
        finally:
            for stream in (sys.stdout, sys.stderr):
                with contextlib.suppress(Exception):
                    stream.flush()
            for fd, copy in saved.items():
                os.dup2(copy, fd)  # our write ends close: a forwarder sees EOF once no child holds one
                os.close(copy)
            for forwarder in forwarders:
                forwarder.join(1.0)
            # The outbox runs one caller's calls in order: once the last put is done, all are.
            last = [f.last_put for f in forwarders if f.last_put is not None]
            with contextlib.suppress(Exception):
                ray.get(last, timeout=10)

    def _obey(self, rank: int, launch_id: str):
        """The control thread: answers the notebook's commands while the function runs (and after)."""
        import ray

        with contextlib.suppress(Exception):  # the outbox is killed at the end of the launch
            for index in itertools.count():
                command = ray.get(self.outbox.next_command.remote(index))
                if command == "stacks":
                    ray.get(self.outbox.put.remote(rank, "stack", _python_stacks()))
                elif command == "clean up":  # what the function started, on this node; the notebook kills us
                    killed = stop_launch_processes(launch_id, spare=(os.getpid(),))
                    ray.get(self.outbox.put.remote(rank, "cleaned", str(killed).encode()))
                    return

    def _snapshot_while_silent(self, rank: int, every: float):
        """While this rank prints nothing, send its stacks every `every` s: on a loaded machine a stall's
        request for stacks can go unanswered for longer than the notebook waits (seen on a 2-core CI
        machine), and the last snapshot then still shows where the rank was."""
        with contextlib.suppress(Exception):  # the outbox is killed at the end of the launch
            while True:
                time.sleep(every)
                if time.monotonic() - self.last_output >= every:
                    self.outbox.put.remote(rank, "snapshot", _python_stacks())


def _python_stacks() -> bytes:
    """The Python stack of every thread in this process but nbhelpers' own, each headed `Thread NAME:` (the
    function runs in the main thread, "Thread MainThread:")."""
    frames = sys._current_frames()
    return "".join(f"Thread {t.name}:\n" + "".join(traceback.format_stack(frames[t.ident]))
                   for t in threading.enumerate() if t.ident in frames and not t.name.startswith("nbhelpers-")
                   ).encode()


class _Forwarder(threading.Thread):
    """Reads one pipe and puts what comes into the outbox, a chunk per 50 ms at most."""

    def __init__(self, rank_actor, rank, stream, fd):
        super().__init__(daemon=True, name=f"nbhelpers-{stream}")
        self.rank_actor, self.outbox = rank_actor, rank_actor.outbox
        self.rank, self.stream, self.fd = rank, stream, fd
        self.last_put = None

    def run(self):
        while True:
            data = os.read(self.fd, 65536)
            if not data:
                break
            deadline = time.monotonic() + 0.05
            while len(data) < 65536 and (left := deadline - time.monotonic()) > 0 and select.select([self.fd], [], [], left)[0]:
                more = os.read(self.fd, 65536)
                if not more:
                    break
                data += more
            self.rank_actor.last_output = time.monotonic()
            self.last_put = self.outbox.put.remote(self.rank, self.stream, data)
        os.close(self.fd)


def rank_layout(places: list[dict], use_gpu: bool) -> list[tuple[int, dict]]:
    """Number the actors node by node, like torchrun: [(actor index, its placement variables)] in rank order.

    places[i] is actor i's `where()`: node_id, ip, gpu_ids. Nodes keep the order in which the actors
    (the placement group's bundles) first reach them, and on a node ranks follow their GPU ids, so that
    LOCAL_RANK i is the i-th GPU of the CUDA_VISIBLE_DEVICES shared by the node's ranks.
    """
    nodes = list(dict.fromkeys(p["node_id"] for p in places))
    gpu_key = lambda ids: [int(g) if g.isdigit() else g for g in ids]  # noqa: E731
    order = sorted(range(len(places)), key=lambda i: (nodes.index(places[i]["node_id"]), gpu_key(places[i]["gpu_ids"]), i))
    layout = []
    for i in order:
        same_node = [j for j in order if places[j]["node_id"] == places[i]["node_id"]]
        placement = {
            "MASTER_ADDR": places[order[0]]["ip"],
            "LOCAL_RANK": str(same_node.index(i)),
            "LOCAL_WORLD_SIZE": str(len(same_node)),
            "GROUP_RANK": str(nodes.index(places[i]["node_id"])),
        }
        if use_gpu:
            placement["CUDA_VISIBLE_DEVICES"] = ",".join(g for j in same_node for g in places[j]["gpu_ids"])
        layout.append((i, placement))
    return layout


# ---------------------------------------------------------------------------------------------------
# The launch, seen from the notebook

class _RayLaunch:
    def __init__(self, name, payload, world_size, bundle, output, stall_timeout, label, cancel, attempt=(0, 0)):
        self.name, self.payload, self.world_size, self.bundle = name, payload, world_size, bundle
        self.use_gpu = "GPU" in bundle
        self.stall_timeout, self.label, self.cancel = stall_timeout, label, cancel
        self.restart, self.max_restarts = attempt
        self.run_id = f"nbhelpers-ray-{os.getpid()}-{time.time_ns()}"
        self.pg = self.outbox = self.take = None
        self.dead_ranks, self.started = set(), set()
        self.actors = []  # in bundle order
        self.by_rank = []  # actors in rank order
        self.places = []  # where() of each rank, in rank order
        self.printers = Printers(output, label)
        self.watch = ProgressWatch(range(world_size), stall_timeout) if stall_timeout is not None else None

    def run(self) -> list:
        try:
            self._start()
            outcomes, failure = self._supervise()
        except BaseException:  # KeyboardInterrupt from the notebook's interrupt button too
            self._stop_all()
            raise
        self._stop_all()
        if failure is not None:
            raise failure
        return [outcomes[r].value for r in range(self.world_size)]

    # -- start ----------------------------------------------------------------------------------
    def _start(self):
        import ray
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy, PlacementGroupSchedulingStrategy

        here = ray.get_runtime_context().get_node_id()
        self.outbox = ray.remote(num_cpus=0)(_Outbox).options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(here, soft=True)).remote()
        bundle = self.bundle
        self.pg = placement_group([dict(bundle) for _ in range(self.world_size)], strategy="PACK",
                                  name=self.run_id)
        ready, _ = ray.wait([self.pg.ready()], timeout=PLACEMENT_TIMEOUT_S)
        if not ready:
            raise RuntimeError(
                f"Ray could not reserve {self.world_size} x {bundle} for {self.name}() within "
                f"{PLACEMENT_TIMEOUT_S:.0f} s: the cluster has {ray.cluster_resources()} in all, "
                f"{ray.available_resources()} free. Free some (other jobs, idle actors) or ask for fewer."
            )
        rank_actor = ray.remote(_RankActor)
        self.actors = [
            rank_actor.options(
                num_cpus=1, num_gpus=1 if self.use_gpu else 0, max_restarts=0,
                scheduling_strategy=PlacementGroupSchedulingStrategy(self.pg, placement_group_bundle_index=i),
            ).remote(self.outbox)
            for i in range(self.world_size)
        ]
        places = self._get([a.where.remote() for a in self.actors], "starting the rank actors", START_TIMEOUT_S)
        layout = rank_layout(places, self.use_gpu)
        self.by_rank = [self.actors[i] for i, _ in layout]
        self.places = [places[i] for i, _ in layout]
        master_port = self._get(self.by_rank[0].free_port.remote(), "finding a free port on rank 0's node",
                                START_TIMEOUT_S)
        payload = ray.put(self.payload)  # stored once, fetched by each node
        snapshot_every = self.watch.snapshot_every if self.watch is not None else None
        self.refs = {}
        for rank, (actor, (_, placement)) in enumerate(zip(self.by_rank, layout)):
            environ = torchrun_environment(rank, self.world_size, master_port, self.run_id, self.restart,
                                           self.max_restarts)
            environ.update(placement)
            ref = actor.run.remote(rank, payload, environ, os.getcwd(), list(sys.path), snapshot_every)
            self.refs[ref] = rank

    def _get(self, refs, doing: str, timeout: float | None):
        """ray.get that gives up after `timeout` s (the stall timeout while the ranks run): a cluster that
        stops answering is a stall too."""
        import ray

        try:
            return ray.get(refs, timeout=timeout)
        except ray.exceptions.GetTimeoutError:
            raise DistributedError(
                f"the Ray cluster did not answer within {timeout} s while {doing} (for {self.name}()); every "
                f"rank was stopped. `ray status` shows what the cluster has and does."
            ) from None

    # -- watch ----------------------------------------------------------------------------------
    def _supervise(self):
        """Print output until every rank has returned; the first failure comes back as an error. A rank whose
        collective broke because a peer went away ("Connection closed by peer") may report before that peer is seen
        dead: its error is held back until the peer's end arrives (PEER_WAIT_S at most), and the peer is named."""
        import ray

        outcomes = {}
        pending = dict(self.refs)
        self.take = self.outbox.take.remote(OUTPUT_POLL_S)
        launched = time.monotonic()
        held, held_until = None, None  # a rank that lost its peer, and how long its error waits for the peer's end
        while pending:
            if self.cancel is not None and self.cancel.is_set():  # the take answers twice a second: noticed then
                return outcomes, cancelled(self.label or self.name)
            if held is not None and time.monotonic() >= held_until:
                break
            timeout = None
            if self.watch is not None:
                starting = len(self.started) < self.world_size
                if not starting and self.watch.stalled():
                    return outcomes, self._stalled()
                deadline = launched + self._start_limit() if starting else self.watch.deadline()
                timeout = max(0.0, deadline - time.monotonic())
            if held is not None:
                timeout = min(timeout if timeout is not None else PEER_WAIT_S, max(0.0, held_until - time.monotonic()))
            ready, _ = ray.wait([self.take, *pending], num_returns=1, timeout=timeout)
            if not ready:
                if self.watch is not None and (len(self.started) < self.world_size or self.watch.stalled()):
                    return outcomes, self._stalled()
                continue
            ref = ready[0]
            if ref == self.take:
                self._print_taken(next_wait=OUTPUT_POLL_S)
                continue
            rank = pending.pop(ref)
            try:
                outcomes[rank] = read_outcome(ray.get(ref))
            except ray.exceptions.RayActorError as exc:
                self.dead_ranks.add(rank)
                self._drain_output()
                later = {held: outcomes[held].summary} if held is not None else {}
                return outcomes, self._rank_died(rank, exc, later)
            if self.watch is not None:
                self.watch.done(rank)
            self._drain_output()  # the rank returned only once its last output had reached the outbox
            if not outcomes[rank].ok:
                if lost_its_peer(outcomes[rank].summary) and pending:
                    if held is None:
                        held, held_until = rank, time.monotonic() + PEER_WAIT_S
                    continue
                return outcomes, self._rank_failed(rank, outcomes)
        self._drain_output()
        if held is not None:
            return outcomes, self._rank_failed(held, outcomes)
        return outcomes, None

    def _rank_failed(self, rank, outcomes) -> DistributedError:
        return failure_error(outcomes[rank], rank=rank, world_size=self.world_size, name=self.name,
                             context=f"It ran on {self._where(rank)}.\n")

    def _print_taken(self, next_wait: float) -> None:
        """Print what the pending take brought (waiting for it), and start the next take."""
        items = self._get(self.take, "taking the ranks' output from the outbox actor", self.stall_timeout)
        self.take = self.outbox.take.remote(next_wait)
        self._receive(items)

    def _drain_output(self):
        self._print_taken(next_wait=0)  # what the pending take holds, then what arrived since
        self._print_taken(next_wait=OUTPUT_POLL_S)

    def _receive(self, items):
        """Note what the ranks reported (started, a stack snapshot) and print their output."""
        now = time.monotonic()
        for rank, stream, data in items:
            if stream == "started":
                self.started.add(rank)
                if self.watch is not None:
                    self.watch.output(rank, now)  # its clock starts now
            elif stream == "snapshot" and self.watch is not None:
                text = data.decode(errors="replace")
                self.watch.snapshot(rank, text, main_thread_stack(text), now)
            elif stream in ("stdout", "stderr"):
                if self.watch is not None:
                    self.watch.output(rank, now)
                self.printers.feed(rank, stream, data)

    # -- fail -----------------------------------------------------------------------------------
    def _where(self, rank) -> str:
        place = self.places[rank]
        return f"node {place['ip']} (node id {place['node_id'][:8]}), pid {place['pid']}"

    def _rank_died(self, rank, exc, later: dict) -> DistributedError:
        """`later`: {rank: error} of the ranks whose collective broke as it went."""
        self.printers.finish()
        cause = str(exc).strip()
        return DistributedError(
            f"rank {rank} of {self.world_size} died without returning from {self.name}() on {self._where(rank)} "
            f"(killed, out of memory, os._exit, or its node was lost).\n{later_failures_text(rank, later)}"
            f"The other ranks were stopped.\nRay says: {cause}\nLast output of rank {rank}:\n{self.printers.tail(rank)}",
            rank=rank, later_failures=later,
        )

    def _start_limit(self) -> float:
        """How long the ranks may take to begin, with a stall timeout (a long stall timeout covers start-up too)."""
        return max(START_TIMEOUT_S, self.stall_timeout)

    def _stalled(self) -> DistributedError:
        import ray

        not_started = [r for r in range(self.world_size) if r not in self.started]
        stalled = self.watch.quiet()
        self.outbox.command.remote("stacks")
        stacks, deadline = {}, time.monotonic() + STACK_WAIT_S
        while len(stacks) < self.world_size and time.monotonic() < deadline:
            try:
                items = ray.get(self.take, timeout=STACK_WAIT_S)
            except ray.exceptions.GetTimeoutError:
                break
            self.take = self.outbox.take.remote(0.2)
            for rank, stream, data in items:
                if stream == "stack":
                    stacks[rank] = data.decode(errors="replace").strip()
            self._receive(items)
        now = time.monotonic()
        for r in range(self.world_size):
            if r not in stacks and r in self.watch.stacks:
                stacks[r] = (f"(no answer within {STACK_WAIT_S:.0f} s; its stacks as it sent them "
                             f"{now - self.watch.snapshot_at[r]:.0f} s ago, while it printed nothing:)\n"
                             f"{self.watch.stacks[r].strip()}")
        if not not_started:
            return stall_error(self.name, self.world_size, self.stall_timeout, stalled, stacks)
        text = "\n".join(f"--- rank {r} ---\n{stacks.get(r, '(no stack: not responding)')}"
                         for r in range(self.world_size))
        return DistributedError(
            f"rank {', '.join(map(str, not_started))} of {self.name}() had not started {self._start_limit():.0f} s "
            f"after the launch (a busy cluster, or one that cannot start their processes: `ray status` shows it; "
            f"or loading the function, with what it imports, takes that long); "
            f"all {self.world_size} ranks were killed. Their Python stacks:\n{text}", rank=not_started[0])

    # -- stop -----------------------------------------------------------------------------------
    def _stop_all(self):
        """Kill what this launch started: the ranks' processes on every node, the rank actors, the outbox,
        the placement group."""
        import ray
        from ray.util.placement_group import remove_placement_group
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        cleaned = self._clean_up_through_ranks() if self.places else set()
        self.printers.finish()
        for actor in self.actors:
            with contextlib.suppress(Exception):
                ray.kill(actor, no_restart=True)
        # A node where no rank answered (it died, or never started): a task there does it.
        killer = ray.remote(num_cpus=0, max_retries=0)(stop_launch_processes)
        refs = [killer.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)).remote(self.run_id)
                for node in dict.fromkeys(p["node_id"] for p in self.places) if node not in cleaned]
        with contextlib.suppress(Exception):
            ray.get(refs, timeout=60)
        if self.outbox is not None:
            with contextlib.suppress(Exception):
                ray.kill(self.outbox, no_restart=True)
        if self.pg is not None:
            with contextlib.suppress(Exception):
                remove_placement_group(self.pg)

    def _clean_up_through_ranks(self) -> set:
        """Ask every live rank to kill the processes the function started on its node; return those nodes."""
        import ray

        cleaned = set()
        with contextlib.suppress(Exception):
            self.outbox.command.remote("clean up")
            nodes = {p["node_id"] for r, p in enumerate(self.places) if r not in self.dead_ranks}
            deadline = time.monotonic() + CLEANUP_WAIT_S
            while not nodes <= cleaned and time.monotonic() < deadline:
                items = ray.get(self.take, timeout=CLEANUP_WAIT_S) if self.take is not None else []
                self.take = self.outbox.take.remote(0.2)
                cleaned.update(self.places[rank]["node_id"] for rank, stream, _ in items if stream == "cleaned")
                self._receive(items)
        return cleaned
