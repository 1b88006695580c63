"""Offline stand-ins for the cookbook's models, for the tests and the GPU benchmarks: the real architecture class,
random weights, a small tokenizer. Not part of the package users import (nbhelpers); the published dimensions are
nbhelpers.planner.model_configs' (which the memory planner uses).

No machine of this project reaches a model hub, yet notebooks and recipes must run their real loading
code (`AutoModelForCausalLM.from_pretrained(model_name)`). A stand-in is a folder that loads exactly
like the hub model: same transformers class and config fields, the family's special tokens and chat
template, but random weights and a byte-level BPE trained on data/ (see data/make_tokenizer.py).

    import standins                                                         # tests/ on sys.path (pytest puts it there)
    path = standins.make("llama-3.2-1b", size="tiny", out="/tmp/llama")     # a few MB, seconds
    standins.make("gpt-oss-20b", size="full", out="/data/gpt-oss-20b", weights=True)   # on the GPU box
    standins.make("gpt-oss-20b", size="tiny", out="/tmp/gpt-oss", mxfp4=True)  # experts in MXFP4, as on the hub
    model = standins.build("gpt-oss-120b", size="full")                     # on the meta device: no memory

    python tests/standins.py make llama-3.2-1b --size tiny --out /tmp/llama
    python tests/standins.py table                                          # parameter counts

Sizes: `tiny` keeps every special feature of the architecture (MoE experts, sliding/full layer types,
Qwen3.5's 3:1 linear/full-attention layers, attention sinks, rope scaling, qk-norm, tied or untied
embeddings) at a width of 64, and its vocabulary is exactly the tokenizer's. `full` has the published dimensions and vocabulary size; the tokenizer stays
small, so ids above len(tokenizer) are simply never used (real checkpoints pad their vocabularies the
same way), and the config's special-token ids are the stand-in tokenizer's, not the hub ones.
GPT-OSS: the hub checkpoints store the MoE experts in MXFP4 (4-bit values in blocks of 32 sharing an
8-bit exponent); `mxfp4=True` writes them the same way, so the notebooks' dequantise-on-load path is the
one that runs, and a full-size 20B takes 14 GB on disk instead of 42 GB.
"""
from __future__ import annotations

import argparse
import json
import math
from dataclasses import dataclass
from pathlib import Path

import torch

from nbhelpers.planner import model_configs

ASSETS = Path(__file__).resolve().parent / "standin_assets"
BASE_TOKENIZER = ASSETS / "tokenizer.json"  # data/make_tokenizer.py trains it

# The hub models' own chat templates, byte for byte (standin_assets/chat_templates/README.md says where each copy
# comes from and which hub repositories it was compared with). None of them marks the assistant's tokens with
# `{% generation %}`: with `assistant_only_loss=True` TRL swaps in its own marked copy where it has one
# (`trl.chat_template_utils.get_training_chat_template`: GPT-OSS, Qwen2.5, Qwen3, Qwen3.5) and refuses the others
# (Llama 3.1 / 3.2), exactly as it does for the hub models.
HUB_TEMPLATES = {  # hub id -> its template in ASSETS/chat_templates
    "openai/gpt-oss-20b": "gpt_oss.jinja",
    "openai/gpt-oss-120b": "gpt_oss.jinja",
    "meta-llama/Llama-3.2-1B-Instruct": "llama_3_2.jinja",
    "unsloth/Llama-3.2-3B-Instruct": "llama_3_2.jinja",
    "meta-llama/Llama-3.1-8B": "llama_3_1.jinja",
    "Qwen/Qwen3-8B": "qwen3.jinja",
    "Qwen/Qwen3-0.6B": "qwen3.jinja",
    "Qwen/Qwen2.5-3B": "qwen2_5.jinja",
    "Qwen/Qwen3.5-27B": "qwen3_5.jinja",
    "Qwen/Qwen3.8-27B": "qwen3_8.jinja",
}


def hub_template(hub_id: str) -> str | None:
    """The chat template the hub model `hub_id` ships, as recorded here; None where none is recorded."""
    name = HUB_TEMPLATES.get(hub_id)
    return (ASSETS / "chat_templates" / name).read_text(encoding="utf-8") if name else None


