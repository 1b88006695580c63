"""GPT-OSS's experts with PEFT LoRA, computed on the routed tokens instead of on the weights.

PEFT reaches the experts' 3-D weights (`LoraConfig(target_parameters=...)`) through a parametrization: every forward
builds W + s A B for all of a layer's experts (one `baddbmm` the size of the expert stack), and the backward a
gradient of that size, whatever the number of tokens (30 % of the 120B's step on one H100, 2026-12-06). It also
registers a new class on every call, which keeps torch.compile from compiling the layer whole. The same function on
the routed tokens is x W + s (x A) B: two grouped matmuls of rank r per weight, beside the grouped matmul of W
itself. The adapter's parameters, their names and `save_pretrained` stay PEFT's: only the experts' forward changes,
so the saved adapter loads and merges as before.

    trainer = SFTTrainer(..., peft_config=LoraConfig(..., target_parameters=[...experts...]))
    lora_on_expert_activations(trainer.model)      # before training; returns how many experts modules changed
"""
from __future__ import annotations

import types

import torch
import torch.nn.functional as F
from peft.tuners.lora.layer import ParamWrapper
from transformers.integrations.moe import _grouped_mm  # the model's own dispatch: torch's grouped_mm, else a fallback
from transformers.models.gpt_oss.modeling_gpt_oss import GptOssExperts


def lora_on_expert_activations(model: torch.nn.Module) -> int:
    """Make each experts module of `model` whose weights carry PEFT LoRA (`target_parameters`) apply it to the
    routed activations; returns how many modules changed. Only for training with one active adapter."""
    wrappers = [m for m in model.modules() if isinstance(m, ParamWrapper)]
    nested = {id(m.base_layer) for m in wrappers}  # PEFT nests one wrapper per targeted parameter
    changed = 0
    for module in (m for m in wrappers if id(m) not in nested):
        by_parameter, experts = {}, module
        while isinstance(experts, ParamWrapper):
            by_parameter[experts.parameter_name] = experts
            experts = experts.base_layer
        if not isinstance(experts, GptOssExperts):
            raise TypeError(f"lora_on_expert_activations computes GPT-OSS's experts; {type(experts).__name__} has "
                            f"LoRA on {sorted(by_parameter)}: leave it to PEFT (do not call this)")
        experts.lora_wrappers = by_parameter  # a plain dict: not made submodules of the experts they wrap
        experts.forward = types.MethodType(_experts_forward, experts)
        module.forward = experts.__call__  # past the wrappers (no W + s A B), through the experts' own hooks
        changed += 1
    return changed


def _experts_forward(self, hidden_states, top_k_index, top_k_weights):
    """GPT-OSS's experts on the routed tokens, grouped by expert; LoRA as x W + s (x A) B."""
    factors = _lora_factors(self.lora_wrappers)
    top_k = top_k_index.shape[-1]
    expert_ids, order = top_k_index.reshape(-1).sort()  # the token-expert pairs, grouped by expert
    tokens = order // top_k
    # histc, not bincount: a fixed output size, which torch.compile keeps in one graph; as in Transformers, ints on
    # CUDA and floats on the CPU (the inputs each supports with deterministic algorithms)
    ids = expert_ids.float() if expert_ids.device.type == "cpu" else expert_ids.int()
    counts = torch.histc(ids, bins=self.num_experts, min=0, max=self.num_experts - 1)
    offsets = counts.cumsum(0).to(torch.int32)

    def project(x, name):
        out = _grouped_mm(x, getattr(self, name), offsets) + getattr(self, f"{name}_bias")[expert_ids]
        if name not in factors:
            return out
        lhs, rhs = factors[name]
        return out + _grouped_mm(_grouped_mm(x, lhs, offsets), rhs, offsets)

    routed = project(self._apply_gate(project(hidden_states[tokens], "gate_up_proj")), "down_proj")
    routed = routed * top_k_weights.reshape(-1)[order, None]
    return torch.zeros_like(hidden_states).index_add_(0, tokens, routed.to(hidden_states.dtype))


# Eager, also in a compiled layer (one graph break): grouped_mm takes each expert's matrix in one block, row- or
# column-major, and Inductor lays a copy of B out as B is stored, the experts' index last (torch 2.11: "Invalid
# strides/sizes").
@torch.compiler.disable
def _lora_factors(wrappers: dict) -> dict:
    """{weight name: (A, s B)} of the active adapter, (experts, in, r) and (experts, r, out), each expert's matrix
    contiguous; r padded with zeros to rows of 16 bytes (grouped_mm's minimum: r = 8 in bf16), the same product."""
    factors = {}
    for name, wrapper in wrappers.items():
        if wrapper.disable_adapters or wrapper.merged:
            continue
        active = [a for a in wrapper.active_adapters if a in wrapper.lora_A]
        if len(active) != 1:
            raise ValueError(f"lora_on_expert_activations trains one adapter at a time; active on {name}: {active}")
        [adapter] = active
        lhs, rhs, scaling = wrapper.get_delta_factors(adapter)  # views of PEFT's A and B
        pad = -lhs.shape[-1] % (16 // lhs.element_size())
        factors[name] = F.pad(lhs, (0, pad)).contiguous(), F.pad(rhs, (0, 0, 0, pad)).contiguous() * scaling
    return factors
