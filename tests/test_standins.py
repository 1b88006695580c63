"""The offline stand-ins: tiny ones load offline through the Auto classes and train; full ones have the
published sizes; every family's chat template renders and masks exactly the assistant's tokens."""
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

import standins
from nbhelpers.planner import model_configs

REPO = Path(__file__).resolve().parents[1]
ARCHS = list(standins.ARCHS)
ONE_ARCH_PER_FAMILY = {spec.family: arch for arch, spec in reversed(standins.ARCHS.items())}


@pytest.mark.parametrize("arch", ARCHS)
def test_tiny_standin_loads_offline_and_runs_forward_backward(arch, standin):
    path = standin(arch)
    assert os.environ["HF_HUB_OFFLINE"] == "1"
    model = AutoModelForCausalLM.from_pretrained(path)
    tokenizer = AutoTokenizer.from_pretrained(path)
    assert type(model.config).__name__ == model_configs.MODELS[arch].config_class
    assert model.config.vocab_size == len(tokenizer)
    messages = [{"role": "user", "content": "What is 12 + 30?"}, {"role": "assistant", "content": "12 + 30 = 42."}]
    input_ids = torch.tensor([tokenizer.apply_chat_template(messages, return_dict=True)["input_ids"]])
    loss = model(input_ids=input_ids, labels=input_ids).loss
    loss.backward()
    assert abs(loss.item() - math.log(len(tokenizer))) < 1.0  # random init predicts about uniformly
    gradients = [p.grad for p in model.parameters() if p.requires_grad]
    assert all(g is not None and torch.isfinite(g).all() for g in gradients)
    size = sum(f.stat().st_size for f in Path(path).iterdir())
    assert size < 5 * 2**20, f"tiny stand-in is {size / 2**20:.1f} MiB"


@pytest.mark.parametrize("arch", ARCHS)
def test_tiny_config_keeps_the_architectures_special_features(arch):
    tiny, full = standins.config(arch, "tiny"), standins.config(arch, "full")
    assert type(tiny) is type(full)
    for field in ("rope_parameters", "tie_word_embeddings", "hidden_act", "attention_bias", "use_sliding_window"):
        assert getattr(tiny, field, None) == getattr(full, field, None), field
    assert set(getattr(tiny, "layer_types", None) or []) == set(getattr(full, "layer_types", None) or [])
    if arch.startswith("gpt-oss"):
        assert tiny.num_local_experts > tiny.num_experts_per_tok > 1
        model = standins.build(arch, "tiny")
        assert all(layer.self_attn.sinks.numel() == tiny.num_attention_heads for layer in model.model.layers)
    if arch.startswith(("qwen3", "olmo")):
        layers = standins.build(arch, "tiny").model.layers
        layer = next(layer for layer in layers if hasattr(layer, "self_attn"))  # Qwen3.5 starts with linear attention
        assert hasattr(layer.self_attn, "q_norm") and hasattr(layer.self_attn, "k_norm")
    if arch.startswith("qwen3.5"):
        linear = standins.build(arch, "tiny").model.layers[0].linear_attn
        assert linear.conv_kernel_size == full.linear_conv_kernel_dim
        assert tiny.rope_parameters["partial_rotary_factor"] == 0.25  # (rope_parameters are equal: above)


@pytest.mark.parametrize("arch", ARCHS)
def test_full_size_parameter_count_matches_the_published_one(arch):
    model = standins.build(arch, "full")  # meta device: shapes only
    assert all(p.device.type == "meta" for p in model.parameters())
    built, published = standins.count_parameters(model), model_configs.MODELS[arch].parameters
    assert abs(built / published - 1) < 0.02, f"{arch}: built {built / 1e9:.3f} B, published {published / 1e9:.2f} B"


def _assistant_spans(tokenizer, messages):
    rendered = tokenizer.apply_chat_template(messages, return_dict=True, return_assistant_tokens_mask=True)
    spans, current = [], []
    for token, in_mask in zip(rendered["input_ids"], rendered["assistant_masks"]):
        if in_mask:
            current.append(token)
        elif current:
            spans.append(tokenizer.decode(current))
            current = []
    if current:
        spans.append(tokenizer.decode(current))
    return spans


CONVERSATION = [
    {"role": "system", "content": "reasoning language: French"},
    {"role": "user", "content": "What is 12 + 30?"},
    {"role": "assistant", "content": "12 + 30 = 42."},
    {"role": "user", "content": "Multiply that by 2."},
    {"role": "assistant", "content": "42 × 2 = 84.", "thinking": "Je calcule 42 × 2 = 84.",
     "reasoning_content": "Je calcule 42 × 2 = 84."},
]
# What the assistant writes after each generation prompt, for the families whose stand-ins use the templates
# written in standins.py; the others carry their hub template (tests/test_chat_templates.py).
EXPECTED_ASSISTANT_TEXT = {
    "olmo3": ["12 + 30 = 42.<|im_end|>", "42 × 2 = 84.<|im_end|>"],
}