# --------------------------------------------------------------------------------------------------
# Chat templates. A stand-in carries its hub model's own template where HUB_TEMPLATES records
# it (byte for byte). The templates below are for the families with none recorded; transformers renders them
# with trim_blocks/lstrip_blocks: every tag strips the whitespace before it, so only what the expressions
# print reaches the output ('\n' for newlines). `{% generation %}` marks what the assistant writes after the
# generation prompt (its content and the end-of-turn token), which `return_assistant_tokens_mask=True` and
# TRL's assistant-only loss use.
# --------------------------------------------------------------------------------------------------
# Olmo 3 Instruct: ChatML, with its default function-calling system prompt when none is given. Written from the
# hub template's behaviour for plain chats (no copy known to equal allenai/Olmo-3-7B-Instruct-SFT's was found
# offline), with `{% generation %}` marks.
OLMO3_TEMPLATE = r"""
{%- if messages[0]['role'] != 'system' %}
    {{- '<|im_start|>system\nYou are a helpful function-calling AI assistant. ' }}
    {{- 'You do not currently have access to any functions. <functions></functions><|im_end|>\n' }}
{%- endif %}
{%- for message in messages %}
    {{- '<|im_start|>' + message['role'] + '\n' }}
    {%- if message['role'] == 'assistant' %}
        {%- generation %}
        {{- message['content'] + '<|im_end|>' }}
        {%- endgeneration %}
    {%- else %}
        {{- message['content'] + '<|im_end|>' }}
    {%- endif %}
    {{- '\n' }}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
"""




@dataclass(frozen=True)
class Family:
    special_tokens: tuple  # added as special tokens after the BPE vocabulary, in the real id order
    chat_template: str | None = None  # for archs without a recorded hub template (HUB_TEMPLATES)
    added_tokens: tuple = ()  # added, but not special (kept by decode(skip_special_tokens=True))
    prepend_bos: bool = False  # the tokenizer puts bos_token in front of every encoded text


FAMILIES = {
    "llama3": Family(("<|begin_of_text|>", "<|end_of_text|>", "<|finetune_right_pad_id|>", "<|start_header_id|>",
                      "<|end_header_id|>", "<|eom_id|>", "<|eot_id|>", "<|python_tag|>"),
                     prepend_bos=True),
    "gpt-oss": Family(("<|startoftext|>", "<|endoftext|>", "<|return|>", "<|constrain|>", "<|channel|>", "<|start|>",
                       "<|end|>", "<|message|>", "<|call|>")),
    "qwen2": Family(("<|endoftext|>", "<|im_start|>", "<|im_end|>"),
                    added_tokens=("<tool_call>", "</tool_call>")),
    "qwen3": Family(("<|endoftext|>", "<|im_start|>", "<|im_end|>"),
                    added_tokens=("<tool_call>", "</tool_call>", "<think>", "</think>")),
    "olmo3": Family(("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|pad|>"), OLMO3_TEMPLATE),
    "qwen3.5": Family(("<|endoftext|>", "<|im_start|>", "<|im_end|>"),
                      added_tokens=("<tool_call>", "</tool_call>", "<think>", "</think>")),
}


@dataclass(frozen=True)
class Arch:
    family: str  # key of FAMILIES
    bos: str | None  # the tokenizer's bos/eos/pad tokens, as the hub tokenizer sets them
    eos: str
    pad: str | None
    generation_eos: tuple  # generation_config.eos_token_id (every token that ends a reply)
    tiny: dict  # the published config fields (planner.model_configs) at toy size (vocab_size is the tokenizer's)


LLAMA3_TOKENS = dict(bos="<|begin_of_text|>", eos="<|eot_id|>", pad=None,
                     generation_eos=("<|end_of_text|>", "<|eom_id|>", "<|eot_id|>"))
LLAMA3_TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=2, head_dim=16, max_position_embeddings=131072, rms_norm_eps=1e-5)
GPT_OSS_TINY = dict(hidden_size=64, intermediate_size=64, head_dim=16, num_attention_heads=4, num_key_value_heads=2,
                    num_hidden_layers=2, num_local_experts=4, num_experts_per_tok=2, sliding_window=16,
                    max_position_embeddings=131072, rms_norm_eps=1e-5, tie_word_embeddings=False,
                    rope_parameters=model_configs.GPT_OSS_ROPE)
