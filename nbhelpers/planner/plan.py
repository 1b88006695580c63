"""Will this fine-tune fit, and with which technique? A per-GPU memory planner.

    from nbhelpers.planner.plan import plan
    plan("llama-3.1-8b", gpus=8, gpu_memory_gib=79.6, seq_len=2048, micro_batch=1)
    plan("gpt-oss-120b", gpus=8, gpu_memory_gib=140.4, lora_rank=16)   # MoE: every expert counted
    plan("qwen3.5-27b", gpus=8, gpu_memory_gib=140.4, seq_len=4096, checkpointing=True)  # hybrid linear attention
    plan("olmo-3-7b", gpus=1, lora_rank=16, quantization="nf4")                       # QLoRA: 4-bit frozen base
    python -m nbhelpers.planner qwen3-8b --gpus 2 --gpu-memory 140.4 --micro-batch 4
    python -m nbhelpers.planner qwen3.5-27b --gpus 32 --gpus-per-node 8 --cpu-memory 1800 --json
    python -m nbhelpers.planner qwen3.8-27b --gpus 32 --seq-len 8192 --checkpointing --linear-attention fla \\
        --fused-adamw --steps 983   # ... and the time to finish: nbhelpers.planner.time_to_finish

Per GPU and per technique, `plan()` makes the estimate in this order, each term counted where its formula stands:
1. the model, on the meta device, and its parameters (nbhelpers.planner.parameters: LoRA, QLoRA's 4-bit weights);
2. the training state each technique keeps per GPU: parameters, gradients, optimizer states and the optimizer step's
   temporaries, or host memory with CPU offload (nbhelpers.planner.techniques);
3. the activations kept for backward (nbhelpers.planner.activations: every layer's bytes per token, the loss head,
   checkpointing, compiled layers);
4. the peak, the allowance and the total (`_estimate`), then the verdict: the technique recommended, with its advice
   (nbhelpers.planner.verdict), and when nothing fits, what would (`_suggestions`).

Validated against measured peaks on 2x H200 in benchmarks/results/planner/ (see benchmarks/gpu/planner.md).
"""
from __future__ import annotations

from nbhelpers.planner.activations import COMPILED_LAYER_SHARE, activation_bytes
from nbhelpers.planner.parameters import LORA_ALL_LINEAR, QUANTIZATIONS, count_parameters, load_model
from nbhelpers.planner.techniques import LABELS, OFFLOAD_TECHNIQUES, PRECISIONS, TECHNIQUES, state_bytes
from nbhelpers.planner.verdict import Estimate, Plan, advice, recommend

GIB = 2**30
CONTEXT_GIB = 1.5  # CUDA context + cuBLAS/NCCL workspaces: outside torch's allocator
FRAGMENTATION = 0.10  # reserved above allocated


