"""The stand-ins carry the hub models' own chat templates, byte for byte (tests/standin_assets/chat_templates/README.md),
and TRL treats them as it treats the hub models: it swaps in its training template for assistant-only loss
where it has one, and refuses where it has none."""
from pathlib import Path

import pytest
import trl
from transformers import AutoTokenizer
from trl.chat_template_utils import get_training_chat_template

import standins
from nbhelpers.planner import model_configs

TRL_COPIES = Path(trl.__file__).parent / "chat_templates"
COPIED_FROM = {"gpt_oss.jinja": "gptoss.jinja", "llama_3_2.jinja": "llama3_2.jinja", "llama_3_1.jinja": "llama3_1.jinja",
               "qwen3.jinja": "qwen3.jinja", "qwen2_5.jinja": "qwen2_5.jinja",
               "qwen3_5.jinja": "qwen3_5_think.jinja",  # Qwen3.5-4B and larger think by default (TRL's README)
               "qwen3_8.jinja": "qwen3_8.jinja"}  # "as shipped by Qwen/Qwen3.8-27B"
WITH_HUB_TEMPLATE = [arch for arch in standins.ARCHS if model_configs.MODELS[arch].hub_id in standins.HUB_TEMPLATES]


@pytest.mark.parametrize("name", sorted(COPIED_FROM))
def test_recorded_template_is_trls_copy_of_the_hub_file(name):
    # TRL checks its copies weekly against the hub repos (scripts/check_chat_templates.py), byte for byte
    assert (standins.ASSETS / "chat_templates" / name).read_bytes() == (TRL_COPIES / COPIED_FROM[name]).read_bytes()
    assert set(standins.HUB_TEMPLATES.values()) == set(COPIED_FROM)


@pytest.mark.parametrize("arch", WITH_HUB_TEMPLATE)
def test_standin_carries_its_hub_models_template_byte_for_byte(arch, standin):
    loaded = AutoTokenizer.from_pretrained(standin(arch)).chat_template
    assert loaded == standins.hub_template(model_configs.MODELS[arch].hub_id)
    assert "{% generation %}" not in loaded and "{%- generation %}" not in loaded


@pytest.mark.parametrize("arch", ["gpt-oss-20b", "qwen3-8b", "qwen2.5-3b", "qwen3.5-27b", "qwen3.8-27b"])
def test_trl_swaps_in_its_training_template_for_assistant_only_loss(arch, standin):
    tokenizer = AutoTokenizer.from_pretrained(standin(arch))
    training = get_training_chat_template(tokenizer)
    assert training is not None and "generation %}" in training
    messages = [{"role": "user", "content": "What is 12 + 30?"}, {"role": "assistant", "content": "12 + 30 = 42."}]
    rendered = tokenizer.apply_chat_template(messages, chat_template=training, return_dict=True,
                                             return_assistant_tokens_mask=True)
    answer = [t for t, in_mask in zip(rendered["input_ids"], rendered["assistant_masks"]) if in_mask]
    assert "12 + 30 = 42." in tokenizer.decode(answer) and "What is" not in tokenizer.decode(answer)


@pytest.mark.parametrize("arch", ["llama-3.2-1b", "llama-3.1-8b"])
def test_trl_has_no_training_template_for_llama_3(arch, standin):
    # So the Llama notebook trains on whole conversations (TRL's default), as users of the hub model must.
    with pytest.raises(ValueError, match="patching is not supported for this template"):
        get_training_chat_template(AutoTokenizer.from_pretrained(standin(arch)))


@pytest.mark.parametrize("arch", WITH_HUB_TEMPLATE)
def test_generation_prompt_is_what_precedes_the_reply_in_a_whole_conversation(arch, standin):
    # so prompt/completion training and generation agree (TRL renders a completion after the prompt)
    tokenizer = AutoTokenizer.from_pretrained(standin(arch))
    messages = [{"role": "user", "content": "What is 12 + 30?"}, {"role": "assistant", "content": "12 + 30 = 42."}]
    prompt = tokenizer.apply_chat_template(messages[:1], tokenize=False, add_generation_prompt=True)
    whole = tokenizer.apply_chat_template(messages, tokenize=False)
    assert whole.startswith(prompt) and "12 + 30 = 42." in whole[len(prompt):]
