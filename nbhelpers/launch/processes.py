"""The processes of a launch: the environment they start with, the port of their rendezvous, and how they are stopped.

- `torchrun_environment` gives each rank what torchrun would (RANK, WORLD_SIZE, MASTER_ADDR, ...), and the launch's
  id: every process of a launch carries it in NBHELPERS_LAUNCH_ID (children inherit it, in whatever process group or
  session they end up). On one host everything listens on loopback only (`loopback_environment` for gloo and NCCL,
  `loopback_rendezvous` for rank 0's store); `single_process_environment` is rank 0 of 1, for a plain call.
- `free_port`: a port for rank 0's rendezvous store that nothing listens on.
- Stopping: `stop_ranks` ends the ranks of this host with all they started; `stop_launch_processes` the processes of
  this node that carry a launch's id (`launch_processes` finds them, `stop_processes` sends SIGTERM, then SIGKILL);
  `stop_despite_interrupts` carries a stop to its end however often the user interrupts.

Nothing here imports an engine, the decorator (nbhelpers.launch.launcher) or torch (but for a plain call, and in a
rank).
"""
from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import threading


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


def _loopback_interface() -> str:
    import psutil

    for name, addresses in psutil.net_if_addrs().items():
        if any(a.family == socket.AF_INET and a.address == "127.0.0.1" for a in addresses):
            return name
    return "lo"


def loopback_environment() -> dict:
    """Gloo and NCCL listen on the interface these name: the loopback one, since all ranks are on this host
    (rank 0's rendezvous store is kept on loopback by loopback_rendezvous)."""
    interface = _loopback_interface()
    return {"GLOO_SOCKET_IFNAME": interface, "NCCL_SOCKET_IFNAME": interface}


@contextlib.contextmanager
def loopback_rendezvous():
    """While inside: the TCPStore that rank 0 serves for `init_process_group` (env:// or tcp:// on
    127.0.0.1) listens on 127.0.0.1 only. torch's own listens on every interface and has no setting for
    it, so its store factory is wrapped to hand the store a socket bound to loopback (TCPStore's
    `master_listen_fd`). Each init still gets a fresh store, as without the wrapper.
    """
    import importlib

    from torch.distributed import TCPStore

    rendezvous = importlib.import_module("torch.distributed.rendezvous")  # the attribute is a function of that name
    create = getattr(rendezvous, "_create_c10d_store", None)
    if create is None:  # a torch without it: its own store, on every interface (a test says so)
        yield
        return

    def create_on_loopback(hostname, port, rank, world_size, timeout, use_libuv=True):
        if rank != 0 or hostname not in ("127.0.0.1", "localhost") or os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
            return create(hostname, port, rank, world_size, timeout, use_libuv)
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as torch's own: a re-init reuses the port
            listener.bind(("127.0.0.1", port))
            listener.listen(1024)
        except OSError:  # the port is served in this process already (multi-tenant): torch reuses that server
            listener.close()
            return create(hostname, port, rank, world_size, timeout, use_libuv)
        fd = listener.detach()  # the store owns the socket from here on
        try:
            return TCPStore(hostname, port, world_size, True, timeout, multi_tenant=True, master_listen_fd=fd,
                            use_libuv=use_libuv)
        except BaseException:
            os.close(fd)
            raise

    rendezvous._create_c10d_store = create_on_loopback
    try:
        yield
    finally:
        rendezvous._create_c10d_store = create


@contextlib.contextmanager
def single_process_environment():
    """For a plain call: the environment of rank 0 of 1, unless a launcher already set one."""
    if "RANK" in os.environ:
        yield
        return
    import torch.distributed as dist

    was_initialized = dist.is_available() and dist.is_initialized()
    added = torchrun_environment(0, 1, free_port(), run_id=f"local-{os.getpid()}")
    added.pop("PYTHONUNBUFFERED")
    added.pop("NBHELPERS_LAUNCH_ID")
    added.pop("TORCH_DIST_INIT_BARRIER")  # one rank waits for nobody; and the user's own setting stays after the call
    added.update(loopback_environment())
    os.environ.update(added)
    try:
        with loopback_rendezvous():
            yield
    finally:
        for key in added:
            os.environ.pop(key, None)
        if not was_initialized and dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()


def stop_ranks(pids: list[int], launch_id: str | None, grace: float) -> None:
    """SIGTERM every rank's process group (`pids`: the ranks, each the leader of its group), its descendants and
    whatever carries the launch id; SIGKILL what remains after `grace` seconds."""
    import psutil

    procs = {}
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            parent = psutil.Process(pid)
            procs.update((p.pid, p) for p in [parent, *parent.children(recursive=True)])
    # Processes whose rank already died (re-parented away) or that left the rank's session
    if launch_id is not None:  # None: interrupted before any rank got the id (launch_processes(None) is everyone)
        procs.update((p.pid, p) for p in launch_processes(launch_id) if p.pid not in procs)

    def signal_groups(sig):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, sig)

    stop_processes(list(procs.values()), grace=grace, also=signal_groups)


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


def stop_despite_interrupts(stop) -> None:
    """`stop()`, carried to its end even if the user interrupts again: a second KeyboardInterrupt during the stop must
    not leave ranks running."""
    while True:
        try:
            with _interrupts_ignored():
                stop()
            return
        except KeyboardInterrupt:
            continue


@contextlib.contextmanager
def _interrupts_ignored():
    """While inside: SIGINT (the notebook's interrupt button, Ctrl-C) does nothing. Signal handlers
    belong to the main thread; in another thread, interrupts do not arrive anyway."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGINT)
    if previous is None:  # a handler installed from C: it could not be put back, and SIGINT would stay ignored after
        yield  # (ignored, it is inherited by every process started later, which then never sees an interrupt)
        return
    try:  # set inside: an interrupt that arrives while it is being set is raised within the try, and undone
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