@pytest.mark.parametrize("family", sorted(EXPECTED_ASSISTANT_TEXT))
def test_chat_template_masks_exactly_the_assistant_tokens(family, standin):
    tokenizer = AutoTokenizer.from_pretrained(standin(ONE_ARCH_PER_FAMILY[family]))
    assert _assistant_spans(tokenizer, CONVERSATION) == EXPECTED_ASSISTANT_TEXT[family]
    # The generation prompt is exactly what precedes the assistant's text in a full rendering, so
    # prompt/completion training and generation agree.
    prompt = tokenizer.apply_chat_template(CONVERSATION[:-1], tokenize=False, add_generation_prompt=True)
    full = tokenizer.apply_chat_template(CONVERSATION, tokenize=False)
    assert full.startswith(prompt + EXPECTED_ASSISTANT_TEXT[family][-1])


@pytest.mark.parametrize("arch", ARCHS)
def test_tokenizer_special_tokens_are_set_as_the_family_sets_them(arch, standin):
    tokenizer = AutoTokenizer.from_pretrained(standin(arch))
    spec = standins.ARCHS[arch]
    assert (tokenizer.bos_token, tokenizer.eos_token, tokenizer.pad_token) == (spec.bos, spec.eos, spec.pad)
    generation = json.loads((Path(standin(arch)) / "generation_config.json").read_text())
    eos = generation["eos_token_id"]
    assert tokenizer.convert_ids_to_tokens(eos if isinstance(eos, list) else [eos]) == list(spec.generation_eos)
    ids = tokenizer("Hello world")["input_ids"]
    assert (ids[0] == tokenizer.bos_token_id) == standins.FAMILIES[spec.family].prepend_bos
    assert tokenizer.decode(ids, skip_special_tokens=True) == "Hello world"


def test_qwen3_generation_prompt_without_thinking_has_an_empty_think_block(standin):
    tokenizer = AutoTokenizer.from_pretrained(standin("qwen3-8b"))
    prompt = tokenizer.apply_chat_template(CONVERSATION[1:2], tokenize=False, add_generation_prompt=True,
                                           enable_thinking=False)
    assert prompt.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_qwen3_5_generation_prompt_thinks_by_default_and_can_skip_it(standin):
    tokenizer = AutoTokenizer.from_pretrained(standin("qwen3.5-27b"))
    prompt = tokenizer.apply_chat_template(CONVERSATION[1:2], tokenize=False, add_generation_prompt=True)
    assert prompt == "<|im_start|>user\nWhat is 12 + 30?<|im_end|>\n<|im_start|>assistant\n<think>\n"
    quiet = tokenizer.apply_chat_template(CONVERSATION[1:2], tokenize=False, add_generation_prompt=True,
                                          enable_thinking=False)
    assert quiet.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    # A reply without reasoning after the last question still gets its (empty) think block; no default system.
    text = tokenizer.apply_chat_template(CONVERSATION[1:3], tokenize=False)
    assert text == quiet + "12 + 30 = 42.<|im_end|>\n"


def qwen3_5_27b_parameters_by_hand() -> int:
    """Qwen3.5-27B's text model counted from its published dimensions (transformers' Qwen3_5ForCausalLM layout)."""
    h, vocab, mlp = 5120, 248320, 17408
    heads, kv_heads, head = 24, 4, 256
    k_heads, v_heads, k_dim, v_dim, conv = 16, 48, 128, 128, 4
    keys, values = k_heads * k_dim, v_heads * v_dim  # 2048, 6144
    linear_mixer = (h * (2 * keys + values)  # in_proj_qkv
                    + h * values + 2 * h * v_heads  # in_proj_z (the output gate), in_proj_b (beta), in_proj_a (decay)
                    + (2 * keys + values) * conv  # depthwise causal conv over q, k, v
                    + 2 * v_heads + v_dim  # dt_bias, A_log, the gated RMSNorm over one value head
                    + values * h)  # out_proj
    full_mixer = h * 2 * heads * head + 2 * h * kv_heads * head + heads * head * h + 2 * head  # q (+ gate), k, v, o, qk-norms
    per_layer = 3 * h * mlp + 2 * h  # SwiGLU MLP, two RMSNorms
    return 2 * vocab * h + h + 48 * (linear_mixer + per_layer) + 16 * (full_mixer + per_layer)


def test_qwen3_5_27b_has_the_published_shape_and_parameter_count():
    config = standins.config("qwen3.5-27b", "full")
    assert (config.hidden_size, config.num_hidden_layers, config.vocab_size) == (5120, 64, 248320)
    assert config.layer_types == (["linear_attention"] * 3 + ["full_attention"]) * 16
    built = standins.count_parameters(standins.build("qwen3.5-27b", "full"))
    assert built == qwen3_5_27b_parameters_by_hand() == 26_895_998_464
    assert abs(built / 27e9 - 1) < 0.01  # the model card: "Number of Parameters: 27B"
    tiny = standins.config("qwen3.5-27b", "tiny")
    assert tiny.layer_types == ["linear_attention"] * 3 + ["full_attention"]
    assert tiny.linear_num_value_heads // tiny.linear_num_key_heads == 3 == 48 // 16


