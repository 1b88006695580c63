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

The model is a name of nbhelpers.planner.model_configs.MODELS (the published configs, so it works offline), a hub
id, a local folder with config.json, a transformers config or a built model. It is built on the meta
device (shapes only, no memory). Per GPU and per technique the estimate is

    total = parameters + optimizer states
            + max(gradients held before backward + activations,   # peak at the start of backward
                  all gradients + optimizer-step temporaries)      # or peak in the optimizer step
            + allowance

Activations are freed layer by layer while gradients are produced, so the two sides of the max are the
memory at the start of backward and at the optimizer step; `peak_at` says which one wins.

Bytes per parameter (P trainable parameters, N GPUs; "bf16-mixed" is bf16 compute with fp32 master
weights and fp32 Adam states, "bf16" is pure bf16 with bf16 Adam states). As in the ZeRO paper, the
fp32 master weights are counted with the optimizer states (DDP and FSDP2 keep them as the module's own
fp32 weights and cast to bf16 on the fly):

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
(foreach) sqrt(v) buffer. LoRA: the frozen base weights are bf16 (2 bytes, sharded by fsdp/zero3 only);
only the adapters have gradients and optimizer states.

Activations (per GPU: micro_batch x seq_len tokens; every technique here is data parallel). This is the
per-layer count of Korthikanti et al., "Reducing Activation Recomputation in Large Transformer Models"
(2022), redone for the tensors Hugging Face decoders save for backward. Their GPT layer stores
s*b*h*(34 + 5*a*s/h) bytes: 11sbh + 5as^2b for attention, 19sbh for a 4h GeLU MLP, 4sbh for two
LayerNorms, dropout masks included. Per token and layer, in bytes (h hidden, a query heads, k kv heads,
d head dim, f MLP width, s sequence length), for a bf16 model:
  RMSNorm over w features    6w (+4 for 1/rms): an fp32 copy of the input (4w) and the bf16 normalised
                             value the weight's gradient needs (2w); Olmo/GPT-OSS norms multiply in fp32,
                             keeping 4w instead: 8w
  inputs of the linears      2h for the attention projections + 2h for the MLP (its norm's output)
  attention, SDPA/flash      2d(a + 2k) for q, k, v at their own head counts (GQA is native), 4a for the
                             logsumexp; no s^2 term, flash kernels do not store the attention matrix
  attention, eager           q, k and v repeated to a heads (6ad) and the softmax: 4as fp32 + 2as bf16
                             copy, or for GPT-OSS (with sinks) 2a(s+1) + 8a (max indices)
  attention output           2ad (the o_proj input; the same storage SDPA keeps)
  SwiGLU MLP                 8f: gate output, SiLU output, up output, their product (no dropout)
  GPT-OSS MoE (grouped_mm)   router 10k' + per routed expert (k' = top-k) 4h + 14f + 35: the gathered
                             input, gate/up output, clamp/sigmoid/GLU intermediates, down output, indices
  qk-norm                    Qwen3 per head over d, Olmo3 over the full q and k width (RMSNorm above)
Under torch.autocast on fp32 weights (DDP bf16-mixed, full fine-tune) the residual stream is fp32: norms
keep 4w, and every linear saves its own bf16 cast of its input (5 casts of 2h per layer instead of 2).
These match the bytes autograd saves (tests/test_plan.py counts them with saved-tensor hooks).
The loss head adds, per token: the final norm, the lm_head input and 12*vocab bytes: transformers upcasts
the logits to fp32 for the cross-entropy, and at the start of backward the saved log-softmax (4V), its
gradient (4V) and the logits' gradient (4V) coexist with every layer's activations. For vocabularies of
128k-200k tokens this is often the largest single term. A chunked loss (chunked_loss=True: TRL's SFTTrainer, whose
fused LM head computes the log-probabilities tile by tile, never the whole logits) keeps instead the targets, the
log-normaliser and the entropy: 16 bytes per token (its fp32 tile, 4,096 tokens by a slice of the vocabulary, is
tens of MB once: ignored).
Full activation checkpointing keeps each layer's input (2h, or 4h fp32 under autocast) plus one layer
recomputed during backward; the loss head is not checkpointed. Selective checkpointing (every_n_layers=k, as
transformers' gradient_checkpointing_enable and torchtitan's "every k-th layer" name it) checkpoints layers 0, k,
2k, ... and keeps the others' activations whole.

