"""What a Hugging Face Trainer run measured: the values it logged, tokens/s without the warm-up steps, and this
rank's step times for the report of which rank held the others back (nbhelpers.training.step_times).

    timer = StepTimer()                                  # needs include_num_input_tokens_seen in the arguments
    trainer.add_callback(timer)
    trainer.train()
    timer.tokens_per_second(warmup_steps=2), logged(trainer, "loss")
"""
from __future__ import annotations

import time

import torch
from transformers import TrainerCallback

from nbhelpers.training.step_times import StepTimes


class StepTimer(TrainerCallback):
    """Clock and input-token count (summed over all ranks) at the end of every optimizer step.

    The Trainer's own `train_tokens_per_second` includes the first steps (allocator growth, first
    all-gathers, kernel autotuning); `tokens_per_second(warmup_steps)` leaves them out, which is what a
    benchmark compares. Needs `include_num_input_tokens_seen` ("all" or "non_padding") in the arguments.
    It also records this rank's StepTimes (its wait for each batch, its forward passes, its steps) for the report of
    which rank held the others back: `@distributed` prints it after the launch; under torchrun rank 0 at the end of
    training. synchronize=False: no host-device sync at the end of a step (the report needs none; tokens/s then
    counts steps as queued, which a long run's average hardly changes).
    """

    def __init__(self, synchronize: bool = True):
        self.times, self.tokens = [], []
        self.synchronize = synchronize
        self.step_times = None

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self.step_times = StepTimes(model)

    def on_step_end(self, args, state, control, **kwargs):
        if self.synchronize and torch.cuda.is_available():
            torch.cuda.synchronize()  # the step's kernels are done, not just queued
        self.times.append(time.perf_counter())
        self.tokens.append(state.num_input_tokens_seen)
        if self.step_times is not None:
            self.step_times.step_done()

    def on_train_end(self, args, state, control, **kwargs):
        if self.step_times is not None:
            self.step_times.close()

    def first_timed(self, warmup_steps: int) -> int:
        """Index of the step the timing starts from: after the warm-up, keeping at least one timed step."""
        if len(self.times) < 2:
            raise RuntimeError("tokens/s needs at least 2 optimizer steps")
        return min(warmup_steps, len(self.times) - 2)

    def timed_steps(self, warmup_steps: int) -> int:
        return len(self.times) - 1 - self.first_timed(warmup_steps)

    def tokens_per_second(self, warmup_steps: int) -> float:
        """nan when this run ended fewer than 2 steps (one resumed with a step or none left: a rerun of a finished
        notebook), which time nothing."""
        if len(self.times) < 2:
            return float("nan")
        first = self.first_timed(warmup_steps)
        if self.tokens[-1] == 0:
            raise RuntimeError("no tokens counted: pass include_num_input_tokens_seen='non_padding' to the config")
        return (self.tokens[-1] - self.tokens[first]) / (self.times[-1] - self.times[first])


def logged(trainer, key: str = "loss") -> list[float]:
    """The values of one logged metric (loss, eval_loss, ...) in the order the Trainer logged them."""
    return [entry[key] for entry in trainer.state.log_history if key in entry]
