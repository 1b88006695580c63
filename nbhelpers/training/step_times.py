"""This rank's step times, for the report of which rank held the others back (nbhelpers.launch.stragglers).

    step_times = StepTimes(model)     # times the model's forward passes (hooks; on a GPU CUDA events, no sync)
    for x, y in loader:
        loss = F.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        step_times.step_done()        # one call per optimizer step
    step_times.close()                # under torchrun rank 0 prints the report here (a collective: every rank)

Frameworks with hooks need no change to the training code: the HF Trainer (TRL, Unsloth) records them with
nbhelpers.training.trainer_log.StepTimer, Lightning with `lightning_callback()`; both are passed to the trainer
explicitly. Nothing of another library is patched: the forward hooks are PyTorch's (`register_forward_pre_hook`)
on the model this rank trains, and `close()` removes them.

Under `@distributed` each step goes at once into the launch's memory file (mapped: a rank that is killed has left its
steps there), and the launcher reports when the launch ends, however it ends. Elsewhere (torchrun, Ray) `close()`
gathers every rank's figures and rank 0 prints the line.

Cost: per step, two timestamps per forward pass and one per step, kept in memory (measured on the MLP notebook's
loop: benchmarks/step_times_overhead.py).
"""
from __future__ import annotations

import collections
import math
import mmap
import os
import sys
import time

import torch

from nbhelpers.launch import stragglers

_PENDING_STEPS = 64  # steps whose forward passes the GPU has not finished, at most (older ones are dropped)
_launch_file = None  # this rank's part of the launch's memory file, once mapped: every StepTimes of the rank appends to it


def _launch_buffer():
    """This rank's part of the launch's memory file (nbhelpers.launch.stragglers.LaunchStepTimes), mapped; None outside
    `@distributed`."""
    global _launch_file
    path = os.environ.get(stragglers.STEP_TIMES_FILE)
    if path is None:
        return None
    if _launch_file is None:
        fd = os.open(path, os.O_RDWR)
        try:
            _launch_file = mmap.mmap(fd, stragglers.BUFFER_BYTES, offset=int(os.environ["RANK"]) * stragglers.RANK_BYTES)
        finally:
            os.close(fd)
    return _launch_file


