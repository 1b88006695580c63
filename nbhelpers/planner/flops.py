"""FLOPs per token and the GPU's peak, for model FLOPs utilisation (MFU): one formula for the recipes and the
performance notebook.

    mfu = tokens_per_s_per_gpu * flops_per_token(model, seq_len) / peak_flops(device)
"""
from __future__ import annotations

# Dense bf16 tensor-core peak per GPU, as the vendor's data sheet states it (no sparsity).
PEAK_BF16_FLOPS = {"H100": 989e12, "H200": 989e12, "H800": 989e12, "A100": 312e12, "A800": 312e12, "L40S": 362e12}

FLOP_FORMULA = ("flops/token = 6 * N + 12 * L * H * S + 18 * L_lin * nv * dk * dv  (N: parameters used in matmuls "
                "= all parameters minus an untied input embedding, a mixture of experts' experts at top-k / experts of "
                "their size; L softmax-attention layers; H = attention heads * "
                "head_dim; S sequence length; L_lin linear-attention (Gated DeltaNet) layers of nv value heads and key/"
                "value head dims dk, dv, counted in the delta rule's recurrent form: read k.S, write the rank-1 update, "
                "read q.S, 2 dk dv each per head and token forward; forward + backward, no recompute counted; softmax "
                "attention counted as the full S x S, as PaLM does)")


def matmul_parameters(model) -> int:
    """Parameters that take part in a token's matmuls: every parameter, minus the input embedding unless it is
    tied to the output layer (a lookup costs no FLOPs; the tied matrix is counted once, for the lm_head). In a
    mixture of experts (GPT-OSS) a token passes through top-k of the experts: their weights count top-k / experts."""
    total = sum(p.numel() for p in model.parameters())
    embedding = model.get_input_embeddings().weight
    output = model.get_output_embeddings()
    tied = output is not None and output.weight is embedding
    experts = getattr(model.config, "num_local_experts", 0) or 0
    unused = 0
    if experts:
        share = model.config.num_experts_per_tok / experts
        unused = (1 - share) * sum(p.numel() for name, p in model.named_parameters() if ".experts." in name)
    return round((total if tied else total - embedding.numel()) - unused)


def flops_per_token(model, seq_len: int) -> float:
    config = model.config
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    types = getattr(config, "layer_types", None) or ["full_attention"] * config.num_hidden_layers
    linear = sum(kind == "linear_attention" for kind in types)  # Qwen3.5's Gated DeltaNet layers
    delta_rule = 18 * linear * (config.linear_num_value_heads * config.linear_key_head_dim
                                * config.linear_value_head_dim) if linear else 0
    return 6 * matmul_parameters(model) + 12 * (len(types) - linear) * heads * head_dim * seq_len + delta_rule


def peak_flops(device, override: float | None = None) -> float | None:
    """The bf16 dense peak of this GPU (FLOP/s), `override` if given, None on a CPU or an unknown GPU."""
    import torch

    if override:
        return float(override)
    if getattr(device, "type", "cpu") != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((flops for key, flops in PEAK_BF16_FLOPS.items() if key in name), None)
