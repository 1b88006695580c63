"""The Hugging Face helpers: tokens/s after the warm-up steps (nbhelpers.training.trainer_log); clear errors for a
model or dataset that cannot be found (nbhelpers.training.hub); activation checkpointing by the names the installed
Transformers has (nbhelpers.training.activation_checkpointing)."""
import math
from types import SimpleNamespace

import pytest

from nbhelpers.training.trainer_log import StepTimer


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


def test_a_rerun_with_one_step_or_none_left_has_no_tokens_per_second_instead_of_an_error():
    """A rerun of a finished notebook resumes from its last checkpoint and trains nothing: its results (the adapter
    was saved) must still come back (a GPU run of 2026-12-06 failed there after training)."""
    for steps in ([], [10.0]):
        timer = _timer(steps, [100] * len(steps))
        assert math.isnan(timer.tokens_per_second(warmup_steps=2))


def test_tokens_per_second_says_what_to_set_when_no_tokens_were_counted():
    timer = _timer([1.0, 2.0, 3.0], [0, 0, 0])
    with pytest.raises(RuntimeError, match="include_num_input_tokens_seen"):
        timer.tokens_per_second(warmup_steps=1)


def test_step_timer_records_the_trainers_token_count():
    timer = StepTimer()
    timer.on_step_end(None, SimpleNamespace(num_input_tokens_seen=42), None)
    assert timer.tokens == [42] and len(timer.times) == 1


def test_a_missing_local_model_folder_is_named_and_not_looked_up_on_the_hub(tmp_path):
    from nbhelpers.training.hub import NotFoundError, find_model

    with pytest.raises(NotFoundError, match=f"no such file or folder: {tmp_path / 'nope'}.*on disk only"):
        find_model(str(tmp_path / "nope"))
    with pytest.raises(NotFoundError, match="holds no config.json"):
        find_model(str(tmp_path))


def test_a_hub_model_that_cannot_be_fetched_says_where_it_looked_and_how_to_pass_a_token(monkeypatch):
    from nbhelpers.training.hub import NotFoundError, find_model

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(NotFoundError) as error:
        find_model("meta-llama/Llama-3.2-1B-Instruct")
    for said in ("'meta-llama/Llama-3.2-1B-Instruct' is not a folder on disk", "HF_HUB_OFFLINE=1", "gated",
                 "HF_TOKEN", "hf auth login"):
        assert said in str(error.value)


def test_a_missing_local_dataset_folder_is_named(tmp_path):
    from nbhelpers.training.hub import NotFoundError, find_dataset

    with pytest.raises(NotFoundError, match=f"no such file or folder: {tmp_path / 'capybara'}"):
        find_dataset(str(tmp_path / "capybara"))
    assert find_dataset("trl-lib/Capybara") == "trl-lib/Capybara"  # a hub id: datasets looks it up


def test_push_to_hub_without_a_token_says_how_to_pass_one(monkeypatch, tmp_path):
    from nbhelpers.training.hub import check_push_to_hub

    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setattr("huggingface_hub.constants.HF_TOKEN_PATH", str(tmp_path / "token"))  # no `hf auth login`
    check_push_to_hub(False, "")  # not pushing: nothing to check
    with pytest.raises(ValueError, match="HF_TOKEN.*hf auth login"):
        check_push_to_hub(True, "me/model")


def test_activation_checkpointing_goes_by_the_names_the_installed_transformers_has(standin):
    """TrainingArguments takes the fields without a deprecation warning, a config file written with either name keeps
    its value, both names of one field are refused, and the model's layers are checkpointed (every 2nd here)."""
    import warnings

    from transformers import AutoModelForCausalLM, TrainingArguments

    from nbhelpers.training.activation_checkpointing import (NEW, OLD, checkpointing_field, checkpointing_fields,
                                                             enable_checkpointing, with_installed_names)

    field = checkpointing_field()
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        args = TrainingArguments("/tmp/unused", **checkpointing_fields(True, use_reentrant=False), use_cpu=True)
    assert getattr(args, field) is True and getattr(args, f"{field}_kwargs") == {"use_reentrant": False}
    for name in (NEW, OLD):
        assert with_installed_names({name: False, f"{name}_kwargs": {"every_n_layers": 2}, "seed": 1}) == {
            field: False, f"{field}_kwargs": {"every_n_layers": 2}, "seed": 1}
    with pytest.raises(ValueError, match="keep one"):
        with_installed_names({NEW: True, OLD: False})
    model = AutoModelForCausalLM.from_pretrained(standin("llama-3.2-1b"))
    enable_checkpointing(model, every_n_layers=2, use_reentrant=False)
    assert [layer.gradient_checkpointing for layer in model.model.layers] == [
        i % 2 == 0 for i in range(len(model.model.layers))]