Qwen3.5 (qwen3_5_text: 3 Gated DeltaNet layers for each gated full-attention layer) is counted layer by layer
from transformers 5.17's code. Its RMSNorms scale by (1 + weight) in fp32 (8w + 4), and both kinds of layer
share the norms, the MLP (8f, its input 2h) and the mixer's input (2h). In bytes per token:
  full attention (SDPA)     qk-norms (8d + 4)(a + k); SDPA's q, k, v, output and logsumexp 2d(2a + 2k) + 4a; the
                            sigmoid output gate keeps its sigmoid and the attention output (4ad); o_proj's input
                            2ad. Rotary embedding saves only cos/sin, once per forward (ignored, < 0.5 %).
  Gated DeltaNet, PyTorch   (transformers' fallback when flash-linear-attention is missing or not usable) with
  fallback                  nk key / nv value heads of dk / dv, conv width K, C = 2 nk dk + nv dv channels,
                            chunks of c = 64 tokens, r = the sequence padded to whole chunks over its length:
                              causal conv: its input 2C and its output for the SiLU 2C (S + K - 1)/S
                              gates: sigmoid beta 2nv, the decay's softplus input and output 8nv
                              fp32 q and k before their L2 norm and their 1/norm (heads repeated to nv): 8 nv dk + 8nv
                              per padded token (x r): five c x c fp32 matrices per head (decays, k.k and q.k
                              products, the triangular system, the intra-chunk attention) 20 nv c; six fp32
                              copies of q/k at dk (normalised, scaled, decayed, k*beta, the solved k) 24 nv dk;
                              three of v (padded value, solved value, each chunk's corrected value) 12 nv dv;
                              the recurrent state entering each chunk 4 nv dk dv / c (the recurrent state:
                              16 KB per head per chunk at dk = dv = 128); beta and three decay exponentials 16nv
                              gated RMSNorm: three fp32 (input, gate, SiLU) 12 nv dv, two bf16 4 nv dv, 1/rms 4nv;
                              out_proj's input 2 nv dv
  Gated DeltaNet, kernels   (flash-linear-attention 0.6 chunk_gated_delta_rule + causal-conv1d; counted from
                            their save_for_backward, not measured here): the conv keeps its input only (2C,
                            SiLU fused); the rule keeps L2-normalised bf16 q and k (4 nv dk), a contiguous bf16
                            v (2 nv dv), their fp32 1/norm (8nv), the cumulated fp32 decay (4nv) and the bf16
                            c-wide WY matrix A (2 nv c); it recomputes the states in backward. Gates, gated
                            norm and out_proj as above.
With sequence packing the fallback pads each sample, not the row, to whole chunks (up to 63 tokens more per
sample); the planner assumes one sample per row. Under DDP's autocast the hybrid layers are counted as in bf16
plus each linear's own bf16 cast of its input (within 10 % of what autograd saves; the rule's per-chunk casts
are not itemised). The formulas match autograd's saved bytes on the tiny stand-in (tests/test_plan.py).

QLoRA (quantization="nf4", bitsandbytes 4-bit as the Unsloth and Axolotl notebooks load): the frozen
weights of the decoder layers' linears take 0.516 bytes per parameter (4-bit codes, an 8-bit absmax per 64
weights and an fp32 scale per 256 absmaxes: double quantisation); embeddings, norms, lm_head, conv and MoE
expert tensors stay bf16. Each 4-bit linear is dequantised to bf16 for its matmul: 2 bytes x the largest
quantised linear are added while one is in use.

CPU offload (two more rows; recommended only when nothing fits on the GPUs alone). Per GPU in host memory:
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
`cpu_memory_gib` (per node, with `gpus_per_node`) decides whether the host can hold it; None: not checked,
only stated.