GPT_OSS_TOKENS = dict(bos="<|startoftext|>", eos="<|return|>", pad="<|endoftext|>",
                      generation_eos=("<|return|>", "<|endoftext|>", "<|call|>"))
QWEN3_TOKENS = dict(bos=None, eos="<|im_end|>", pad="<|endoftext|>", generation_eos=("<|im_end|>", "<|endoftext|>"))
QWEN3_TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=16, max_position_embeddings=40960, rms_norm_eps=1e-6,
                  rope_parameters=model_configs.QWEN3_ROPE)
# 4 layers keep Qwen3.5's 3:1 layout (the default layer_types: every 4th layer is full attention); 3 value heads per
# key head as in the full model
QWEN3_5_TINY = dict(model_configs.QWEN3_5, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                    num_attention_heads=4, num_key_value_heads=2, head_dim=16, linear_num_key_heads=2,
                    linear_num_value_heads=6, linear_key_head_dim=16, linear_value_head_dim=16)
OLMO3_ROPE = model_configs.MODELS["olmo-3-7b"].fields["rope_parameters"]

ARCHS = {  # the published dimensions are nbhelpers.planner.model_configs'; here the tokenizer and the tiny size
    "gpt-oss-20b": Arch("gpt-oss", **GPT_OSS_TOKENS, tiny=GPT_OSS_TINY),
    "gpt-oss-120b": Arch("gpt-oss", **GPT_OSS_TOKENS, tiny=GPT_OSS_TINY),
    "llama-3.2-1b": Arch("llama3", **LLAMA3_TOKENS, tiny=dict(LLAMA3_TINY, tie_word_embeddings=True,
                                                                rope_parameters=model_configs._llama3_rope(32.0))),
    "llama-3.2-3b": Arch("llama3", **dict(LLAMA3_TOKENS, pad="<|finetune_right_pad_id|>"),
                         tiny=dict(LLAMA3_TINY, tie_word_embeddings=True, rope_parameters=model_configs._llama3_rope(32.0))),
    "llama-3.1-8b": Arch("llama3", bos="<|begin_of_text|>", eos="<|end_of_text|>", pad=None,
                         generation_eos=("<|end_of_text|>",),
                         tiny=dict(LLAMA3_TINY, tie_word_embeddings=False, rope_parameters=model_configs._llama3_rope(8.0))),
    # 4 layers: three sliding-window layers and one full-attention layer, as in the real pattern
    "olmo-3-7b": Arch("olmo3", bos="<|endoftext|>", eos="<|im_end|>", pad="<|pad|>",
                      generation_eos=("<|im_end|>", "<|endoftext|>"),
                      tiny=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
                                num_key_value_heads=4, max_position_embeddings=65536, rms_norm_eps=1e-6,
                                sliding_window=16, tie_word_embeddings=False, rope_parameters=OLMO3_ROPE)),
    "qwen2.5-3b": Arch("qwen2", bos=None, eos="<|endoftext|>", pad="<|endoftext|>", generation_eos=("<|endoftext|>",),
                       tiny=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                 num_key_value_heads=2, max_position_embeddings=32768, rms_norm_eps=1e-6,
                                 tie_word_embeddings=True, use_sliding_window=False,
                                 rope_parameters=model_configs.QWEN3_ROPE)),
    "qwen3-8b": Arch("qwen3", **QWEN3_TOKENS, tiny=dict(QWEN3_TINY, tie_word_embeddings=False)),
    "qwen3-0.6b": Arch("qwen3", **QWEN3_TOKENS, tiny=dict(QWEN3_TINY, tie_word_embeddings=True)),
    "qwen3.5-27b": Arch("qwen3.5", **QWEN3_TOKENS, tiny=QWEN3_5_TINY),
    "qwen3.8-27b": Arch("qwen3.5", **QWEN3_TOKENS, tiny=QWEN3_5_TINY),
}
SIZES = ("tiny", "full")
# config.json's quantization_config of the GPT-OSS hub checkpoints: only the experts are MXFP4
MXFP4_QUANTIZATION = {"quant_method": "mxfp4", "modules_to_not_convert": [
    "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}
MXFP4_TENSORS = ("mlp.experts.gate_up_proj", "mlp.experts.down_proj")
ZERO_CENTRED_NORMS = ("Qwen3_5RMSNorm", "Qwen3_5MoeRMSNorm", "Qwen3NextRMSNorm")  # weight applied as 1 + weight
FP4_RMS = math.sqrt(sum(v * v for v in (0, 0.5, 1, 1.5, 2, 3, 4, 6)) / 8)  # of the 16 E2M1 codes, drawn uniformly


def _arch(arch: str) -> Arch:
    if arch not in ARCHS:
        raise ValueError(f"unknown stand-in architecture {arch!r}; choose one of: {', '.join(ARCHS)}")
    return ARCHS[arch]


def tokenizer(arch: str):
    """The family's tokenizer: the shared byte-level BPE plus the family's special tokens and chat template."""
    from tokenizers import AddedToken, Tokenizer, processors
    from transformers import PreTrainedTokenizerFast

    spec = _arch(arch)
    family = FAMILIES[spec.family]
    backend = Tokenizer.from_file(str(BASE_TOKENIZER))
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in family.special_tokens])
    if family.added_tokens:
        backend.add_tokens([AddedToken(t, special=False, normalized=False) for t in family.added_tokens])
    if family.prepend_bos:
        bos_id = backend.token_to_id(spec.bos)
        backend.post_processor = processors.Sequence([
            processors.ByteLevel(trim_offsets=False),
            processors.TemplateProcessing(single=f"{spec.bos} $A", pair=f"{spec.bos} $A {spec.bos} $B",
                                          special_tokens=[(spec.bos, bos_id)]),
        ])
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token=spec.bos, eos_token=spec.eos, pad_token=spec.pad,
        chat_template=hub_template(model_configs.MODELS[arch].hub_id) or family.chat_template.strip(),
        model_max_length=model_configs.MODELS[arch].fields["max_position_embeddings"],
        clean_up_tokenization_spaces=False,
    )


