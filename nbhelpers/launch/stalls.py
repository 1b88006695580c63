"""Stalls: when a rank of a launch counts as stalled, and the report that shows every rank's Python stack.

`ProgressWatch` keeps, per rank, when it last made progress: its own output, or a change in its main thread's Python
stack between two snapshots (`main_thread_stack` finds that thread in a dump). A rank with none for `stall_timeout`
seconds is stalled, whatever the others do. `stall_error` is the report. Each engine sends the output and the
snapshots its own way (the local engine: SIGUSR1 and faulthandler; Ray: a control thread in each rank actor).

Nothing here imports an engine, the decorator (nbhelpers.launch.launcher) or torch.
"""
from __future__ import annotations

import time

from nbhelpers.launch.errors import DistributedError


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
