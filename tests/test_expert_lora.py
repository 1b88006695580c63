"""nbhelpers.training.expert_lora, which computes the 120B notebook's LoRA on the experts on the routed tokens
(issue 38): the same function as PEFT's W + s A B, so the same loss and gradients, and the same adapter when saved.
Tiny GPT-OSS-120B stand-in on the CPU, fp32; its GPU speed is benchmarks/gpu/gpt_oss.sh's `fsdp` and `fsdp_peft`."""
import copy
from types import SimpleNamespace

import pytest
import standins
import torch
from harness import REPO
from peft import LoraConfig, get_peft_model

from nbhelpers.training.expert_lora import lora_on_expert_activations
from notebook_code import notebook_cells


def loss_and_gradients(model, ids):
    model.zero_grad()
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    return loss.item(), {name: p.grad.clone() for name, p in model.named_parameters() if p.requires_grad}


# 32: the experts' rank 8 (the notebook's default); 8: rank 2, below grouped_mm's 16-byte rows, padded with zeros
@pytest.mark.parametrize("lora_r", [32, 8])
def test_lora_on_the_experts_activations_gives_peft_s_loss_and_gradients(lora_r):
    nb = notebook_cells(REPO / "notebooks/trl/fsdp_gpt_oss_120b.ipynb", "lora_config")
    model = standins.build("gpt-oss-120b", "tiny", device="cpu", seed=0, layers=2)
    model.config.use_cache = False
    peft_model = get_peft_model(model, nb["lora_config"](SimpleNamespace(lora_r=lora_r))).train()
    with torch.no_grad():  # PEFT starts B at zero, where any forward that ignores the adapter would pass
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.normal_(std=0.05)
    candidate = copy.deepcopy(peft_model)
    assert lora_on_expert_activations(candidate) == 2  # one experts module a layer, both its weights adapted
    ids = torch.randint(0, model.config.vocab_size, (2, 32), generator=torch.Generator().manual_seed(0))

    loss, gradients = loss_and_gradients(peft_model, ids)
    candidate_loss, candidate_gradients = loss_and_gradients(candidate, ids)
    assert candidate_loss == pytest.approx(loss, rel=1e-6)
    experts = [name for name in gradients if ".experts." in name]
    assert len(experts) == 8  # A and B of gate_up_proj and down_proj in each layer
    for name, gradient in gradients.items():
        torch.testing.assert_close(candidate_gradients[name], gradient, rtol=1e-4, atol=1e-6, msg=name)
    assert candidate.state_dict().keys() == peft_model.state_dict().keys()  # the adapter saves as PEFT's


def test_compiled_with_inductor_in_bf16_it_gives_the_eager_results():
    """On GPUs (bf16) Inductor handed grouped_mm a copy of B laid out as PEFT stores it, the experts' index last,
    which it refuses ("Invalid strides/sizes", 2026-12-06); the CPU's grouped_mm takes bf16 through the same path."""
    nb = notebook_cells(REPO / "notebooks/trl/fsdp_gpt_oss_120b.ipynb", "lora_config")
    model = standins.build("gpt-oss-120b", "tiny", device="cpu", seed=0, layers=1).to(torch.bfloat16)
    peft_model = get_peft_model(model, nb["lora_config"](SimpleNamespace(lora_r=32)))
    lora_on_expert_activations(peft_model)
    experts = peft_model.get_base_model().model.layers[0].mlp.experts  # the outermost of PEFT's wrappers
    hidden = torch.randn(24, model.config.hidden_size, dtype=torch.bfloat16, requires_grad=True)
    top_k_index = torch.randint(0, model.config.num_local_experts, (24, model.config.num_experts_per_tok))
    top_k_weights = torch.rand(24, model.config.num_experts_per_tok, dtype=torch.bfloat16)

    def output_and_input_gradient(forward):
        hidden.grad = None
        out = forward(hidden, top_k_index, top_k_weights)
        out.float().square().sum().backward()
        return out.detach(), hidden.grad.clone()

    eager = output_and_input_gradient(experts)
    compiled = output_and_input_gradient(torch.compile(experts, backend="inductor", fullgraph=False))
    torch._dynamo.reset()
    for got, expected in zip(compiled, eager):
        torch.testing.assert_close(got, expected, rtol=2e-2, atol=2e-2)


def test_lora_on_another_models_parameters_is_refused_with_what_to_do():
    model = standins.build("llama-3.2-1b", "tiny", device="cpu", seed=0, layers=1)
    peft_model = get_peft_model(model, LoraConfig(r=4, target_modules=[], target_parameters=["mlp.gate_proj.weight"]))
    with pytest.raises(TypeError, match=r"GPT-OSS's experts; Linear has LoRA on \['weight'\]: leave it to PEFT"):
        lora_on_expert_activations(peft_model)
