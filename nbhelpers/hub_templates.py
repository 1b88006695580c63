"""The hub models' own chat templates, byte for byte, for the offline stand-ins (nbhelpers.standins).

The files are in nbhelpers/chat_templates/; its README.md says where each copy comes from and which hub
repositories it was compared with. A stand-in carries its model's template, so what the tests render is
what users of the real model render. None of these templates marks the assistant's tokens with
`{% generation %}`: with `assistant_only_loss=True` TRL swaps in its own marked copy where it has one
(`trl.chat_template_utils.get_training_chat_template`: GPT-OSS, Qwen2.5, Qwen3, Qwen3.5) and refuses the others
(Llama 3.1 / 3.2), exactly as it does for the hub models.
"""
from __future__ import annotations

from pathlib import Path

FOLDER = Path(__file__).resolve().parent / "chat_templates"
FILES = {  # hub id -> its template in FOLDER
    "openai/gpt-oss-20b": "gpt_oss.jinja",
    "openai/gpt-oss-120b": "gpt_oss.jinja",
    "meta-llama/Llama-3.2-1B-Instruct": "llama_3_2.jinja",
    "unsloth/Llama-3.2-3B-Instruct": "llama_3_2.jinja",
    "meta-llama/Llama-3.1-8B": "llama_3_1.jinja",
    "Qwen/Qwen3-8B": "qwen3.jinja",
    "Qwen/Qwen3-0.6B": "qwen3.jinja",
    "Qwen/Qwen2.5-3B": "qwen2_5.jinja",
    "Qwen/Qwen3.5-27B": "qwen3_5.jinja",
}


def hub_template(hub_id: str) -> str | None:
    """The chat template the hub model `hub_id` ships, as recorded here; None where none is recorded."""
    name = FILES.get(hub_id)
    return (FOLDER / name).read_text(encoding="utf-8") if name else None