def config(arch: str, size: str = "tiny", layers: int | None = None):
    """The transformers config of a stand-in; `layers` overrides the depth (e.g. the most layers that fit)."""
    import transformers

    spec = _arch(arch)
    if size not in SIZES:
        raise ValueError(f"size must be one of {SIZES}, not {size!r}")
    tok = tokenizer(arch)
    fields = dict(model_configs.MODELS[arch].fields if size == "full" else spec.tiny)
    if size == "tiny":
        fields["vocab_size"] = len(tok)
    if layers is not None:
        fields["num_hidden_layers"] = layers
    # The config names the tokenizer's eos; generation_config.json lists every end-of-reply token.
    ids = {"bos_token_id": tok.bos_token_id, "eos_token_id": tok.eos_token_id, "pad_token_id": tok.pad_token_id}
    config_class = model_configs.MODELS[arch].config_class
    return getattr(transformers, config_class)(**fields, **ids, dtype="bfloat16" if size == "full" else "float32")


def generation_config(arch: str):
    from transformers import GenerationConfig

    spec = _arch(arch)
    tok = tokenizer(arch)
    eos = tok.convert_tokens_to_ids(list(spec.generation_eos))
    return GenerationConfig(bos_token_id=tok.bos_token_id, eos_token_id=eos if len(eos) > 1 else eos[0],
                            pad_token_id=tok.pad_token_id)


def build(arch: str, size: str = "tiny", device: str | torch.device = "meta", dtype: torch.dtype | None = None,
          layers: int | None = None, seed: int = 0):
    """The model, randomly initialised on `device` (default "meta": shapes only, no memory)."""
    from transformers import AutoModelForCausalLM

    cfg = config(arch, size, layers)
    dtype = dtype or (torch.bfloat16 if size == "full" else torch.float32)
    torch.manual_seed(seed)
    with torch.device(device):
        return AutoModelForCausalLM.from_config(cfg, dtype=dtype)


def count_parameters(model) -> int:
    """Parameters counted once (tied embeddings count once, as model cards count them)."""
    return sum(p.numel() for p in model.parameters())


