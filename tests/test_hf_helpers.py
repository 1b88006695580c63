"""nbhelpers.hf: tokens/s after the warm-up steps."""
from types import SimpleNamespace

import pytest

from nbhelpers.hf import StepTimer


def _timer(times, tokens):
    timer = StepTimer()
    for t, n in zip(times, tokens):
        timer.times.append(t)
        timer.tokens.append(n)
    return timer


def test_tokens_per_second_leaves_out_the_warmup_steps():
    # steps end at t = 10 (slow first step), 11, 12, 13; 100 tokens per step
    timer = _timer([10.0, 11.0, 12.0, 13.0], [100, 200, 300, 400])
    assert timer.tokens_per_second(warmup_steps=1) == pytest.approx(100.0)
    assert timer.timed_steps(warmup_steps=1) == 2


def test_tokens_per_second_keeps_one_timed_step_when_the_run_is_short():
    timer = _timer([10.0, 12.0], [100, 300])
    assert timer.tokens_per_second(warmup_steps=5) == pytest.approx(100.0)
    assert timer.timed_steps(warmup_steps=5) == 1


def test_tokens_per_second_says_what_to_set_when_no_tokens_were_counted():
    timer = _timer([1.0, 2.0, 3.0], [0, 0, 0])
    with pytest.raises(RuntimeError, match="include_num_input_tokens_seen"):
        timer.tokens_per_second(warmup_steps=1)


def test_step_timer_records_the_trainers_token_count():
    timer = StepTimer()
    timer.on_step_end(None, SimpleNamespace(num_input_tokens_seen=42), None)
    assert timer.tokens == [42] and len(timer.times) == 1