def plan(model, gpus: int = 1, gpu_memory_gib: float = 80.0, precision: str = "bf16-mixed",
         lora_rank: int | None = None, lora_targets=LORA_ALL_LINEAR, seq_len: int = 2048, micro_batch: int = 1,
         checkpointing: bool = False, attention: str | None = None, suggest: bool = True,
         quantization: str | None = None, cpu_memory_gib: float | None = None, gpus_per_node: int | None = None,
         linear_attention: str = "torch", fused_adamw: bool = False, gradient_as_bucket_view: bool = False,
         chunked_loss: bool = False, every_n_layers: int = 1, torch_compile: bool = False) -> Plan:
    """Estimate per-GPU memory of each technique and pick one (the module docstring says in which order).

    model: a stand-in name, hub id, model folder, transformers config or built model, or the (name, model)
    pair `load_model` returns (to plan one model many times without rebuilding it).
    gpu_memory_gib: what one GPU reports (an "80 GB" H100 has 79.6 GiB, a "141 GB" H200 140.4 GiB).
    lora_rank: None for a full fine-tune. attention: "sdpa" (also flash/flex: no s^2 term) or "eager";
    default: what transformers picks for the model (eager for GPT-OSS, sdpa for the others).
    quantization: "nf4" for QLoRA (needs lora_rank): the frozen base in bitsandbytes 4-bit.
    cpu_memory_gib: host memory per node, for the CPU-offload rows (None: stated, not checked);
    gpus_per_node: default min(gpus, 8).
    linear_attention: the Gated DeltaNet implementation of hybrid models (Qwen3.5): "torch" (transformers'
    fallback) or "fla" (flash-linear-attention + causal-conv1d).
    fused_adamw: torch.optim.AdamW(fused=True), as the FSDP2 recipe uses on GPUs: no sqrt(v) step temporary
    (DDP and FSDP2 rows; DeepSpeed keeps its own optimizer).
    gradient_as_bucket_view: DDP(gradient_as_bucket_view=True): the gradients are views into DDP's all-reduce
    buckets, not a second copy beside them (the DDP row on several GPUs).
    chunked_loss: the loss never holds the whole logits (TRL's SFTTrainer): 16 bytes a token instead of 12 x vocab.
    every_n_layers: with checkpointing, only every k-th decoder layer is checkpointed (1: all of them).
    torch_compile: each decoder layer compiled; its activations as measured for the model (COMPILED_LAYER_SHARE),
    else counted as eager.
    """
    # What is asked: every setting checked before anything is counted
    if not isinstance(gpus, int) or gpus < 1:
        raise ValueError(f"gpus must be a whole number >= 1, not {gpus!r}")
    if not gpu_memory_gib or gpu_memory_gib <= CONTEXT_GIB:
        raise ValueError(f"gpu_memory_gib must be the memory of one GPU in GiB (e.g. 79.6 for an 80 GB H100), not {gpu_memory_gib!r}")
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, not {precision!r}")
    if not isinstance(every_n_layers, int) or every_n_layers < 1:
        raise ValueError(f"every_n_layers must be a whole number >= 1 (1: every layer), not {every_n_layers!r}")
    if seq_len < 1 or micro_batch < 1:
        raise ValueError(f"seq_len and micro_batch must be >= 1 (got {seq_len}, {micro_batch})")
    if lora_rank is not None and lora_rank < 1:
        raise ValueError(f"lora_rank must be >= 1, or None for a full fine-tune (got {lora_rank})")
    if quantization is not None and quantization not in QUANTIZATIONS:
        raise ValueError(f"quantization must be one of {QUANTIZATIONS} or None, not {quantization!r}")
    if quantization and not lora_rank:
        raise ValueError("4-bit weights are frozen: quantization='nf4' is QLoRA, pass lora_rank too (e.g. 16)")
    gpus_per_node = gpus_per_node or min(gpus, 8)
    if not isinstance(gpus_per_node, int) or gpus_per_node < 1 or gpus % gpus_per_node:
        raise ValueError(f"gpus_per_node must divide gpus ({gpus}), not {gpus_per_node!r}")
    if cpu_memory_gib is not None and cpu_memory_gib <= 0:
        raise ValueError(f"cpu_memory_gib must be the host memory of one node in GiB, or None, not {cpu_memory_gib!r}")
    # 1. The model, its parameters counted
    name, meta_model = model if isinstance(model, tuple) else load_model(model)
    config = meta_model.config
    attention = attention or ("eager" if config._attn_implementation == "eager" else "sdpa")
    if attention not in ("sdpa", "flash", "flex", "eager"):
        raise ValueError(f"attention must be 'sdpa', 'flash', 'flex' or 'eager', not {attention!r}")
    attention = "eager" if attention == "eager" else "sdpa"
    hybrid = "linear_attention" in (getattr(config, "layer_types", None) or [])
    counts = count_parameters(meta_model, lora_rank, lora_targets, quantization)
    compiled_share = COMPILED_LAYER_SHARE.get((config.model_type, "lora" if lora_rank else "full"), 1.0) \
        if torch_compile else 1.0

    estimates = []
    for technique in TECHNIQUES + OFFLOAD_TECHNIQUES:
        # 2. The training state this technique keeps per GPU
        terms = state_bytes(technique, counts, gpus, precision, fused_adamw, gradient_as_bucket_view)
        # 3. The activations
        fp32_residual = technique == "ddp" and precision == "bf16-mixed" and not lora_rank  # autocast on fp32 weights
        terms["activations"] = activation_bytes(config, seq_len, micro_batch, checkpointing, attention, fp32_residual,
                                                linear_attention, chunked_loss, every_n_layers, compiled_share)
        # 4. The peak and the total
        host_fits = cpu_memory_gib is None or terms["cpu"] * gpus_per_node / GIB <= cpu_memory_gib
        estimates.append(_estimate(technique, terms, gpu_memory_gib, host_fits))

    # The verdict
    recommended, offload = recommend(estimates, gpus)
    said = advice(recommended, offload, estimates, gpus, gpu_memory_gib, gpus_per_node, cpu_memory_gib)
    fine_tune = "full" if not lora_rank else f"QLoRA r={lora_rank} ({quantization})" if quantization else f"LoRA r={lora_rank}"
    result = Plan(name, counts.total, counts.trainable, gpus, gpu_memory_gib, precision, fine_tune, seq_len,
                  micro_batch, checkpointing, attention, estimates[:len(TECHNIQUES)], recommended, said,
                  offload=offload, gpus_per_node=gpus_per_node, cpu_memory_gib=cpu_memory_gib,
                  linear_attention=linear_attention if hybrid else None,
                  offload_estimates=estimates[len(TECHNIQUES):], fused_adamw=fused_adamw,
                  gradient_as_bucket_view=gradient_as_bucket_view, chunked_loss=chunked_loss,
                  every_n_layers=every_n_layers if checkpointing else 1)
    if suggest and recommended is None:
        result.suggestions = _suggestions((name, meta_model), result, lora_targets, quantization)
    return result


