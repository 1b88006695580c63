"""What the ranks of a launch say: their output in the cell, and their logs.

- `Printers` print each rank's stdout and stderr into the cell as they come, line by line, prefixed `[rank N]`
  (`[train#2 rank N]` for a launch in the background), and keep each rank's last lines for its error.
- `RankLog` keeps a rank's output as a log (its head and tail), which `save_rank_logs` saves to the MLflow run as
  logs/rank_N.txt, as databricks.air does.

Nothing here imports an engine, the decorator (nbhelpers.launch.launcher) or torch.
"""
from __future__ import annotations

import codecs
import collections
import sys


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
