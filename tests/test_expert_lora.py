"""benchmarks/expert_lora.py, the candidate that computes the 120B notebook's LoRA on the experts on the routed tokens
(issue 38): the same function as PEFT's W + s A B, so the same loss and gradients, and the same adapter when saved.
Tiny GPT-OSS-120B stand-in on the CPU, fp32; its GPU speed is benchmarks/gpu/gpt_oss.sh's `fsdp_activations` stage."""
import copy
import sys
from types import SimpleNamespace

import pytest
import standins
import torch
from harness import REPO
from peft import get_peft_model

from notebook_code import notebook_cells


def loss_and_gradients(model, ids):
    model.zero_grad()
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    return loss.item(), {name: p.grad.clone() for name, p in model.named_parameters() if p.requires_grad}


def test_lora_on_the_experts_activations_gives_peft_s_loss_and_gradients():
    sys.path.insert(0, str(REPO / "benchmarks"))
    from expert_lora import lora_on_expert_activations

    nb = notebook_cells(REPO / "notebooks/trl/fsdp_gpt_oss_120b.ipynb", "lora_config")
    model = standins.build("gpt-oss-120b", "tiny", device="cpu", seed=0, layers=2)
    model.config.use_cache = False
    peft_model = get_peft_model(model, nb["lora_config"](SimpleNamespace(lora_r=32))).train()
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
