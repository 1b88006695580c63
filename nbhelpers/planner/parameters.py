"""The model the memory planner counts: built on the meta device (shapes only, no memory), its parameters counted.

The model is a name of nbhelpers.planner.model_configs.MODELS (the published configs, so it works offline), a hub
id, a local folder with config.json, a transformers config or a built model (`load_model`). `count_parameters` gives
what the other terms are made of (`Counts`): every unique parameter (tied embeddings once; MoE: every expert), the
largest decoder layer (a sharding unit), what lies outside the layers (embeddings, final norm, lm_head).

LoRA: only the adapters are trainable (rank x (in + out) per targeted linear, rank x experts x (in + out) per 3-D
expert tensor, as peft's `target_parameters`); the frozen base weights are bf16 (2 bytes).

QLoRA (quantization="nf4", bitsandbytes 4-bit as the Unsloth and Axolotl notebooks load): the frozen
weights of the decoder layers' linears take 0.516 bytes per parameter (NF4_BYTES: 4-bit codes, an 8-bit absmax per 64
weights and an fp32 scale per 256 absmaxes: double quantisation); embeddings, norms, lm_head, conv and MoE
expert tensors stay bf16. Each 4-bit linear is dequantised to bf16 for its matmul: 2 bytes x the largest
quantised linear are added while one is in use (nbhelpers.planner.techniques).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

QUANTIZATIONS = ("nf4",)
NF4_BYTES = 0.5 + 1 / 64 + 4 / (64 * 256)  # 4-bit code + 8-bit absmax per 64 + fp32 scale per 256 absmaxes
LORA_ALL_LINEAR = "all-linear"


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
