"""The training state per GPU under each technique: parameters, gradients, optimizer states and the optimizer step's
temporaries, and with CPU offload what lives in host memory (`state_bytes`).

    TECHNIQUES           ddp, zero1, zero2, fsdp, zero3: everything on the GPUs
    OFFLOAD_TECHNIQUES   fsdp_offload, zero3_offload: the states in CPU memory (recommended only when nothing else fits)

The bytes per parameter of each (a table: `state_bytes`' docstring) follow the ZeRO paper: the fp32 master weights are
counted with the optimizer states (DDP and FSDP2 keep them as the module's own fp32 weights and cast to bf16 on the
fly). The activations are nbhelpers.planner.activations'; the parameter counts nbhelpers.planner.parameters'.
"""
from __future__ import annotations

from nbhelpers.planner.parameters import Counts

TECHNIQUES = ("ddp", "zero1", "zero2", "fsdp", "zero3")  # everything on the GPUs
OFFLOAD_TECHNIQUES = ("fsdp_offload", "zero3_offload")  # states in CPU memory
LABELS = {"ddp": "DDP", "zero1": "DeepSpeed ZeRO-1", "zero2": "DeepSpeed ZeRO-2", "fsdp": "FSDP2 (ZeRO-3)",
          "zero3": "DeepSpeed ZeRO-3", "fsdp_offload": "FSDP2 + CPU offload",
          "zero3_offload": "ZeRO-3 + CPU offload"}
PRECISIONS = ("bf16-mixed", "bf16")
DEEPSPEED_REDUCE_BUCKET = 5e8  # elements; DeepSpeed's reduce_bucket_size default
DEEPSPEED_PREFETCH = 5e7  # elements; stage3_prefetch_bucket_size default


