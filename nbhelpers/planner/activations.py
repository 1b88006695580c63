"""Activations: the bytes each GPU keeps for backward, per token, layer by layer (every technique here is data
parallel: per GPU, micro_batch x seq_len tokens).

This is the per-layer count of Korthikanti et al., "Reducing Activation Recomputation in Large Transformer Models"
(2022), redone for the tensors Hugging Face decoders save for backward. Their GPT layer stores
s*b*h*(34 + 5*a*s/h) bytes: 11sbh + 5as^2b for attention, 19sbh for a 4h GeLU MLP, 4sbh for two
LayerNorms, dropout masks included. The formulas stand next to the code that uses them:
- `activation_bytes_per_token`: a decoder layer of the dense and MoE models, and the loss head;
- `_hybrid_layer_bytes`: Qwen3.5's two kinds of layer (gated full attention, Gated DeltaNet);
- `activation_bytes`: the layers and the head together, with activation checkpointing (all layers, or every k-th)
  and compiled layers (COMPILED_LAYER_SHARE).
These match the bytes autograd saves (tests/test_plan.py counts them with saved-tensor hooks).
"""
from __future__ import annotations

LINEAR_ATTENTION_KERNELS = ("torch", "fla")
DELTA_RULE_CHUNK = 64  # transformers' torch_chunk_gated_delta_rule chunk_size (and fla's)
# Compiled decoder layers (torch.compile of each layer) keep a share of what eager autograd saves: Inductor's partitioner
# recomputes the pointwise chains (norms, the experts' clamped SwiGLU) in the backward and saves mostly what matmuls,
# attention and the routing need. Measured, (model_type, "lora" or "full") -> share of the eager count per layer;
# where nothing was measured the eager count stands (an upper bound). GPT-OSS-20B, LoRA r=8 on the attention, flex
# attention, packed rows of 4 x 2,048, one H100, 2026-12-07: 115.5 k of the 285.9 k bytes a token and layer that eager
# saves (the peak of the run without checkpointing less the planner's other terms; the runs with micro-batches of 2,
# every 2nd layer and every layer checkpointed then came within 1 %, 1 % and 5 %: benchmarks/README.md).
COMPILED_LAYER_SHARE = {("gpt_oss", "lora"): 0.40}


def activation_bytes_per_token(config, seq_len: int, attention: str, fp32_residual: bool = False,
                               linear_attention: str = "torch", chunked_loss: bool = False) -> dict:
    """Bytes saved for backward per token: {"layers": each decoder layer in order, "layer": the largest,
    "head": final norm + loss head at its peak, "checkpoint": what a checkpointed layer keeps}.
    linear_attention: "torch" or "fla", the Gated DeltaNet implementation (hybrid models only).

    Per token and layer, in bytes (h hidden, a query heads, k kv heads, d head dim, f MLP width, s sequence length),
    for a bf16 model:
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
    Under torch.autocast on fp32 weights (DDP bf16-mixed, full fine-tune: fp32_residual) the residual stream is fp32:
    norms keep 4w, and every linear saves its own bf16 cast of its input (5 casts of 2h per layer instead of 2).
    The loss head adds, per token: the final norm, the lm_head input and 12*vocab bytes: transformers upcasts
    the logits to fp32 for the cross-entropy, and at the start of backward the saved log-softmax (4V), its
    gradient (4V) and the logits' gradient (4V) coexist with every layer's activations. For vocabularies of
    128k-200k tokens this is often the largest single term. A chunked loss (chunked_loss=True: TRL's SFTTrainer, whose
    fused LM head computes the log-probabilities tile by tile, never the whole logits) keeps instead the targets, the
    log-normaliser and the entropy: 16 bytes per token (its fp32 tile, 4,096 tokens by a slice of the vocabulary, is
    tens of MB once: ignored). A checkpointed layer keeps its input: 2h, or 4h fp32 under autocast.
    """
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
    """Qwen3.5's two kinds of decoder layer, bytes per token: {"full_attention": ..., "linear_attention": ...}.

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
    """
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
    """Bytes per GPU kept for backward at its start: every layer's activations (activation_bytes_per_token) and the
    loss head's, for micro_batch x seq_len tokens. compiled_share: what compiled layers keep of the eager count
    (COMPILED_LAYER_SHARE), 1.0 eager.

    Full activation checkpointing keeps each layer's input (2h, or 4h fp32 under autocast) plus one layer
    recomputed during backward; the loss head is not checkpointed. Selective checkpointing (every_n_layers=k, as
    transformers' gradient_checkpointing_enable and torchtitan's "every k-th layer" name it) checkpoints layers 0, k,
    2k, ... and keeps the others' activations whole.
    """
    per_token = activation_bytes_per_token(config, seq_len, attention, fp32_residual, linear_attention, chunked_loss)
    layers = [size * compiled_share for size in per_token["layers"]]
    checkpointed = [checkpointing and i % every_n_layers == 0 for i in range(len(layers))]
    kept = sum(size for size, inside in zip(layers, checkpointed) if not inside)
    if any(checkpointed):  # the checkpointed layers' inputs, then one of them recomputed while the head is gone
        per = kept + sum(checkpointed) * per_token["checkpoint"] + max(per_token["head"], max(layers))
    else:
        per = kept + per_token["head"]
    return int(per * seq_len * micro_batch)
