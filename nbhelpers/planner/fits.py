"""Will it fit? The memory planner's verdict (nbhelpers.planner.plan) before a notebook loads its model.

    check_fits("openai/gpt-oss-20b", "ddp", lora_rank=8, seq_len=2048, micro_batch=4, checkpointing=True,
               chunked_loss=True, max_steps=500, gradient_accumulation_steps=4, torch_compile=True, framework="trl")
    # planner: gpt-oss-20b (LoRA r=8) with DDP on 1 x 139.8 GiB (NVIDIA H200), 4 x 2048 tokens per GPU,
    #   gradient checkpointing: about 48.0 GiB per GPU, fits (91.8 GiB spare); about 17 min on 1 x H200 at 38 % MFU
    #   (measured on 1 x H100: median of 2 runs, e.g. h100x1_2026-12-06/gpt_oss_20b/20b_compiled_packed)

On GPUs that cannot hold it, it raises WillNotFit at once, with what would fit instead (more GPUs, a sharding
technique, gradient checkpointing, QLoRA, a shorter max_length), instead of an out-of-memory error minutes later,
after the weights have loaded. The model's config alone is read (a hub id, a folder, or a name of
nbhelpers.planner.model_configs); nothing is downloaded but config.json.
"""
from __future__ import annotations

import sys

from nbhelpers.planner.plan import LABELS, load_model, plan
from nbhelpers.planner.time_to_finish import time_clause

__all__ = ["WillNotFit", "check_fits", "gradient_checkpointing_to_fit", "visible_gpus"]


class WillNotFit(MemoryError):
    """The planner says the training state and activations exceed the memory of the GPUs here."""


def visible_gpus() -> list[tuple[str, float]]:
    """(name, GiB) of each GPU this process may use."""
    import torch

    return [(torch.cuda.get_device_name(i), torch.cuda.get_device_properties(i).total_memory / 2**30)
            for i in range(torch.cuda.device_count())]


def check_fits(model, technique: str, *, gpus: int | None = None, lora_rank: int | None = None,
               quantization: str | None = None, seq_len: int = 2048, micro_batch: int = 1, checkpointing: bool = False,
               attention: str | None = None, fused_adamw: bool = False, gradient_as_bucket_view: bool = False,
               chunked_loss: bool = False, max_steps: int | None = None, gradient_accumulation_steps: int = 1,
               dataset_tokens: int | None = None, num_train_epochs: float = 1, torch_compile: bool | None = None,
               framework: str | None = None, price_per_gpu_hour: float | None = None):
    """Print the planner's one-line verdict for training `model` with `technique` ("ddp", "fsdp", "zero3", ...) on
    `gpus` of the GPUs this process sees (None: all of them); return the Plan, or None where no GPU is visible.
    Where it fits, the line ends with the time to finish (nbhelpers.planner.time_to_finish): of max_steps, or of
    dataset_tokens x num_train_epochs, else of one step; torch_compile and framework ("trl", "unsloth", ...) pick
    the nearest measured runs.

    Raises WillNotFit, naming what would fit instead, when the planner's estimate exceeds one GPU's memory.
    """
    here = visible_gpus()
    if not here:
        print("planner: no GPU is visible, so there is no GPU memory to check (CPU processes)", file=sys.stderr)
        return None
    gpus = gpus or len(here)
    name, memory = here[0][0], min(gib for _, gib in here[:gpus])
    options = dict(lora_rank=lora_rank, quantization=quantization, seq_len=seq_len, micro_batch=micro_batch,
                   checkpointing=checkpointing, attention=attention, fused_adamw=fused_adamw,
                   gradient_as_bucket_view=gradient_as_bucket_view, chunked_loss=chunked_loss, suggest=False)
    built = load_model(model)  # on the meta device, once for every plan below
    verdict = plan(built, gpus=gpus, gpu_memory_gib=memory, **options)
    needed = verdict.estimate(technique)
    shape = (f"{verdict.model} ({verdict.fine_tune}) with {LABELS[technique]} on {gpus} x {memory:.1f} GiB ({name}), "
             f"{micro_batch} x {seq_len} tokens per GPU" + (", gradient checkpointing" if checkpointing else ""))
    if needed.fits:
        took = time_clause(built, technique, name, gpus, seq_len=seq_len, micro_batch=micro_batch,
                           gradient_accumulation_steps=gradient_accumulation_steps, max_steps=max_steps,
                           dataset_tokens=dataset_tokens, num_train_epochs=num_train_epochs, lora_rank=lora_rank,
                           checkpointing=checkpointing, torch_compile=torch_compile, framework=framework,
                           price_per_gpu_hour=price_per_gpu_hour)
        print(f"planner: {shape}: about {needed.total:.1f} GiB per GPU, fits ({memory - needed.total:.1f} GiB spare); "
              f"{took}", file=sys.stderr)
        return verdict
    instead = _what_would_fit(built, technique, gpus, memory, options, verdict)
    raise WillNotFit(
        f"{shape}: about {needed.total:.1f} GiB per GPU are needed and one GPU has {memory:.1f}, so it would run out "
        f"of memory after loading. What would fit: {'; '.join(instead) or 'nothing the planner knows of here'}. "
        "(To try anyway, set check_memory=False.)")


def gradient_checkpointing_to_fit(model, technique: str, gradient_checkpointing: bool | None = None, **shape) -> bool:
    """Whether to checkpoint activations (check_fits' arguments in `shape`): `gradient_checkpointing` where it is
    given, checked like check_fits; None: off where the planner says the run fits without it (recomputing every
    layer in the backward costs about a third of a step), on where only that fits, off without GPUs. One line of
    verdict either way; WillNotFit where nothing fits."""
    if gradient_checkpointing is not None:
        check_fits(model, technique, checkpointing=gradient_checkpointing, **shape)
        return gradient_checkpointing
    try:
        check_fits(model, technique, checkpointing=False, **shape)
        return False
    except WillNotFit:
        check_fits(model, technique, checkpointing=True, **shape)
        return True


def _what_would_fit(built, technique, gpus, memory, options, verdict) -> list[str]:
    found = [f"{LABELS[e.technique]} on these {gpus} GPU(s) ({e.total:.1f} GiB per GPU)"
             for e in verdict.estimates if e.fits and e.technique != technique]
    for more in (g for g in (2, 4, 8, 16, 32, 64) if g > gpus):  # the fewest GPUs on which it fits
        bigger = plan(built, gpus=more, gpu_memory_gib=memory, **options)
        fitting = technique if bigger.fits(technique) else bigger.recommended
        if fitting:
            found.append(f"{LABELS[fitting]} on {more} such GPUs ({bigger.estimate(fitting).total:.1f} GiB per GPU)")
            break
    changes = []
    if not options["checkpointing"]:
        changes.append(("gradient_checkpointing", {"checkpointing": True}))
    if options["lora_rank"] and not options["quantization"]:
        changes.append(("QLoRA (load_in_4bit)", {"quantization": "nf4"}))
    if options["seq_len"] >= 512:
        changes.append((f"max_length {options['seq_len'] // 2}", {"seq_len": options["seq_len"] // 2}))
    for what, change in changes:
        estimate = plan(built, gpus=gpus, gpu_memory_gib=memory, **{**options, **change}).estimate(technique)
        if estimate.fits:
            found.append(f"{what} ({estimate.total:.1f} GiB per GPU)")
    return found
