"""Which rank held the others back, and why: one line at the end of a launch, nothing when the ranks are even.

    @distributed: train(): rank 1 was 35 % slower than the median rank: 92 % of its extra time waiting for data
    (its wait for a batch 41 ms a step, the others' 3 ms)

Each rank records three durations per optimizer step (nbhelpers.training.step_times: a call per step, or a Trainer or
Lightning callback): its data wait (from the end of its previous step to the start of its first forward pass), its
forward passes (CUDA events on a GPU: the GPU's time, read once finished, without a host-device sync), and the whole
step (end to end). Under `@distributed` they go into the launch's memory file (`LaunchStepTimes`: a memfd, nothing on
disk), which the launcher reads when the launch ends, however it ends; elsewhere (torchrun, Ray) the ranks gather
them at the end and rank 0 prints the line (StepTimes.close).

How the line is decided. Every step of a data-parallel job ends in a collective (DDP's all-reduce), so every rank's
step lasts as long as the slowest rank's: step times alone cannot tell who was late. What differs is what each rank
did on its own, without a collective: how long it waited for its batch, and how long its forward pass took (DDP has
no collective there). Per rank, against the median of the other ranks (medians over the last `WINDOW` steps):
    extra data wait   its data wait - the others'
    extra compute     (1 - 1/r) x (its step - its data wait), r = its forward time / the others'
                      (this assumes its backward pass and optimizer step slowed as its forward pass did)
    slower by         extra / (its step - extra): its extra time against what a step of the median rank needs
The rank slower by the most is named when that is at least SLOWER_BY (10 %), with the cause that holds most of its
extra time: waiting for data, or slower steps; then, with GPUs, its GPU's SM clock against the others' (NVML, read
by nbhelpers.launch.system_metrics) when it is lower, and why NVML says it was held down (thermal, power).
Where it cannot tell. Under FSDP or ZeRO-3 the forward pass gathers parameters from the other ranks, so a rank that
computes slowly shows less there. A collective between steps that blocks the host makes the others wait for a late
rank's data there too, which evens out the data waits: the HF Trainer's token count (`average_tokens_across_devices`)
on CPUs (gloo blocks the host, NCCL does not); Lightning's broadcast from rank 0 before each batch (its SIGTERM check)
adds its latency to the other ranks' data wait (about a millisecond on a busy 2-core machine).

Nothing here imports torch, or another module of nbhelpers.
"""
from __future__ import annotations

import math
import mmap
import os
import struct
import sys

STEP_TIMES_FILE = "NBHELPERS_STEP_TIMES_FILE"  # set by the local engine in each rank: the launch's memory file
SLOWER_BY = 0.10  # a rank at least this much slower than the median rank is named
WINDOW = 4096  # steps kept per rank (the newest): the medians are of these
CLOCK_LOWER_BY = 0.05  # a straggler's GPU clock at least this much below the others' is said