def make(arch: str, size: str = "tiny", out: str | Path = "standin", weights: bool | None = None,
         layers: int | None = None, device: str | None = None, mxfp4: bool = False) -> Path:
    """Save a stand-in to `out` (config, generation config, tokenizer, and weights) and return its path.

    weights: default True for tiny; for full, False saves config + tokenizer only (build the model with
    `AutoModelForCausalLM.from_config`), True writes random bf16 safetensors shard by shard, generated on
    `device` (default: the GPU if there is one), so even a model larger than one GPU is written quickly.
    Full bf16 weights take 2 bytes per parameter on disk (gpt-oss-20b 42 GB, gpt-oss-120b 234 GB): where
    the disk is smaller, pass `layers` for a model of the full width with fewer layers, and say so.
    mxfp4 (GPT-OSS only): store the experts as the hub checkpoints do (about 4.25 bits per expert weight;
    gpt-oss-20b 14 GB, gpt-oss-120b 65 GB); `from_pretrained(..., quantization_config=Mxfp4Config(dequantize=True))`
    turns them into bf16 on load.
    """
    spec = _arch(arch)
    published = model_configs.MODELS[arch]
    if mxfp4 and published.config_class != "GptOssConfig":
        raise ValueError(f"mxfp4 is how the GPT-OSS checkpoints store their MoE experts; {arch} has no such "
                         "checkpoint: leave mxfp4 off")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    for stale in [*out.glob("model*.safetensors"), *out.glob("model.safetensors.index.json")]:
        stale.unlink()  # weights of an earlier stand-in in the same folder would be loaded with the new config
    weights = (size == "tiny") if weights is None else weights
    tok = tokenizer(arch)
    cfg = config(arch, size, layers)
    if mxfp4:
        cfg.quantization_config = dict(MXFP4_QUANTIZATION)
    tok.save_pretrained(out)
    if weights and size == "tiny" and not mxfp4:
        model = build(arch, size, device=device or "cpu", layers=layers)
        model.save_pretrained(out)
        n_parameters = count_parameters(model)
    else:
        cfg.save_pretrained(out)
        model = build(arch, size, device="meta", layers=layers)
        n_parameters = count_parameters(model)
        if weights:
            device = device or ("cuda" if torch.cuda.is_available() and size == "full" else "cpu")
            write_random_weights(model, out, device=device, dtype=model.dtype, mxfp4_experts=mxfp4)
    generation_config(arch).save_pretrained(out)  # after the model's, which would overwrite it
    (out / "standin.json").write_text(json.dumps({
        "arch": arch, "size": size, "stands_in_for": published.hub_id, "config_class": published.config_class,
        "parameters": n_parameters, "published_parameters": published.parameters,
        "weights": "random" if weights else "none (config and tokenizer only)",
        "note": "A random-weight stand-in with the real architecture, made by the cookbook's tests/standins.py; "
                "its tokenizer is a small BPE trained on the cookbook's data, not the hub tokenizer.",
    }, indent=2) + "\n")
    return out


