"""The published configurations of the cookbook's models, offline: what the memory planner (nbhelpers.planner.plan)
builds on the meta device when it is given a name instead of a hub id or a folder.

    from nbhelpers.planner.model_configs import MODELS, config
    config("gpt-oss-120b")               # a transformers GptOssConfig with the published dimensions
    config("qwen3.8-27b", layers=12)     # the full width, fewer layers

Each entry: the transformers config class, the hub id it stands for, the parameter count its model card states,
and the config fields of the hub's config.json that set the shapes (sources in the comments).
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Published:
    config_class: str  # a transformers config class name
    hub_id: str
    parameters: float  # as the model card / release states it
    fields: dict  # the config fields that set the shapes


def _llama3_rope(factor: float) -> dict:
    return {"rope_type": "llama3", "rope_theta": 500000.0, "factor": factor, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}


GPT_OSS_ROPE = {"rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                "truncate": False, "original_max_position_embeddings": 4096}
GPT_OSS = dict(hidden_size=2880, intermediate_size=2880, head_dim=64, num_attention_heads=64, num_key_value_heads=8,
               num_experts_per_tok=4, sliding_window=128, vocab_size=201088, max_position_embeddings=131072,
               rms_norm_eps=1e-5, tie_word_embeddings=False, rope_parameters=GPT_OSS_ROPE)
QWEN3_ROPE = {"rope_type": "default", "rope_theta": 1000000.0}
QWEN3_5 = dict(max_position_embeddings=262144, rms_norm_eps=1e-6, tie_word_embeddings=False, hidden_act="silu",
               attention_bias=False, linear_conv_kernel_dim=4,
               rope_parameters={"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25,
                                "mrope_interleaved": True, "mrope_section": [11, 11, 10]})
# The 27B text model shared by Qwen3.5-27B and Qwen3.8-27B: 16 x (3 Gated DeltaNet layers + 1 gated full-attention
# layer), hidden 5120, 24 query / 4 KV heads of 256 with an output gate, rope theta 1e7 on a quarter of each head
# (interleaved mrope sections 11/11/10), MLP 17408, linear attention with 16 key heads and 48 value heads of 128 and
# a causal conv of width 4, vocabulary 248,320, untied embeddings.
QWEN3_5_27B = dict(QWEN3_5, hidden_size=5120, intermediate_size=17408, num_hidden_layers=64, num_attention_heads=24,
                   num_key_value_heads=4, head_dim=256, linear_num_key_heads=16, linear_num_value_heads=48,
                   linear_key_head_dim=128, linear_value_head_dim=128, vocab_size=248320)

MODELS = {
    "gpt-oss-20b": Published("GptOssConfig", "openai/gpt-oss-20b", 20.91e9,
                             dict(GPT_OSS, num_hidden_layers=24, num_local_experts=32)),
    "gpt-oss-120b": Published("GptOssConfig", "openai/gpt-oss-120b", 116.83e9,
                              dict(GPT_OSS, num_hidden_layers=36, num_local_experts=128)),
    "llama-3.2-1b": Published("LlamaConfig", "meta-llama/Llama-3.2-1B-Instruct", 1.23e9, dict(
        hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8,
        head_dim=64, vocab_size=128256, max_position_embeddings=131072, rms_norm_eps=1e-5, tie_word_embeddings=True,
        rope_parameters=_llama3_rope(32.0))),
    "llama-3.2-3b": Published("LlamaConfig", "unsloth/Llama-3.2-3B-Instruct", 3.21e9, dict(
        hidden_size=3072, intermediate_size=8192, num_hidden_layers=28, num_attention_heads=24, num_key_value_heads=8,
        head_dim=128, vocab_size=128256, max_position_embeddings=131072, rms_norm_eps=1e-5, tie_word_embeddings=True,
        rope_parameters=_llama3_rope(32.0))),
    "llama-3.1-8b": Published("LlamaConfig", "meta-llama/Llama-3.1-8B", 8.03e9, dict(
        hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
        head_dim=128, vocab_size=128256, max_position_embeddings=131072, rms_norm_eps=1e-5, tie_word_embeddings=False,
        rope_parameters=_llama3_rope(8.0))),
    "olmo-3-7b": Published("Olmo3Config", "allenai/Olmo-3-7B-Instruct-SFT", 7.30e9, dict(
        hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=32,
        vocab_size=100278, max_position_embeddings=65536, rms_norm_eps=1e-6, sliding_window=4096,
        tie_word_embeddings=False, rope_parameters={
            "full_attention": {"rope_type": "yarn", "rope_theta": 500000.0, "factor": 8.0,
                               "original_max_position_embeddings": 8192, "beta_fast": 32.0, "beta_slow": 1.0,
                               "attention_factor": 1.2079441541679836},
            "sliding_attention": {"rope_type": "default", "rope_theta": 500000.0}})),
    "qwen2.5-3b": Published("Qwen2Config", "Qwen/Qwen2.5-3B", 3.09e9, dict(
        hidden_size=2048, intermediate_size=11008, num_hidden_layers=36, num_attention_heads=16, num_key_value_heads=2,
        vocab_size=151936, max_position_embeddings=32768, rms_norm_eps=1e-6, tie_word_embeddings=True,
        use_sliding_window=False, sliding_window=32768, max_window_layers=36, rope_parameters=QWEN3_ROPE)),
    "qwen3-8b": Published("Qwen3Config", "Qwen/Qwen3-8B", 8.2e9, dict(
        hidden_size=4096, intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8,
        head_dim=128, vocab_size=151936, max_position_embeddings=40960, rms_norm_eps=1e-6, tie_word_embeddings=False,
        rope_parameters=QWEN3_ROPE)),
    # The Qwen3-family model of the multi-node FSDP2 recipe's quick run.
    "qwen3-0.6b": Published("Qwen3Config", "Qwen/Qwen3-0.6B", 0.6e9, dict(
        hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8,
        head_dim=128, vocab_size=151936, max_position_embeddings=40960, rms_norm_eps=1e-6, tie_word_embeddings=True,
        rope_parameters=QWEN3_ROPE)),
    # Qwen3.5-27B. Sources (the hub is unreachable here): the model card of Qwen/Qwen3.5-27B (27B parameters, hidden
    # 5120, 64 layers, vocabulary 248,320, the 3:1 layout; huggingface.co/Qwen/Qwen3.5-27B, commit 3b29628), and the
    # text_config of its config.json as mirrored in public code (THUDM/slime scripts/models/qwen3.5-27B.sh and
    # others). The class is the text model transformers loads for that checkpoint with AutoModelForCausalLM
    # (Qwen3_5ForCausalLM); the hub's vision encoder and multi-token-prediction layer (about 0.9 B more, 27.78 B in its
    # safetensors index) are not part of it. Built: 26.90 B, 0.4 % under the card's 27 B.
    "qwen3.5-27b": Published("Qwen3_5TextConfig", "Qwen/Qwen3.5-27B", 27e9, QWEN3_5_27B),
    # Qwen3.8-27B, the model of Databricks' FSDP2 recipe and this cookbook's FSDP2 recipe's default. NVIDIA NeMo
    # AutoModel's model page describes it as a dense 27B that "retains the Qwen3.5 hybrid Gated DeltaNet and
    # gated-attention architecture" (Qwen3_5ForConditionalGeneration), and TRL 1.15 ships its chat template (trl/chat_templates/qwen3_8.jinja, "as
    # shipped by Qwen/Qwen3.8-27B"). No public copy of its config.json could be read offline: its text config is
    # assumed to be Qwen3.5-27B's (same class, same layout, same tokenizer vocabulary), which its 27B size and the
    # page's "retains the ... architecture" support. Where that differs, pass the hub id or its folder instead.
    "qwen3.8-27b": Published("Qwen3_5TextConfig", "Qwen/Qwen3.8-27B", 27e9, QWEN3_5_27B),
}


def config(name: str, layers: int | None = None, **ids):
    """The transformers config of a published model (bf16); `layers` overrides the depth (e.g. what fits a
    benchmark); `ids` sets token ids (bos_token_id, ...), where a tokenizer's matter."""
    import transformers

    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; the published configs known offline: {', '.join(MODELS)}")
    spec = MODELS[name]
    fields = dict(spec.fields)
    if layers is not None:
        fields["num_hidden_layers"] = layers
    return getattr(transformers, spec.config_class)(**fields, **ids, dtype="bfloat16")
