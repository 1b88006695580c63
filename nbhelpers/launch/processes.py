"""The processes of a launch: the environment they start with, the port of their rendezvous, and how they are stopped.

- `torchrun_environment` gives each rank what torchrun would (RANK, WORLD_SIZE, MASTER_ADDR, ...), and the launch's
  id: every process of a launch carries it in NBHELPERS_LAUNCH_ID (children inherit it, in whatever process group or
  session they end up).
- `free_port`: a port for rank 0's rendezvous store that nothing listens on.
- `stop_launch_processes` ends the processes of this node that carry a launch's id (`launch_processes` finds them,
  `stop_processes` sends SIGTERM, then SIGKILL).

Nothing here imports an engine, the decorator (nbhelpers.launch.launcher) or torch.
"""
from __future__ import annotations

import contextlib
import os
import random
import signal
import socket


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