Allowance: 1.5 GiB (CUDA context, cuBLAS and NCCL workspaces, not seen by torch's allocator) plus 10 %
of the estimate (allocator fragmentation: reserved above allocated).

Validated against measured peaks on 2x H200 in benchmarks/results/planner/ (see benchmarks/gpu/planner.md).
"""
from __future__ import annotations

import argparse
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from nbhelpers.planner.flops import PEAK_BF16_FLOPS
from nbhelpers.planner.time_to_finish import FRAMEWORKS, time_to_finish, tokens_to_train

GIB = 2**30
TECHNIQUES = ("ddp", "zero1", "zero2", "fsdp", "zero3")  # everything on the GPUs
OFFLOAD_TECHNIQUES = ("fsdp_offload", "zero3_offload")  # states in CPU memory
LABELS = {"ddp": "DDP", "zero1": "DeepSpeed ZeRO-1", "zero2": "DeepSpeed ZeRO-2", "fsdp": "FSDP2 (ZeRO-3)",
          "zero3": "DeepSpeed ZeRO-3", "fsdp_offload": "FSDP2 + CPU offload",
          "zero3_offload": "ZeRO-3 + CPU offload"}
QUANTIZATIONS = ("nf4",)
NF4_BYTES = 0.5 + 1 / 64 + 4 / (64 * 256)  # 4-bit code + 8-bit absmax per 64 + fp32 scale per 256 absmaxes
LINEAR_ATTENTION_KERNELS = ("torch", "fla")
DELTA_RULE_CHUNK = 64  # transformers' torch_chunk_gated_delta_rule chunk_size (and fla's)
PRECISIONS = ("bf16-mixed", "bf16")
CONTEXT_GIB = 1.5  # CUDA context + cuBLAS/NCCL workspaces: outside torch's allocator
# Compiled decoder layers (torch.compile of each layer) keep a share of what eager autograd saves: Inductor's partitioner
# recomputes the pointwise chains (norms, the experts' clamped SwiGLU) in the backward and saves mostly what matmuls,
# attention and the routing need. Measured, (model_type, "lora" or "full") -> share of the eager count per layer;
# where nothing was measured the eager count stands (an upper bound). GPT-OSS-20B, LoRA r=8 on the attention, flex
# attention, packed rows of 4 x 2,048, one H100, 2026-12-07: 115.5 k of the 285.9 k bytes a token and layer that eager
# saves (the peak of the run without checkpointing less the planner's other terms; the runs with micro-batches of 2,
# every 2nd layer and every layer checkpointed then came within 1 %, 1 % and 5 %: benchmarks/README.md).
COMPILED_LAYER_SHARE = {("gpt_oss", "lora"): 0.40}
FRAGMENTATION = 0.10  # reserved above allocated
DEEPSPEED_REDUCE_BUCKET = 5e8  # elements; DeepSpeed's reduce_bucket_size default
DEEPSPEED_PREFETCH = 5e7  # elements; stage3_prefetch_bucket_size default
LORA_ALL_LINEAR = "all-linear"


# --------------------------------------------------------------------------------------------------
# The model: built on the meta device, parameters counted
# --------------------------------------------------------------------------------------------------
def load_model(model) -> tuple[str, torch.nn.Module]:
    """(name, model on the meta device) from a stand-in name, local folder, hub id, config or built model."""
    from transformers import AutoConfig, AutoModelForCausalLM, PretrainedConfig

    from nbhelpers.planner import model_configs

    if isinstance(model, torch.nn.Module):
        return getattr(model.config, "name_or_path", "") or type(model).__name__, model
    if isinstance(model, PretrainedConfig):
        name, config = getattr(model, "name_or_path", "") or model.model_type, model
    elif not isinstance(model, (str, Path)):
        raise TypeError(f"model must be a stand-in name, hub id, folder, transformers config or model, not {type(model).__name__}")
    elif str(model) in model_configs.MODELS:
        name, config = str(model), model_configs.config(str(model))
    elif Path(model).is_dir():
        if not (Path(model) / "config.json").exists():
            raise ValueError(f"{model} is a folder without config.json; point at a model folder (config.json is enough)")
        name, config = str(model), AutoConfig.from_pretrained(model)
    else:
        try:
            name, config = str(model), AutoConfig.from_pretrained(model)
        except Exception as error:  # offline, unknown id, gated repo: all end here
            like = [name for name in model_configs.MODELS if name in str(model).lower()]
            hint = (f"use the offline copy of its published config: plan({like[0]!r}, ...)" if like else
                    f"published configs known offline: {', '.join(model_configs.MODELS)}")
            raise ValueError(f"cannot load the config of {model!r} ({type(error).__name__}: {str(error)[:160]}). "
                             f"No model hub here? {hint}") from None
    with torch.device("meta"):
        return name, AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)


def decoder_layers(model) -> torch.nn.ModuleList:
    depth = model.config.num_hidden_layers
    for module in model.modules():
        if isinstance(module, torch.nn.ModuleList) and len(module) == depth:
            return module
    raise ValueError(f"{type(model).__name__}: no list of {depth} decoder layers found")


def lora_parameters(module: torch.nn.Module, rank: int, targets) -> int:
    """Adapter parameters LoRA adds to `module`: rank*(in+out) per targeted linear, rank*E*(in+out) per 3-D
    expert tensor (peft `target_parameters`). targets: "all-linear" or names (last name part or a suffix)."""
    count = 0
    for name, sub in module.named_modules():
        if isinstance(sub, torch.nn.Linear) and not name.endswith("lm_head") and (
                targets == LORA_ALL_LINEAR or any(name == t or name.endswith("." + t) for t in targets)):
            count += rank * (sub.in_features + sub.out_features)
    if targets != LORA_ALL_LINEAR:
        for name, parameter in module.named_parameters():
            if parameter.ndim == 3 and any(name == t or name.endswith("." + t) for t in targets):
                experts, fan_in, fan_out = parameter.shape
                count += rank * experts * (fan_in + fan_out)
    return count


@dataclass
class Counts:
    total: int  # unique parameters (tied embeddings once); MoE: every expert
    trainable: int  # total for a full fine-tune, the adapters for LoRA
    frozen: int  # the base weights under LoRA, else 0
    layer: int  # parameters of the largest decoder layer (a sharding unit)
    root: int  # everything outside the decoder layers (embeddings, final norm, lm_head)
    largest_root_module: int  # the largest of those modules (embedding or lm_head)
    quantized: int = 0  # frozen parameters stored in 4 bits (QLoRA: the decoder layers' linear weights)
    layer_quantized: int = 0  # of those, in the largest decoder layer
    largest_quantized_linear: int = 0  # the largest 4-bit weight (dequantised to bf16 for its matmul)

    @property
    def frozen_bytes(self) -> float:
        return 2 * (self.frozen - self.quantized) + NF4_BYTES * self.quantized

    @property
    def layer_bytes(self) -> float:
        """The largest decoder layer as stored for compute: bf16, 4-bit where quantised."""
        return 2 * (self.layer - self.layer_quantized) + NF4_BYTES * self.layer_quantized


def _linear_weights(block: torch.nn.Module) -> list[int]:
    return [m.weight.numel() for m in block.modules() if isinstance(m, torch.nn.Linear)]


def count_parameters(model, lora_rank: int | None = None, lora_targets=LORA_ALL_LINEAR,
                     quantization: str | None = None) -> Counts:
    layers = decoder_layers(model)
    total = sum(p.numel() for p in model.parameters())
    sizes = [sum(p.numel() for p in block.parameters()) for block in layers]
    layer = max(sizes)
    in_layers = {id(p) for p in layers.parameters()}
    root_modules = [sum(p.numel() for p in m.parameters(recurse=False) if id(p) not in in_layers)
                    for m in model.modules()]
    root = total - sum(p.numel() for p in layers.parameters())
    trainable, frozen = total, 0
    if lora_rank:
        if isinstance(lora_targets, str) and lora_targets != LORA_ALL_LINEAR:
            lora_targets = [lora_targets]
        trainable, frozen = lora_parameters(model, lora_rank, lora_targets), total
        if trainable == 0:
            names = sorted({n.rsplit(".", 1)[-1] for n, m in layers[0].named_modules() if isinstance(m, torch.nn.Linear)})
            raise ValueError(f"LoRA targets {lora_targets!r} match no linear layer or expert tensor; "
                             f"the decoder layers' linears are {names}")
    counts = Counts(total, trainable, frozen, layer, root, max(root_modules))
    if quantization:
        linears = [_linear_weights(block) for block in layers]
        counts.quantized = sum(sum(w) for w in linears)
        counts.layer_quantized = sum(linears[sizes.index(layer)])
        counts.largest_quantized_linear = max(max(w) for w in linears)
    return counts


# --------------------------------------------------------------------------------------------------
# Activations (formula and its derivation: module docstring)
# --------------------------------------------------------------------------------------------------
def activation_bytes_per_token(config, seq_len: int, attention: str, fp32_residual: bool = False,
                               linear_attention: str = "torch", chunked_loss: bool = False) -> dict:
    """Bytes saved for backward per token: {"layers": each decoder layer in order, "layer": the largest,
    "head": final norm + loss head at its peak, "checkpoint": what a checkpointed layer keeps}.
    linear_attention: "torch" or "fla", the Gated DeltaNet implementation (hybrid models only)."""
    model_type = config.model_type
    h, a = config.hidden_size, config.num_attention_heads
    k = getattr(config, "num_key_value_heads", None) or a
    d = getattr(config, "head_dim", None) or h // a
    f, vocab = config.intermediate_size, config.vocab_size
    fp32_norms = fp32_residual or model_type in ("olmo2", "olmo3", "gpt_oss", "qwen3_5_text")  # fp32 normalised

    def norm(width, vectors=1):  # fp32 input copy + normalised value for the weight's grad + 1/rms
        return (4 + (4 if fp32_norms else 2)) * width + 4 * vectors

    head = norm(h) + 2 * h + (16 if chunked_loss else 12 * vocab)
    checkpoint = (4 if fp32_residual else 2) * h
    if "linear_attention" in (getattr(config, "layer_types", None) or []):
        per_type = _hybrid_layer_bytes(config, seq_len, attention, fp32_residual, linear_attention, norm)
        layers = [per_type[t] for t in config.layer_types]
        return {"layers": layers, "layer": max(layers), "head": head, "checkpoint": checkpoint}
    moe = getattr(config, "num_local_experts", 0) or 0
    top_k = getattr(config, "num_experts_per_tok", 0) or 0
    layer = 2 * norm(h)
    layer += 2 * h * (5 if fp32_residual and not moe else 2)  # inputs of the linears: a bf16 cast each under autocast
    if model_type == "qwen3":  # per-head RMSNorm on q and k
        layer += norm(d) * (a + k)
    elif model_type in ("olmo2", "olmo3"):  # RMSNorm over the full q and k widths
        layer += norm(a * d) + norm(k * d)
    if attention == "eager":
        layer += 6 * a * d  # q and k, v repeated to every query head
        layer += 2 * a * (seq_len + 1) + 8 * a if model_type == "gpt_oss" else 6 * a * seq_len
    else:
        layer += 2 * d * (a + 2 * k) + 4 * a
        window = getattr(config, "sliding_window", None)
        if window and seq_len > window and getattr(config, "use_sliding_window", True):  # SDPA gets a mask
            layer += 2 * seq_len * _sliding_fraction(config)
    layer += 2 * a * d  # attention output, the o_proj input
    layer += 10 * top_k + top_k * (4 * h + 14 * f + 35) if moe else 8 * f
    return {"layers": [layer] * config.num_hidden_layers, "layer": layer, "head": head, "checkpoint": checkpoint}


def _hybrid_layer_bytes(config, seq_len, attention, fp32_residual, linear_attention, norm) -> dict:
    """Qwen3.5's two kinds of decoder layer, bytes per token (derivation: module docstring)."""
    if config.model_type != "qwen3_5_text":
        raise ValueError(f"linear-attention layers are counted for Qwen3.5 (qwen3_5_text) only, not {config.model_type}")
    if attention == "eager":
        raise ValueError("Qwen3.5 is planned with SDPA or flash attention (attention='sdpa'), not eager")
    if linear_attention not in LINEAR_ATTENTION_KERNELS:
        raise ValueError(f"linear_attention must be one of {LINEAR_ATTENTION_KERNELS}, not {linear_attention!r}")
    h, a, k, f = config.hidden_size, config.num_attention_heads, config.num_key_value_heads, config.intermediate_size
    d = config.head_dim
    nk, nv = config.linear_num_key_heads, config.linear_num_value_heads
    dk, dv, width = config.linear_key_head_dim, config.linear_value_head_dim, config.linear_conv_kernel_dim
    channels, c = 2 * nk * dk + nv * dv, DELTA_RULE_CHUNK
    shared = 2 * norm(h) + 2 * h + 8 * f + 2 * h  # two norms, the MLP and its input, the mixer's input
    full = shared + norm(d) * (a + k) + 2 * d * (2 * a + 2 * k) + 4 * a + 4 * a * d + 2 * a * d
    gates = 2 * nv + 8 * nv  # sigmoid(b), softplus(a + dt_bias) in and out
    gated_norm = 12 * nv * dv + 4 * nv * dv + 4 * nv + 2 * nv * dv  # ... and out_proj's input
    if linear_attention == "torch":
        padded = -(-seq_len // c) * c / seq_len
        conv = 2 * channels + 2 * channels * (seq_len + width - 1) / seq_len
        rule = 8 * nv * dk + 8 * nv + padded * (
            20 * nv * c + 24 * nv * dk + 12 * nv * dv + 4 * nv * dk * dv / c + 16 * nv)
    else:  # causal-conv1d keeps its input; fla keeps contiguous copies of q, k (normalised) and v
        conv = 2 * channels
        rule = 4 * nv * dk + 2 * nv * dv + 8 * nv + 4 * nv + 2 * nv * c
    linear = shared + conv + gates + rule + gated_norm
    if fp32_residual:  # autocast: each linear casts its fp32 input (q, k, v, gate/up | qkv, z, b, a, gate/up)
        full, linear = full + 6 * h, linear + 8 * h
    return {"full_attention": full, "linear_attention": linear}


def _sliding_fraction(config) -> float:
    types = getattr(config, "layer_types", None)
    return sum(t == "sliding_attention" for t in types) / len(types) if types else 1.0


def activation_bytes(config, seq_len: int, micro_batch: int, checkpointing: bool, attention: str,
                     fp32_residual: bool = False, linear_attention: str = "torch", chunked_loss: bool = False,
                     every_n_layers: int = 1, compiled_share: float = 1.0) -> int:
    """compiled_share: what compiled layers keep of the eager count (COMPILED_LAYER_SHARE), 1.0 eager."""
    per_token = activation_bytes_per_token(config, seq_len, attention, fp32_residual, linear_attention, chunked_loss)
    layers = [size * compiled_share for size in per_token["layers"]]
    checkpointed = [checkpointing and i % every_n_layers == 0 for i in range(len(layers))]
    kept = sum(size for size, inside in zip(layers, checkpointed) if not inside)
    if any(checkpointed):  # the checkpointed layers' inputs, then one of them recomputed while the head is gone
        per = kept + sum(checkpointed) * per_token["checkpoint"] + max(per_token["head"], max(layers))
    else:
        per = kept + per_token["head"]
    return int(per * seq_len * micro_batch)


# --------------------------------------------------------------------------------------------------
# Parameters, gradients, optimizer states per technique (table: module docstring)
# --------------------------------------------------------------------------------------------------
def state_bytes(technique: str, counts: Counts, gpus: int, precision: str, fused_adamw: bool = False,
                gradient_as_bucket_view: bool = False) -> dict:
    """Bytes per GPU: parameters, optimizer (states incl. fp32 master), gradients (at the end of backward),
    gradients_held (the part allocated before backward starts), temporaries (optimizer step only) and cpu
    (host memory per GPU, the offload techniques only)."""
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


# --------------------------------------------------------------------------------------------------
# The plan
# --------------------------------------------------------------------------------------------------
@dataclass
class Estimate:
    technique: str
    parameters: float  # GiB per GPU, each term
    gradients: float
    optimizer: float
    activations: float
    temporaries: float  # optimizer step only: never alive together with the activations
    allowance: float
    total: float
    fits: bool  # on the GPU, and (offload) in the host memory when cpu_memory_gib is given
    gradients_held: float  # the part of `gradients` already allocated when backward starts
    peak_at: str  # "backward" (activations) or "optimizer step" (gradients + temporaries)
    cpu: float = 0.0  # GiB of host memory per GPU (offload techniques)

    @property
    def allocated(self) -> float:
        """What torch.cuda.max_memory_allocated should show: the total without the allowance."""
        return self.total - self.allowance

    def at_peak(self) -> dict:
        """The terms alive at the peak, in GiB; they add up to `total`."""
        backward = self.peak_at == "backward"
        return {"parameters": self.parameters, "optimizer": self.optimizer,
                "gradients": self.gradients_held if backward else self.gradients,
                "activations": self.activations if backward else 0.0,
                "step temporaries": 0.0 if backward else self.temporaries, "allowance": self.allowance}


@dataclass
class Plan:
    model: str
    parameters: int
    trainable: int
    gpus: int
    gpu_memory_gib: float
    precision: str
    fine_tune: str  # "full", "LoRA r=..." or "QLoRA r=... (nf4)"
    seq_len: int
    micro_batch: int
    checkpointing: bool
    attention: str
    estimates: list[Estimate]  # TECHNIQUES: everything on the GPUs
    recommended: str | None  # a key of TECHNIQUES, or None when none fits
    advice: str
    suggestions: list[str] = field(default_factory=list)
    offload: str | None = None  # when nothing fits on the GPUs: the OFFLOAD_TECHNIQUES key that fits, if any
    gpus_per_node: int = 1
    cpu_memory_gib: float | None = None  # per node; None: host memory not checked
    linear_attention: str | None = None  # Gated DeltaNet implementation counted (hybrid models)
    offload_estimates: list[Estimate] = field(default_factory=list)  # OFFLOAD_TECHNIQUES
    fused_adamw: bool = False
    gradient_as_bucket_view: bool = False
    chunked_loss: bool = False
    every_n_layers: int = 1  # with checkpointing: every k-th decoder layer is checkpointed

    def estimate(self, technique: str) -> Estimate:
        return next(e for e in self.estimates + self.offload_estimates if e.technique == technique)

    def fits(self, technique: str) -> bool:
        return self.estimate(technique).fits

    def rows(self) -> list[dict]:
        """One dict per technique (for pandas), with the plan's inputs."""
        head = {"model": self.model, "gpus": self.gpus, "gpu_memory_gib": self.gpu_memory_gib,
                "fine_tune": self.fine_tune, "precision": self.precision, "seq_len": self.seq_len,
                "micro_batch": self.micro_batch, "checkpointing": self.checkpointing,
                "every_n_layers": self.every_n_layers}
        return [{**head, **asdict(e), "recommended": e.technique in (self.recommended, self.offload)}
                for e in self.estimates + self.offload_estimates]

    def to_dict(self) -> dict:
        """Everything, JSON-ready: the inputs, each technique's terms in GiB per GPU, the answer."""
        return {**{k: v for k, v in asdict(self).items() if k not in ("estimates", "offload_estimates")},
                "estimates": {e.technique: {**asdict(e), "allocated": e.allocated}
                              for e in self.estimates + self.offload_estimates}}

    def table(self) -> str:
        lines = [f"{self.model}: {self.parameters / 1e9:.2f} B parameters, {self.fine_tune} fine-tune "
                 f"({self.trainable / 1e9:.3g} B trainable), {self.precision}",
                 f"{self.gpus} GPU{'s' if self.gpus > 1 else ''} x {self.gpu_memory_gib:g} GiB, {self.micro_batch} x "
                 f"{self.seq_len} tokens per GPU, {checkpointing_words(self.checkpointing, self.every_n_layers)}, "
                 f"{self.attention} attention" + (f", Gated DeltaNet: {self.linear_attention}"
                                                  if self.linear_attention else ""),
                 f"{'GiB per GPU':20s} {'params':>7s} {'grads':>7s} {'optim':>7s} {'activ':>7s} {'step tmp':>8s} "
                 f"{'allow':>7s} {'total':>7s} {'CPU':>7s}  fits  peak at"]
        for e in self.estimates + self.offload_estimates:
            label = "1 GPU, no DDP" if e.technique == "ddp" and self.gpus == 1 else LABELS[e.technique]
            lines.append(f"{label:20s} {e.parameters:7.1f} {e.gradients:7.1f} {e.optimizer:7.1f} "
                         f"{e.activations:7.1f} {e.temporaries:8.1f} {e.allowance:7.1f} {e.total:7.1f} "
                         f"{e.cpu:7.1f}  {'yes ' if e.fits else 'no  '}  {e.peak_at}"
                         f"{'  <- recommended' if e.technique in (self.recommended, self.offload) else ''}")
        lines.append(self.advice)
        lines += [f"  - {s}" for s in self.suggestions]
        return "\n".join(lines)

    __repr__ = __str__ = table


def checkpointing_words(checkpointing: bool, every_n_layers: int = 1, name: str = "activation checkpointing") -> str:
    if not checkpointing:
        return "no checkpointing"
    if every_n_layers == 1:
        return name
    n = every_n_layers
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{name} of every {n}{suffix} decoder layer"


def plan(model, gpus: int = 1, gpu_memory_gib: float = 80.0, precision: str = "bf16-mixed",
         lora_rank: int | None = None, lora_targets=LORA_ALL_LINEAR, seq_len: int = 2048, micro_batch: int = 1,
         checkpointing: bool = False, attention: str | None = None, suggest: bool = True,
         quantization: str | None = None, cpu_memory_gib: float | None = None, gpus_per_node: int | None = None,
         linear_attention: str = "torch", fused_adamw: bool = False, gradient_as_bucket_view: bool = False,
         chunked_loss: bool = False, every_n_layers: int = 1, torch_compile: bool = False) -> Plan:
    """Estimate per-GPU memory of each technique and pick one (see the module docstring for the model).

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
        terms = state_bytes(technique, counts, gpus, precision, fused_adamw, gradient_as_bucket_view)
        fp32_residual = technique == "ddp" and precision == "bf16-mixed" and not lora_rank  # autocast on fp32 weights
        terms["activations"] = activation_bytes(config, seq_len, micro_batch, checkpointing, attention, fp32_residual,
                                                linear_attention, chunked_loss, every_n_layers, compiled_share)
        backward = terms["gradients_held"] + terms["activations"]
        step = terms["gradients"] + terms["temporaries"]
        allocated = terms["parameters"] + terms["optimizer"] + max(backward, step)
        allowance = CONTEXT_GIB * GIB + FRAGMENTATION * allocated
        total = (allocated + allowance) / GIB
        host_fits = cpu_memory_gib is None or terms["cpu"] * gpus_per_node / GIB <= cpu_memory_gib
        estimates.append(Estimate(technique, **{key: value / GIB for key, value in terms.items()},
                                  allowance=allowance / GIB, total=total, fits=total <= gpu_memory_gib and host_fits,
                                  peak_at="backward" if backward >= step else "optimizer step"))

    fitting = {e.technique for e in estimates if e.fits}
    order = ["ddp"] if gpus == 1 else ["ddp", "zero2", "zero1", "fsdp", "zero3"]  # sharding needs >= 2 GPUs
    recommended = next((t for t in order if t in fitting), None)
    offload = None if recommended else next((t for t in OFFLOAD_TECHNIQUES if t in fitting), None)
    by_name = {e.technique: e for e in estimates}
    advice = _advice(recommended, offload, fitting, gpus, by_name, gpu_memory_gib, gpus_per_node, cpu_memory_gib)
    fine_tune = "full" if not lora_rank else f"QLoRA r={lora_rank} ({quantization})" if quantization else f"LoRA r={lora_rank}"
    result = Plan(name, counts.total, counts.trainable, gpus, gpu_memory_gib, precision, fine_tune, seq_len,
                  micro_batch, checkpointing, attention, estimates[:len(TECHNIQUES)], recommended, advice,
                  offload=offload, gpus_per_node=gpus_per_node, cpu_memory_gib=cpu_memory_gib,
                  linear_attention=linear_attention if hybrid else None,
                  offload_estimates=estimates[len(TECHNIQUES):], fused_adamw=fused_adamw,
                  gradient_as_bucket_view=gradient_as_bucket_view, chunked_loss=chunked_loss,
                  every_n_layers=every_n_layers if checkpointing else 1)
    if suggest and recommended is None:
        result.suggestions = _suggestions((name, meta_model), result, lora_targets, quantization)
    return result


def _advice(recommended, offload, fitting, gpus, estimates, memory, gpus_per_node, cpu_memory) -> str:
    if recommended is None:
        if offload:
            e = estimates[offload]
            host = e.cpu * gpus_per_node
            checked = f"of {cpu_memory:g} GiB" if cpu_memory is not None else "(host memory not checked: pass it)"
            return (f"fits on the GPUs only with CPU offload: {LABELS[offload]}, {e.total:.1f} of {memory:g} GiB per "
                    f"GPU and {host:.0f} GiB {checked} of CPU memory per node ({gpus_per_node} GPUs), slower steps. "
                    f"Without offload nothing fits {gpus} x {memory:g} GiB; also:")
        return f"fits nowhere: no technique fits {gpus} x {memory:g} GiB; use LoRA, more GPUs or CPU offload:"
    spare = memory - estimates[recommended].total
    why = {"ddp": "the whole training state fits on every GPU, so plain data parallelism (fastest, simplest)"
                  if gpus > 1 else "it fits one GPU: plain single-GPU training, nothing to distribute",
           "zero2": "DDP does not fit; sharding the optimizer states and gradients (ZeRO-2) does, at DDP's "
                    "communication cost" + (" (ZeRO-1 fits too)" if "zero1" in fitting else ""),
           "zero1": "DDP does not fit; sharding the optimizer states (ZeRO-1) does",
           "fsdp": "only sharding the parameters too fits: FSDP2"
                   + (" (or DeepSpeed ZeRO-3, which fits as well)" if "zero3" in fitting else ""),
           "zero3": "only DeepSpeed ZeRO-3 fits (FSDP2's larger gathered units do not)"}[recommended]
    label = "single GPU (no DDP)" if gpus == 1 else LABELS[recommended]
    return f"recommended: {label}, {estimates[recommended].total:.1f} of {memory:g} GiB " \
           f"({spare:.1f} GiB spare): {why}."


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


def build_parser() -> argparse.ArgumentParser:
    from nbhelpers.planner import model_configs

    class Formatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
        pass  # defaults after each flag's help; the epilog as written (names are not split at hyphens)

    known = "\n".join(f"  {name:14s} {spec.hub_id}" for name, spec in model_configs.MODELS.items())
    parser = argparse.ArgumentParser(
        prog="python -m nbhelpers.planner", description=__doc__.split("\n")[0], formatter_class=Formatter,
        epilog=f"known architectures (offline: their published configs):\n{known}\n"
               "How each term is counted: python -c 'import nbhelpers.planner.plan; help(nbhelpers.planner.plan)'")
    parser.add_argument("model", help="a known architecture (below), a hub id or a local folder with config.json")
    parser.add_argument("--gpus", type=int, default=1, help="GPUs in all (data-parallel ranks)")
    parser.add_argument("--gpus-per-node", type=int, default=None,
                        help="GPUs per node, for the host memory of CPU offload; None: min(gpus, 8)")
    parser.add_argument("--gpu-memory", type=float, default=79.6,
                        help="GiB per GPU as the GPU reports it (80 GB H100: 79.6, 141 GB H200: 140.4)")
    parser.add_argument("--cpu-memory", type=float, default=None,
                        help="GiB of host memory per node, to check CPU offload; None: not checked, only stated")
    parser.add_argument("--precision", choices=PRECISIONS, default="bf16-mixed",
                        help="bf16-mixed: bf16 compute, fp32 master weights and Adam states; bf16: all 2-byte")
    parser.add_argument("--lora-rank", type=int, default=None, help="LoRA rank; None: full fine-tune")
    parser.add_argument("--lora-targets", nargs="+", default=[LORA_ALL_LINEAR],
                        help="module names LoRA adapts (last name part), or all-linear")
    parser.add_argument("--quantization", choices=QUANTIZATIONS, default=None,
                        help="QLoRA: the frozen base in bitsandbytes 4-bit (needs --lora-rank)")
    parser.add_argument("--seq-len", type=int, default=2048, help="tokens per sequence")
    parser.add_argument("--micro-batch", type=int, default=1, help="sequences per GPU per forward")
    parser.add_argument("--checkpointing", action="store_true",
                        help="activation checkpointing of every decoder layer")
    parser.add_argument("--attention", choices=("sdpa", "eager"), default=None,
                        help="attention implementation; None: what transformers picks for the model")
    parser.add_argument("--linear-attention", choices=LINEAR_ATTENTION_KERNELS, default="torch",
                        help="hybrid models (Qwen3.5): Gated DeltaNet as transformers' PyTorch fallback or "
                             "flash-linear-attention + causal-conv1d")
    parser.add_argument("--fused-adamw", action="store_true",
                        help="torch.optim.AdamW(fused=True), as the FSDP2 recipe on GPUs: no sqrt(v) step temporary")
    parser.add_argument("--chunked-loss", action="store_true",
                        help="the loss never holds the whole logits (TRL's SFTTrainer): 16 bytes a token, not 12 x vocab")
    time = parser.add_argument_group("time to finish (nbhelpers.planner.time_to_finish), with the recommended technique")
    time.add_argument("--gpu", default="H100", choices=list(PEAK_BF16_FLOPS),
                      help="the GPU: its dense bf16 peak and the speeds measured on it")
    time.add_argument("--steps", dest="max_steps", type=int, default=None,
                      help="max_steps: optimizer steps of gpus x micro-batch x accumulation sequences of seq-len tokens")
    time.add_argument("--gradient-accumulation-steps", type=int, default=1, help="micro-steps per optimizer step")
    time.add_argument("--dataset-tokens", type=int, default=None,
                      help="without --steps: the training data's tokens, trained num-train-epochs times")
    time.add_argument("--num-train-epochs", type=float, default=1, help="passes over --dataset-tokens")
    time.add_argument("--torch-compile", action=argparse.BooleanOptionalAction, default=None,
                      help="torch.compile on or off, for the nearest measured runs; unset: either")
    time.add_argument("--framework", choices=FRAMEWORKS, default=None,
                      help="what trains (pytorch: a training loop of its own, as the recipes), for the measured runs")
    time.add_argument("--price-per-gpu-hour", type=float, default=None, help="to state the cost too")
    parser.add_argument("--json", action="store_true", help="print the plan as JSON (every term, GiB per GPU)")
    return parser


def main(argv=None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    targets = args.lora_targets[0] if args.lora_targets == [LORA_ALL_LINEAR] else args.lora_targets
    try:
        built = load_model(args.model)
        result = plan(built, gpus=args.gpus, gpu_memory_gib=args.gpu_memory, precision=args.precision,
                      lora_rank=args.lora_rank, lora_targets=targets, seq_len=args.seq_len,
                      micro_batch=args.micro_batch, checkpointing=args.checkpointing, attention=args.attention,
                      quantization=args.quantization, cpu_memory_gib=args.cpu_memory,
                      gpus_per_node=args.gpus_per_node, linear_attention=args.linear_attention,
                      fused_adamw=args.fused_adamw, chunked_loss=args.chunked_loss)
    except ValueError as error:
        parser.error(str(error))
    technique = result.recommended or result.offload
    took = technique and time_to_finish(
        built, technique, gpus=args.gpus, gpu=args.gpu, seq_len=args.seq_len, micro_batch=args.micro_batch,
        gradient_accumulation_steps=args.gradient_accumulation_steps, lora_rank=args.lora_rank,
        checkpointing=args.checkpointing, torch_compile=args.torch_compile, framework=args.framework,
        price_per_gpu_hour=args.price_per_gpu_hour,
        tokens=tokens_to_train(max_steps=args.max_steps, per_device_train_batch_size=args.micro_batch,
                               gradient_accumulation_steps=args.gradient_accumulation_steps, gpus=args.gpus,
                               seq_len=args.seq_len, dataset_tokens=args.dataset_tokens,
                               num_train_epochs=args.num_train_epochs))
    said = f"time to finish with {LABELS[technique]}: {took}" if took else "time to finish: nothing fits, so no time"
    if args.json:
        print(json.dumps({**result.to_dict(), "time_to_finish": took.to_dict() if took else None}, indent=2))
    else:
        print(f"{result}\n{said}")