def write_random_weights(model, out: Path, device: str, dtype: torch.dtype = torch.bfloat16,
                         shard_bytes: int = 4 * 2**30, seed: int = 0, mxfp4_experts: bool = False) -> None:
    """Write random weights for a (meta) model's parameters as safetensors shards, one tensor at a time.

    Initialisation follows the models' own: normal(0, initializer_range) for matrices, embeddings, expert
    tensors and attention sinks; ones for norm weights (zeros for the norms that scale by 1 + weight, as
    Qwen3.5's); zeros for biases; Gated DeltaNet's decay log A uniform in log(0.01 .. 16) and its dt_bias ones.
    Tied weights are written once.
    mxfp4_experts: each GPT-OSS expert tensor [E, X, Y] is written as the hub stores it, `NAME_blocks`
    [E, Y, X/32, 16] (two random 4-bit codes per byte) and `NAME_scales` [E, Y, X/32] (a power of two
    giving about the same spread as normal(0, initializer_range)).
    """
    from safetensors.torch import save_file

    std = model.config.initializer_range
    scale_exponent = 127 + round(math.log2(std / FP4_RMS))  # MXFP4 scales are 2 ** (byte - 127)
    tensors = []  # (name, parameter, kind)
    for module_name, module in model.named_modules():
        is_norm = "norm" in type(module).__name__.lower()
        norm_kind = "zeros" if type(module).__name__ in ZERO_CENTRED_NORMS else "ones"
        for name, parameter in module.named_parameters(recurse=False):
            kind = (norm_kind if is_norm else "log_uniform" if name == "A_log" else "ones" if name == "dt_bias"
                    else "zeros" if name.endswith("bias") else "normal")
            tensors.append((f"{module_name}.{name}" if module_name else name, parameter, kind))
    seen, unique = set(), []  # (name, shape, kind, dtype)
    for name, parameter, kind in tensors:  # tied parameters are the same object: keep the first name
        if id(parameter) in seen:
            continue
        seen.add(id(parameter))
        if mxfp4_experts and name.endswith(MXFP4_TENSORS):
            experts, rows, columns = parameter.shape  # the hub stores the transpose, in blocks of 32 rows
            unique.append((f"{name}_blocks", (experts, columns, rows // 32, 16), "fp4_codes", torch.uint8))
            unique.append((f"{name}_scales", (experts, columns, rows // 32), "fp4_scales", torch.uint8))
        else:
            unique.append((name, tuple(parameter.shape), kind, dtype))
    shards, current, current_bytes = [], [], 0
    for item in unique:
        size = math.prod(item[1]) * item[3].itemsize
        if current and current_bytes + size > shard_bytes:
            shards.append(current)
            current, current_bytes = [], 0
        current.append(item)
        current_bytes += size
    shards.append(current)
    generator = torch.Generator(device=device).manual_seed(seed)
    weight_map, total = {}, 0
    for index, shard in enumerate(shards, start=1):
        filename = "model.safetensors" if len(shards) == 1 else f"model-{index:05d}-of-{len(shards):05d}.safetensors"
        data = {}
        for name, shape, kind, tensor_dtype in shard:
            if kind == "normal":
                tensor = torch.empty(shape, dtype=tensor_dtype, device=device).normal_(0.0, std, generator=generator)
            elif kind == "fp4_codes":
                tensor = torch.randint(0, 256, shape, dtype=tensor_dtype, device=device, generator=generator)
            elif kind == "fp4_scales":
                tensor = torch.full(shape, scale_exponent, dtype=tensor_dtype, device=device)
            elif kind == "log_uniform":
                uniform = torch.empty(shape, device=device).uniform_(0.01, 16, generator=generator)
                tensor = uniform.log().to(tensor_dtype)
            else:
                tensor = (torch.ones if kind == "ones" else torch.zeros)(shape, dtype=tensor_dtype, device=device)
            data[name] = tensor.cpu()
            weight_map[name] = filename
            total += tensor.nbytes
        save_file(data, str(out / filename), metadata={"format": "pt"})
        del data
    if len(shards) > 1:
        (out / "model.safetensors.index.json").write_text(
            json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2) + "\n")


def parameter_table() -> list[dict]:
    """arch -> class, published vs built (full, meta device) parameter count."""
    rows = []
    for arch in ARCHS:
        published = model_configs.MODELS[arch]
        built = count_parameters(build(arch, "full"))
        rows.append({"arch": arch, "config_class": published.config_class, "hub_id": published.hub_id,
                     "published": published.parameters, "built": built, "error": built / published.parameters - 1})
    return rows


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python tests/standins.py", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    make_parser = commands.add_parser("make", help="save a stand-in model folder")
    make_parser.add_argument("arch", choices=list(ARCHS))
    make_parser.add_argument("--size", choices=SIZES, default="tiny")
    make_parser.add_argument("--out", required=True)
    make_parser.add_argument("--weights", action=argparse.BooleanOptionalAction, default=None,
                             help="write random weights (default: yes for tiny, no for full)")
    make_parser.add_argument("--layers", type=int, default=None, help="override the number of layers")
    make_parser.add_argument("--device", default=None, help="where to generate full-size weights (default: cuda if any)")
    make_parser.add_argument("--mxfp4", action="store_true",
                             help="GPT-OSS: store the experts in MXFP4, as the hub checkpoints do")
    commands.add_parser("table", help="published vs built parameter counts of the full sizes (meta device)")
    args = parser.parse_args(argv)
    if args.command == "make":
        path = make(args.arch, size=args.size, out=args.out, weights=args.weights, layers=args.layers,
                    device=args.device, mxfp4=args.mxfp4)
        size = sum(f.stat().st_size for f in path.iterdir() if f.is_file())
        print(f"{args.arch} ({args.size}) -> {path}  {size / 2**20:.1f} MiB")
    else:
        for row in parameter_table():
            print(f"{row['arch']:14s} {row['config_class']:13s} published {row['published'] / 1e9:7.2f} B  "
                  f"built {row['built'] / 1e9:7.3f} B  ({row['error']:+.2%})")


if __name__ == "__main__":
    main()
