"""LoRA on GPT-OSS's experts applied to the activations, a candidate for issue 38 (measured by gpt_oss_speed.py).

PEFT reaches the experts' 3-D weights (`LoraConfig(target_parameters=...)`) through a parametrization: every forward
builds W + s A B for all of a layer's experts (one `baddbmm` the size of the expert stack), and the backward builds a
gradient of that size, whatever the number of tokens. On one H100 that was 30 % of the 120B's step (2026-12-06). The
same function, computed on the routed tokens instead, is x W + s (x A) B: two grouped matmuls of rank r per weight,
next to the grouped matmul of W itself. The adapter's parameters, their names and `save_pretrained` are PEFT's: only
the forward of the experts changes, so the saved adapter loads and merges as before.

    from expert_lora import lora_on_expert_activations
    lora_on_expert_activations(peft_model)      # after get_peft_model / SFTTrainer(peft_config=...), before training
"""
from __future__ import annotations

import types

import torch
from peft.tuners.lora.layer import ParamWrapper
from transformers.integrations.moe import _grouped_mm  # the model's own dispatch: torch's grouped_mm, else a fallback


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
        experts.lora_wrappers = by_parameter  # a plain dict: not made submodules of the experts they wrap
        experts.forward = types.MethodType(_experts_forward, experts)
        module.forward = experts.forward  # past the wrappers: no parametrization, no W + s A B
        changed += 1
    return changed


def _experts_forward(self, hidden_states, top_k_index, top_k_weights):
    """GPT-OSS's experts on the routed tokens, grouped by expert; LoRA as x W + s (x A) B."""
    top_k = top_k_index.shape[-1]
    expert_ids, order = top_k_index.reshape(-1).sort()  # the token-expert pairs, grouped by expert
    tokens = order // top_k
    # histc, not bincount: a fixed output size, which torch.compile keeps in one graph
    counts = torch.histc(expert_ids.float(), bins=self.num_experts, min=0, max=self.num_experts - 1)
    offsets = counts.cumsum(0).to(torch.int32)

    def project(x, name):
        out = _grouped_mm(x, getattr(self, name), offsets) + getattr(self, f"{name}_bias")[expert_ids]
        wrapper = self.lora_wrappers.get(name)
        if wrapper is None or wrapper.disable_adapters or wrapper.merged:
            return out
        [adapter] = [a for a in wrapper.active_adapters if a in wrapper.lora_A]
        lhs, rhs, scaling = wrapper.get_delta_factors(adapter)  # (experts, in, r), (experts, r, out): views of A, B
        # contiguous: grouped_mm takes each expert's matrix row- or column-major, not B's view (experts last)
        return out + scaling * _grouped_mm(_grouped_mm(x, lhs.contiguous(), offsets), rhs.contiguous(), offsets)

    routed = project(self._apply_gate(project(hidden_states[tokens], "gate_up_proj")), "down_proj")
    routed = routed * top_k_weights.reshape(-1)[order, None]
    return torch.zeros_like(hidden_states).index_add_(0, tokens, routed.to(hidden_states.dtype))