def state_bytes(technique: str, counts: Counts, gpus: int, precision: str, fused_adamw: bool = False,
                gradient_as_bucket_view: bool = False) -> dict:
    """Bytes per GPU: parameters, optimizer (states incl. fp32 master), gradients (at the end of backward),
    gradients_held (the part allocated before backward starts), temporaries (optimizer step only) and cpu
    (host memory per GPU, the offload techniques only).

    Bytes per parameter (P trainable parameters, N GPUs; "bf16-mixed" is bf16 compute with fp32 master
    weights and fp32 Adam states, "bf16" is pure bf16 with bf16 Adam states):

    technique (implementation assumed)         parameters        gradients [held before backward]   optimizer  step temporaries
    ddp   DDP, torch.autocast on fp32 weights   2P (bf16 casts)   4P DDP buckets [all]               12P        4P .grad + 4P Adam
          (1 GPU: plain training, no DDP)                         4P [none]                                     4P Adam
    zero1 DeepSpeed ZeRO-1, bf16: true          2P                2P + bucket [none]                 12P/N      4P/N fp32 grad + 4P/N Adam
    zero2 DeepSpeed ZeRO-2, bf16: true          2P                2P/N + bucket [none]               12P/N      4P/N + 4P/N
    fsdp  FSDP2 fully_shard per decoder layer,  gathered units    4P/N + 6 bytes x one layer's       12P/N      4P/N Adam
          MixedPrecisionPolicy(bf16, fp32)                        unsharded grads [the layer part]
    zero3 DeepSpeed ZeRO-3, bf16: true          2P/N + gathered   2P/N + bucket [all]                12P/N      4P/N + 4P/N
    (pure bf16: weights, gradients, Adam states and the temporaries are all 2 bytes: 2P, 2P, 4P, 2P+2P)

    "gathered" is the bf16 copy of the units being computed: FSDP2 keeps the root unit (embeddings, final
    norm, lm_head) unsharded for the whole step and gathers ~2 decoder layers at a time (current and
    prefetched); ZeRO-3 holds the largest module plus a prefetched layer. "bucket" is DeepSpeed's gradient
    reduction buffer (reduce_bucket_size 5e8 elements, bf16: 0.93 GiB). "Adam" temporaries are torch.optim.AdamW's
    (foreach) sqrt(v) buffer. LoRA: the frozen base weights are bf16 (2 bytes, sharded by fsdp/zero3 only; 4-bit
    under QLoRA, with the largest quantised linear dequantised beside them); only the adapters have gradients and
    optimizer states.

    CPU offload, per GPU in host memory:
        fsdp_offload   FSDP2 fully_shard(offload_policy=CPUOffloadPolicy()): the fp32 parameter shards (4P/N),
                       their gradients (4P/N), Adam m, v (8P/N) and the step's sqrt(v) (4P/N) live on the CPU,
                       the step runs there; the GPU holds the gathered units, one layer's unsharded gradients and
                       the activations.
        zero3_offload  DeepSpeed ZeRO-3 offload_param + offload_optimizer (device: cpu, DeepSpeedCPUAdam in
                       place): bf16 parameter partitions (2P/N), fp32 master and Adam (12P/N) and fp32 gradients
                       (4P/N) on the CPU; the GPU holds the gathered modules, the reduce bucket and the activations.
    (pure bf16: 2-byte parameters, gradients, Adam states.) The frozen base of LoRA is offloaded with the rest.

    fused_adamw=True (torch.optim.AdamW(fused=True), the FSDP2 recipe's optimizer on GPUs) updates in place: the
    DDP and FSDP2 rows then have no sqrt(v) temporary. gradient_as_bucket_view=True (DDP's option of that name: the
    gradients are views into its buckets) drops the DDP row's 4P .grad temporary.
    """
    n, trainable = gpus, counts.trainable
    frozen = counts.frozen_bytes  # bf16, or 4-bit where quantised
    mixed = precision == "bf16-mixed"
    optimizer = (12 if mixed else 4) * trainable  # fp32 master + Adam m, v  |  bf16 m, v
    adam_temp = (4 if mixed else 2) * trainable  # foreach AdamW's sqrt(v)
    torch_adam_temp = 0 if fused_adamw else adam_temp  # AdamW(fused=True) updates in place (DDP, FSDP2)
    fp32_grad = 4 * trainable if mixed else 0  # DeepSpeed upcasts its bf16 gradient partition for the step
    bucket = 2 * DEEPSPEED_REDUCE_BUCKET  # DeepSpeed's bf16 reduce buffer, allocated at full size
    layer_trainable = counts.layer if not counts.frozen else trainable * counts.layer / max(counts.total, 1)
    dequantized = 2 * counts.largest_quantized_linear  # a 4-bit weight in bf16 for its matmul
    fsdp_gathered = 2 * counts.root + 2 * counts.layer_bytes  # root unit stays unsharded; current + prefetched layer
    zero3_gathered = (max(2 * counts.largest_root_module, counts.layer_bytes)
                      + min(2 * DEEPSPEED_PREFETCH, counts.layer_bytes))
    unsharded = (6 if mixed else 2) * layer_trainable  # a layer's bf16 grads (+ fp32 copy to reduce-scatter)
    if technique == "ddp":
        grad = (4 if mixed else 2) * trainable
        if n == 1:  # one GPU needs no DDP: no buckets, gradients appear during backward
            terms = {"parameters": 2 * trainable + frozen, "gradients": grad, "gradients_held": 0,
                     "optimizer": optimizer, "temporaries": torch_adam_temp}
        else:  # DDP's all-reduce buckets are allocated at wrap time; the .grad tensors beside them during backward,
            # unless they are views into the buckets (DDP(gradient_as_bucket_view=True))
            terms = {"parameters": 2 * trainable + frozen, "gradients": grad, "gradients_held": grad,
                     "optimizer": optimizer, "temporaries": (0 if gradient_as_bucket_view else grad) + torch_adam_temp}
    elif technique in ("zero1", "zero2"):
        grad = 2 * trainable / (n if technique == "zero2" else 1) + bucket
        terms = {"parameters": 2 * trainable + frozen, "gradients": grad, "gradients_held": 0,
                 "optimizer": optimizer / n, "temporaries": (fp32_grad + adam_temp) / n}
    elif technique == "fsdp":
        stored = (frozen + (0 if mixed else 2 * trainable)) / n  # mixed: the fp32 shards are the master weights
        terms = {"parameters": stored + fsdp_gathered, "gradients": (4 if mixed else 2) * trainable / n + unsharded,
                 "gradients_held": unsharded, "optimizer": optimizer / n, "temporaries": torch_adam_temp / n}
    elif technique == "zero3":
        grad = 2 * trainable / n + bucket  # both allocated when the engine is built
        terms = {"parameters": (2 * trainable + frozen) / n + zero3_gathered, "gradients": grad,
                 "gradients_held": grad, "optimizer": optimizer / n, "temporaries": (fp32_grad + adam_temp) / n}
    elif technique == "fsdp_offload":  # shards, their gradients and the optimizer on the CPU; the step runs there
        on_cpu = frozen + (4 + 4 + 8 if mixed else 2 + 2 + 4) * trainable + torch_adam_temp
        terms = {"parameters": fsdp_gathered, "gradients": unsharded, "gradients_held": unsharded,
                 "optimizer": 0, "temporaries": 0, "cpu": on_cpu / n}
    elif technique == "zero3_offload":  # bf16 partitions, fp32 master + Adam and fp32 gradients on the CPU
        on_cpu = frozen + (2 + 12 + 4 if mixed else 2 + 4 + 2) * trainable
        terms = {"parameters": zero3_gathered, "gradients": bucket, "gradients_held": bucket,
                 "optimizer": 0, "temporaries": 0, "cpu": on_cpu / n}
    else:
        raise ValueError(f"technique must be one of {TECHNIQUES + OFFLOAD_TECHNIQUES}, not {technique!r}")
    terms["parameters"] += dequantized
    return {"cpu": 0, **terms}