def _estimate(technique: str, terms: dict, gpu_memory_gib: float, host_fits: bool) -> Estimate:
    """One technique's estimate per GPU from its terms in bytes (state_bytes' and "activations"):

        total = parameters + optimizer states
                + max(gradients held before backward + activations,   # peak at the start of backward
                      all gradients + optimizer-step temporaries)      # or peak in the optimizer step
                + allowance

    Activations are freed layer by layer while gradients are produced, so the two sides of the max are the
    memory at the start of backward and at the optimizer step; `peak_at` says which one wins.
    Allowance: 1.5 GiB (CUDA context, cuBLAS and NCCL workspaces, not seen by torch's allocator) plus 10 %
    of the estimate (allocator fragmentation: reserved above allocated). It fits where the total fits one GPU's
    memory and, with CPU offload, the host holds its part (`host_fits`).
    """
    backward = terms["gradients_held"] + terms["activations"]
    step = terms["gradients"] + terms["temporaries"]
    allocated = terms["parameters"] + terms["optimizer"] + max(backward, step)
    allowance = CONTEXT_GIB * GIB + FRAGMENTATION * allocated
    total = (allocated + allowance) / GIB
    return Estimate(technique, **{key: value / GIB for key, value in terms.items()}, allowance=allowance / GIB,
                    total=total, fits=total <= gpu_memory_gib and host_fits,
                    peak_at="backward" if backward >= step else "optimizer step")




def _suggestions(model, failed: Plan, lora_targets, quantization) -> list[str]:
    """What would fit on the GPUs instead: checkpointing, LoRA, more GPUs (each at the fewest GPUs that fit)."""
    lora_rank = int(failed.fine_tune.split("=")[1].split()[0]) if failed.fine_tune != "full" else None
    kwargs = dict(gpus=failed.gpus, gpu_memory_gib=failed.gpu_memory_gib, precision=failed.precision,
                  lora_rank=lora_rank, lora_targets=lora_targets, seq_len=failed.seq_len,
                  micro_batch=failed.micro_batch, checkpointing=failed.checkpointing, attention=failed.attention,
                  suggest=False, quantization=quantization, linear_attention=failed.linear_attention or "torch",
                  fused_adamw=failed.fused_adamw, gradient_as_bucket_view=failed.gradient_as_bucket_view,
                  chunked_loss=failed.chunked_loss)
    counts = [failed.gpus] + [g for g in (2, 4, 8, 16, 32, 64, 128, 256) if g > failed.gpus]
    alternatives = [("more GPUs", {})]
    if not failed.checkpointing:
        alternatives.insert(0, ("activation checkpointing", {"checkpointing": True}))
    if failed.fine_tune == "full":
        alternatives.insert(1, ("LoRA r=16 on all linear layers", {"lora_rank": 16, "lora_targets": LORA_ALL_LINEAR}))
    found = []
    for what, change in alternatives:
        alternative = next((p for p in (plan(model, **{**kwargs, **change, "gpus": g}) for g in counts)
                            if p.recommended), None)
        if alternative:
            e = alternative.estimate(alternative.recommended)
            where = "" if alternative.gpus == failed.gpus else f" on {alternative.gpus} GPUs"
            what = f"{alternative.gpus} GPUs" if not change else what + where
            found.append(f"{what}: {LABELS[e.technique]} fits ({e.total:.1f} GiB per GPU)")
        elif not change:
            found.append(f"more GPUs alone do not help (up to {counts[-1]}): activations are "
                         f"{failed.estimate('zero3').activations:.1f} GiB per GPU; lower micro_batch or seq_len")
    if failed.offload is None:
        e = min((failed.estimate(t) for t in OFFLOAD_TECHNIQUES), key=lambda e: e.total)
        host = e.cpu * failed.gpus_per_node
        found.append(f"CPU offload ({LABELS[e.technique]}) needs {e.total:.1f} GiB per GPU and {host:.0f} GiB of "
                     f"CPU memory per node" + (f" (have {failed.cpu_memory_gib:g})"
                                               if failed.cpu_memory_gib is not None else ""))
    return found
