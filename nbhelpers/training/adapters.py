"""A PEFT (LoRA) model's adapter: its fingerprint (DDP keeps it identical on every rank), and the merged model's
export."""
from __future__ import annotations


def adapter_fingerprint(model) -> str:
    """A hash of this rank's trainable (LoRA) weights: DDP keeps them identical on every rank."""
    import hashlib

    digest = hashlib.sha256()
    for parameter in model.parameters():
        if parameter.requires_grad:
            digest.update(parameter.detach().float().cpu().numpy().tobytes())
    return digest.hexdigest()


def save_merged(model, tokenizer, folder) -> None:
    """Merge a PEFT model's adapter into its base weights and save the result to `folder` (safetensors shards).

    Saved from its state dict: transformers 5.17's `save_pretrained` writes the experts of a GPT-OSS model loaded
    with `Mxfp4Config(dequantize=True)` under broken names (it reverses the MXFP4 loading step)."""
    from huggingface_hub import save_torch_state_dict

    merged = model.merge_and_unload()
    for part in (merged.config, merged.generation_config, tokenizer):
        part.save_pretrained(folder)
    save_torch_state_dict(merged.state_dict(), folder, max_shard_size="5GB")