def test_random_weight_writer_output_loads_with_no_missing_keys(tmp_path):
    # The writer `make(size="full", weights=True)` uses on the GPU machine, exercised on tiny shapes with
    # small shards: tied and untied embeddings, MoE experts, sinks and norms all load.
    for arch in ("gpt-oss-20b", "qwen3-0.6b", "qwen3.5-27b"):
        model = standins.build(arch, "tiny")
        out = tmp_path / arch
        out.mkdir()
        model.config.save_pretrained(out)
        standins.write_random_weights(model, out, device="cpu", shard_bytes=200_000)
        assert (out / "model.safetensors.index.json").exists()
        loaded, info = AutoModelForCausalLM.from_pretrained(out, output_loading_info=True)
        assert not any(info.values()), info
        with safe_open(next(out.glob("*.safetensors")), "pt") as shard:
            assert all(shard.get_tensor(name).dtype == torch.bfloat16 for name in shard.keys())
        norm = loaded.model.norm.weight  # Qwen3.5's norms scale by 1 + weight: initialised to 0
        assert torch.equal(norm, torch.zeros_like(norm) if arch == "qwen3.5-27b" else torch.ones_like(norm))
        assert 0.015 < loaded.model.embed_tokens.weight.float().std().item() < 0.025
        ids = torch.randint(0, loaded.config.vocab_size, (1, 32), generator=torch.Generator().manual_seed(0))
        with torch.no_grad():  # random weights of the right scale predict about uniformly
            loss = loaded.float()(input_ids=ids, labels=ids).loss.item()
        assert abs(loss - math.log(loaded.config.vocab_size)) < 1.0, (arch, loss)


def test_cli_makes_a_full_size_config_without_weights(tmp_path):
    out = tmp_path / "llama"
    subprocess.run([sys.executable, "tests/standins.py", "make", "llama-3.2-1b", "--size", "full",
                    "--out", str(out)], check=True, cwd=REPO,
                   capture_output=True, timeout=120)
    config = AutoConfig.from_pretrained(out)
    assert (config.hidden_size, config.num_hidden_layers, config.vocab_size) == (2048, 16, 128256)
    assert not list(out.glob("*.safetensors"))
    assert len(AutoTokenizer.from_pretrained(out)) < config.vocab_size  # the published vocabulary, padded
    assert json.loads((out / "standin.json").read_text())["stands_in_for"] == "meta-llama/Llama-3.2-1B-Instruct"


def test_mxfp4_gpt_oss_stand_in_stores_its_experts_as_the_hub_does_and_dequantises_on_load(tmp_path):
    from transformers import Mxfp4Config

    out = standins.make("gpt-oss-20b", "tiny", out=tmp_path / "gpt-oss", mxfp4=True)
    config = AutoConfig.from_pretrained(out)
    assert config.quantization_config == standins.MXFP4_QUANTIZATION
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        names = set(f.keys())
        blocks = f.get_tensor("model.layers.0.mlp.experts.gate_up_proj_blocks")
        scales = f.get_tensor("model.layers.0.mlp.experts.gate_up_proj_scales")
    assert "model.layers.0.mlp.experts.gate_up_proj" not in names  # no bf16 copy of the experts
    experts, hidden, width = config.num_local_experts, config.hidden_size, 2 * config.intermediate_size
    assert blocks.dtype == scales.dtype == torch.uint8
    assert tuple(blocks.shape) == (experts, width, hidden // 32, 16) and tuple(scales.shape) == (experts, width, hidden // 32)

    model, info = AutoModelForCausalLM.from_pretrained(out, quantization_config=Mxfp4Config(dequantize=True),
                                                       output_loading_info=True)
    assert not any(info.values()), info
    loaded = model.model.layers[0].mlp.experts.gate_up_proj
    # Decoded by hand: two E2M1 codes per byte (low nibble first) times 2 ** (scale - 127), blocks of 32
    # along the input dimension, stored transposed.
    table = torch.tensor([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6])
    codes = torch.stack([blocks & 0x0F, blocks >> 4], dim=-1).long()
    values = table[codes].reshape(experts, width, hidden // 32, 32) * torch.exp2(scales.float() - 127)[..., None]
    expected = values.reshape(experts, width, hidden).transpose(1, 2)
    assert torch.equal(loaded.float(), expected)
    assert 0.015 < loaded.float().std().item() < 0.03  # about the spread of the bf16 stand-in's init


def test_mxfp4_is_refused_for_a_model_whose_checkpoints_have_none(tmp_path):
    with pytest.raises(ValueError, match="leave mxfp4 off"):
        standins.make("llama-3.2-1b", "tiny", out=tmp_path / "llama", mxfp4=True)