class StepTimes:
    """Per optimizer step: how long this rank waited for its batch, how long its forward passes took, and the step.

    model: the module whose forward passes to time (a DDP-wrapped one: the module inside), in training mode only
        (evaluation and generation are left out). None: call forward_started() and forward_ended() yourself.
    """

    def __init__(self, model=None):
        self.buffer = _launch_buffer() or bytearray(stragglers.BUFFER_BYTES)
        self.step_ended = None  # time.perf_counter() at the end of the last step
        self.data_wait = math.nan  # this step's: from the end of the last step to its first forward pass
        self.forwards = []  # this step's forward passes: (start, end), perf_counter times or CUDA events
        self.forward_start = None
        self.pending = collections.deque()  # (data wait, forward passes, step) of steps the GPU may not have finished
        self.hooks, self.on_gpu = [], None
        if model is not None:
            if isinstance(model, torch.nn.parallel.DistributedDataParallel):
                model = model.module  # DDP's forward calls it after its own collectives (buffers)
            pre, post = self._forward_pre_hook, self._forward_hook
            if "torch._dynamo" in sys.modules:  # a model compiled whole calls them as they are (no graph break said);
                pre, post = torch.compiler.disable(pre), torch.compiler.disable(post)  # else not imported (1 s) for it
            self.hooks = [model.register_forward_pre_hook(pre), model.register_forward_hook(post)]

    def _forward_pre_hook(self, module, args):
        if module.training and torch.is_grad_enabled():
            if self.on_gpu is None:  # at the first forward pass: the model is where it trains by then
                self.on_gpu = any(p.is_cuda for p in module.parameters())
            self.forward_started(on_gpu=self.on_gpu)

    def _forward_hook(self, module, args, output):
        if self.forward_start is not None:
            self.forward_ended()

    def forward_started(self, on_gpu: bool = False) -> None:
        """A forward pass of training starts (on_gpu: the model's parameters are on a GPU: timed by CUDA events)."""
        now = time.perf_counter()
        if self.step_ended is not None and not self.forwards and self.forward_start is None:
            self.data_wait = now - self.step_ended
        self.forward_start = _cuda_event() if on_gpu else now

    def forward_ended(self) -> None:
        end = _cuda_event() if isinstance(self.forward_start, torch.cuda.Event) else time.perf_counter()
        self.forwards.append((self.forward_start, end))
        self.forward_start = None

    def step_done(self) -> None:
        """The optimizer step has been taken (call it once per step, after optimizer.step())."""
        now = time.perf_counter()
        if self.step_ended is not None:  # the first step has no start to count from: it is left out
            self.pending.append((self.data_wait, self.forwards, now - self.step_ended))
        self.step_ended, self.data_wait, self.forwards, self.forward_start = now, math.nan, [], None
        while self.pending and all(_finished(end) for _, end in self.pending[0][1]):
            data_wait, forwards, step = self.pending.popleft()
            forward = sum(_seconds(start, end) for start, end in forwards) if forwards else math.nan
            stragglers.record_step(self.buffer, data_wait if forwards else math.nan, forward, step)
        while len(self.pending) > _PENDING_STEPS:
            self.pending.popleft()

    def close(self) -> str | None:
        """Remove the hooks. Outside `@distributed` (torchrun, Ray), with torch.distributed initialized: gather every
        rank's figures, and rank 0 prints the straggler's line, if any, and logs them to its MLflow run (a collective:
        every rank calls it; no GPU clocks there: the launcher samples those). Returns the line (on rank 0)."""
        for hook in self.hooks:
            hook.remove()
        self.hooks = []
        dist = torch.distributed
        if os.environ.get(stragglers.STEP_TIMES_FILE) is not None or not (dist.is_available() and dist.is_initialized()):
            return None  # @distributed reports after the launch; a single process cannot straggle
        ranks = [None] * dist.get_world_size()
        dist.all_gather_object(ranks, stragglers.rank_figures(self.buffer))
        if dist.get_rank() != 0:
            return None
        figures = stragglers.launch_figures(ranks)
        if figures["straggler"]:
            print(f"nbhelpers: {figures['straggler']}", file=sys.stderr, flush=True)
        mlflow = sys.modules.get("mlflow")
        run = mlflow.active_run() or mlflow.last_active_run() if mlflow is not None else None
        if run is not None:
            stragglers.log_to_mlflow(run.info.run_id, figures)
        return figures["straggler"]


def _cuda_event():
    event = torch.cuda.Event(enable_timing=True)
    event.record()
    return event


def _finished(end) -> bool:
    return not isinstance(end, torch.cuda.Event) or end.query()  # query: no sync


def _seconds(start, end) -> float:
    return start.elapsed_time(end) / 1000 if isinstance(end, torch.cuda.Event) else end - start


def lightning_callback():
    """A Lightning Callback that records this rank's StepTimes with no change to the LightningModule: its forward
    passes (where training_step does not call the module itself, training_step up to the backward pass) and its
    batches. Pass it to the Trainer: `L.Trainer(..., callbacks=[lightning_callback()])`."""
    from lightning.pytorch.callbacks import Callback

    class StepTimesCallback(Callback):
        step_times, batch_started = None, None

        def on_train_start(self, trainer, pl_module):
            self.step_times = StepTimes(pl_module)

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            self.batch_started = (time.perf_counter(), _cuda_event() if pl_module.device.type == "cuda" else None)

        def on_before_backward(self, trainer, pl_module, loss):
            times = self.step_times
            if not times.forwards and times.forward_start is None and self.batch_started is not None:
                now, event = self.batch_started  # the module's forward did not run: training_step is the forward
                if times.step_ended is not None:
                    times.data_wait = now - times.step_ended
                times.forwards.append((event, _cuda_event()) if event is not None else (now, time.perf_counter()))

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            self.step_times.step_done()

        def on_train_end(self, trainer, pl_module):
            self.step_times.close()

        def on_exception(self, trainer, pl_module, exception):
            if self.step_times is not None:
                for hook in self.step_times.hooks:
                    hook.remove()

    return StepTimesCallback()
