"""Activation checkpointing under the names the installed Transformers reads.

From Transformers 5.23 it is activation checkpointing: TrainingArguments' `activation_checkpointing` and
`activation_checkpointing_kwargs`, the model's `activation_checkpointing_enable()`; `gradient_checkpointing`,
`gradient_checkpointing_kwargs` and `gradient_checkpointing_enable()` are their deprecated aliases, removed in v6.
Transformers 5.17 (the GPU machine's, the Unsloth environment's) has only the old names. The notebooks, the recipes and
the planner set it through these three functions, so each version gets the names it wants: no deprecation warning on
the one, no unknown field on the other.
"""
from __future__ import annotations

import functools

NEW, OLD = "activation_checkpointing", "gradient_checkpointing"


@functools.cache
def checkpointing_field() -> str:
    """TrainingArguments' field for activation checkpointing in the installed Transformers (its `_kwargs` beside)."""
    from transformers import TrainingArguments

    return NEW if NEW in TrainingArguments.__dataclass_fields__ else OLD


def checkpointing_fields(enabled: bool, **kwargs) -> dict:
    """The TrainingArguments fields that turn activation checkpointing on (or off); `kwargs` (use_reentrant,
    every_n_layers, ...) are its `_kwargs`, for the model's `..._checkpointing_enable()`."""
    field = checkpointing_field()
    return {field: enabled, **({f"{field}_kwargs": kwargs} if kwargs else {})}


def with_installed_names(fields: dict) -> dict:
    """`fields` (TrainingArguments fields: a config file's, the planner's) with activation checkpointing's under the
    installed Transformers' names, whichever of the two names they came with. Both names of one field: ValueError."""
    field = checkpointing_field()
    other = OLD if field == NEW else NEW
    renamed = dict(fields)
    for suffix in ("", "_kwargs"):
        if other + suffix in renamed:
            if field + suffix in renamed:
                raise ValueError(f"both {other + suffix} and {field + suffix} are set: keep one ({field + suffix} is "
                                 "the installed Transformers' name)")
            renamed[field + suffix] = renamed.pop(other + suffix)
    return renamed


def enable_checkpointing(model, every_n_layers: int = 1, **kwargs) -> None:
    """Checkpoint the activations of `model`'s decoder layers (every n-th of them) with its
    `activation_checkpointing_enable()`, or `gradient_checkpointing_enable()` where that is the only one; `model` is a
    Transformers model, bare or under PEFT; `kwargs` (e.g. use_reentrant=False) go to torch.utils.checkpoint."""
    enable = getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable
    enable(kwargs or None, every_n_layers=every_n_layers)