_COUNT = struct.Struct("<q")  # the file's header: steps recorded in all
_RECORD = struct.Struct("<3d")  # one step: data wait, forward, whole step (seconds; NaN where unknown)
BUFFER_BYTES = _COUNT.size + WINDOW * _RECORD.size
RANK_BYTES = -(-BUFFER_BYTES // mmap.ALLOCATIONGRANULARITY) * mmap.ALLOCATIONGRANULARITY  # a rank's part of the file


def record_step(buffer, data_wait: float, forward: float, step: float) -> None:
    """One step into `buffer` (a rank's file, mapped, or a bytearray): the newest WINDOW steps are kept."""
    (count,) = _COUNT.unpack_from(buffer, 0)
    _RECORD.pack_into(buffer, _COUNT.size + (count % WINDOW) * _RECORD.size, data_wait, forward, step)
    _COUNT.pack_into(buffer, 0, count + 1)


def rank_figures(buffer) -> dict:
    """A rank's medians (seconds) over the steps in `buffer`: {"steps", "data_wait_s", "forward_s", "step_s"}."""
    (count,) = _COUNT.unpack_from(buffer, 0)
    rows = [_RECORD.unpack_from(buffer, _COUNT.size + i * _RECORD.size) for i in range(min(count, WINDOW))]
    return {"steps": count, **{name: _median([row[i] for row in rows])
                               for i, name in enumerate(("data_wait_s", "forward_s", "step_s"))}}


def _median(values):
    values = sorted(v for v in values if not math.isnan(v))
    if not values:
        return None
    middle = len(values) // 2
    return values[middle] if len(values) % 2 else (values[middle - 1] + values[middle]) / 2


def launch_figures(ranks: list, gpus: dict | None = None) -> dict:
    """The launch's figures from each rank's rank_figures (None for a rank that recorded nothing): per rank, as lists
    in rank order, and `straggler_rank` and `straggler` (the line) when one rank held the others back. gpus: the
    launch's system metrics (nbhelpers.launch.system_metrics' summary), for the clocks of the ranks' GPUs."""
    figures = {key: [r and r[key] for r in ranks] for key in ("steps", "data_wait_s", "forward_s", "step_s")}
    figures["slower_than_median"] = [None] * len(ranks)
    figures["straggler_rank"] = figures["straggler"] = None
    timed = [r for r, f in enumerate(ranks) if f and f["step_s"] is not None and f["forward_s"] is not None
             and f["data_wait_s"] is not None]
    if len(timed) < 2 or len(timed) < len(ranks):  # one rank cannot straggle; an untimed rank cannot be compared
        return figures
    found = {}
    for r in timed:
        others = [ranks[o] for o in timed if o != r]
        found[r] = _extra_time(ranks[r], _median([o["data_wait_s"] for o in others]),
                               _median([o["forward_s"] for o in others]))
        figures["slower_than_median"][r] = found[r]["slower_by"]
    worst = max(found, key=lambda r: found[r]["slower_by"])
    if found[worst]["slower_by"] >= SLOWER_BY:
        figures["straggler_rank"] = worst
        figures["straggler"] = _line(worst, found[worst], _gpu_clause(worst, gpus, found[worst]))
    return figures


def _extra_time(mine: dict, others_wait: float, others_forward: float) -> dict:
    extra_data = max(0.0, mine["data_wait_s"] - others_wait)
    ratio = mine["forward_s"] / others_forward if others_forward > 0 else 1.0
    extra_compute = max(0.0, 1 - 1 / ratio) * max(0.0, mine["step_s"] - mine["data_wait_s"]) if ratio > 0 else 0.0
    extra = extra_data + extra_compute
    median_step = mine["step_s"] - extra
    return {"extra_data": extra_data, "extra_compute": extra_compute, "others_wait": others_wait,
            "others_forward": others_forward, "mine": mine,
            "slower_by": extra / median_step if median_step > 0 else (math.inf if extra > 0 else 0.0)}


def _line(rank: int, found: dict, gpu_clause: str) -> str:
    extra = found["extra_data"] + found["extra_compute"]
    data_share = found["extra_data"] / extra
    mine = found["mine"]
    if data_share >= 0.5:
        cause = (f"{data_share * 100:.0f} % of its extra time waiting for data (its wait for a batch "
                 f"{_ms(mine['data_wait_s'])} a step, the others' {_ms(found['others_wait'])})")
    else:
        cause = (f"slower steps, {(1 - data_share) * 100:.0f} % of its extra time (its forward pass {_ms(mine['forward_s'])}, "
                 f"the others' {_ms(found['others_forward'])})")
    return f"rank {rank} was {found['slower_by'] * 100:,.0f} % slower than the median rank: {cause}{gpu_clause}"


def _gpu_clause(rank: int, gpus: dict | None, found: dict) -> str:
    """"; its GPU ran at 1,410 MHz against 1,980 MHz on the others: thermal throttling (87 °C)" when its slower steps
    and its GPU's lower clock tell the same story; "" otherwise."""
    clocks = (gpus or {}).get("gpu_sm_clock_mhz_median")
    if not clocks or clocks[rank] is None or found["extra_compute"] < found["extra_data"]:
        return ""
    others = _median([c for r, c in enumerate(clocks) if r != rank and c is not None])
    if others is None or clocks[rank] > (1 - CLOCK_LOWER_BY) * others:
        return ""
    held_by = ((gpus.get("gpu_clock_limited_by") or [None] * len(clocks))[rank] or [])
    why = "thermal throttling" if "thermal" in held_by else "power capping" if "power" in held_by else ""
    temperature = (gpus.get("gpu_temperature_celsius_max") or [None] * len(clocks))[rank]
    if why and temperature is not None:
        why += f" ({temperature:.0f} °C)"
    return f"; its GPU ran at {clocks[rank]:,.0f} MHz against {others:,.0f} MHz on the others" + (f": {why}" if why else "")


def _ms(seconds: float) -> str:
    ms = seconds * 1000
    return f"{ms:,.0f} ms" if ms >= 100 else f"{ms:.3g} ms"


def log_to_mlflow(run_id: str, figures: dict) -> None:
    """Each rank's medians beside the launch's system metrics (`system/rank_N_step_time_ms`, ...), and the line as the
    run's tag `straggler`. A failure to log is said in one line: the launch's own result stands."""
    try:
        import time

        from mlflow.entities import Metric
        from mlflow.tracking import MlflowClient

        now = int(time.time() * 1000)
        metrics = [Metric(f"system/rank_{rank}_{name}_ms", values[rank] * 1000, now, 0)
                   for key, name in (("step_s", "step_time"), ("data_wait_s", "data_wait"), ("forward_s", "forward_time"))
                   for values in [figures[key]] for rank in range(len(values)) if values[rank] is not None]
        client = MlflowClient()
        client.log_batch(run_id, metrics=metrics)
        if figures["straggler"]:
            client.set_tag(run_id, "straggler", figures["straggler"])
    except Exception as exc:
        print(f"nbhelpers: the ranks' step times not logged to MLflow run {run_id}: {exc}", file=sys.stderr)


class LaunchStepTimes:
    """Where a local launch's ranks record their steps: a memory file of the launcher (memfd), RANK_BYTES for each
    rank, which a rank maps through /proc/<launcher>/fd. Nothing is on disk, and the kernel frees it once the launcher
    and its ranks are gone, however they end. Where memfds are missing (not Linux), the ranks report as under torchrun."""

    def __init__(self, world_size: int):
        self.world_size, self.fd = world_size, None
        if hasattr(os, "memfd_create"):
            self.fd = os.memfd_create("nbhelpers-step-times")  # close-on-exec: no process the launcher runs gets it
            os.ftruncate(self.fd, world_size * RANK_BYTES)

    def environment(self) -> dict:
        return {} if self.fd is None else {STEP_TIMES_FILE: f"/proc/{os.getpid()}/fd/{self.fd}"}

    def report(self, name: str, system_metrics: dict | None, mlflow_run_id: str | None) -> dict | None:
        """The launch's figures (launch_figures), None where no rank recorded a step; the straggler's line, if any, is
        printed, and the figures go to the MLflow run."""
        if self.fd is None:
            return None
        ranks = [rank_figures(os.pread(self.fd, BUFFER_BYTES, rank * RANK_BYTES)) for rank in range(self.world_size)]
        ranks = [r if r["steps"] else None for r in ranks]  # a rank that recorded nothing
        if not any(ranks):
            return None
        figures = launch_figures(ranks, system_metrics)
        if figures["straggler"]:
            print(f"@distributed: {name}: {figures['straggler']}", file=sys.stderr, flush=True)
        if mlflow_run_id is not None:
            log_to_mlflow(mlflow_run_id, figures)
        return figures

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
