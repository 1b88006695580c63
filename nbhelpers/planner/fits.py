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

from nbhelpers.planner.parameters import load_model
from nbhelpers.planner.plan import plan
from nbhelpers.planner.techniques import LABELS
from nbhelpers.planner.time_to_finish import time_clause
from nbhelpers.planner.verdict import checkpointing_words
from nbhelpers.training.activation_checkpointing import checkpointing_fields

__all__ = ["WillNotFit", "check_fits", "fit_activations", "visible_gpus"]

# What each way of fitting the activations costs, as a share of a step without it. A checkpointed layer runs its forward
# twice: a forward is a third of a full fine-tune's step (the backward computes input and weight gradients, 2x the
# forward) and half of a LoRA step's (frozen weights: input gradients only).
RECOMPUTE_SHARE = {"full": 1 / 3, "lora": 1 / 2}
# Half the micro-batch with twice the accumulation steps: the same FLOPs, in kernels on half the rows and twice the
# launches. Measured on the GPT-OSS-20B notebook, one H100, 2026-12-07, both compiled without checkpointing: 23,133
# tokens/s with micro-batches of 4 rows of 2,048, 16,246 with 2 (its grouped GEMMs get half the rows per expert).
# Recomputation measured the same day: every layer 0.45 (0.5 counted), every 2nd layer 0.18 (0.25 counted).
HALVED_MICRO_BATCH_COST = 0.42


class WillNotFit(MemoryError):
    """The planner says the training state and activations exceed the memory of the GPUs here."""


def visible_gpus() -> list[tuple[str, float]]:
    """(name, GiB) of each GPU this process may use."""
    import torch

    return [(torch.cuda.get_device_name(i), torch.cuda.get_device_properties(i).total_memory / 2**30)
            for i in range(torch.cuda.device_count())]


def check_fits(model, technique: str, *, gpus: int | None = None, lora_rank: int | None = None,
               quantization: str | None = None, seq_len: int = 2048, micro_batch: int = 1, checkpointing: bool = False,
               every_n_layers: int = 1, attention: str | None = None, fused_adamw: bool = False, gradient_as_bucket_view: bool = False,
               chunked_loss: bool = False, max_steps: int | None = None, gradient_accumulation_steps: int = 1,
               dataset_tokens: int | None = None, num_train_epochs: float = 1, torch_compile: bool | None = None,
               framework: str | None = None, price_per_gpu_hour: float | None = None, chosen: str = ""):
    """Print the planner's one-line verdict for training `model` with `technique` ("ddp", "fsdp", "zero3", ...) on
    `gpus` of the GPUs this process sees (None: all of them); return the Plan, or None where no GPU is visible.
    Where it fits, the line ends with the time to finish (nbhelpers.planner.time_to_finish): of max_steps, or of
    dataset_tokens x num_train_epochs, else of one step; torch_compile and framework ("trl", "unsloth", ...) pick
    the nearest measured runs. every_n_layers: with checkpointing, every k-th decoder layer only; `chosen`: why this
    shape (fit_activations), said after the shape.

    Raises WillNotFit, naming what would fit instead, when the planner's estimate exceeds one GPU's memory.
    """
    here = visible_gpus()
    if not here:
        print("planner: no GPU is visible, so there is no GPU memory to check (CPU processes)", file=sys.stderr)
        return None
    gpus = gpus or len(here)
    name, memory = here[0][0], min(gib for _, gib in here[:gpus])
    options = dict(lora_rank=lora_rank, quantization=quantization, seq_len=seq_len, micro_batch=micro_batch,
                   checkpointing=checkpointing, every_n_layers=every_n_layers, attention=attention, fused_adamw=fused_adamw,
                   gradient_as_bucket_view=gradient_as_bucket_view, chunked_loss=chunked_loss,
                   torch_compile=bool(torch_compile), suggest=False)
    built = load_model(model)  # on the meta device, once for every plan below
    verdict = plan(built, gpus=gpus, gpu_memory_gib=memory, **options)
    needed = verdict.estimate(technique)
    shape = (f"{verdict.model} ({verdict.fine_tune}) with {LABELS[technique]} on {gpus} x {memory:.1f} GiB ({name}), "
             f"{micro_batch} x {seq_len} tokens per GPU" + (f", {checkpointing_words(True, every_n_layers, 'gradient checkpointing')}"
                                                             if checkpointing else "") + chosen)
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


def fit_activations(model, technique: str, *, per_device_train_batch_size: int,
                    gradient_accumulation_steps: int | None = None, gradient_checkpointing: bool | None = None,
                    **shape) -> dict:
    """The cheapest way this run's activations fit the GPUs here, before the model loads, as the TrainingArguments
    fields to set ({} to keep the run as asked), activation checkpointing's under the installed Transformers' names
    (nbhelpers.training.activation_checkpointing). The same tokens per optimizer step either way. In order of what each
    costs (RECOMPUTE_SHARE, HALVED_MICRO_BATCH_COST): nothing, where the run fits as asked; the micro-batch halved
    (once or more) with as many more accumulation steps, where gradient_accumulation_steps is given; gradient
    checkpointing of every n-th decoder layer, n as large as fits (`every_n_layers` of its `_kwargs`, transformers'
    own setting); checkpointing every layer. One line of verdict (check_fits, with `shape`: gpus,
    lora_rank, seq_len, attention, ...); WillNotFit where nothing fits. `gradient_checkpointing` given (a config
    file's) is kept and checked. Without GPUs: {} and one line."""
    here = visible_gpus()
    batch, accumulation = per_device_train_batch_size, gradient_accumulation_steps
    if not here or gradient_checkpointing is not None:
        check_fits(model, technique, micro_batch=batch, gradient_accumulation_steps=accumulation or 1,
                   checkpointing=bool(gradient_checkpointing), **shape)
        return {}
    gpus = shape.get("gpus") or len(here)
    memory = min(gib for _, gib in here[:gpus])
    built = load_model(model)
    layers = built[1].config.num_hidden_layers
    recompute = RECOMPUTE_SHARE["lora" if shape.get("lora_rank") else "full"]
    options = [(0.0, batch, accumulation, False, 1)]  # (cost, micro-batch, accumulation, checkpointing, every_n_layers)
    halved, cost = batch, 0.0
    while accumulation and halved % 2 == 0:
        halved, cost = halved // 2, cost + HALVED_MICRO_BATCH_COST
        options.append((cost, halved, accumulation * batch // halved, False, 1))
    options += [(recompute * -(-layers // n) / layers, batch, accumulation, True, n) for n in range(layers, 0, -1)]
    planning = {k: v for k, v in shape.items() if k in ("lora_rank", "quantization", "seq_len", "attention",
                                                         "fused_adamw", "gradient_as_bucket_view", "chunked_loss")}
    planning["torch_compile"] = bool(shape.get("torch_compile"))
    for cost, micro, steps, checkpointing, every in sorted(options, key=lambda option: option[0]):
        if plan(built, gpus=gpus, gpu_memory_gib=memory, micro_batch=micro, checkpointing=checkpointing,
                every_n_layers=every, suggest=False, **planning).fits(technique):
            break
    else:  # nothing fits: the error of the run as asked, with what would fit instead
        check_fits(model, technique, micro_batch=batch, gradient_accumulation_steps=accumulation or 1,
                   checkpointing=True, **shape)
    if cost == 0:
        check_fits(model, technique, micro_batch=batch, gradient_accumulation_steps=accumulation or 1, **shape)
        return checkpointing_fields(False)
    asked = plan(built, gpus=gpus, gpu_memory_gib=memory, micro_batch=batch, suggest=False, **planning)
    how = (f"micro-batches of {micro} and {steps} accumulation steps, no recomputation" if not checkpointing
           else f"{-(-layers // every)} of {layers} layers recomputed in the backward")
    chosen = (f" (as asked, {batch} x {shape.get('seq_len', 2048)} tokens would need "
              f"{asked.estimate(technique).total:.1f} GiB; the cheapest way that fits: {how})")
    check_fits(model, technique, micro_batch=micro, gradient_accumulation_steps=steps or 1, checkpointing=checkpointing,
               every_n_layers=every, chosen=chosen, **shape)
    # non-reentrant: DDP with frozen weights needs it (transformers' default, said explicitly)
    fields = checkpointing_fields(True, use_reentrant=False, every_n_layers=every) if checkpointing else \
        checkpointing_fields(False)
    if micro != batch:
        fields |= {"per_device_train_batch_size": micro, "gradient_accumulation_steps": steps}
    return fields


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
